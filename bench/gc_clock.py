"""What Python's garbage collector costs a training step, and what drives that cost.

A full collection walks every object the collector tracks: a transformers Llama's trainer holds
hundreds of thousands, and one took 265-290 ms on H100 and H200 hosts. CPython runs one once
enough objects have survived into its oldest generation since the last, so what brings them is
what a step *promotes*: objects that live through two younger collections (records kept from
forward to backward, checkpointing's frames). The median step never shows a full collection;
the mean does.

:class:`GcClock` counts, while active: collections per generation and their host time, and the
objects each generation-1 collection moved up into the oldest. Used by frontier_bench.py's
rows; no torch here.
"""

import gc
import time


class GcClock:
    """``with GcClock() as clock: ...``; then ``clock.summary(steps)``."""

    def __init__(self):
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.promoted = 0       # survivors of generation-1 collections (into the oldest)
        self.oldest_at_start = None
        self._t0 = None
        self._young = None      # objects in the generations being collected, at their start

    def _callback(self, phase, info):
        generation = info["generation"]
        if phase == "start":
            self._t0 = time.perf_counter()
            if generation < 2:
                # (Cheap: the young generations hold at most a few thousand objects.)
                self._young = sum(len(gc.get_objects(g)) for g in range(generation + 1))
            return
        if self._t0 is None:
            return  # began before this clock
        self.seconds[generation] += time.perf_counter() - self._t0
        self.collections[generation] += 1
        self._t0 = None
        if generation == 1 and self._young is not None:
            self.promoted += max(0, self._young - info["collected"])
        self._young = None

    def __enter__(self):
        self.oldest_at_start = len(gc.get_objects(2))
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._callback)
        return False

    def summary(self, steps):
        """Per step: collections and ms of each generation, and objects promoted to the oldest;
        the objects tracked there when the clock started."""
        steps = max(1, steps)
        return {
            "collections_per_step": [c / steps for c in self.collections],
            "ms_per_step": [s * 1e3 / steps for s in self.seconds],
            "promoted_per_step": self.promoted / steps,
            "tracked_at_start": self.oldest_at_start,
        }
