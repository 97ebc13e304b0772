"""The host's cost per offloaded storage, clocked on one planned step (HOST_PROBE_STEP of the first
plan that offloads): what each offloading block's forward took the host beyond its calibrated,
hook-free time, over the storages it offloaded. The joint planner plans again with it
(tier/torch/_activation_planner.host_extra_s)."""

import time

from . import _activation_planner as ap

# The planned step (1: the first) that is clocked: not the first, which pays once for
# registering the allocator's memory with tierd.
HOST_PROBE_STEP = 2


class HostProbe:
    """Per block, when its forward began and ended on the host, on the one step clocked."""

    __slots__ = ("_marks",)

    def __init__(self, blocks):
        self._marks = [[None, None] for _ in range(blocks)]

    def begins(self, b):
        self._marks[b][0] = time.perf_counter()

    def ends(self, b):
        self._marks[b][1] = time.perf_counter()

    def cost_s(self, evaluation, profile, signatures):
        """Seconds per offloaded storage under `evaluation` (the plan followed); None where no
        offloading block was clocked against a calibrated host time."""
        counts = ap.offloads_by_block(evaluation.layout, evaluation.chosen)
        extra, n = 0.0, 0
        for b, (sig, mode) in enumerate(zip(signatures, evaluation.modes)):
            calibrated = profile.host.get(sig, {}).get(mode)
            start, end = self._marks[b]
            if counts[b] == 0 or calibrated is None or start is None or end is None:
                continue
            extra += (end - start) - calibrated[2]
            n += counts[b]
        return max(0.0, extra / n) if n else None
