"""Host staging: how CPU tensors (and CUDA tensors when tierd has no GPU engine) reach tierd,
through host buffers of the session (:class:`StagingPool`, reused by size class), and the
offload path over them (:class:`StagedOffloads`).

Ownership (DESIGN.md section 5): a staging buffer belongs to its job from submission until the
job completes (the job record holds it; its completion callback gives it back), so dropping a
handle early is safe. A failed offload asked to retain its data keeps the buffer in its handle
as the only copy instead. The staged reload is :class:`tier._reloads.StagedReload`.
"""

import collections
import ctypes
import weakref

from . import errors
from ._handle import Handle
from ._host_buffer import staging_view
from ._streams import torch_module, wait_stream

DEFAULT_STAGING_CACHE_BYTES = 256 << 20
MIN_STAGING_BYTES = 64 << 10


def staging_class(nbytes):
    """Staging buffers come in size classes: 64 KiB, then four classes per power of two (at most
    25% waste), so buffers are reused across tensors of nearby sizes."""
    if nbytes <= MIN_STAGING_BYTES:
        return MIN_STAGING_BYTES
    step = 1 << max(nbytes.bit_length() - 3, 0)
    return (nbytes + step - 1) // step * step


class StagingPool:
    """Reusable staging buffers by size class, at most ``cache_bytes`` of them idle. acquire and
    release run under the session's lock; take and give_back take it."""

    def __init__(self, session, cache_bytes):
        self._session = session
        self.cache_bytes = cache_bytes
        self._idle = collections.OrderedDict()  # buffer id -> HostBuffer, least recently used first
        # size class -> [HostBuffer] idle, most recently released last
        self._by_size = collections.defaultdict(list)
        self._idle_bytes = 0
        self._all = {}
        session.on_reset(self.invalidate_all)  # the buffers were the old session's

    def _pop_idle(self, size):
        """An idle buffer of size class `size` (the most recently released), or None."""
        bufs = self._by_size.get(size)
        if not bufs:
            return None
        buf = bufs.pop()
        del self._idle[buf.id]
        self._idle_bytes -= size
        return buf

    def acquire(self, nbytes):
        size = staging_class(nbytes)
        buf = self._pop_idle(size)
        if buf is not None:
            return buf
        self._trim(self.cache_bytes - size)
        buf = self._session.alloc_host_locked(size)
        self._all[buf.id] = buf
        return buf

    def release(self, buf):
        if buf.id not in self._all or not buf._valid or buf.id in self._idle:
            return
        self._idle[buf.id] = buf
        self._by_size[buf.nbytes].append(buf)
        self._idle_bytes += buf.nbytes

    def take(self, nbytes):
        """acquire, under the lock; reaps first (completed jobs give their buffers back) when no
        idle buffer of the size class is at hand."""
        size = MIN_STAGING_BYTES if nbytes <= MIN_STAGING_BYTES else staging_class(nbytes)
        with self._session.checked:
            bufs = self._by_size.get(size)
            if bufs:  # (_pop_idle inline: this runs for every staged tensor)
                buf = bufs.pop()
                del self._idle[buf.id]
                self._idle_bytes -= size
                return buf
            self._session.jobs.reap()
            return self.acquire(nbytes)

    def take_many(self, sizes, out):
        """take for each of `sizes` (bytes), under one hold of the lock, appended to `out` as
        they are taken (on an error, the caller gives back those there)."""
        with self._session.checked:
            reaped = False
            for nbytes in sizes:
                size = MIN_STAGING_BYTES if nbytes <= MIN_STAGING_BYTES else staging_class(nbytes)
                bufs = self._by_size.get(size)
                if bufs:  # (_pop_idle inline)
                    buf = bufs.pop()
                    del self._idle[buf.id]
                    self._idle_bytes -= size
                    out.append(buf)
                    continue
                if not reaped:
                    self._session.jobs.reap()
                    reaped = True
                out.append(self.acquire(nbytes))

    def give_back(self, buf):
        """release, under the lock."""
        with self._session.lock:
            self.release(buf)

    def trim(self):
        """Idle buffers beyond the cache's budget are unregistered (under the lock; waits for
        the session's jobs if any is in flight: call it where none is)."""
        self._trim(self.cache_bytes)

    def _trim(self, keep_bytes):
        # tier_buffer_unregister waits for every job of the session; it only runs when the cache
        # exceeds its budget, and never from a completion callback.
        while self._idle and self._idle_bytes > max(keep_bytes, 0):
            buffer_id, buf = self._idle.popitem(last=False)
            self._by_size[buf.nbytes].remove(buf)
            self._idle_bytes -= buf.nbytes
            del self._all[buffer_id]
            try:
                self._session.unregister_locked(buf)
            except errors.TierError:
                pass

    @property
    def idle_bytes(self):
        return self._idle_bytes

    @property
    def total_bytes(self):
        return sum(b.nbytes for b in self._all.values())

    def invalidate_all(self):
        for buf in self._all.values():
            buf.invalidate()
        self._all.clear()
        self._idle.clear()
        self._by_size.clear()
        self._idle_bytes = 0

    def chunks(self, items, nbytes_of):
        """Consecutive runs of items of at most batch_limit items and at most the cache's bytes
        (at least one item each): the staging buffers of a batch are all taken before it is
        submitted, so a large batch must not hold all of its staging memory at once."""
        chunk, used = [], 0
        for item in items:
            nbytes = nbytes_of(item)
            if chunk and (len(chunk) >= self._session.batch_limit or
                          used + nbytes > self.cache_bytes):
                yield chunk
                chunk, used = [], 0
            chunk.append(item)
            used += nbytes
        if chunk:
            yield chunk


