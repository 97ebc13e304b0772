#!/usr/bin/env python3
"""Activation memory vs step time: no offload, full recompute, an in-process offloader and tierd.

    python3 bench/torch_offload_bench.py --json out.json        # both models, both allocators

Models (--model a|b|both; --layers/--d-model/--heads/--seq/--batch override the preset):
  a  8 blocks, d_model 1024, seq 1024, batch 4, 16 heads
  b  4 blocks, d_model 4096, seq 4096, batch 1, 32 heads (a wider model: more compute per byte)
GPT blocks (pre-norm, attention written out, dropout 0.1 seeded per step), bf16 on CUDA, fp32 on
CPU; one step = forward + backward + SGD step.

Modes (--modes; `none` always runs first: the others are compared with it):
  none          no offload: the baseline.
  recompute     full recompute: torch.utils.checkpoint around each block (use_reentrant=False
                where this torch has it); blocks' activations are recomputed in backward.
  inprocess     an in-process offloader written in this file the way torchtune's
                OffloadActivations works (use_streams): D2H into pinned host tensors on a side
                stream with events; a GPU tensor is dropped once `max_fwd_stash` newer ones were
                offloaded, after the compute stream waited for its copy's event; in backward, H2D
                on the side stream `prefetch` ahead (CUDA only).
  tierd         tier.torch.offload_activations, offload-all: tierd's engine does the copies.
  tierd-budget  the same with max_overhead=0.05: the first step calibrates (offloads nothing),
                from the next on only what the policy predicts to hide under compute.
  tierd-half    the same with target_bytes = half the activation peak of mode none in this run
                (CPU, where no peak is measured: half of what tierd offload-all offloaded).
Each child runs the modes one after the other, each from the same initial weights, with the
caching allocator's cache kept from mode to mode. One offloader per tierd mode, entered every
step (the budget learns across steps). The budget needs 2 steps to learn (the calibration step,
then one under the plan; warmup is raised to 2 if less), and re-plans after a step slower than
predicted: the default warmup of 5 leaves it room, and the policy line says how many plans it
made and how many of them fell in the measured steps.

Columns (median of --steps after --warmup):
  step ms       forward + backward + optimizer step, host wall clock, synchronized both ends.
  vs none       step ms / none's step ms.
  fwd / bwd ms  forward (with the loss) and backward, CUDA events (CPU: host clock).
  act peak MiB  torch.cuda.max_memory_allocated above the step's start (weights only, gradients
                set to None): activations, temporaries and the gradients made in backward.
  D2H / H2D     MiB moved per step. inprocess: what it copied each way. tierd: what tierd moved
                for this process's session (offloaded / reloaded bytes, `tierctl clients
                --json`); without tierctl, D2H is the offloader's stats.offloaded_bytes and H2D
                '-'. The offloader's own count goes to the JSON (offloader_d2h_mib) and a note
                says where it exceeds what tierd moved (with expandable segments, a tensor
                spanning two physical pages stays on the GPU). 0 for none and recompute.
  losses = none every step's loss (warmup included) bit for bit equal to none's: same weights,
                data and dropout seeds.

The bound for tierd-budget, "what the link can hide in this step": none's forward time x D2H
bandwidth (copies that overlap forward), capped by none's backward time x H2D bandwidth (what
backward can bring back in time) and by what offload-all chooses to offload (all there is).
Bandwidths: a pinned-host copy of --link-mib each way, timed with CUDA events (CPU: the
offloader's own link probe). Reported: the fraction of the bound that tierd-budget offloaded
(tierd's D2H bytes).

Targets checked after each table: tierd-budget step <= 1.05x none and offloaded >= 80% of the
bound; tierd-half's activation peak at most half of none's, and tierd-half faster than recompute
(the target is for model b) with tierd moving at least 90% of what the offloader chose; tierd
offload-all no slower than inprocess while moving at least 90% of inprocess's D2H bytes (else it
did not do the same work); losses equal.

Allocators (--allocators default,expandable): PYTORCH_CUDA_ALLOC_CONF must be set before CUDA
starts, so each (model, allocator) runs in a child process of this script (unset, or
expandable_segments:True); the parent prints one table per child and writes everything to --json.
The parent starts one tierd from --build-dir for the whole run unless --socket is given.
--device cpu is a smoke run of this script's logic (tierd's host engine; no memory columns).
"""

import argparse
import contextlib
import inspect
import json
import math
import os
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
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from _tierd import TierdProcess  # noqa: E402  (bench/_tierd.py)

