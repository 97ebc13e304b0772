"""What Python's garbage collector costs a training step, and what drives that cost.

A full collection walks every object the collector tracks: a transformers Llama's trainer holds
hundreds of thousands, and one full collection took about 290 ms on an H100's host. CPython
(3.11, 3.12) runs one once the objects that survived into the oldest generation since the last one
exceed a quarter of those there after it. So what a step costs on average is proportional to what
it *promotes*: objects that live through two younger collections (a step's saved activations'
wrappers, records kept from forward to backward), about 4 x (seconds per tracked object) per
promoted object, however large the heap; the median step never shows it, the mean does.

:class:`GcClock` counts, while active: collections per generation and their host time, and the
objects each young collection moved up (survivors of generation 1 go to the oldest). Used by
frontier_bench.py's rows and plan_profile.py; no torch here.
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
        """Per step: collections and ms of each generation, objects promoted to the oldest, and
        the full collections' mean cost those promotions imply (seconds per tracked object from
        the full collections seen, else None)."""
        steps = max(1, steps)
        per_object = None
        if self.collections[2] and self.oldest_at_start:
            per_object = self.seconds[2] / self.collections[2] / self.oldest_at_start
        promoted = self.promoted / steps
        return {
            "collections_per_step": [c / steps for c in self.collections],
            "ms_per_step": [s * 1e3 / steps for s in self.seconds],
            "promoted_per_step": promoted,
            "tracked_at_start": self.oldest_at_start,
            # A full collection comes when promotions reach a quarter of the oldest generation,
            # and walks all of it: 4 x promoted x its cost per object, on average.
            "full_ms_per_step_implied": (4 * promoted * per_object * 1e3
                                         if per_object is not None else None),
        }