class StagedOffloads:
    """Offloads through staging buffers: the bytes are copied into a buffer now (the tensor may
    change right after), and the job copies them into tierd. CUDA tensors (no GPU engine) are
    copied on the current stream after the producer streams; copy_ into pageable memory returns
    once the bytes are on the host."""

    def __init__(self, client, session, pool):
        self._client = client
        self._session = session
        self._pool = pool
        self._uint8 = None  # torch.uint8, once a storage was staged

    def stage(self, handle, t, streams):
        """A staging buffer holding t's bytes."""
        nbytes = handle.nbytes
        cuda = t.device.type == "cuda"
        if cuda:
            torch = torch_module()
            cur = torch.cuda.current_stream(t.device)
            for s in streams or ():
                wait_stream(cur, s)
        staging = self._pool.take(nbytes)
        try:
            # (t is detached: the copy records nothing for autograd, no_grad or not.)
            if cuda:
                with torch.cuda.device(t.device):
                    staging_view(staging, t.dtype, t.shape, nbytes).copy_(t)
            elif t.is_contiguous() and not t.is_conj() and not t.is_neg():
                # Host memory to host memory, the bytes as they are (no tensor op: this runs
                # for every staged activation).
                if not staging._valid:
                    staging.check_valid()  # raises
                ctypes.memmove(staging.address, t.data_ptr(), nbytes)
            else:
                staging_view(staging, t.dtype, t.shape, nbytes).copy_(t)  # any strides
        except BaseException:
            self._pool.give_back(staging)
            raise
        return staging

    def _keep(self, handle, staging, retain_on_failure):
        """What a staged offload's job keeps: its staging buffer, and a weak reference to its
        handle when the data must stay there should the offload fail (see _staged_done)."""
        return (staging, weakref.ref(handle) if retain_on_failure else None)

    def _staged_done(self, job):
        """The completion callback of every staged offload (one bound method, no closure per
        job): the staging buffer was the job's until now; it goes back to the pool, or stays
        with the handle as the only copy of the data if the offload failed and that was asked."""
        staging, weak_handle = job.keep
        h = weak_handle() if weak_handle is not None and job.status != errors.OK else None
        if h is not None:
            h.fallback = staging
        else:
            self._pool.release(staging)

    def offload(self, handle, t, hint, retain_on_failure, streams):
        """One tensor, staged and submitted."""
        staging = self.stage(handle, t, streams)
        keep = self._keep(handle, staging, retain_on_failure)
        try:
            with self._session.checked:
                handle.object_id, handle.job = self._session.jobs.offload(
                    staging.id, 0, handle.nbytes, None, hint, keep, self._staged_done)
        except BaseException:
            self._pool.give_back(staging)
            raise
        return handle

    def offload_batch(self, items, retain_on_failure):
        """[(handle, tensor, hint, producer streams)]: each staged as it would be alone, then
        submitted as batches of host jobs."""
        jobs = self._session.jobs
        for chunk in self._pool.chunks(items, lambda item: item[0].nbytes):
            stagings = []
            try:
                for handle, t, _, streams in chunk:
                    stagings.append(self.stage(handle, t, streams))
                rows = [(staging.id, 0, handle.nbytes, hint)
                        for (handle, _, hint, _), staging in zip(chunk, stagings)]
                keeps = [self._keep(handle, staging, retain_on_failure)
                         for (handle, _, _, _), staging in zip(chunk, stagings)]
                with self._session.checked:
                    submitted = jobs.offload_batch(rows, None, keeps,
                                                   [self._staged_done] * len(rows))
            except BaseException:
                for staging in stagings:  # none was submitted: they are still ours
                    self._pool.give_back(staging)
                raise
            for (handle, _, _, _), (obj, job) in zip(chunk, submitted):
                handle.object_id, handle.job = obj, job

    def stage_offload(self, tensor):
        """See Client.stage_offload. A CPU storage's bytes are staged as a flat uint8 tensor over
        it would be, without making that tensor (activation offload stages every saved CPU
        storage so: the handle is made here, without the calls that ask a tensor)."""
        if type(tensor).__name__ != "UntypedStorage":  # (torch.UntypedStorage, without a call)
            t = tensor.detach() if tensor.requires_grad else tensor  # (the same bytes)
            handle = self._client._new_handle(t)
            if handle.nbytes == 0:
                return handle, None
            return handle, self.stage(handle, t, None)
        storage = tensor
        device = storage.device
        if device.type != "cpu":
            raise TypeError("stage_offload() stages CPU storages, not %s" % device.type)
        nbytes = storage.nbytes()
        uint8 = self._uint8
        if uint8 is None:
            uint8 = self._uint8 = torch_module().uint8
        handle = Handle(self._client, self._session, self._pool, (nbytes,), uint8, device, nbytes)
        if nbytes == 0:
            return handle, None
        staging = self._pool.take(nbytes)
        if not staging._valid:
            self._pool.give_back(staging)
            staging.check_valid()  # raises
        ctypes.memmove(staging.address, storage.data_ptr(), nbytes)
        return handle, staging

    def submit(self, items, retain_on_failure):
        """See Client.submit_staged."""
        items = [(h, s) for h, s in items if s is not None]
        if not items:
            return
        rows = [(staging.id, 0, handle.nbytes, 0) for handle, staging in items]
        if retain_on_failure:
            keeps = [(staging, weakref.ref(handle)) for handle, staging in items]
        else:
            keeps = [(staging, None) for _, staging in items]
        dones = [self._staged_done] * len(rows)
        jobs = self._session.jobs
        with self._session.checked:
            for lo, hi in jobs.chunks(len(rows)):
                submitted = jobs.offload_batch(rows[lo:hi], None, keeps[lo:hi], dones[lo:hi])
                for (handle, _), (obj, job) in zip(items[lo:hi], submitted):
                    handle.object_id, handle.job = obj, job
