"""Reloads into new tensors: the one place where the client starts a reload and orders it before
its use. Client.start_reloads, Client.reload_batch and Handle.reload all come here, and every
offloader of tier.torch (activations, weights, optimizer state, compiled graphs) reloads and
prefetches through Client.start_reloads.

Stream ordering (CUDA, tierd's GPU engine), stated once here:

* The destination is allocated on the consumer stream (the one given, else the current one),
  before the reload's ticket is taken on it in tier_reload(_batch): the caching allocator only
  hands out memory whose earlier users are ordered before that point, and the daemon's H2D copy
  waits for the ticket, so no copy can overwrite memory still in use, and nothing is
  host-synchronized. The memory comes from that stream's own allocator pool (a side stream's
  pool would be one the consumer never reuses: reserved memory grew by the reloads, issue 28).
* For immediate use, the consumer stream waits (on the GPU) for the copies when the call
  returns: work queued on it from then on sees the data.
* Prefetch (``prefetch=True``, TIER_RELOAD_DEFER_WAIT): the consumer is not made to wait at
  once. :class:`DeferredReload.result` makes the stream current at the first use wait for the
  batch's copies (tier_stream_wait_reload; one wait per batch and stream), so the work queued
  between the prefetch and the first use runs beside the copies. Used on another stream than
  the allocating one, the tensor is ``record_stream``'ed there (allocator lifetime only: the wait
  is the ordering). A prefetch never used still has its wait put on the allocating stream before
  its memory is let go (:meth:`DeferredReload.__del__`).
* Should tierd die with such a reload in flight, the library releases the waiting streams (none
  may wait for ever) and the work queued after the wait reads memory the copy never filled. Each
  GPU reload a stream was made to wait on is noted (JobTable.in_use). A :class:`ReloadCheck`
  (:meth:`Client.reload_check`), called, waits for those noted since it was made and raises
  :class:`tier.Unavailable` if one did not complete. The activation offloader calls one at the
  end of each backward that reloaded, the optimizer-state offloader at the end of its step.

Staged reloads (CPU handles, or CUDA without a GPU engine) copy out of a staging buffer once
their job completed (:class:`StagedReload`).
"""

import collections
import ctypes

from . import _streams, errors
from ._handle import Handle
from ._host_buffer import HostBuffer, staging_view
from ._streams import (consumer_stream, current_stream_ptr, refuse_in_capture, stream_ptr,
                       torch_module, wait_stream)


class ReloadCheck:
    """Client.reload_check(): called, waits for the GPU reloads that a stream was made to wait on
    since the check was made, forgets every noted one, and raises :class:`tier.Unavailable` if any
    of those did not complete (see the module docstring: the work after the wait read memory the
    copy never filled)."""

    __slots__ = ("_session", "_since")

    def __init__(self, session):
        self._session = session
        with session.lock:
            self._since = session.jobs.noted

    def __call__(self):
        with self._session.checked:
            self._session.jobs.verify_in_use(self._since)


class Ready:
    """A reload whose tensor is already usable (CUDA: the stream waits on the GPU)."""

    __slots__ = ("_tensor",)

    def __init__(self, tensor):
        self._tensor = tensor

    def result(self):
        return self._tensor


class DeferredBatch:
    """The jobs of one deferred GPU reload batch (TIER_RELOAD_DEFER_WAIT) and the streams already
    made to wait for them. One ticket per chunk of the batch, so waiting on each chunk's last job
    waits for all of its copies."""

    __slots__ = ("_session", "_jobs", "allocating_ptr", "_waited", "__weakref__")

    def __init__(self, session, jobs, allocating_ptr):
        self._session = session
        self._jobs = jobs
        self.allocating_ptr = allocating_ptr  # the cudaStream_t the destinations came from
        self._waited = set()  # stream pointers

    def wait_on(self, stream):
        self.wait_on_ptr(stream_ptr(stream))

    def wait_on_ptr(self, ptr):
        """wait_on for the stream whose cudaStream_t is `ptr`."""
        if ptr in self._waited:
            return
        session = self._session
        with session.lock:
            if session.c_session is None:
                return  # closed: every job ended, nothing left to wait for
            for lo, hi in session.jobs.chunks(len(self._jobs)):
                session.jobs.stream_wait_reload(self._jobs[hi - 1].id, ptr)
            if not self._waited:
                session.jobs.in_use(self._jobs)
        self._waited.add(ptr)

    def waited(self):
        return bool(self._waited)


