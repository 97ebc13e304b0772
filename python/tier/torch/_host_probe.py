"""The host's cost per offloaded storage, clocked on one planned step (HOST_PROBE_STEP of the first
plan that offloads): what each offloading block's forward took the host beyond its calibrated,
hook-free time, over the storages it offloaded (the median block's). The joint planner plans
again with it (tier/torch/_activation_planner.host_extra_s)."""

import statistics
import time

from . import _activation_planner as ap

# The planned step (1: the first) that is clocked: not the first, which pays once for
# registering the allocator's memory with tierd.
HOST_PROBE_STEP = 2


class HostProbe:
    """Per block, when its forward began and ended on the host, on the one step clocked.
    ``blocks`` (after cost_s): per block, (mode, offloads, host seconds beyond calibration or
    None, {offloader call: seconds} of the calls clocked through :meth:`timing`): what the cost
    came from (a block with no offload shows what the hooks and releases alone cost there)."""

    __slots__ = ("_marks", "_sections", "_current", "blocks")

    def __init__(self, blocks):
        self._marks = [[None, None] for _ in range(blocks)]
        self._sections = [{} for _ in range(blocks)]  # per block: offloader call -> seconds
        self._current = 0
        self.blocks = []

    def timing(self, offloader):
        """A view of `offloader` whose calls (releases, a block's hooks opening and closing, the
        barrier) are clocked, each for the block in progress: where an offloading block's host
        time goes."""
        return _Timed(offloader, self)

    def spent(self, name, seconds):
        sections = self._sections[self._current]
        sections[name] = sections.get(name, 0.0) + seconds

    def begins(self, b):
        self._current = b
        self._marks[b][0] = time.perf_counter()

    def ends(self, b):
        self._marks[b][1] = time.perf_counter()

    def cost_s(self, evaluation, profile, signatures):
        """Seconds per offloaded storage under `evaluation` (the plan followed); None where no
        offloading block was clocked against a calibrated host time."""
        counts = ap.offloads_by_block(evaluation.layout, evaluation.chosen)
        per_offload = []
        self.blocks = []
        for b, (sig, mode) in enumerate(zip(signatures, evaluation.modes)):
            calibrated = profile.host.get(sig, {}).get(mode)
            start, end = self._marks[b]
            sections = dict(self._sections[b])
            if calibrated is None or start is None or end is None:
                self.blocks.append((mode, counts[b], None, sections))
                continue
            extra = (end - start) - calibrated[2]
            self.blocks.append((mode, counts[b], extra, sections))
            if counts[b]:
                per_offload.append(extra / counts[b])
        if not per_offload:
            return None
        # The median block's: one step is clocked, and one block held up by something else (the
        # last one's barrier, the allocator, another process on the host) must not set the cost
        # for all of them.
        return max(0.0, statistics.median(per_offload))


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
