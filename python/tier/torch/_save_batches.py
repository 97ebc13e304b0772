"""Forward's side of activation offload: storages packed and not yet submitted, sent to tierd as
batches.

A CUDA storage is deferred (the copy of a batch runs after the producer's work queued so far, as
every GPU offload) and sent as one batch per (device, producer stream) once ``batch_tensors`` of
them or ``batch_bytes`` wait, and before anything needs them (a release point, the first unpack,
the end of the context); under a plan, also after each run of planned offloads saved back to back
(the plan's timing assumes each copy starts when its tensor was produced). A CPU storage is staged
when saved, straight from its UntypedStorage (one changed in place afterwards is offloaded as it
was when saved), and its job goes with the next batch (a release point does not wait for it:
nothing of the source is held). Storages whose saved tensors are all gone by then are dropped. An offload
refused before anything was submitted (tierd gone, draining) leaves the bytes where they are, and
backward uses them; one that fails later keeps its data in its handle (retain_on_failure). Without
a plan, each CUDA source is held until its copy is known complete, within
:class:`~tier.torch._inflight.InflightBound`.

Called with the offloader's lock held.
"""

import collections
import warnings
import weakref

import torch

from .. import errors as _errors
from .._streams import current_stream_ptr
from ._inflight import InflightBound
from ._offload_planner import OFFLOAD as _OFFLOAD