class DeferredReload:
    """A prefetched GPU reload into the consumer's memory: result() orders the copy before the
    current stream's later work and returns the tensor."""

    __slots__ = ("_batch", "_tensor")

    def __init__(self, batch, tensor):
        self._batch = batch
        self._tensor = tensor

    def result(self):
        device = self._tensor.device
        raw = _streams._raw_stream
        if raw is None:
            raw = _streams.raw_stream_fn()
        # (A raw pointer: no stream object per tensor.)
        ptr = raw(device.index) if raw and device.index is not None else \
            current_stream_ptr(device)
        batch = self._batch
        if ptr not in batch._waited:  # (wait_on_ptr's own check: a call only to wait)
            batch.wait_on_ptr(ptr)
        if ptr != batch.allocating_ptr:
            # allocator lifetime only: the wait orders
            self._tensor.record_stream(torch_module().cuda.current_stream(device))
        return self._tensor

    def __del__(self):
        # Never taken: the allocating stream must still wait for the copy before the memory goes
        # back to its pool, or a later allocation there could be overwritten by the copy.
        batch = self._batch
        if batch is not None and not batch._waited:  # (waited(), without its call)
            try:
                batch.wait_on_ptr(batch.allocating_ptr)
            except Exception:  # noqa: BLE001  (a closed or dead session has no copy in flight)
                pass


class StagedReload:
    """A reload into a staging buffer: result() waits for the job and copies out."""

    _staging = None  # (read by __del__ even if __init__ did not run to its end)

    def __init__(self, session, pool, handle, staging, job, stream):
        self._session = session
        self._pool = pool
        self._handle = handle
        self._staging = staging
        self._job = job
        self._stream = stream
        self._tensor = None

    def result(self):
        if self._tensor is not None:
            return self._tensor
        h = self._handle
        with self._session.checked:
            jobs = self._session.jobs
            if self._job.status is None:
                # One poll takes the results of every job done by now (a batch's reloads complete
                # together): the rest of the batch then waits for nothing.
                jobs.reap()
                jobs.wait(self._job, -1)
            if self._job.status == errors.OK and h.device.type == "cpu":
                # The common case in one lock hold: copied out, the buffer given back.
                staging, self._staging = self._staging, None
                out = (_empty_fn or _torch_empty())(h.shape, dtype=h.dtype)
                if not staging._valid:
                    staging.check_valid()  # raises
                ctypes.memmove(out.data_ptr(), staging.address, h.nbytes)  # (no tensor op)
                self._pool.release(staging)
                self._tensor = out
                return out
        torch = torch_module()
        staging, self._staging = self._staging, None
        try:
            err = self._job.error()
            if err is not None:
                if self._job.status == errors.ABORTED:
                    h.wait()  # the reload failed because the offload did: raise the offload's error
                raise err
            src = staging_view(staging, h.dtype, h.shape, h.nbytes)
            if h.device.type == "cuda":
                # From pageable memory: copy_ returns once the bytes left the staging buffer.
                with torch.cuda.device(h.device), torch.cuda.stream(self._stream):
                    out = torch.empty(h.shape, dtype=h.dtype, device=h.device)
                    out.copy_(src)
            else:
                out = src.clone()
        finally:
            self._pool.give_back(staging)
        self._tensor = out
        return out

    def __del__(self):
        staging = self._staging
        if staging is None:
            return
        pool = self._pool
        job = self._job

        def release():
            if job.status is not None:
                pool.release(staging)
            else:
                job.on_done = lambda j: pool.release(staging)
        try:
            self._session.run_or_defer(release)
        except Exception:
            pass


_empty_fn = None  # torch.empty, once looked up


def _torch_empty():
    global _empty_fn
    if _empty_fn is None:
        _empty_fn = torch_module().empty
    return _empty_fn


