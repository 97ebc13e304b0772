"""Host cost of the saved-tensor hooks per offloaded storage (issue 24; bench/hook_overhead_bench.py
measures it in microseconds).

Timing alone cannot tell the old path from a faster one on a loaded 2-core CI machine, so the
strict bound is on work, which load does not change: the Python calls (functions and builtins,
as sys.setprofile sees them) a step makes per offloaded storage beyond a step whose plan keeps
everything. A loose bound on time, as a ratio to the same step without hooks measured in the same
test (the least of several steps, taken in turn with the others), catches a path gone badly
slow. CTest runs this file alone (RUN_SERIAL): a neighbour's load is what failed it in CI."""

import gc
import sys
import time

import torch

import tier.torch as tt

OPS = 64
NBYTES = 4096
# Calls per offloaded storage (pack, batch, stage, reload, unpack): 201 before issue 24's
# trimming, 125-127 after its first pass, 115 after its second (CPU storages staged without a
# flat tensor, no flush at CPU release points), 85 after its third (no closure or _finish per
# job, handles made where staged, unpack inline; torch 2.13, CPU, tierd's host engine). 88 since
# planned steps index their saves (_save_shape.py): the same offload path, measured against a
# kept step that makes 2.8 calls a save fewer, and one call more per offloaded save (the index).
# The same code reads 88.4-90.7 from run to run (how many completions each reap finds depends on
# tierd's timing: the bound of 90 failed a CI run of code that read 88.4 and 89.5 here): the
# bound sits above that spread, still below any pass's worth of calls.
MAX_CALLS_PER_OFFLOADED_STORAGE = 93
# Beyond identity hooks, per saved tensor a planned step keeps as it is: 3.6 when each asked
# whether it was a candidate, 0.8 since planned steps index a table by save (_save_shape.py).
MAX_CALLS_PER_KEPT_SAVED_TENSOR = 1.5
# Extra host time per offloaded storage, in units of one op of the step without hooks (sin
# forward and backward, about 6 us here): about 4.5 now, 6.5 before. Loose: a loaded machine.
MAX_TIME_PER_OFFLOADED_STORAGE = 15.0


class _Chain:
    def __init__(self):
        self.x = torch.randn(NBYTES // 4, requires_grad=True)

    def step(self, ctx):
        with ctx:
            y = self.x
            for _ in range(OPS):
                y = torch.sin(y)
            y.sum().backward()
        self.x.grad = None


def _contexts(client):
    kept = tt.offload_activations(min_bytes=0, client=client, max_overhead=0.05,
                                  link=(1e3, 1e3))
    planned = tt.offload_activations(min_bytes=0, client=client, max_overhead=10.0,
                                     link=(1e15, 1e15))
    return kept, planned


def _calls(chain, ctx):
    """Python calls one step makes, and the storages it offloaded."""
    count = [0]

    def profile(frame, event, arg):
        if event == "call" or event == "c_call":
            count[0] += 1
    stats = getattr(ctx, "stats", None)
    before = stats.offloaded_storages if stats is not None else 0
    # A garbage collection inside the step would count the finalizers of whatever earlier tests
    # left behind (torch.compile leaves plenty): collected before, none during.
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        chain.step(ctx)
    finally:
        sys.setprofile(None)
        gc.enable()
    return count[0], (stats.offloaded_storages - before) if stats is not None else 0


def _host_times(chain, none, kept, planned, rounds=15):
    """Host seconds of one step without hooks, with a plan that keeps everything and with one that
    offloads every saved tensor: the least of `rounds` steps each, taken in turn so that a burst of
    load from a neighbouring test (ctest -j2 on two cores) falls on all three alike. The least, not
    the median: load only ever adds time. A planned step that offloaded less than the plan (the
    budget calibrating again on a loaded machine) does other work and is not counted."""
    best = {"none": float("inf"), "kept": float("inf"), "planned": float("inf")}
    stats = planned.stats
    for _ in range(rounds):
        for name, ctx in (("none", none), ("kept", kept), ("planned", planned)):
            before = stats.offloaded_storages
            t0 = time.perf_counter()
            chain.step(ctx)
            took = time.perf_counter() - t0
            if name == "planned" and stats.offloaded_storages - before < OPS - 2:
                continue
            best[name] = min(best[name], took)
    return best["none"], best["kept"], best["planned"]


def test_calls_and_time_per_offloaded_storage(client):
    import contextlib
    chain = _Chain()
    kept, planned = _contexts(client)
    for _ in range(4):  # calibration, then planned steps
        chain.step(kept)
        chain.step(planned)
    kept_calls = min(_calls(chain, kept)[0] for _ in range(3))
    assert kept.budget is not None and kept.stats.offloaded_storages == 0
    # Per step, the least: a step the budget calibrates again (it may, on a loaded machine)
    # offloads nothing and does other work, so only steps whose plan offloaded every saved
    # tensor count.
    per_storage = []
    for _ in range(6):
        calls, offloaded = _calls(chain, planned)
        if offloaded >= OPS - 2:
            per_storage.append((calls - kept_calls) / offloaded)
    assert per_storage, planned.stats  # the plan offloads (nearly) every saved tensor
    per_storage = min(per_storage)
    assert per_storage <= MAX_CALLS_PER_OFFLOADED_STORAGE, (
        "%.0f Python calls per offloaded storage (at most %d)" % (
            per_storage, MAX_CALLS_PER_OFFLOADED_STORAGE))

    none = contextlib.nullcontext()
    chain.step(none)
    # Up to three tries: a machine busy through a whole try (two cores, other tests beside this
    # one) says nothing about the path; a slow path fails all three.
    for _ in range(3):
        t_none, t_kept, t_planned = _host_times(chain, none, kept, planned)
        per_op = t_none / OPS
        extra = (t_planned - t_kept) / (OPS - 1) / per_op
        if extra <= MAX_TIME_PER_OFFLOADED_STORAGE:
            break
    assert extra <= MAX_TIME_PER_OFFLOADED_STORAGE, (
        "an offloaded storage costs %.1f ops' time (%.1f us; at most %.0f ops)" % (
            extra, extra * per_op * 1e6, MAX_TIME_PER_OFFLOADED_STORAGE))


def test_calls_per_kept_saved_tensor(client):
    """A planned step's saves that the plan keeps as they are: the table built from the
    calibration's shape returns them (tier/torch/_save_shape.py) with no question asked of the
    tensor. Calls beyond identity hooks' per saved tensor: 3.6 when every save asked whether it
    was a candidate, 0.8 with the table (unpack's type() of what it gets)."""
    import contextlib
    chain = _Chain()
    kept, _ = _contexts(client)
    for _ in range(4):  # calibration, the timed step, then planned steps
        chain.step(kept)
    identity = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    base = min(_calls(chain, identity)[0] for _ in range(3))
    calls = min(_calls(chain, kept)[0] for _ in range(3))
    per_saved = (calls - base) / OPS
    assert per_saved <= MAX_CALLS_PER_KEPT_SAVED_TENSOR, (
        "%.2f Python calls per kept saved tensor beyond identity hooks (at most %.1f)" % (
            per_saved, MAX_CALLS_PER_KEPT_SAVED_TENSOR))
    assert kept.stats.saved == kept.stats.kept > 0 and kept.stats.offloaded_storages == 0
