"""Backward's side of activation offload: each offloaded storage comes back once.

A storage is reloaded when backward first needs it; without a plan the next ``prefetch`` in reverse
order of offload (the order backward needs them) are started with it, and a plan starts its reloads
at its triggers instead. The reloads of one device go as batches (at most CHUNK_BYTES each, in the
order given), through Client.start_reloads: on CUDA allocated on the consumer (current) stream,
also when prefetching, so they come from that stream's allocator pool; a prefetch's wait is put
where the tensor is first used (the offloader's unpack takes its result), so the copies overlap
the backward work queued in between (tier/_reloads.py). Each object is freed by its reload (a record is reloaded
once: the bytes stay with it for every later unpack), not by a separate free. A CUDA storage whose
offload is still in flight never left the GPU: its source is used as it is.

Called with the offloader's lock held.
"""

import bisect
import collections
import weakref

import torch

from .. import errors as _errors


def torch_engine():
    return torch.autograd.Variable._execution_engine


# The reloads one start() begins go as batches of at most CHUNK_BYTES, in the order given (a plan
# gives them in the order backward needs them): a batch is one ticket, and its first tensor's
# user waits for the whole batch. As one batch, the 1B Llama's first backward block waited 13 ms
# for 1.3 GB of reloads planned early for blocks far later in backward.
CHUNK_BYTES = 64 << 20


def _chunks(records):
    group, size = [], 0
    for record in records:
        if group and size + record.nbytes > CHUNK_BYTES:
            yield group
            group, size = [], 0
        group.append(record)
        size += record.nbytes
    if group:
        yield group


class BackwardReloads:
    """See the module docstring. ``offloader``: the ActivationOffloader whose records these are
    (its client and stats are read when needed)."""

    def __init__(self, offloader, batches):
        self._off = weakref.proxy(offloader)  # (it owns this: no cycle)
        self._batches = batches
        self._order_index = []  # record indices in pack order (for bisect)
        self._order = []        # weakref.ref(StorageRecord), parallel to _order_index
        self._compact_at = 1024
        # A reload check waits for this backward's end (read by the offloader: no call when set).
        self.check_queued = False

    def note(self, record):
        """An offloaded record in pack order, for count-based prefetch (a plan has triggers)."""
        self._order_index.append(record.index)
        self._order.append(weakref.ref(record))
        if len(self._order) >= self._compact_at:
            self._compact()

    def _compact(self):
        live = [(i, r) for i, r in zip(self._order_index, self._order) if r() is not None]
        self._order_index = [i for i, _ in live]
        self._order = [r for _, r in live]
        self._compact_at = max(1024, 2 * len(live))

    def start(self, records, prefetch):
        """Starts the reloads of the records not started yet (see the module docstring)."""
        stats = self._off.stats
        todo = collections.OrderedDict()  # device -> [record]
        seen = set()
        client = self._off.client
        reaped = False
        for record in records:
            key = id(record)
            if record.tensor is not None or record.pending is not None or key in seen:
                continue
            seen.add(key)
            if record.handle is None:
                self._batches.flush()
            if not reaped:
                client.collect()  # once for the batch: which offloads are done
                reaped = True
            job = record.handle.job
            if job is not None and job.status is not None and job.status != _errors.OK:
                stats.fallbacks += 1  # the offload failed (handle.failed): it kept the data
            handle = record.handle
            if record.device.type == "cuda" and handle.direct and job is not None and (
                    job.status is None or handle.fallback is not None):
                # (Else pending_source has nothing to give: no call.)
                source = handle.pending_source(reap=False)
                if source is not None:
                    # The offload is still in flight, so the bytes never left the GPU: use them.
                    record.tensor = source
                    stats.source_hits += 1
                    continue
            todo.setdefault(record.device, []).append(record)
        for device, records_of_device in todo.items():
            for group in _chunks(records_of_device):
                self._start_group(client, group, prefetch)

    def _start_group(self, client, group, prefetch):
        """One batch of reloads (one ticket)."""
        stats = self._off.stats
        handles = [record.handle for record in group]
        # CUDA: allocated on the current stream, which waits (GPU) for the copies: at once
        # for a reload needed now, at the first use (take: result()) for a prefetch.
        # CPU: submitted now, taken in take().
        try:
            started = client.start_reloads(handles, free=True, prefetch=prefetch)
        except _errors.TierError as e:
            lost = [r for r in group if r.released and r.handle.failed]
            if lost:
                raise RuntimeError(
                    "tier.torch: %d saved activation(s) (%d bytes) were lost: the offload "
                    "failed (%s) after the plan had handed the GPU memory back to PyTorch. "
                    "Give tierd room for a step's offloads (pool_bytes, the session's "
                    "quota), or plan with less offload." % (
                        len(lost), sum(r.nbytes for r in lost), e)) from e
            raise
        for record, pending in zip(group, started):
            record.pending = pending
            if prefetch:
                stats.prefetches += 1
            else:
                stats.reloads += 1

    def check_at_end_of_backward(self):
        """Once per backward (its first reload): at its end the GPU reloads it used are checked
        (Client.reload_check), so that a tierd that died with one in flight fails
        loss.backward() instead of leaving gradients computed from memory the copy never filled
        (seen once in 415 tasks of scripts/gpu-stress on 2 H100s, delay injection on, tierd
        SIGKILLed). Needs no lock."""
        if self.check_queued:
            return
        check = self._off.client.reload_check()

        def at_end():
            self.check_queued = False
            check()
        try:
            torch_engine().queue_callback(at_end)
        except RuntimeError:
            return  # not inside a backward (an unpack called directly): nothing to end
        self.check_queued = True

    def prefetch_before(self, record, count):
        """Starts the next `count` records before `record` in pack order, as one batch."""
        if count == 0:
            return
        order = self._order
        pos = bisect.bisect_left(self._order_index, record.index)
        ahead = []
        need = count
        j = pos - 1
        dead_top = None  # the top of the run of gone records the walk is in
        while j >= 0 and need:
            other = order[j]()
            if other is None:  # its backward already ran
                if dead_top is None:
                    dead_top = j
            else:
                dead_top = None
                ahead.append(other)
                need -= 1
            j -= 1
        if j < 0 and dead_top is not None:
            # Every record at or below dead_top is gone (earlier steps' records, once their
            # backward ran): dropped, so that no later walk steps over them again (they were
            # walked at every unpack near the start of each step's pack order).
            del order[:dead_top + 1]
            del self._order_index[:dead_top + 1]
        self.start(ahead, prefetch=True)  # those not started yet, as one batch
