"""A bound on GPU memory held by offloads whose copies the host has not seen complete.

CUDA: without a plan, an offload's source is released only once the host learns that the
daemon's copy read it, and the host runs far ahead of the GPU: every source of a forward could be
held at once. :class:`InflightBound` keeps what waits so under a limit: past it, the host reaps
once (cheap), then waits for the oldest copy. The GPU keeps busy meanwhile with the work already
queued; the copy waits only for kernels queued before it. Used by the eager offloader and by the
compiled graphs' ops alike.
"""

import collections


class InflightBound:
    """Handles of offloads still in flight, oldest first, and their bytes."""

    def __init__(self):
        self._queue = collections.deque()  # (handle, bytes)
        self._bytes = 0

    def add(self, handle, nbytes, limit):
        """Counts `handle`'s offload until its copy is known complete; while more than `limit`
        bytes wait so, reaps and then waits for the oldest. Returns how many host waits it
        took."""
        self._queue.append((handle, nbytes))
        self._bytes += nbytes
        waits = 0
        reaped = False
        while self._queue:
            oldest, size = self._queue[0]
            if oldest.in_flight:
                if self._bytes <= limit:
                    break
                if not reaped:
                    oldest.client.collect()
                    reaped = True
                    continue
                oldest.wait_offload()
                waits += 1
            self._queue.popleft()
            self._bytes -= size
        return waits