MODES = ("none", "recompute", "inprocess", "tierd", "tierd-budget", "tierd-half")
TIERD_MODES = ("tierd", "tierd-budget", "tierd-half")
PRESETS = {
    "a": dict(layers=8, d_model=1024, seq=1024, batch=4, heads=16),
    "b": dict(layers=4, d_model=4096, seq=4096, batch=1, heads=32),
}
ALLOC_CONF = {"default": None, "expandable": "expandable_segments:True"}
MAX_OVERHEAD = 0.05     # tierd-budget
BOUND_FRACTION = 0.80   # tierd-budget must offload at least this much of the bound
BUDGET_WARMUP = 3       # the calibration step, the timed baseline, then one step under the plan
SAME_WORK = 0.90        # "the same work": tierd moved at least this share of the reference's D2H
CHECKPOINT_KW = ({"use_reentrant": False}
                 if "use_reentrant" in inspect.signature(checkpoint).parameters else {})
MiB = 2**20


def log(*parts):
    print(*parts, flush=True)


# ---- the model (the GPU test's GPT: pre-norm blocks, attention written out) -------------------

class Block(nn.Module):
    def __init__(self, d_model, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = self.drop(att.masked_fill(mask[:s, :s], float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, seq, dropout):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1),
                             persistent=False)
        self.recompute = False                      # set per mode: checkpoint each block
        self.head_region = contextlib.nullcontext   # set per mode: the head is never offloaded

    def forward(self, idx):
        s = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(s, device=idx.device))
        for block in self.blocks:
            if self.recompute:
                x = checkpoint(block, x, self.mask, **CHECKPOINT_KW)
            else:
                x = block(x, self.mask)
        with self.head_region():
            return self.head(self.ln_f(x))


# ---- the in-process offloader (torchtune's OffloadActivations, use_streams=True) -------------

def _identity(x):
    return x


def keep_saved_tensors():
    """Identity hooks: saved tensors inside stay where they are (the head's)."""
    return torch.autograd.graph.saved_tensors_hooks(_identity, _identity)


class Moved:
    """Bytes copied each way (the in-process offloader's counters, kept across steps)."""

    def __init__(self):
        self.d2h = 0
        self.h2d = 0


class InProcessOffloader:
    """Saved tensors to pinned host memory and back, on a side stream, inside this process."""

    def __init__(self, min_bytes, prefetch, max_fwd_stash, skip_storages, moved):
        self.min_bytes = min_bytes
        self.prefetch = prefetch
        self.max_fwd_stash = max_fwd_stash
        self.skip = skip_storages
        self.moved = moved
        self.next_id = 0
        self.host = {}       # id -> pinned CPU copy
        self.fwd_stash = {}  # id -> (GPU tensor, event of its D2H): kept until the copy is waited
        self.bwd = {}        # id -> (GPU tensor, event of its H2D): prefetched
        self.s0 = self.s1 = None
        self._hooks = None

    def __enter__(self):
        self.s0 = torch.cuda.current_stream()
        self.s1 = torch.cuda.Stream()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False

    def _offloadable(self, t):
        if type(t) is not torch.Tensor or not t.is_cuda or t.layout != torch.strided:
            return False
        if t.numel() * t.element_size() < self.min_bytes:
            return False
        base = t._base if t._base is not None else t
        if isinstance(base, nn.Parameter) or (base.is_leaf and base.requires_grad):
            return False
        return storage_ptr(t) not in self.skip

    def _to_gpu(self, tid):
        self.moved.h2d += self.host[tid].numel() * self.host[tid].element_size()
        return self.host[tid].to("cuda", non_blocking=True)

    def pack(self, t):
        if not self._offloadable(t):
            return t
        tid = self.next_id
        self.next_id += 1
        self.s1.wait_stream(self.s0)  # the copy reads what the compute stream wrote
        with torch.cuda.stream(self.s1):
            cpu = torch.empty(t.size(), dtype=t.dtype, pin_memory=True)
            cpu.copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.s1)
        self.moved.d2h += t.numel() * t.element_size()
        self.host[tid] = cpu
        self.fwd_stash[tid] = (t, event)
        # Drop GPU tensors whose copies are old enough: the compute stream waits for each copy
        # first, so its later work (which may reuse the memory) is ordered after the copy.
        for old in [k for k in self.fwd_stash if k <= tid - self.max_fwd_stash]:
            _, old_event = self.fwd_stash.pop(old)
            self.s0.wait_event(old_event)
        return tid

    def unpack(self, tid):
        if not isinstance(tid, int):
            return tid
        if tid in self.fwd_stash:  # never dropped: still on the GPU
            out = self.fwd_stash.pop(tid)[0]
        elif tid in self.bwd:
            out, event = self.bwd.pop(tid)
            self.s0.wait_event(event)
            out.record_stream(self.s0)
        else:
            out = self._to_gpu(tid)
        self.host.pop(tid, None)
        for j in range(tid - 1, max(tid - 1 - self.prefetch, -1), -1):
            if j in self.host and j not in self.bwd and j not in self.fwd_stash:
                with torch.cuda.stream(self.s1):
                    gpu = self._to_gpu(j)
                    event = torch.cuda.Event()
                    event.record(self.s1)
                self.bwd[j] = (gpu, event)
        return out


