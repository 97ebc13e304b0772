#!/usr/bin/env python3
"""Host time the saved-tensor hooks add, per saved tensor: kept, offloaded, or as a plan chose.

    python3 bench/hook_overhead_bench.py --device cpu            # tierd's host engine, 4 KiB tensors
    python3 bench/hook_overhead_bench.py --device cuda --json hooks.json

A chain of N elementwise ops (``x = sin(x)``: each saves its input for backward, a new storage of
--bytes each) runs forward and backward under each mode; the host time a step takes (from the
first op to the last call of backward returning; CUDA: before the closing synchronize, so the
GPU's own time is not counted while the host runs ahead) minus that of mode none in the same
round (the modes take turns, a step each), median over --steps rounds, divided by N, is the
hooks' cost per saved tensor. Pack and unpack both count. Modes:

  none        no hooks.
  identity    saved_tensors_hooks(identity, identity): the floor any hook pays.
  kept        offload_activations(max_overhead=0.05) on a link too slow to hide anything: every
              saved tensor is a candidate and the plan keeps it (the usual budget step).
  planned     offload_activations(max_overhead=10) on a fast link: the plan offloads every one.
  half        offload_activations(target_bytes=half): the plan offloads about half.
  offload-all offload_activations(min_bytes=0): every saved tensor offloaded, no plan.
  inprocess   (CUDA) the in-process offloader of bench/torch_offload_bench.py (torchtune's
              design: pinned copies on a side stream, inside this process): the baseline of
              what offloading a saved tensor costs the host without tierd.

Target (issue 24): <= 5 us per saved tensor for kept, planned and half. offload-all is reported.
The script starts its own tierd from --build-dir (or uses --socket).
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)

# --tier-python DIR: import tier from DIR instead of this checkout's python/ (before/after runs of
# the hook path in one call: DIR holds another revision's python/ tree). Read before tier loads.
_TIER_PYTHON = os.path.join(REPO_ROOT, "python")
for _i, _arg in enumerate(sys.argv):
    if _arg == "--tier-python" and _i + 1 < len(sys.argv):
        _TIER_PYTHON = os.path.abspath(sys.argv[_i + 1])
    elif _arg.startswith("--tier-python="):
        _TIER_PYTHON = os.path.abspath(_arg.split("=", 1)[1])
sys.path.insert(0, _TIER_PYTHON)

import torch  # noqa: E402

from _tierd import TierdProcess  # noqa: E402

MODES = ("none", "identity", "kept", "planned", "half", "offload-all", "inprocess")
TARGET_US = 5.0
TARGET_MODES = ("kept", "planned", "half")


def _identity(x):
    return x


class Chain:
    """N sin() ops: each saves its input (a fresh storage) for backward."""

    def __init__(self, n, nbytes, device):
        self.n = n
        self.x = torch.randn(max(1, nbytes // 4), device=device, requires_grad=True)

    def step(self, ctx, cuda):
        t0 = time.perf_counter()
        with ctx:
            y = self.x
            for _ in range(self.n):
                y = torch.sin(y)
            loss = y.sum()
            loss.backward()
        host = time.perf_counter() - t0
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        self.x.grad = None
        return host, wall


def make_context(mode, client, total_bytes):
    import contextlib
    import tier.torch as tt
    if mode == "none":
        return contextlib.nullcontext()
    if mode == "identity":
        return torch.autograd.graph.saved_tensors_hooks(_identity, _identity)
    if mode == "kept":
        return tt.offload_activations(min_bytes=0, client=client, max_overhead=0.05,
                                      link=(1e3, 1e3))
    if mode == "planned":
        return tt.offload_activations(min_bytes=0, client=client, max_overhead=10.0,
                                      link=(1e15, 1e15))
    if mode == "half":
        return tt.offload_activations(min_bytes=0, client=client, target_bytes=total_bytes // 2,
                                      link=(1e15, 1e15))
    if mode == "offload-all":
        return tt.offload_activations(min_bytes=0, client=client)
    if mode == "inprocess":
        return InProcess()
    raise ValueError(mode)


class _Count:
    offloaded_storages = 0
    saved = None


class InProcess:
    """torch_offload_bench's in-process offloader as a reusable context, its offloads counted
    as ``stats.offloaded_storages`` (every tensor it moved)."""

    def __init__(self):
        from torch_offload_bench import InProcessOffloader, Moved
        self._make = lambda: InProcessOffloader(0, 2, 4, set(), Moved())
        self.stats = _Count()
        self._off = None

    def __enter__(self):
        self._off = self._make()
        self._off.__enter__()
        return self

    def __exit__(self, *exc):
        off, self._off = self._off, None
        self.stats.offloaded_storages += off.next_id
        return off.__exit__(*exc)


# --sections: host time inside these functions (inclusive: a section contains the ones it calls),
# per offloaded storage, from a separate pass after the timed steps (the wrappers cost time).
SECTIONS = (
    ("pack", "tier.torch._activations", "ActivationOffloader", "_pack"),
    ("unpack", "tier.torch._activations", "ActivationOffloader", "_unpack"),
    ("  release points", "tier.torch._activations", "ActivationOffloader", "_release"),
    ("  batch flush", "tier.torch._save_batches", "SaveBatches", "flush"),
    ("    Client.offload_batch", "tier.client", "Client", "offload_batch"),
    ("    Client.stage_offload", "tier.client", "Client", "stage_offload"),
    ("    Client.submit_staged", "tier.client", "Client", "submit_staged"),
    ("  reloads started", "tier.torch._backward_reloads", "BackwardReloads", "start"),
    ("    Client.start_reloads", "tier.client", "Client", "start_reloads"),
    ("  reload taken", "tier.torch._backward_reloads", "BackwardReloads", "take"),  # (older)
    ("  staged reload results", "tier._reloads", "StagedReload", "result"),
    ("  release_sources", "tier.client", "Client", "release_sources"),
    ("  capture checks", "tier._cuda_graphs", "CaptureGuard", "keep"),
    ("  GPU offload batches", "tier._offloads", "Offloads", "_offload_batch_cuda"),
    ("  GPU reload batches", "tier._reloads", "Reloads", "_start_cuda"),
    ("  GPU reload results", "tier._reloads", "DeferredReload", "result"),
    ("  register_devices", "tier._session", "Session", "register_devices"),
    ("  reap", "tier._jobs", "JobTable", "reap"),
)


# Besides SECTIONS, every call into libtierclient is timed ("C <function>"): the library's own
# time, apart from the Python around it. (On a real Llama's planned step, the H100 showed
# tier_offload at 24 us a call inside 107 us of the Python that makes it, and tier_job_wait,
# the end of backward's reload check, blocking 2.7 ms a call: bench/plan_profile.py.)
LIBRARY_PREFIX = "C "


class Sections:
    """Wraps the SECTIONS functions, and the library's functions, with perf_counter_ns
    accumulators while active. ``ns`` and ``calls`` by section name."""

    def __init__(self):
        import importlib
        self.ns = {}
        self.calls = {}
        self._orig = []
        for name, module, cls, attr in SECTIONS:
            owner = getattr(importlib.import_module(module), cls, None)
            fn = owner.__dict__.get(attr) if owner is not None else None
            if fn is not None:  # (another revision may lack one)
                self._orig.append((name, owner, attr, fn))
        try:
            from tier import _lib
            lib = _lib.load()
            for attr in getattr(_lib, "_SIGNATURES", {}):
                # (The CDLL's attribute is replaced: every call site looks it up at call time.)
                self._orig.append((LIBRARY_PREFIX + attr, lib, attr, getattr(lib, attr)))
        except (ImportError, OSError):
            pass

    def names(self):
        """Section names in report order: SECTIONS, then the library calls made."""
        return [n for n, _, _, _ in SECTIONS] + sorted(
            n for n in self.calls if n.startswith(LIBRARY_PREFIX))

    def __enter__(self):
        ns, calls = self.ns, self.calls
        for name, owner, attr, fn in self._orig:
            def timed(*a, _fn=fn, _name=name, **k):
                t0 = time.perf_counter_ns()
                try:
                    return _fn(*a, **k)
                finally:
                    ns[_name] = ns.get(_name, 0) + time.perf_counter_ns() - t0
                    calls[_name] = calls.get(_name, 0) + 1
            setattr(owner, attr, timed)
        return self

    def __exit__(self, *exc):
        for _, owner, attr, fn in self._orig:
            setattr(owner, attr, fn)
        return False


def measure_sections(chain, ctx, cuda, steps):
    """us per offloaded storage in each section, over `steps` steps (None without offloads)."""
    stats = getattr(ctx, "stats", None)
    if stats is None:
        return None
    before = stats.offloaded_storages
    with Sections() as sec:
        for _ in range(steps):
            chain.step(ctx, cuda)
    offloaded = stats.offloaded_storages - before
    if offloaded == 0:
        return None
    return {name: {"us_per_offloaded_storage": sec.ns.get(name, 0) / 1e3 / offloaded,
                   "calls_per_offloaded_storage": sec.calls.get(name, 0) / offloaded}
            for name in sec.names()}


def run(args):
    cuda = args.device == "cuda"
    import tier
    daemon = None
    socket = args.socket
    if socket is None:
        daemon = TierdProcess(args.build_dir, args.pool_bytes)
        daemon.connect("hook_overhead_bench").close()
        socket = daemon.socket
    rows = []
    try:
        client = tier.Client(socket=socket, name="hook_overhead_bench")
        chain = Chain(args.ops, args.bytes, args.device)
        total = args.ops * args.bytes
        # The modes take turns, one step each per round: the host's speed drifts (the device's
        # hosts moved the step without hooks by 2.5 ms between runs of the same code), and a mode
        # measured minutes after `none` carried that drift as hook time.
        contexts = {mode: make_context(mode, client, total) for mode in args.modes}
        for _ in range(args.warmup):
            for mode in args.modes:
                chain.step(contexts[mode], cuda)
        offloaded_before = {mode: getattr(ctx, "stats", None) and ctx.stats.offloaded_storages
                            for mode, ctx in contexts.items()}
        samples = {mode: [] for mode in args.modes}
        for _ in range(args.steps):
            for mode in args.modes:
                samples[mode].append(chain.step(contexts[mode], cuda))
        client.synchronize()
        # tierd's own figure for the chain's GPU, (d2h, h2d)
        link = client.link_bandwidth(torch.cuda.current_device()) if cuda else None
        for mode in args.modes:
            ctx = contexts[mode]
            stats = getattr(ctx, "stats", None)
            row = {"mode": mode,
                   "host_ms": statistics.median(s[0] for s in samples[mode]) * 1e3,
                   "wall_ms": statistics.median(s[1] for s in samples[mode]) * 1e3,
                   # Per round, this mode's step less none's (the same round): drift cancels.
                   "paired_host_ms": statistics.median(
                       a[0] - b[0] for a, b in zip(samples[mode], samples["none"])) * 1e3}
            if stats is not None:
                # (Before the sections pass: its steps offload too.)
                row["offloaded_storages"] = stats.offloaded_storages
                row["offloaded_per_step"] = (stats.offloaded_storages -
                                             offloaded_before[mode]) / args.steps
                row["saved"] = stats.saved
            if args.sections:
                row["sections"] = measure_sections(chain, ctx, cuda, args.steps)
                client.synchronize()
            rows.append(row)
            print("%-12s host %8.2f ms  wall %8.2f ms  over none, paired %7.2f ms" % (
                mode, row["host_ms"], row["wall_ms"], row["paired_host_ms"]), flush=True)
        client.close()
    finally:
        if daemon is not None:
            daemon.stop()
    kept = next((r for r in rows if r["mode"] == "kept"), None)
    identity = next((r for r in rows if r["mode"] == "identity"), None)
    checks = []
    for r in rows:
        r["us_per_saved_tensor"] = r["paired_host_ms"] * 1e3 / args.ops
        per_step = r.get("offloaded_per_step", 0)
        if r["mode"] == "inprocess" and identity is not None and per_step > 0:
            # Its kept saves cost what identity hooks do: beyond identity.
            r["us_per_offloaded_storage"] = (r["paired_host_ms"] -
                                             identity["paired_host_ms"]) * 1e3 / per_step
        elif kept is not None and r is not kept and per_step > 0:
            # What an offloaded storage costs beyond a kept one (its offload, release, reload).
            r["us_per_offloaded_storage"] = (r["paired_host_ms"] -
                                             kept["paired_host_ms"]) * 1e3 / per_step
    print("\n%d saved tensors of %d bytes per step on %s (torch %s); host us per saved tensor "
          "(pack + unpack), median over %d rounds of the modes in turn of a step's time less none's in "
          "the same round:" % (args.ops, args.bytes, args.device,
                                                   torch.__version__, args.steps))
    for r in rows:
        if r["mode"] == "none":
            continue
        mark = ""
        if r["mode"] in TARGET_MODES:
            ok = r["us_per_saved_tensor"] <= TARGET_US
            checks.append({"mode": r["mode"], "us": r["us_per_saved_tensor"], "pass": ok})
            mark = "  [%s] <= %.0f us" % ("pass" if ok else "FAIL", TARGET_US)
        extra = ""
        if "us_per_offloaded_storage" in r:
            extra = "  (%.1f us more per offloaded storage than %s)" % (
                r["us_per_offloaded_storage"], "identity" if r["mode"] == "inprocess" else "kept")
        print("  %-12s %7.2f us%s%s" % (r["mode"], r["us_per_saved_tensor"], mark, extra))
    link_us = None
    if link:
        # The copies' own time per offloaded storage, both ways, at the rate tierd measured: a
        # step whose copies take longer than its host work waits for them (the reload check at
        # the end of backward), so an offloaded storage cannot cost less than this. Below it,
        # the figures above are the link's, not the hooks'.
        link_us = (args.bytes / link[0] + args.bytes / link[1]) * 1e6
        print("  link: d2h %.1f GB/s, h2d %.1f GB/s (tierd's figure): %.1f us per offloaded "
              "storage of %d bytes, both ways" % (link[0] / 1e9, link[1] / 1e9, link_us,
                                                   args.bytes))
    print("  (tier from %s)" % _TIER_PYTHON)
    for r in rows:
        if r.get("sections"):
            print("\nsections of %s (inclusive), per offloaded storage, a separate pass with "
                  "timers:" % r["mode"])
            for name, v in r["sections"].items():
                print("  %-28s %7.2f us  %5.2f calls" % (name, v["us_per_offloaded_storage"],
                                                         v["calls_per_offloaded_storage"]))
    out = {"benchmark": "hook_overhead_bench", "device": args.device,
           "tier_python": _TIER_PYTHON,
           "device_name": torch.cuda.get_device_name() if cuda else "cpu",
           "torch": torch.__version__, "ops": args.ops, "bytes": args.bytes, "rows": rows,
           "link_us_per_offloaded_storage": link_us,
           "checks": checks}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print("wrote", args.json)
    return 0 if all(c["pass"] for c in checks) or not args.strict else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--ops", type=int, default=256, help="saved tensors per step")
    p.add_argument("--bytes", type=int, help="bytes per saved tensor (CPU 4 KiB, CUDA 1 MiB)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--modes", help="comma-separated (default: all; inprocess on CUDA only)")
    p.add_argument("--socket")
    p.add_argument("--build-dir", default=os.environ.get("TIER_BUILD_DIR",
                                                         os.path.join(REPO_ROOT, "build")))
    p.add_argument("--pool-bytes", default="2G")
    p.add_argument("--json")
    p.add_argument("--sections", action="store_true",
                   help="also time sections of the hook path (a separate pass per mode)")
    p.add_argument("--tier-python", help="import tier from this python/ tree (default: the "
                   "checkout's)")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    if args.bytes is None:
        args.bytes = 1 << 20 if args.device == "cuda" else 4096
    if args.modes is None:
        args.modes = ",".join(m for m in MODES if m != "inprocess" or args.device == "cuda")
    args.modes = ["none"] + [m for m in args.modes.split(",") if m and m != "none"]
    unknown = set(args.modes) - set(MODES)
    if unknown:
        raise SystemExit("unknown modes: %s" % ", ".join(sorted(unknown)))
    if "inprocess" in args.modes and args.device != "cuda":
        raise SystemExit("mode inprocess is CUDA's (--device cuda)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available (--device cpu)")
    os.environ.setdefault("TIER_BUILD_DIR", args.build_dir)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
