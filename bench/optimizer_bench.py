#!/usr/bin/env python3
"""Optimizer state offload four ways, same model, same data: step time, GPU memory, bytes moved,
and how close the optimizer step comes to what the link (and the disk) allow.

    python3 bench/optimizer_bench.py --json opt.json                  # on the GPU machine
    python3 bench/optimizer_bench.py --device cpu --params 2e6 --width 256 --steps 2 \\
        --warmup 1 --disk-mib 64                                      # a smoke run

The model is a stack of bias-free Linear(--width, --width) layers, x = x + tanh(layer(x)), fp32,
about --params parameters (1.2 G by default: 4.8 GB of weights, 9.6 GB of AdamW state), fed
--tokens x --width inputs, so forward and backward are short and the optimizer step dominates.
torch.optim.AdamW (foreach by default on CUDA; --fused for the fused kernel).

Rows:
  none        the state stays on the GPU: the baseline, and the reference for correctness.
  inprocess   an offloader written in this file: the state lives in pinned CPU tensors between
              steps; the step runs group by group (about --group-mib of state each): group i+1..
              i+--prefetch come back host-to-device on one side stream while group i is updated
              on the compute stream, and the updated state goes device-to-host on a second side
              stream, non-blocking, so both directions overlap. Ordering is by events
              (wait_event), allocator lifetime by record_stream; at most --prefetch + 2 groups
              hold GPU memory (the host waits for the oldest write-back beyond that).
  tierd-host  tier.torch.offload_optimizer_state (same --group-mib and --prefetch), a private
              tierd whose pool holds the whole state.
  tierd-nvme  the same with the pool at --nvme-pool-fraction (a quarter) of the state and an NVMe
              tier (spill file under --spill-dir, large enough for the state): most of the state
              goes to disk and back every step. Fewer steps (--nvme-warmup, --nvme-steps).
Each tierd row starts its own tierd from --build-dir (bench/_tierd.py) and stops it after.

Columns (medians over the measured steps, after the warmup steps):
  step ms     zero_grad + forward + backward + optimizer step, until every copy the step started
              is done (torch.cuda.synchronize, and for tierd client.synchronize()).
  opt ms      the optimizer step alone, state reload and write-back included (synchronized
              before and after as above).
  peak MiB    torch.cuda.max_memory_allocated over the measured steps (weights, gradients and
              whatever state is on the GPU).
  moved GiB   state bytes over the host link per step, device-to-host + host-to-device (the
              offloader's own count for inprocess; tierd's bytes_offloaded + bytes_reloaded).
  disk GiB    bytes tierd wrote to and read from NVMe per step (bytes_spilled + bytes_fetched).
  bound ms    what the hardware allows, from bandwidths measured in the same run:
                link  = max(D2H bytes / D2H rate, H2D bytes / H2D rate), with the rates measured
                        while both directions copy at once (pinned host <-> device,
                        --link-mib each way), since the offloaders overlap the two directions;
                disk  = bytes written / disk write rate + bytes read / disk read rate (one device
                        does both; rates of an O_DIRECT write then read of --disk-mib in
                        --spill-dir, --disk-qd requests of --disk-io-kib in flight);
                bound = max(link, disk) + AdamW's own time (the none row's opt ms).
              Adding AdamW's time rather than overlapping it leaves room for the pipeline's fill
              and drain; the target is opt ms within 15% of the bound.
  opt/bound   opt ms / bound ms (target <= 1.15).
  vs inproc   opt ms / the inprocess row's opt ms (target for tierd-host <= 1.00).
  params=none the parameters after the row's last step bit-identical to the none row's after the
              same number of steps (same seed, same data).

--device cpu is a smoke run of this script's logic against tierd's host engine (no inprocess
row, no link, no GPU memory); the disk is measured all the same, and the nvme row spills.
Prints progress, a table, and writes JSON (--json).
"""