def storage_ptr(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr()


# ---- tierd: this process's session and its counters -------------------------------------------

class TierdSession:
    """A client of the bench's tierd; the bytes tierd moved for it from `tierctl clients --json`."""

    def __init__(self, socket, build_dir):
        import tier
        self.socket = socket
        self.client = tier.Client(socket=socket, name="torch_offload_bench")
        self.session_id = self.client.info().session_id
        self.engine = self.client.engine
        self.tierctl = os.path.join(build_dir, "tierctl", "tierctl")

    def moved(self):
        """{"d2h", "h2d"}: this session's offloaded and reloaded bytes so far; None without
        tierctl."""
        if not os.access(self.tierctl, os.X_OK):
            return None
        self.client.synchronize()  # every job done, so counted
        done = subprocess.run([self.tierctl, "--socket", self.socket, "--json", "clients"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return None
        for s in json.loads(done.stdout).get("sessions", []):
            if int(s["session_id"]) == self.session_id:
                return {"d2h": int(s.get("bytes_offloaded", 0)),
                        "h2d": int(s.get("bytes_reloaded", 0))}
        return None

    def close(self):
        self.client.close()


# ---- modes ------------------------------------------------------------------------------------

class Mode:
    """none: how a mode sets up the model, each step's context, the bytes moved so far."""

    recompute = False
    head_region = staticmethod(contextlib.nullcontext)

    def install(self, model):
        model.recompute = self.recompute
        model.head_region = self.head_region

    def context(self):
        return contextlib.nullcontext()

    def counters(self):
        """Cumulative counters: "d2h" and "h2d" bytes (None where unknown), and others."""
        return {"d2h": 0, "h2d": 0}

    def details(self):
        return {}


class Recompute(Mode):
    recompute = True


class InProcess(Mode):
    head_region = staticmethod(keep_saved_tensors)

    def __init__(self, model, args):
        self.skip = {storage_ptr(t) for t in list(model.parameters()) + list(model.buffers())}
        self.args = args
        self.moved = Moved()

    def context(self):
        a = self.args
        return InProcessOffloader(a.min_bytes, a.prefetch, a.max_fwd_stash, self.skip,
                                  self.moved)

    def counters(self):
        return {"d2h": self.moved.d2h, "h2d": self.moved.h2d}


class Tierd(Mode):
    """One tier.torch.offload_activations for the whole mode, entered every step."""

    def __init__(self, model, args, session, **budget):
        import tier.torch as tt
        self.head_region = tt.no_offload
        self.session = session
        self.budget_args = budget
        if getattr(args, "activation_batch", None):
            # Saved storages per batch (one ticket each); 1: every storage its own job.
            tt.ActivationOffloader.BATCH_TENSORS = args.activation_batch
        self.off = tt.offload_activations(min_bytes=args.min_bytes, prefetch=args.prefetch,
                                          client=session.client, module=model,
                                          max_inflight_bytes=args.max_inflight_mib * MiB,
                                          **budget)

    def context(self):
        return self.off

    def counters(self):
        # D2H and H2D as tierd moved them: the offloader's own count (offloader_d2h) also
        # includes tensors it could not hand to tierd and kept on the GPU.
        out = {"d2h": self.off.stats.offloaded_bytes, "h2d": None}
        out.update(self.session.moved() or {})
        out["offloader_d2h"] = self.off.stats.offloaded_bytes
        out["released"] = self.off.stats.released_bytes
        if self.off.budget is not None:
            out["plans"] = self.off.budget.plans
        return out

    def details(self):
        out = {"tier_stats": self.off.stats.as_dict(), "budget_args": self.budget_args}
        if self.off.budget is not None:
            out["budget"] = self.off.budget.as_dict()
            out["plan"] = self.off.plan.as_dict() if self.off.plan is not None else None
        return out


class SkipMode(Exception):
    pass


def half_target(results):
    """tierd-half's target_bytes: half of none's activation peak (CPU: of offload-all's D2H)."""
    peak = results["none"].get("act_peak_mib")
    if peak is None and "d2h_mib" in results.get("tierd", {}):
        peak = results["tierd"]["d2h_mib"]
    return None if peak is None else int(peak * MiB / 2)


def make_mode(name, model, args, session, results):
    if name == "none":
        return Mode()
    if name == "recompute":
        return Recompute()
    if name == "inprocess":
        return InProcess(model, args)
    if name == "tierd":
        return Tierd(model, args, session)
    if name == "tierd-budget":
        return Tierd(model, args, session, max_overhead=MAX_OVERHEAD)
    if name == "tierd-half":
        target = half_target(results)
        if target is None:
            raise SkipMode("no activation peak to halve (CPU without mode tierd)")
        return Tierd(model, args, session, target_bytes=target)
    raise ValueError(name)


# ---- one step, one mode -----------------------------------------------------------------------

class Clock:
    """Marks within a step: CUDA events on the GPU's timeline, else the host clock."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.marks = []

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals(self):
        """Seconds between consecutive marks (CUDA: after the step synchronized)."""
        pairs = zip(self.marks, self.marks[1:])
        if self.cuda:
            return [a.elapsed_time(b) / 1e3 for a, b in pairs]
        return [b - a for a, b in pairs]


def train_step(model, opt, batch, mode, seed, args):
    cuda = args.device == "cuda"
    idx, target = batch
    torch.manual_seed(seed)  # dropout: the same masks in every mode
    opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    clock = Clock(cuda)
    t0 = time.perf_counter()
    clock.mark()
    with mode.context():
        logits = model(idx)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), target.view(-1))
    clock.mark()
    loss.backward()
    clock.mark()
    opt.step()
    if cuda:
        torch.cuda.synchronize()
    step_s = time.perf_counter() - t0
    fwd_s, bwd_s = clock.intervals()
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return {"loss": loss.item(), "step_s": step_s, "fwd_s": fwd_s, "bwd_s": bwd_s,
            "act_peak": None if peak is None else peak - base, "peak": peak}


def median_of(samples, key, scale):
    values = [s[key] for s in samples]
    return None if None in values else statistics.median(values) * scale


def run_mode(name, mode, model, opt, batch, args):
    mode.install(model)
    samples = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            before = mode.counters()
        samples.append(train_step(model, opt, batch, mode, 1000 + step, args))
    after = mode.counters()
    measured = samples[args.warmup:]

    def per_step_mib(key):
        if before.get(key) is None or after.get(key) is None:
            return None
        return (after[key] - before[key]) / args.steps / MiB

    row = {"mode": name,
           "step_ms": median_of(measured, "step_s", 1e3),
           "step_ms_min": min(s["step_s"] for s in measured) * 1e3,
           "fwd_ms": median_of(measured, "fwd_s", 1e3),
           "bwd_ms": median_of(measured, "bwd_s", 1e3),
           "act_peak_mib": None, "peak_allocated_mib": None,
           "d2h_mib": per_step_mib("d2h"), "h2d_mib": per_step_mib("h2d"),
           "offloader_d2h_mib": per_step_mib("offloader_d2h"),
           "released_mib": per_step_mib("released"),
           "losses": [s["loss"] for s in samples]}
    if "plans" in after:
        row["replans_while_measured"] = after["plans"] - before["plans"]
    if args.device == "cuda":
        row["act_peak_mib"] = max(s["act_peak"] for s in measured) / MiB
        row["peak_allocated_mib"] = max(s["peak"] for s in measured) / MiB
    row.update(mode.details())
    return row


def try_mode(name, model, batch, args, session, results):
    """run_mode from the initial weights; a row saying so if the GPU ran out of memory."""
    mode = make_mode(name, model, args, session, results)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    try:
        return run_mode(name, mode, model, opt, batch, args)
    except RuntimeError as e:
        if "out of memory" not in str(e):
            raise
    torch.cuda.empty_cache()  # the failed step's tensors are gone with the exception
    return {"mode": name, "error": "out of memory"}


# ---- the child: one model, one allocator, all modes --------------------------------------------

def make_model(args):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq, args.dropout)
    return model.to(args.device, dtype)


def make_batch(args):
    g = torch.Generator().manual_seed(1)
    shape = (args.batch, args.seq)
    return (torch.randint(0, args.vocab, shape, generator=g).to(args.device),
            torch.randint(0, args.vocab, shape, generator=g).to(args.device))


def measure_link(nbytes, repeats=3):
    """Pinned host <-> GPU copy bandwidth (bytes/s) each way: best of `repeats`, CUDA events."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def best(copy):
        seconds = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            copy()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        return nbytes / min(seconds)

    return {"d2h": best(lambda: host.copy_(dev, non_blocking=True)),
            "h2d": best(lambda: dev.copy_(host, non_blocking=True)),
            "source": "pinned copy of %d MiB" % (nbytes // MiB)}


def run_child(config):
    args = argparse.Namespace(**config)
    tag = "[%s/%s]" % (args.model, args.allocator)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available (use --device cpu for a smoke run)")
    session = TierdSession(args.socket, args.build_dir) if set(args.modes) & set(TIERD_MODES) \
        else None
    log("%s building the model (%d blocks, d_model %d, seq %d, batch %d)" % (
        tag, args.layers, args.d_model, args.seq, args.batch))
    model = make_model(args)
    initial = {k: v.to("cpu", copy=True) for k, v in model.state_dict().items()}
    batch = make_batch(args)
    out = {"model": args.model, "allocator": args.allocator,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
           "device": torch.cuda.get_device_name() if cuda else "cpu",
           "torch": torch.__version__, "config": config,
           "tierd_engine": session.engine if session else None,
           "link": measure_link(args.link_mib * MiB) if cuda else None,
           "results": [], "notes": []}
    results = {}
    try:
        for name in args.modes:
            # Every mode starts from the same weights. The allocator's cache is kept: the budget
            # calibrates in its first step, which should not pay for growing the cache.
            model.load_state_dict(initial)
            log("%s %s ..." % (tag, name))
            try:
                row = try_mode(name, model, batch, args, session, results)
            except SkipMode as e:
                out["notes"].append("%s skipped: %s" % (name, e))
                continue
            results[name] = row
            out["results"].append(row)
            log("%s %s: %s" % (tag, name, progress_line(row)))
    finally:
        if session is not None:
            session.close()
    with open(args.out, "w") as f:
        json.dump(out, f)


def progress_line(row):
    if "error" in row:
        return row["error"]
    return "step %.1f ms (fwd %.1f, bwd %.1f), act peak %s MiB, D2H %s MiB/step" % (
        row["step_ms"], row["fwd_ms"], row["bwd_ms"], fmt(row["act_peak_mib"], "%.0f"),
        fmt(row["d2h_mib"], "%.0f"))


# ---- analysis and report (parent) -------------------------------------------------------------

def fmt(value, spec="%.1f"):
    return "-" if value is None else spec % value


def mib(nbytes):
    return None if nbytes is None else nbytes / MiB


def compare_to_none(results):
    base = results.get("none")
    for r in results.values():
        ok = base is not None and "error" not in r and "error" not in base
        r["vs_none"] = r["step_ms"] / base["step_ms"] if ok else None
        r["losses_equal_to_none"] = r["losses"] == base["losses"] if ok else None


def offload_bound(results, link):
    """What the link can hide in a step (bytes), from mode none's forward and backward times."""
    none, budget, everything = (results.get(m) for m in ("none", "tierd-budget", "tierd"))
    if none is None or budget is None or "error" in none or "error" in budget:
        return None
    if link is None:  # CPU: the offloader's own probe of the link
        link = {"d2h": budget["budget"]["link_d2h"], "h2d": budget["budget"]["link_h2d"],
                "source": "tierd-budget's link probe"}
    bound = {"link": link,
             "forward_x_d2h": none["fwd_ms"] / 1e3 * link["d2h"],
             "backward_x_h2d": none["bwd_ms"] / 1e3 * link["h2d"],
             "offload_all": (everything["offloader_d2h_mib"] * MiB  # what there is to move
                             if everything and "error" not in everything else None)}
    limits = [v for k, v in bound.items() if k != "link" and v is not None]
    bound["bytes"] = min(limits)
    offloaded = budget["d2h_mib"] * MiB
    bound["budget_offloaded"] = offloaded
    bound["fraction"] = offloaded / bound["bytes"] if bound["bytes"] > 0 else None
    return bound


def moved_as_chosen(row):
    """Whether tierd moved (nearly) all the offloader chose to offload."""
    chosen, moved = row.get("offloader_d2h_mib"), row.get("d2h_mib")
    return chosen is None or (moved is not None and moved >= SAME_WORK * chosen)


def target_checks(model_name, results, bound):
    """The issue's targets: [{"target", "value", "pass"}]."""
    def ok(*modes):
        return all(m in results and "error" not in results[m] for m in ("none",) + modes)

    checks = []

    def check(target, value, passed):
        checks.append({"target": target, "value": value, "pass": passed})

    if ok("tierd-budget"):
        ratio = results["tierd-budget"]["vs_none"]
        check("tierd-budget step <= %.2fx none" % (1 + MAX_OVERHEAD), "%.3fx" % ratio,
              ratio <= 1 + MAX_OVERHEAD)
    if bound is not None and bound["fraction"] is not None:
        check("tierd-budget offloads >= %d%% of the bound" % (100 * BOUND_FRACTION),
              "%.0f%% (%.0f of %.0f MiB)" % (100 * bound["fraction"],
                                            mib(bound["budget_offloaded"]), mib(bound["bytes"])),
              bound["fraction"] >= BOUND_FRACTION)
    if ok("tierd-budget") and results["none"]["act_peak_mib"] and \
            results["tierd-budget"]["d2h_mib"]:
        # Issue 24, defect 2: what the budget offloads must come off the measured peak (every
        # offloaded tensor is alive at the end of forward without offload).
        b = results["tierd-budget"]
        off_peak = results["none"]["act_peak_mib"] - b["act_peak_mib"]
        check("tierd-budget takes >= 90% of what it offloads off the activation peak",
              "%.0f of %.0f MiB" % (off_peak, b["d2h_mib"]), off_peak >= 0.9 * b["d2h_mib"])
    if ok("tierd-half") and results["none"]["act_peak_mib"]:
        ratio = results["tierd-half"]["act_peak_mib"] / results["none"]["act_peak_mib"]
        check("tierd-half activation peak <= half of none's", "%.0f%%" % (100 * ratio),
              ratio <= 0.5)
    if ok("tierd-half", "recompute"):
        half, rec = results["tierd-half"], results["recompute"]
        check("tierd-half faster than recompute, tierd moving what it chose" +
              ("" if model_name == "b" else " (the target is for model b)"),
              "%.1f vs %.1f ms, moved %s of %s MiB/step" % (
                  half["step_ms"], rec["step_ms"], fmt(half["d2h_mib"], "%.0f"),
                  fmt(half["offloader_d2h_mib"], "%.0f")),
              half["step_ms"] < rec["step_ms"] and moved_as_chosen(half))
    if ok("tierd", "inprocess"):
        t, i = results["tierd"], results["inprocess"]
        # Equal work: tierd counts each storage once, inprocess each saved tensor (a few %).
        same_work = t["d2h_mib"] is not None and t["d2h_mib"] >= SAME_WORK * i["d2h_mib"]
        check("tierd offload-all no slower than inprocess, moving as much",
              "%.1f vs %.1f ms, %s vs %.0f MiB/step" % (
                  t["step_ms"], i["step_ms"], fmt(t["d2h_mib"], "%.0f"), i["d2h_mib"]),
              t["step_ms"] <= i["step_ms"] and same_work)
    unequal = [m for m, r in results.items() if r.get("losses_equal_to_none") is False]
    check("losses identical to none", "not: " + ", ".join(unequal) if unequal else "all",
          not unequal)
    return checks


def print_table(rows):
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        log("  ".join(cell.rjust(w) if i else cell.ljust(w)
                      for i, (cell, w) in enumerate(zip(row, widths))))


def yes_no(value):
    return "-" if value is None else ("yes" if value else "no")


def report(run):
    cfg = run["config"]
    log("\n== model %s: %d blocks, d_model %d, seq %d, batch %d, %d heads, %s; allocator %s; "
        "%s, torch %s, tierd engine %s" % (
            run["model"], cfg["layers"], cfg["d_model"], cfg["seq"], cfg["batch"], cfg["heads"],
            "bf16" if cfg["device"] == "cuda" else "fp32", run["allocator"], run["device"],
            run["torch"], run["tierd_engine"] or "-"))
    rows = [("mode", "step ms", "vs none", "fwd ms", "bwd ms", "act peak MiB", "D2H MiB",
             "H2D MiB", "losses = none")]
    for r in run["results"]:
        if "error" in r:
            rows.append((r["mode"], r["error"]) + ("",) * (len(rows[0]) - 2))
            continue
        rows.append((r["mode"], fmt(r["step_ms"]), fmt(r["vs_none"], "%.3f"), fmt(r["fwd_ms"]),
                     fmt(r["bwd_ms"]), fmt(r["act_peak_mib"], "%.0f"), fmt(r["d2h_mib"], "%.0f"),
                     fmt(r["h2d_mib"], "%.0f"), yes_no(r["losses_equal_to_none"])))
    print_table(rows)
    report_budgets(run)
    for c in run["checks"]:
        log("  [%s] %s: %s" % ("pass" if c["pass"] else "FAIL", c["target"], c["value"]))
    for note in run["notes"]:
        log("  note:", note)


def report_budgets(run):
    bound = run["bound"]
    if bound is not None:
        link = bound["link"]
        log("  bound: forward x D2H %.0f MiB (%.2f GB/s), backward x H2D %.0f MiB (%.2f GB/s), "
            "offload-all %s MiB -> %.0f MiB (link: %s)" % (
                mib(bound["forward_x_d2h"]), link["d2h"] / 1e9, mib(bound["backward_x_h2d"]),
                link["h2d"] / 1e9, fmt(mib(bound["offload_all"]), "%.0f"), mib(bound["bytes"]),
                link["source"]))
    for r in run["results"]:
        if r.get("budget"):
            b, plan = r["budget"], r.get("plan") or {}
            log("  %s policy: %d of %d sites, planned %.0f MiB (kept %s MiB, target %s MiB), "
                "predicted overhead %.1f%%, measured %.1f%%, %d plan(s) (%d while measured), "
                "link %.2f/%.2f GB/s from %s; released in stream order %s MiB/step" % (
                    r["mode"], b["chosen_sites"], b["sites"], mib(b["planned_bytes"]),
                    fmt(mib(plan.get("kept_bytes")), "%.0f"),
                    fmt(mib(plan.get("target_bytes")), "%.0f"),
                    100 * b["predicted_overhead"], 100 * b["measured_overhead"], b["plans"],
                    r["replans_while_measured"], b["link_d2h"] / 1e9, b["link_h2d"] / 1e9,
                    b.get("link_source", "-"), fmt(r.get("released_mib"), "%.0f")))


def kept_on_gpu_notes(results):
    """Where tierd moved less than the offloader chose (expandable segments: tensors spanning
    two physical pages stay on the GPU)."""
    return ["%s: the offloader counted %.0f MiB/step as offloaded, tierd moved %.0f: the rest "
            "stayed on the GPU" % (r["mode"], r["offloader_d2h_mib"], r["d2h_mib"])
            for r in results.values() if "error" not in r and not moved_as_chosen(r)]


def analyze(run):
    results = {r["mode"]: r for r in run["results"]}
    run["notes"] += kept_on_gpu_notes(results)
    compare_to_none(results)
    run["bound"] = offload_bound(results, run["link"])
    run["checks"] = target_checks(run["model"], results, run["bound"])


# ---- the parent: children per (model, allocator), one tierd -------------------------------------

def child_config(args, model, allocator, out):
    shape = dict(PRESETS[model])
    for key in shape:
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    config = {k: v for k, v in vars(args).items() if k not in ("json", "allocators")}
    config.update(shape, model=model, allocator=allocator, out=out)
    return config


def run_child_process(config):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if ALLOC_CONF[config["allocator"]]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[config["allocator"]]
    cmd = [sys.executable, os.path.abspath(__file__), "--child-config", json.dumps(config)]
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0 or not os.path.exists(config["out"]):
        return None
    with open(config["out"]) as f:
        return json.load(f)


def parse_modes(args, notes):
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit("unknown modes: %s (known: %s)" % (", ".join(sorted(unknown)),
                                                             ", ".join(MODES)))
    if args.device == "cpu" and "inprocess" in modes:
        modes.remove("inprocess")
        notes.append("inprocess needs CUDA streams: skipped on cpu")
    # MODES' order: none first (the reference), tierd before tierd-half (CPU: its target).
    modes = ["none"] + [m for m in MODES if m in modes and m != "none"]
    if any(m.startswith("tierd-") for m in modes) and args.warmup < BUDGET_WARMUP:
        notes.append("warmup raised to %d: the budget calibrates, then plans" % BUDGET_WARMUP)
        args.warmup = BUDGET_WARMUP
    return modes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write all results here")
    p.add_argument("--model", default="both", choices=["a", "b", "both"])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--allocators", help="default,expandable (CUDA default); default (CPU)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    for name in ("layers", "d-model", "heads", "seq", "batch"):
        p.add_argument("--" + name, type=int, help="overrides the model preset")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5,
                   help="leaves the budget room to re-plan (it needs %d)" % BUDGET_WARMUP)
    p.add_argument("--min-bytes", type=int,
                   help="offload saved tensors of at least this many bytes (1 MiB; CPU 4 KiB)")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--activation-batch", type=int, default=0,
                   help="tierd: saved storages per batch (0: the package's default; 1: none)")
    p.add_argument("--max-fwd-stash", type=int, default=5, help="inprocess: GPU tensors kept")
    p.add_argument("--max-inflight-mib", type=int, default=512,
                   help="tierd: see offload_activations")
    p.add_argument("--link-mib", type=int, default=256, help="pinned copy size for the bound")
    p.add_argument("--socket", help="an already running tierd (else one is started)")
    p.add_argument("--compile", action="store_true",
                   help="also the rows 'compiled none' / 'compiled tierd' (bench/framework_rows.py)")
    p.add_argument("--fsdp", type=int, default=0, metavar="N",
                   help="also the rows 'fsdpN none' / 'fsdpN tierd': FSDP2 on N GPUs")
    p.add_argument("--build-dir", default=os.environ.get("TIER_BUILD_DIR",
                                                         os.path.join(REPO_ROOT, "build")))
    p.add_argument("--pool-bytes", help="tierd's host pool (24G; CPU 1G)")
    p.add_argument("--child-config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if args.allocators is None:
        args.allocators = "default,expandable" if cuda else "default"
    if args.min_bytes is None:
        args.min_bytes = 1 << 20 if cuda else 4096
    if args.pool_bytes is None:
        args.pool_bytes = "24G" if cuda else "1G"
    return args


def start_tierd(args, notes):
    """The tierd the children use: --socket, or a private one. Returns (socket, TierdProcess)."""
    if args.socket:
        return args.socket, None
    daemon = TierdProcess(args.build_dir, args.pool_bytes)
    client = daemon.connect("torch_offload_bench")  # waits until it serves
    notes.append("tierd engine: %s" % client.engine)
    if args.device == "cuda" and client.engine != "cuda":
        notes.append("WARNING: tierd has no GPU engine; tierd modes stage through host memory")
    client.close()
    return daemon.socket, daemon


def main():
    if "--child-config" in sys.argv:
        return run_child(json.loads(parse_args().child_config))
    args = parse_args()
    notes = []
    args.modes = parse_modes(args, notes)
    allocators = [a for a in args.allocators.split(",") if a]
    if set(allocators) - set(ALLOC_CONF):
        raise SystemExit("--allocators takes %s" % ",".join(ALLOC_CONF))
    models = ["a", "b"] if args.model == "both" else [args.model]
    os.environ.setdefault("TIER_BUILD_DIR", args.build_dir)
    daemon = None
    if set(args.modes) & set(TIERD_MODES) or args.compile or args.fsdp:
        args.socket, daemon = start_tierd(args, notes)
    runs = []
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="torch_offload_bench-") as tmp:
            for model in models:
                for allocator in allocators:
                    out = os.path.join(tmp, "%s-%s.json" % (model, allocator))
                    run = run_child_process(child_config(args, model, allocator, out))
                    if run is None:
                        log("[%s/%s] FAILED (see above)" % (model, allocator))
                        notes.append("model %s, allocator %s: the child failed" % (model,
                                                                                  allocator))
                        continue
                    analyze(run)
                    report(run)
                    runs.append(run)
        if args.compile or args.fsdp:
            import framework_rows  # bench/framework_rows.py
            for model in models:
                config = argparse.Namespace(**child_config(args, model, "default", None))
                log("\n[%s] framework rows" % model)
                rows = framework_rows.run("activations", "torch_offload_bench", config,
                                          args.socket, args.compile, args.fsdp)
                runs.append({"model": model, "framework_rows": rows})
    finally:
        if daemon is not None:
            daemon.stop()
    log("\ntotal %.0f s" % (time.monotonic() - started))
    for note in notes:
        log("note:", note)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "torch_offload_bench", "python": sys.version.split()[0],
                       "config": vars(args), "runs": runs, "notes": notes}, f, indent=2)
        log("wrote", args.json)
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
