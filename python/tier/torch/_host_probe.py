"""The host's cost per offloaded storage, clocked on one planned step (HOST_PROBE_STEP of the first
plan that offloads): what each offloading block's forward took the host beyond its calibrated,
hook-free time, over the storages it offloaded (the median block's). The joint planner plans
again with it (tier/torch/_activation_planner.host_extra_s).

The same step also tells where else a block's time went, against the same calibration: its host
backward, and its forward and backward on the device's timeline (CUDA events, as calibration
clocks them). An offload's price that shows on the GPU and not on the host is a stall (a stream
waiting for a copy, copies slowing the model's kernels), not host work."""

import functools
import statistics
import time

from . import _activation_planner as ap
from . import _offload_budget as ob

# The planned step (1: the first) that is clocked: not the first, which pays once for
# registering the allocator's memory with tierd.
HOST_PROBE_STEP = 2


class HostProbe:
    """Per block, when its forward began and ended on the host, on the one step clocked.
    ``blocks`` (after cost_s): per block, (mode, offloads, host seconds beyond calibration or
    None, {offloader call: seconds} of the calls clocked through :meth:`timing`, {"host_bwd",
    "gpu_fwd", "gpu_bwd": seconds beyond calibration or None}): what the cost came from (a block
    with no offload shows what the hooks and releases alone cost there)."""

    __slots__ = ("_marks", "_sections", "_current", "_clock", "_back", "blocks")

    def __init__(self, blocks):
        self._marks = [[None, None] for _ in range(blocks)]
        self._sections = [{} for _ in range(blocks)]  # per block: offloader call -> seconds
        self._current = 0
        self._clock = ob.Clock()  # the blocks' boundaries on the device's timeline
        self._back = {}           # ("bs" | "be", block) -> host seconds
        self.blocks = []

    def timing(self, offloader):
        """A view of `offloader` whose calls (releases, a block's hooks opening and closing, the
        barrier) are clocked, each for the block in progress: where an offloading block's host
        time goes."""
        return _Timed(offloader, self)

    def spent(self, name, seconds):
        sections = self._sections[self._current]
        sections[name] = sections.get(name, 0.0) + seconds

    def begins(self, b, x=None, device=None):
        """Block b's forward begins; `x`, its input, is stamped when its gradient arrives (the
        block's backward ends). `device`: the step's (None: the host's clock only)."""
        self._current = b
        self._marks[b][0] = time.perf_counter()
        if device is not None:
            self._clock.stamp(("fs", b), device)
            if x is not None:
                x.register_hook(functools.partial(_grad_arrived, self, ("be", b), device))

    def ends(self, b, y=None, device=None):
        """Block b's forward ends; `y`, its output, is stamped when its gradient arrives (the
        block's backward begins)."""
        self._marks[b][1] = time.perf_counter()
        if device is not None:
            self._clock.stamp(("fe", b), device)
            if y is not None:
                y.register_hook(functools.partial(_grad_arrived, self, ("bs", b), device))

    def _timeline(self, b, calibrated, times):
        """Block b's host backward and its device forward and backward, each beyond its
        calibrated time (None where a boundary was not reached, or not calibrated)."""
        def beyond(t, start, end, base):
            if base is None or (start, b) not in t or (end, b) not in t:
                return None
            return t[(end, b)] - t[(start, b)] - base
        gpu_f, gpu_b, _, host_b = calibrated if calibrated is not None else (None,) * 4
        return {"host_bwd": beyond(self._back, "bs", "be", host_b),
                "gpu_fwd": beyond(times, "fs", "fe", gpu_f),
                "gpu_bwd": beyond(times, "bs", "be", gpu_b)}

    def cost_s(self, evaluation, profile, signatures):
        """Seconds per offloaded storage under `evaluation` (the plan followed); None where no
        offloading block was clocked against a calibrated host time."""
        counts = ap.offloads_by_block(evaluation.layout, evaluation.chosen)
        per_offload = []
        self.blocks = []
        times = self._clock.resolve()  # (waits for the step's events: once a plan)
        for b, (sig, mode) in enumerate(zip(signatures, evaluation.modes)):
            calibrated = profile.host.get(sig, {}).get(mode)
            start, end = self._marks[b]
            sections = dict(self._sections[b])
            timeline = self._timeline(b, calibrated, times)
            if calibrated is None or start is None or end is None:
                self.blocks.append((mode, counts[b], None, sections, timeline))
                continue
            extra = (end - start) - calibrated[2]
            self.blocks.append((mode, counts[b], extra, sections, timeline))
            if counts[b]:
                per_offload.append(extra / counts[b])
        if not per_offload:
            return None
        # The median block's: one step is clocked, and one block held up by something else (the
        # last one's barrier, the allocator, another process on the host) must not set the cost
        # for all of them.
        return max(0.0, statistics.median(per_offload))


def _grad_arrived(probe, key, device, grad):
    probe._back[key] = time.perf_counter()
    probe._clock.stamp(key, device)
    return None


class _Timed:
    """An offloader whose calls are clocked into a HostProbe (see HostProbe.timing)."""

    __slots__ = ("_offloader", "_probe")

    def __init__(self, offloader, probe):
        self._offloader = offloader
        self._probe = probe

    def __getattr__(self, name):
        call = getattr(self._offloader, name)

        def clocked(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self._probe.spent(name, time.perf_counter() - start)
        return clocked