_empty = torch.empty
_uint8 = torch.uint8
# What current_stream_ptr asks (tier/_streams.py), without its Python call per saved tensor.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class SaveBatches:
    """See the module docstring. ``offloader``: the ActivationOffloader whose storages these
    are (its client, stats, BATCH_TENSORS, BATCH_BYTES and max_inflight_bytes are read when
    needed). ``bounded``: hold sources until their copies complete, within max_inflight_bytes
    (no plan); else the plan releases them in stream order."""

    def __init__(self, offloader, bounded):
        # A weak reference: the offloader owns this, and a cycle would keep it (its records and
        # tierd objects with it) alive until a collection.
        self._off = weakref.proxy(offloader)
        self._bounded = bounded
        # (weakref to StorageRecord, source (the tensor or its storage's flat bytes), producer
        # stream, staged); read, never changed, by the offloader (whether anything waits: no
        # call on its hot path)
        self.deferred = []
        self._pending_bytes = 0
        self._inflight = InflightBound()
        self._warned = False

    def __bool__(self):
        return bool(self.deferred)

    def _warn_once(self, message, stacklevel):
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)

    def add_staged(self, record, storage):
        """A CPU storage: its bytes are staged now (as a flat uint8 tensor over it would be, but
        without making one), its job goes with the next batch."""
        off = self._off
        try:
            # (The offloader's client as it holds it once known: no descriptor call per save.)
            staged = (off._client or off.client).stage_offload(storage)
        except _errors.TierError as e:
            # No staging memory from tierd (it went away or drains): the bytes stay where they
            # are and backward uses them, as for a batch refused in flush().
            record.tensor = _empty(0, dtype=_uint8).set_(storage)
            self._off.stats.fallbacks += 1
            self._warn_once("tier: saved activations stay in memory: %s" % e, 3)
            return
        self.deferred.append((weakref.ref(record), None, None, staged))
        self._pending_bytes += record.nbytes  # (this runs for every save: no call)
        if len(self.deferred) >= off.BATCH_TENSORS or self._pending_bytes >= off.BATCH_BYTES:
            self.flush()

    def add(self, record, flat, t):
        """Defers record's storage (`flat`, of tensor t) for the next batch, unstaged."""
        # The producer is the current stream now (it may be another by the time of the batch),
        # as its cudaStream_t (an int: no stream object per saved tensor).
        stream = None
        if t.is_cuda:
            raw = _RAW_STREAM
            index = t.device.index
            stream = raw(index) if raw and index is not None else current_stream_ptr(t.device)
        self.deferred.append((weakref.ref(record), flat, stream, None))
        self._pending_bytes += record.nbytes
        off = self._off
        if len(self.deferred) >= off.BATCH_TENSORS or self._pending_bytes >= off.BATCH_BYTES:
            self.flush()

    def after_planned(self, actions, site):
        """A plan's offload at `site` was added: the deferred storages go now unless the next
        candidate is a planned offload too. A planned copy starts after the work that produced
        it: deferred to a later point, it would wait there for everything queued since, and the
        release point the plan put after its predicted end would stall the stream for it (the
        1B Llama's forward: +9.6 ms at recompute's peak). Offloads saved back to back still go
        as one batch."""
        nxt = site + 1
        if self.deferred and (nxt >= len(actions) or actions[nxt] != _OFFLOAD):
            self.flush()

    def flush(self):
        """Submits the deferred storages: one batch per (device, producer stream); each job
        waits (GPU) for its producer stream and keeps its source alive until copied."""
        if not self.deferred:
            return
        deferred, self.deferred, self._pending_bytes = self.deferred, [], 0
        groups = collections.OrderedDict()  # (device, stream) -> [(record, flat)]
        staged = []                         # [(record, (handle, staging))]: CPU, staged already
        client = self._off.client
        for ref, flat, stream, stage in deferred:
            record = ref()
            if stage is not None:
                if record is not None:
                    staged.append((record, stage))
                elif stage[1] is not None:
                    client.staging_release(stage[1])  # its saved tensors are gone
            elif record is not None:
                groups.setdefault((record.device, stream), []).append((record, flat))
        if staged:
            self._submit_staged(client, staged)
        for (device, stream), items in groups.items():
            # retain_on_failure: if an offload fails (pool or quota full), its handle keeps the
            # data and backward uses it from there: not offloaded, but not lost either (unless a
            # plan's release point handed the source back before the failure was known).
            try:
                if stream is not None:
                    # CUDA: what the offloader sends is contiguous, plain and without grad
                    # (the tensor itself detached, or a flat view of its storage).
                    handles = client._offload_contiguous(device, stream,
                                                         [flat for _, flat in items], True)
                else:
                    handles = client.offload_batch([flat for _, flat in items], None, None,
                                                   retain_on_failure=True)
            except _errors.TierError as e:
                # Refused before anything was submitted (tierd gone, ...). Raised here it would
                # surface far from its cause (a later save, or backward); the bytes stay where
                # they are and backward uses them.
                for record, flat in items:
                    record.tensor = flat
                    self._off.stats.fallbacks += 1
                self._warn_once("tier: saved activations stay on the GPU: %s" % e, 2)
                continue
            for (record, _), handle in zip(items, handles):
                self._submitted(record, handle)

    def _submit_staged(self, client, staged):
        """CPU storages staged when saved, submitted as batches of host jobs."""
        try:
            # retain_on_failure: a failed offload leaves the data in its handle (see flush).
            client.submit_staged([stage for _, stage in staged], retain_on_failure=True)
        except _errors.TierError as e:
            self._warn_once("tier: saved activations stay in memory: %s" % e, 3)
        for record, (handle, staging) in staged:
            if handle.job is None and staging is not None:  # (not handle.submitted)
                # Not submitted (refused): the bytes come back out of the staging buffer.
                record.tensor = staging.tensor()[:handle.nbytes].clone()
                client.staging_release(staging)
                self._off.stats.fallbacks += 1
                continue
            self._submitted(record, handle)

    def _submitted(self, record, handle):
        stats = self._off.stats
        record.handle = handle
        if handle.kept is not None:  # (handle.stayed_on_gpu)
            stats.stayed_on_gpu_storages += 1  # not offloadable: nothing went to Tierd
            stats.stayed_on_gpu_bytes += record.nbytes
        else:
            stats.offloaded_storages += 1
            stats.offloaded_bytes += record.nbytes
        if handle.direct and handle.kept is None and self._bounded and handle.job is not None:
            # Without a plan: released when the host sees the copy complete, bounded.
            stats.inflight_waits += self._inflight.add(handle, record.nbytes,
                                                       self._off.max_inflight_bytes)