def staged_reload_bytes(h):
    """Staging bytes a reload of handle h takes until its result is taken (0: none)."""
    if h.direct or h.kept is not None or h.object_id is None:
        return 0
    return h.nbytes


class Reloads:
    """Client.start_reloads and reload_batch (see them for what the caller sees)."""

    def __init__(self, client, session, pool):
        self._client = client
        self._session = session
        self._pool = pool

    def reload_batch(self, handles, stream, free):
        handles = list(handles)
        self._check(handles, stream, free)
        out = []
        # Staged reloads hold a staging buffer each until their results are taken: bounded.
        for chunk in self._pool.chunks(handles, staged_reload_bytes):
            out.extend(started.result() for started in self.start(chunk, stream, free))
        return out

    def _check(self, handles, stream, free):
        """What start() refuses, checked for every handle before any is started."""
        seen = set()
        generation = self._session.generation
        for h in handles:
            # (Attributes read directly: this runs for every reloaded activation.)
            if type(h) is not Handle and not isinstance(h, Handle) or \
                    h._client is not self._client:
                raise ValueError("reload_batch() takes handles of this client, got %r" % (h,))
            if h.freed:
                raise errors.FailedPrecondition(errors.FAILED_PRECONDITION,
                                                "reload of a freed handle")
            if free and h in seen:  # (handles hash by identity)
                raise ValueError("reload_batch(free=True): a handle appears twice")
            if h.generation != generation and h.lost():
                h.raise_lost()
            seen.add(h)
            if stream is not None and h.device.type == "cuda":
                consumer_stream(stream, h.device)  # refuses a stream of another device
        for h in handles:
            if h.kept is not None or h.object_id is None:
                continue
            if not h.direct and h.job is not None and h.job.status is None:
                h.wait_offload()  # staged: the offload's own result comes first
            job = h.job
            if job is not None and job.status is not None and job.status != errors.OK and \
                    h.fallback is None:
                raise job.error()

    def start(self, handles, stream=None, free=False, prefetch=False):
        """A started reload per handle (its result() is the tensor). The reloads of one GPU's
        handles are one batch: one ticket, and the consumer waits once for all of their copies.
        Staged reloads go as batches of host jobs. prefetch: see the module docstring."""
        handles = list(handles)
        self._check(handles, stream, free)
        for device in {h.device for h in handles}:
            refuse_in_capture(device, "reload")
        started = [None] * len(handles)
        direct = collections.OrderedDict()  # device -> [index]
        staged = []
        for i, h in enumerate(handles):
            if h.kept is not None:
                started[i] = Ready(_from_kept(h, stream, free))
            elif h.object_id is None:
                started[i] = Ready(_empty(h, stream))
            elif h.job is not None and h.job.status is not None and h.job.status != errors.OK:
                # (h.failed, read directly)
                if h.fallback is None:
                    raise h.job.error()
                started[i] = Ready(_from_fallback(h, stream))
            elif h.direct:
                direct.setdefault(h.device, []).append(i)
            else:
                staged.append(i)
        for device, indices in direct.items():
            dsts, jobs, consumer_ptr = self._start_cuda([handles[i] for i in indices], device,
                                                        stream, free, prefetch)
            batch = DeferredBatch(self._session, jobs, consumer_ptr) if prefetch else None
            for i, dst in zip(indices, dsts):
                started[i] = DeferredReload(batch, dst) if prefetch else Ready(dst)
        if staged:
            for i, s in zip(staged, self._start_staged([handles[i] for i in staged], stream,
                                                       free)):
                started[i] = s
        return started

    def _start_cuda(self, handles, device, stream, free, defer):
        """One GPU's handles as one batch (split at batch_limit). Returns (destinations, the
        jobs, the consumer stream's cudaStream_t)."""
        torch = torch_module()
        session = self._session
        # Every destination is allocated on the consumer stream before the batch's ticket is
        # taken on it (module docstring); when tier_reload_ranges returns, that stream waits (on
        # the GPU) for every copy of the batch unless deferred, and a destination dropped early
        # is reused only by work ordered after them.
        empty = torch.empty
        if stream is None:
            # The device's current stream: torch.empty on `device` allocates from that stream's
            # pool already (the allocator asks the current stream of the tensor's device), so no
            # stream object and no device or stream context per batch.
            ptr = current_stream_ptr(device)
            dsts = [empty(h.shape, dtype=h.dtype, device=device) for h in handles]
        else:
            stream = consumer_stream(stream, device)
            with torch.cuda.device(device), torch.cuda.stream(stream):
                dsts = [empty(h.shape, dtype=h.dtype, device=device) for h in handles]
            ptr = stream_ptr(stream)
        # Registration and submission in one library call per chunk (tier_reload_ranges), under
        # the session's lock (no reaper sees a job before it is tracked). All or nothing: a
        # destination that cannot be registered raises with nothing of its chunk submitted.
        rows = [(h.object_id, dst.data_ptr(), h.nbytes) for h, dst in zip(handles, dsts)]
        submitted = []
        jobs = session.jobs
        with session.checked:
            jobs.reap()
            try:
                for lo, hi in jobs.chunks(len(rows)):
                    batch = jobs.reload_ranges(rows[lo:hi], ptr, free, defer=defer)
                    submitted.extend(batch)
                    for h, job in zip(handles[lo:hi], batch):
                        if h.reloads:
                            h.reloads = [j for j in h.reloads if j.status is None]
                        h.reloads.append(job)
                        if free:
                            h.freed = True
            finally:
                if not defer and submitted:
                    # The consumer stream waits on them now (also on the chunks before one
                    # that raised).
                    jobs.in_use(submitted)
        return dsts, submitted, ptr

    def _start_staged(self, handles, stream, free):
        """Staged handles as batches of host jobs: a StagedReload each."""
        streams = [consumer_stream(stream, h.device) if h.device.type == "cuda" else stream
                   for h in handles]
        stagings = []
        out = []
        jobs = self._session.jobs
        try:
            self._pool.take_many([h.nbytes for h in handles], stagings)
            with self._session.checked:
                for lo, hi in jobs.chunks(len(handles)):
                    rows = [(h.object_id, staging.id, 0, h.nbytes, free)
                            for h, staging in zip(handles[lo:hi], stagings[lo:hi])]
                    batch = jobs.reload_batch(rows, None)
                    # Submitted: each staging buffer now belongs to its started reload.
                    for h, staging, job, s in zip(handles[lo:hi], stagings[lo:hi], batch,
                                                  streams[lo:hi]):
                        out.append(StagedReload(self._session, self._pool, h, staging, job, s))
                        if free:
                            h.freed = True
        except BaseException:
            for staging in stagings[len(out):]:
                self._pool.give_back(staging)
            raise
        return out