import argparse
import collections
import concurrent.futures
import contextlib
import gc
import inspect
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO_ROOT, "python"))  # the package of this checkout

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from _tierd import TierdProcess  # noqa: E402  (bench/_tierd.py)

MODES = ("none", "inprocess", "tierd-host", "tierd-nvme")
MIN_STATE_BYTES = 4096  # smaller state tensors (AdamW's step count) stay where they are
POOL_GRANULE = 2 << 20  # tierd's pool_bytes granule


def log(*args):
    print(*args, flush=True)


# ---- the model and its data --------------------------------------------------------------------

class Stack(nn.Module):
    """Residual stack of bias-free square Linear layers: every layer gets a real gradient."""

    def __init__(self, width, layers, device):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False, device=device)
                                    for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x


def model_shape(args):
    """(layers, parameters, AdamW state bytes: exp_avg + exp_avg_sq, fp32)."""
    layers = max(1, int(args.params // (args.width * args.width)))
    params = layers * args.width * args.width
    return layers, params, 2 * 4 * params


def build(args):
    """Model and AdamW, the same every time (seeded; initialized on the device itself)."""
    torch.manual_seed(0)
    model = Stack(args.width, model_shape(args)[0], args.device)
    kwargs = {"lr": args.lr, "weight_decay": args.weight_decay}
    if args.fused:
        kwargs["fused"] = True
    return model, torch.optim.AdamW(model.parameters(), **kwargs)


def batch(args, step):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(args.tokens, args.width, generator=g).to(args.device)


def nbytes(t):
    return t.numel() * t.element_size()


@contextlib.contextmanager
def only_params(opt, keep):
    """opt.param_groups restricted to the parameters in `keep` (ids) for the duration."""
    saved = [pg["params"] for pg in opt.param_groups]
    for pg, params in zip(opt.param_groups, saved):
        pg["params"] = [p for p in params if id(p) in keep]
    try:
        yield
    finally:
        for pg, params in zip(opt.param_groups, saved):
            pg["params"] = params


# ---- the in-process offloader --------------------------------------------------------------------

class InProcessStateOffloader:
    """AdamW's state in pinned CPU tensors between steps, moved by this process on side streams.

    step(): the parameters in groups of about group_bytes of state; for group i, in order:
      load    (H2D stream) waits for the event of the group's last write-back (its host copy is
              complete), allocates the GPU state on the H2D stream, copies non-blocking, records
              an event; issued `prefetch` groups ahead.
      update  the compute stream waits for the load's event; the tensors are record_stream'ed
              on it (allocated on the H2D stream); the optimizer steps this group only.
      write   (D2H stream) waits for an event after the update, copies into the pinned tensors
              non-blocking, record_stream's the GPU tensors on the D2H stream, records the event
              the next load of these parameters waits for; the state entries become empty
              placeholders and the GPU tensors are dropped (freed once both streams pass).
    Before a load the host waits for the oldest write-backs until at most prefetch + 2 groups
    hold GPU memory, so the CPU cannot run ahead and allocate the whole state. The first step
    finds no state: the optimizer creates it on the GPU and the write-back sends it out.
    """

    def __init__(self, opt, group_bytes, prefetch):
        self.opt = opt
        self.group_bytes = group_bytes
        self.prefetch = prefetch
        self.compute = torch.cuda.current_stream()
        self.h2d = torch.cuda.Stream()
        self.d2h = torch.cuda.Stream()
        self.host = {}     # id(param) -> {key: pinned CPU tensor}
        self.written = {}  # id(param) -> event after the param's last write-back
        self.h2d_bytes = 0
        self.d2h_bytes = 0

    def _params(self):
        return [p for pg in self.opt.param_groups for p in pg["params"]]

    def _offloadable(self, p):
        """(key, tensor) of the state tensors of p that move."""
        return [(k, v) for k, v in self.opt.state.get(p, {}).items()
                if isinstance(v, torch.Tensor) and v.is_cuda and nbytes(v) >= MIN_STATE_BYTES]

    def _groups(self):
        groups, current, size = [], [], 0
        for p in self._params():
            known = self.host.get(id(p))
            b = sum(map(nbytes, known.values())) if known else nbytes(p)  # no state yet: ~p
            if current and size + b > self.group_bytes:
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += b
        return groups + [current] if current else groups

    def _load(self, group):
        for event in {self.written[id(p)] for p in group if id(p) in self.written}:
            self.h2d.wait_event(event)
        loaded = []
        with torch.cuda.stream(self.h2d):
            for p in group:
                for key, host in self.host.get(id(p), {}).items():
                    t = torch.empty(host.shape, dtype=host.dtype, device=p.device)
                    t.copy_(host, non_blocking=True)
                    self.h2d_bytes += nbytes(t)
                    loaded.append((p, key, t))
        event = torch.cuda.Event()
        event.record(self.h2d)
        return event, loaded

    def _update(self, group, load):
        event, loaded = load
        self.compute.wait_event(event)
        for p, key, t in loaded:
            t.record_stream(self.compute)
            self.opt.state[p][key] = t
        with only_params(self.opt, set(map(id, group))):
            type(self.opt).step(self.opt)

    def _write_back(self, group):
        updated = torch.cuda.Event()
        updated.record(self.compute)
        self.d2h.wait_event(updated)
        with torch.cuda.stream(self.d2h):
            for p in group:
                for key, t in self._offloadable(p):
                    host = self.host.setdefault(id(p), {}).get(key)
                    if host is None:  # first step: the optimizer just created it
                        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                        self.host[id(p)][key] = host
                    host.copy_(t, non_blocking=True)
                    t.record_stream(self.d2h)
                    self.d2h_bytes += nbytes(t)
                    self.opt.state[p][key] = torch.empty(0, dtype=t.dtype, device=t.device)
        done = torch.cuda.Event()
        done.record(self.d2h)
        for p in group:
            self.written[id(p)] = done
        return done

    def step(self):
        groups = self._groups()
        loads = {}
        writing = collections.deque()  # write-back events of groups whose GPU memory may be live
        next_load = 0
        for gi, group in enumerate(groups):
            while next_load < len(groups) and next_load <= gi + self.prefetch:
                while writing and len(writing) + len(loads) >= self.prefetch + 2:
                    writing.popleft().synchronize()
                loads[next_load] = self._load(groups[next_load])
                next_load += 1
            self._update(group, loads.pop(gi))
            writing.append(self._write_back(group))

    def counters(self):
        return {"d2h_bytes": self.d2h_bytes, "h2d_bytes": self.h2d_bytes}


# ---- the rows ----------------------------------------------------------------------------------

def tierd_status(build_dir, socket):
    """`tierctl --json status` of the daemon on `socket`, or None without tierctl."""
    tierctl = os.path.join(build_dir, "tierctl", "tierctl")
    if not os.access(tierctl, os.X_OK):
        return None
    r = subprocess.run([tierctl, "--socket", socket, "--json", "status"], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)


def failed_jobs(port):
    """Jobs that ended with an error, by kind and status code, from tierd's metrics endpoint on
    127.0.0.1:`port` ({"offload RESOURCE_EXHAUSTED": 12, ...}); {} when it cannot be read."""
    import urllib.request
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if not line.startswith("tierd_jobs_completed_total{"):
            continue
        labels, value = line[len("tierd_jobs_completed_total{"):].rsplit("} ", 1)
        fields = dict(kv.split("=", 1) for kv in labels.split(","))
        code, kind = fields.get("code", "").strip('"'), fields.get("kind", "").strip('"')
        if code != "OK" and float(value) > 0:
            out["%s %s" % (kind, code)] = int(float(value))
    return out


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TIERD_COUNTERS = ("bytes_offloaded", "bytes_reloaded", "bytes_spilled", "bytes_fetched",
                  "jobs_failed", "spill_write_errors", "spill_read_errors")


class Row:
    """One mode: the optimizer step to call, how to wait for it, its traffic counters."""

    def __init__(self, mode, args, opt, state_bytes):
        self.mode = mode
        self.args = args
        self.opt = opt
        self.cuda = args.device == "cuda"
        self.daemon = self.client = self.offloader = None
        self.notes = []
        if mode == "inprocess":
            self.offloader = InProcessStateOffloader(opt, args.group_bytes, args.prefetch)
        elif mode.startswith("tierd"):
            self._start_tierd(state_bytes)

    def _start_tierd(self, state_bytes):
        import tier.torch as tt
        args = self.args
        extra = []
        if self.mode == "tierd-nvme":
            pool = state_bytes * args.nvme_pool_fraction
            self.spill_dir = tempfile.mkdtemp(prefix="tier-optbench-spill-", dir=args.spill_dir)
            extra += ["--spill_dir=" + self.spill_dir,
                      "--spill_bytes=%d" % round_up(int(state_bytes * 1.25) + (256 << 20),
                                                    POOL_GRANULE)]
        else:
            pool = state_bytes * 1.25 + (256 << 20)
        self.pool_bytes = round_up(int(pool), POOL_GRANULE)
        self.metrics_port = free_port()
        extra.append("--metrics_listen=127.0.0.1:%d" % self.metrics_port)
        self.daemon = TierdProcess(args.build_dir, self.pool_bytes, extra)
        self.client = self.daemon.connect("optimizer_bench")
        if self.cuda and self.client.engine != "cuda":
            self.notes.append("%s: tierd runs the %s engine (no GPU engine): CUDA tensors are "
                              "staged through host memory" % (self.mode, self.client.engine))
        self.offloader = tt.offload_optimizer_state(self.opt, group_bytes=args.group_bytes,
                                                    prefetch=args.prefetch, client=self.client)

    def step(self):
        if self.mode == "inprocess":
            self.offloader.step()
        else:
            self.opt.step()  # tierd: offload_optimizer_state installed its own step

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()
        if self.client is not None:
            self.client.synchronize()

    def counters(self):
        """Cumulative traffic counters (differences over the measured steps are reported)."""
        if self.mode == "inprocess":
            return self.offloader.counters()
        if self.daemon is None:
            return {}
        status = tierd_status(self.args.build_dir, self.daemon.socket)
        if status is None:  # no tierctl: the offloader's own count, reloads taken as equal
            b = self.offloader.stats.offloaded_bytes
            return {"bytes_offloaded": b, "bytes_reloaded": b}
        return {k: status.get(k, 0) for k in TIERD_COUNTERS}

    def extra(self):
        if self.daemon is None:
            return {}
        out = {"pool_bytes": self.pool_bytes, "tier_stats": self.offloader.stats.as_dict(),
               "failed_jobs": failed_jobs(self.metrics_port)}
        status = tierd_status(self.args.build_dir, self.daemon.socket)
        if status is not None:
            out["tiers"] = status.get("tiers")
            out["spill_files"] = status.get("spill_files")
        return out

    def close(self):
        self.offloader = None
        if self.client is not None:
            self.client.close()
        if self.daemon is not None:
            self.daemon.stop()
            if self.mode == "tierd-nvme":
                shutil.rmtree(self.spill_dir, ignore_errors=True)


def round_up(n, granule):
    return (n + granule - 1) // granule * granule


def run_mode(mode, args, steps, warmup, state_bytes, snapshot_at=()):
    """Trains `warmup + steps` steps (more when snapshots are asked for later); returns the row's
    results and CPU copies of the parameters after each step count in snapshot_at."""
    log("[%s] building the model" % mode)
    model, opt = build(args)
    row = Row(mode, args, opt, state_bytes)
    total = max([warmup + steps, *snapshot_at])
    step_ms, opt_ms, snapshots = [], [], {}
    before = after = {}
    peak = None
    try:
        for step in range(total):
            x = batch(args, step)
            row.sync()
            if step == warmup:
                before = row.counters()
                if row.cuda:
                    torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            row.sync()
            t1 = time.perf_counter()
            row.step()
            row.sync()
            t2 = time.perf_counter()
            if warmup <= step < warmup + steps:
                step_ms.append((t2 - t0) * 1e3)
                opt_ms.append((t2 - t1) * 1e3)
            if step == warmup + steps - 1:
                after = row.counters()
                if row.cuda:
                    peak = torch.cuda.max_memory_allocated() / 2**20
            log("[%s] step %d/%d: %.1f ms (optimizer %.1f ms)%s" % (
                mode, step + 1, total, (t2 - t0) * 1e3, (t2 - t1) * 1e3,
                "" if warmup <= step < warmup + steps else " (not measured)"))
            if step + 1 in snapshot_at:
                # copy=True: on the CPU, .cpu() would alias the parameters still training
                snapshots[step + 1] = [p.detach().to("cpu", copy=True)
                                       for p in model.parameters()]
        result = {
            "mode": mode, "steps": steps, "warmup": warmup,
            "step_ms": statistics.median(step_ms), "opt_ms": statistics.median(opt_ms),
            "step_ms_all": step_ms, "opt_ms_all": opt_ms, "peak_mib": peak,
            "per_step": {k: (after[k] - before.get(k, 0)) / steps for k in after},
            "notes": row.notes, **row.extra(),
        }
        result["params"] = [p.detach() for p in model.parameters()]  # compared, then dropped
    finally:
        row.close()
    return result, snapshots


def moved_bytes(r):
    """(D2H, H2D, disk written, disk read) bytes per step of a row."""
    c = r["per_step"]
    return (c.get("d2h_bytes", c.get("bytes_offloaded", 0)),
            c.get("h2d_bytes", c.get("bytes_reloaded", 0)),
            c.get("bytes_spilled", 0), c.get("bytes_fetched", 0))


# ---- bandwidths --------------------------------------------------------------------------------

def measure_link(nbytes_each, reps=5):
    """Pinned host <-> device copy rates (GB/s): each direction alone, then both at once (the
    rate of each direction while the other runs), best of `reps`."""
    host = [torch.empty(nbytes_each, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    dev = [torch.empty(nbytes_each, dtype=torch.uint8, device="cuda") for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    h2d = (dev[0], host[0])
    d2h = (host[1], dev[1])

    def timed(copies):
        torch.cuda.synchronize()
        marks = []
        for stream, (dst, src) in zip(streams, copies):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                start.record()
                dst.copy_(src, non_blocking=True)
                end.record()
            marks.append((start, end))
        torch.cuda.synchronize()
        return [nbytes_each / (s.elapsed_time(e) * 1e-3) / 1e9 for s, e in marks]

    def best(copies):
        return [max(rates) for rates in zip(*(timed(copies) for _ in range(reps)))]

    out = {"bytes_each_way": nbytes_each,
           "h2d_gbs": best([h2d])[0], "d2h_gbs": best([d2h])[0]}
    out["both_h2d_gbs"], out["both_d2h_gbs"] = best([h2d, d2h])
    del host, dev
    torch.cuda.empty_cache()
    return out


def measure_disk(directory, total, io_bytes, depth):
    """Write then read `total` bytes of a fresh file in `directory` with O_DIRECT (buffered, fsync
    and dropped from the page cache where O_DIRECT is refused), `depth` requests of `io_bytes` in
    flight (threads). MB/s (1e6)."""
    path = os.path.join(directory, "optimizer_bench.disk.%d" % os.getpid())
    chunks = max(1, total // io_bytes)
    direct = hasattr(os, "O_DIRECT")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0),
                     0o600)
    except OSError:
        direct = False
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    buffers = []
    for _ in range(depth):
        buf = mmap.mmap(-1, io_bytes)  # page-aligned, as O_DIRECT wants
        buf.write(os.urandom(io_bytes))
        buffers.append(buf)

    def run(op):
        def worker(k):
            for c in range(k, chunks, depth):
                op(buffers[k], c * io_bytes)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(depth) as pool:
            list(pool.map(worker, range(depth)))
        return t0

    try:
        t0 = run(lambda buf, off: os.pwrite(fd, buf, off))
        os.fsync(fd)
        write_s = time.perf_counter() - t0
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = run(lambda buf, off: os.preadv(fd, [buf], off))
        read_s = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
        for buf in buffers:
            buf.close()
    moved = chunks * io_bytes
    return {"directory": directory, "bytes": moved, "io_bytes": io_bytes, "queue_depth": depth,
            "direct_io": direct, "write_mbs": moved / write_s / 1e6,
            "read_mbs": moved / read_s / 1e6}


# ---- bound, correctness, table -----------------------------------------------------------------

def add_bounds(results, link, disk):
    """bound ms, opt/bound and vs inproc per row (see the module docstring)."""
    by_mode = {r["mode"]: r for r in results}
    adamw_ms = by_mode["none"]["opt_ms"] if "none" in by_mode else 0.0
    for r in results:
        d2h, h2d, written, read = moved_bytes(r)
        r["moved_bytes"] = d2h + h2d
        r["disk_bytes"] = written + read
        link_ms = disk_ms = None
        if link is not None:
            link_ms = max(d2h / (link["both_d2h_gbs"] * 1e9),
                          h2d / (link["both_h2d_gbs"] * 1e9)) * 1e3
        if disk is not None and written + read:
            disk_ms = (written / (disk["write_mbs"] * 1e6) + read / (disk["read_mbs"] * 1e6)) * 1e3
        parts = [t for t in (link_ms, disk_ms) if t is not None]
        r["link_ms"], r["disk_ms"] = link_ms, disk_ms
        r["bound_ms"] = (max(parts) + adamw_ms) if parts and r["mode"] != "none" else None
        r["opt_vs_bound"] = r["opt_ms"] / r["bound_ms"] if r["bound_ms"] else None
        inproc = by_mode.get("inprocess")
        r["vs_inprocess"] = r["opt_ms"] / inproc["opt_ms"] if inproc else None


def check_params(result, snapshots):
    """Bit-identical to the none row after as many steps (None: the none row, or no reference)."""
    params = result.pop("params")
    ref = snapshots.get(result["warmup"] + result["steps"])
    if ref is None or result["mode"] == "none":
        return None
    return all(torch.equal(p.cpu(), q) for p, q in zip(params, ref))


def print_table(results):
    def fmt(v, f="%.1f"):
        return "-" if v is None else f % v

    header = ("mode", "step ms", "opt ms", "peak MiB", "moved GiB", "disk GiB", "bound ms",
              "opt/bound", "vs inproc", "params=none")
    rows = [header]
    for r in results:
        rows.append((r["mode"], fmt(r["step_ms"]), fmt(r["opt_ms"]), fmt(r["peak_mib"], "%.0f"),
                     fmt(r["moved_bytes"] / 2**30, "%.2f"), fmt(r["disk_bytes"] / 2**30, "%.2f"),
                     fmt(r["bound_ms"]), fmt(r["opt_vs_bound"], "%.2f"),
                     fmt(r["vs_inprocess"], "%.2f"),
                     {None: "-", True: "yes", False: "NO"}[r["params_equal_to_none"]]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        log("  ".join(cell.rjust(w) if i else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))))


def targets(results):
    """Lines on the targets: opt within 15% of the bound, tierd no slower than inprocess."""
    out = []
    for r in results:
        if r["opt_vs_bound"] is not None:
            out.append("%s: optimizer step %.2fx its bound (target <= 1.15: %s)" % (
                r["mode"], r["opt_vs_bound"], "met" if r["opt_vs_bound"] <= 1.15 else "MISSED"))
        if r["mode"] == "tierd-host" and r["vs_inprocess"] is not None:
            out.append("tierd-host: optimizer step %.2fx the in-process offloader's (target "
                       "<= 1.00: %s)" % (r["vs_inprocess"],
                                         "met" if r["vs_inprocess"] <= 1.0 else "MISSED"))
    return out


# ---- main --------------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--params", type=float, default=1.2e9)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--tokens", type=int, default=8, help="rows of the input batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--nvme-steps", type=int, default=3)
    p.add_argument("--nvme-warmup", type=int, default=1)
    p.add_argument("--group-mib", type=float, default=64,
                   help="state per group (both offloaders); at most 1/16 of the state")
    p.add_argument("--prefetch", type=int, default=2, help="groups loaded ahead (both offloaders)")
    p.add_argument("--nvme-pool-fraction", type=float, default=0.25)
    p.add_argument("--spill-dir", default=tempfile.gettempdir(),
                   help="where tierd-nvme's spill directory and the disk measurement go")
    p.add_argument("--link-mib", type=int, default=512)
    p.add_argument("--disk-mib", type=int, default=2048)
    p.add_argument("--disk-qd", type=int, default=16)
    p.add_argument("--disk-io-kib", type=int, default=1024)
    p.add_argument("--compile", action="store_true",
                   help="also 'compiled none' / 'compiled tierd' (bench/framework_rows.py)")
    p.add_argument("--fsdp", type=int, default=0, metavar="N",
                   help="also 'fsdpN none' / 'fsdpN tierd': FSDP2 on N GPUs")
    p.add_argument("--build-dir", default=os.environ.get("TIER_BUILD_DIR",
                                                         os.path.join(REPO_ROOT, "build")))
    args = p.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    args.spill_dir = os.path.abspath(args.spill_dir)
    return args


def select_modes(args):
    """The rows to run, and notes on the ones left out."""
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit("unknown modes: %s (choose from %s)" % (", ".join(sorted(unknown)),
                                                                 ", ".join(MODES)))
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available (use --device cpu for a smoke run)")
    if args.fused and "fused" not in inspect.signature(torch.optim.AdamW).parameters:
        raise SystemExit("this torch (%s) has no fused AdamW" % torch.__version__)
    notes = []
    if args.device == "cpu" and "inprocess" in modes:
        modes.remove("inprocess")
        notes.append("inprocess needs CUDA streams: skipped on cpu")
    return modes, notes


def measure_bandwidths(args, modes):
    """The link (CUDA) and, for the nvme row, the disk under --spill-dir."""
    link = disk = None
    if args.device == "cuda":
        link = measure_link(args.link_mib << 20)
        log("link: H2D %.1f GB/s, D2H %.1f GB/s alone; %.1f / %.1f GB/s both at once" % (
            link["h2d_gbs"], link["d2h_gbs"], link["both_h2d_gbs"], link["both_d2h_gbs"]))
    if "tierd-nvme" in modes:
        disk = measure_disk(args.spill_dir, args.disk_mib << 20, args.disk_io_kib << 10,
                            args.disk_qd)
        log("disk (%s, %s, QD%d x %d KiB): write %.0f MB/s, read %.0f MB/s" % (
            disk["directory"], "O_DIRECT" if disk["direct_io"] else "buffered",
            args.disk_qd, args.disk_io_kib, disk["write_mbs"], disk["read_mbs"]))
    return link, disk


def run_all(args, modes, state_bytes):
    """Every row in turn, GPU memory freed between them; none first keeps the reference
    parameters for each step count the other rows run."""
    plan = {m: (args.nvme_steps, args.nvme_warmup) if m == "tierd-nvme" else
            (args.steps, args.warmup) for m in modes}
    results, snapshots, notes = [], {}, []
    for mode in modes:
        steps, warmup = plan[mode]
        snapshot_at = {w + s for s, w in plan.values()} if mode == "none" else ()
        r, snaps = run_mode(mode, args, steps, warmup, state_bytes, snapshot_at)
        snapshots.update(snaps)
        r["params_equal_to_none"] = check_params(r, snapshots)
        notes.extend(r.pop("notes"))
        results.append(r)
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
        log("[%s] done: optimizer step %.1f ms, parameters equal to none: %s" % (
            mode, r["opt_ms"], r["params_equal_to_none"]))
    return results, notes


def print_report(args, shape, device_name, results, link, disk, notes):
    layers, params, state_bytes = shape
    log("\noptimizer state offload, %s, torch %s: %.3f G parameters (%d x %d), AdamW%s, "
        "state %.2f GiB, group_bytes %.0f MiB, prefetch %d" % (
            device_name, torch.__version__, params / 1e9, layers, args.width,
            " fused" if args.fused else "", state_bytes / 2**30, args.group_bytes / 2**20,
            args.prefetch))
    print_table(results)
    if link is not None:
        log("link: %.1f GB/s H2D, %.1f GB/s D2H while both copy (alone %.1f / %.1f)" % (
            link["both_h2d_gbs"], link["both_d2h_gbs"], link["h2d_gbs"], link["d2h_gbs"]))
    if disk is not None:
        log("disk: write %.0f MB/s, read %.0f MB/s (%s)" % (
            disk["write_mbs"], disk["read_mbs"], "O_DIRECT" if disk["direct_io"] else "buffered"))
    for r in results:
        if "tiers" in r:
            nvme = [t for t in r["tiers"] or () if t["name"] == "nvme"]
            log("%s: pool %.0f MiB; tierd per step: %.0f MiB spilled, %.0f MiB fetched, %.0f "
                "failed jobs; nvme tier now holds %.0f MiB" % (
                    r["mode"], r["pool_bytes"] / 2**20,
                    r["per_step"].get("bytes_spilled", 0) / 2**20,
                    r["per_step"].get("bytes_fetched", 0) / 2**20,
                    r["per_step"].get("jobs_failed", 0),
                    nvme[0]["used_bytes"] / 2**20 if nvme else 0))
            if r.get("failed_jobs"):
                log("%s: failed jobs since start, by kind and code: %s" % (
                    r["mode"], ", ".join("%s %d" % kv for kv in sorted(r["failed_jobs"].items()))))
    for line in targets(results):
        log(line)
    for n in notes:
        log("note:", n)


def main():
    args = parse_args()
    modes, notes = select_modes(args)
    os.environ.setdefault("TIER_BUILD_DIR", args.build_dir)  # tier._lib finds libtierclient
    layers, params, state_bytes = shape = model_shape(args)
    args.group_bytes = int(min(args.group_mib * 2**20, state_bytes / 16))
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    log("model: %d x Linear(%d, %d), %.3f G parameters fp32; AdamW state %.2f GiB; %s; "
        "group_bytes %.1f MiB" % (layers, args.width, args.width, params / 1e9, state_bytes / 2**30,
                                device_name, args.group_bytes / 2**20))
    link, disk = measure_bandwidths(args, modes)
    results, row_notes = run_all(args, modes, state_bytes)
    notes += row_notes
    add_bounds(results, link, disk)
    print_report(args, shape, device_name, results, link, disk, notes)
    framework = {}
    if args.compile or args.fsdp:
        import framework_rows  # bench/framework_rows.py
        daemon = TierdProcess(args.build_dir, int(state_bytes * 1.25) + (512 << 20))
        try:
            daemon.connect("optimizer_bench").close()  # waits until it serves
            framework = framework_rows.run("optimizer", "optimizer_bench", args, daemon.socket,
                                           args.compile, args.fsdp)
        finally:
            daemon.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "optimizer_bench", "device": device_name,
                       "torch": torch.__version__, "python": sys.version.split()[0],
                       "config": vars(args), "params": params, "layers": layers,
                       "state_bytes": state_bytes, "link": link, "disk": disk,
                       "results": results, "framework_rows": framework, "notes": notes}, f,
                      indent=2)
        log("wrote", args.json)


if __name__ == "__main__":
    main()