def _empty(h, stream):
    torch = torch_module()
    if h.device.type == "cuda":
        with torch.cuda.device(h.device), torch.cuda.stream(consumer_stream(stream, h.device)):
            return torch.empty(h.shape, dtype=h.dtype, device=h.device)
    return torch.empty(h.shape, dtype=h.dtype, device=h.device)


def _from_fallback(h, stream):
    """The data a failed offload left in its handle (retain_on_failure)."""
    torch = torch_module()
    data = h.fallback
    if isinstance(data, HostBuffer):
        out = _empty(h, stream)
        with torch.no_grad():
            if h.device.type == "cuda":
                with torch.cuda.device(h.device), torch.cuda.stream(
                        consumer_stream(stream, h.device)):
                    out.copy_(staging_view(data, h.dtype, h.shape, h.nbytes))
            else:
                out.copy_(staging_view(data, h.dtype, h.shape, h.nbytes))
        return out
    # The source tensor itself (a contiguous CUDA tensor): used where it is, like the data of an
    # offload still in flight (Handle.pending_source).
    return data.view(h.shape)


def _from_kept(h, stream, free):
    """A tensor that stayed on the GPU: the stream follows its producers, and gets it."""
    src, producers = h.kept
    stream = consumer_stream(stream, h.device)
    for p in producers:
        wait_stream(stream, p)
    if free:
        h.kept = None
        h.freed = True
    return src.view(h.shape)
