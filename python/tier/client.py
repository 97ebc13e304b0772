"""The Python client: a session with the local tierd, over the C ABI.

Two layers, one :class:`Client`:

* Low level, one method per C call: :meth:`Client.alloc_host_buffer` (a :class:`HostBuffer` with a
  memoryview / numpy / torch view of memory shared with the daemon), :meth:`Client.register_fd`,
  :meth:`Client.register_device`, :meth:`Client.unregister`, :meth:`Client.offload_buffer`,
  :meth:`Client.reload_buffer`, :meth:`Client.free`, :meth:`Client.wait`, :meth:`Client.poll`;
  batches (tier_offload_batch / tier_reload_batch, many jobs under one GPU ticket):
  :meth:`Client.offload_buffer_batch`, :meth:`Client.reload_buffer_batch`.
* Tensors: ``h = client.offload(t, streams=None)`` gives a :class:`Handle`;
  ``h.reload(stream=None)`` a tensor of the same shape, dtype and device; ``h.free()``. Handles
  may simply be dropped. ``client.offload_batch(ts)`` / ``client.reload_batch(handles)`` do the
  same for many tensors, one batch per GPU (one producer wait, one consumer wait) and batches of
  host jobs for CPU ones. ``client.start_reloads(handles, prefetch=True)`` is the prefetch every
  offloader of tier.torch uses.

Where each part lives (this class only wires them and checks arguments):

* tier/_session.py: the session (C session, the lock, finalizer queue, reconnecting);
  tier/_jobs.py: job records from submission to result, reaping, waiting;
  tier/_objects.py: persistent named objects.
* tier/_offloads.py: tensors to jobs (checks, GPU engine path); tier/_staging.py: staging
  buffers and the staged path; tier/_reloads.py: every reload and the prefetch protocol;
  tier/_handle.py: :class:`Handle`; tier/_host_buffer.py: :class:`HostBuffer`.

Ownership rules (DESIGN.md section 5): the source of an offload stays alive until its job has
completed: the in-flight job record holds it (the CPU staging buffer, or the CUDA tensor
itself), not the handle. Dropping the handle early is safe: its object is freed (the daemon
orders a free after the offload that fills the object) and the source is released only when
the offload's completion is reaped. CUDA tensors are copied by the daemon itself (GPU engine);
a reload allocates its destination on the consumer stream (tier/_reloads.py says how it is
ordered).
"""

import os
import sys
import threading

from . import errors
from ._handle import Handle
from ._host_buffer import HostBuffer
from ._info import Completion, ObjectInfo, SessionInfo
from ._jobs import POLL_BATCH
from ._objects import PersistentObjects
from ._offloads import Offloads
from ._reloads import Ready, ReloadCheck, Reloads
from ._session import Session
from ._staging import DEFAULT_STAGING_CACHE_BYTES, StagedOffloads, StagingPool
from ._streams import refuse_in_capture, stream_ptr

__all__ = ["Client", "Handle", "HostBuffer", "SessionInfo", "Completion", "ObjectInfo",
           "Ready", "default_client", "DEFAULT_STAGING_CACHE_BYTES"]


class Client:
    """A session with tierd.

    ``socket``: the daemon's control socket (None: ``$TIER_SOCKET``, else
    ``$XDG_RUNTIME_DIR/tierd/tierd.sock`` when it exists, else ``/run/tierd/tierd.sock``).
    ``name``: shown by ``tierctl clients``. ``quota_bytes``: 0 takes the daemon's default.
    ``staging_cache_bytes``: idle staging memory kept for reuse (CPU tensors).
    ``daemon_wait_ms``: how long the constructor waits for a tierd that is not serving yet
    (starting, restarting, draining before its successor starts; 0: 60000, < 0: no wait), so a
    trainer started during ``systemctl restart tierd`` opens its session instead of failing.

    Thread-safe. Use as a context manager or call :meth:`close`.

    When tierd goes away (killed, restarted, upgraded), the client opens a session with the next
    tierd on the same socket by itself, at the first call after it is up (tried at most once per
    ``reconnect_interval_s``; offload contexts try when they are entered). Until then calls fail
    with :class:`tier.Unavailable` and the torch integration keeps data on the GPU. What was
    offloaded to the tierd that went away is lost and reported so (:class:`tier.DataLoss` from a
    handle's reload), never read from the new one. ``generation`` counts the sessions opened.
    ``reconnect=False`` turns this off.
    """

    RECONNECT_TIMEOUT_MS = Session.RECONNECT_TIMEOUT_MS

    def __init__(self, socket=None, name=None, quota_bytes=0, ring_entries=0,
                 connect_timeout_ms=0, staging_cache_bytes=DEFAULT_STAGING_CACHE_BYTES,
                 reconnect=True, reconnect_interval_s=1.0, daemon_wait_ms=0):
        self._session = Session(socket, name, quota_bytes, ring_entries, connect_timeout_ms,
                                reconnect, reconnect_interval_s, daemon_wait_ms)
        self._staging = StagingPool(self._session, staging_cache_bytes)
        self._staged = StagedOffloads(self, self._session, self._staging)
        self._offloads = Offloads(self, self._session, self._staged)
        self._offload_contiguous = self._offloads.offload_contiguous  # (tier.torch's lane)
        self._reloads = Reloads(self, self._session, self._staging)
        self._objects = PersistentObjects(self._session)

    def _new_handle(self, t):
        """An empty Handle for (detached) tensor t: nothing submitted yet."""
        return Handle(self, self._session, self._staging, t.shape, t.dtype, t.device,
                      t.numel() * t.element_size())

    # ---- the session ------------------------------------------------------------------------

    @property
    def generation(self):
        """Sessions opened since the first (one more at each reconnect)."""
        return self._session.generation

    @property
    def session_id(self):
        return self._session.session_id

    @property
    def engine(self):
        """The daemon's copy engine: "host", "cuda" or "hip"."""
        return self._session.engine

    @property
    def closed(self):
        return self._session.closed

    def reconnect(self):
        """Opens a session with the next tierd now if the current one's went away (else nothing).
        Returns True if it did."""
        with self._session.lock:
            self._session.check_open()
            return self._session.maybe_reconnect(force=True)

    def ensure_connected(self):
        """False while tierd is gone (a new session is tried, at most once per reconnect_interval_s)
        or draining; True when it serves. For offload contexts' start: no message to tierd."""
        with self._session.lock:
            self._session.check_open()
            self._session.maybe_reconnect()
            return self._session.flags() == 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone
            pass

    def close(self):
        """Waits for this client's jobs, then closes the session: the daemon frees every object it
        held and drops every buffer. Host buffers and their views become invalid."""
        session = getattr(self, "_session", None)
        if session is not None:
            session.close()

    def info(self):
        """The session's state (tier_session_get_info): a :class:`SessionInfo`."""
        with self._session.checked:
            return self._session.info_locked()

    def link_bandwidth(self, device):
        """``(d2h_bytes_per_s, h2d_bytes_per_s)`` tierd's copies on GPU ``device``'s link achieved
        lately (it sees every byte it moves, for every process), or None while it has no figure
        (too few bytes, or the host engine). A control call: for planning, not the hot path."""
        return self._session.link_rate(device)

    # ---- buffers ----------------------------------------------------------------------------

    def alloc_host_buffer(self, nbytes):
        """Host memory shared with the daemon, registered (tier_buffer_alloc_host)."""
        with self._session.checked:
            return self._session.alloc_host_locked(nbytes)

    def register_fd(self, fd, nbytes):
        """Registers a memfd sealed with F_SEAL_SHRINK (tier_buffer_register_fd); returns its
        id. Map it (writable) before: tierd seals it against new writable mappings and writes."""
        return self._session.register_fd(fd, nbytes)

    def register_device(self, device_ptr, nbytes=None):
        """Registers the GPU allocation holding device_ptr (once per allocation: the library returns
        the id it already gave for pointers inside it). Returns (buffer id, offset of device_ptr in
        the allocation). With nbytes, raises tier.OutOfRange when [device_ptr, +nbytes) crosses
        what the library can register as one range (an expandable segment is registered whole,
        so only ranges over pages of different sizes, or a tierd without segments). Raises
        tier.Unimplemented without a GPU engine. The id stays registered in tierd until a job
        names it (tier.h), even if another registration finds its memory remapped meanwhile:
        register again for every job rather than keeping ids of memory the allocator may free."""
        return self._session.register_device(device_ptr, nbytes)

    def unregister(self, buffer):
        """Waits for the session's jobs, then drops the buffer (a HostBuffer or a buffer id)."""
        self._session.unregister(buffer)

    # ---- jobs: low level --------------------------------------------------------------------

    def offload_buffer(self, buffer, offset, length, producer_streams=None, next_use_hint=0):
        """tier_offload: copies buffer[offset, +length) into a new daemon object. Returns
        (object id, job id); wait for the job before changing the bytes."""
        buffer_id = _buffer_id(buffer, "offload_buffer() of device memory")
        ptrs = [stream_ptr(s) for s in producer_streams] if producer_streams else None
        with self._session.checked:
            obj, job = self._session.jobs.offload(buffer_id, offset, length, ptrs,
                                                  next_use_hint, None, user=True)
        return obj, job.id

    def reload_buffer(self, object_id, buffer, offset, length, consumer_stream=None,
                      free_after=False):
        """tier_reload: copies the object (length must equal its length) into buffer at offset.
        Returns the job id."""
        buffer_id = _buffer_id(buffer, "reload_buffer() into device memory")
        with self._session.checked:
            return self._session.jobs.reload(object_id, buffer_id, offset, length,
                                             stream_ptr(consumer_stream), free_after,
                                             user=True).id

    @property
    def batch_limit(self):
        """Jobs per batch call: min(the session's ring_entries, 1024). Larger batches given to the
        *_batch methods are split into several calls of at most this many jobs."""
        return self._session.batch_limit

    def offload_buffer_batch(self, jobs, producer_streams=None):
        """tier_offload_batch: offload_buffer for many ranges at once. ``jobs``: tuples (buffer,
        offset, length) or (buffer, offset, length, next_use_hint). Every buffer of a call lies in
        host memory, or all on one GPU (else tier.InvalidArgument, and nothing is submitted: one
        call per GPU). On a GPU the jobs share one ticket: the daemon's copies wait once for
        ``producer_streams`` (default: the legacy default stream), which wrote every source.

        Returns [(object id, job id)] in the order of ``jobs``; each job completes or fails on its
        own (:meth:`wait`, :meth:`poll`). More jobs than one call takes (:attr:`batch_limit`) are
        submitted as several batches, in order; each is submitted whole or not at all. If a batch
        after the first fails, the error raised carries ``submitted``: the (object id, job id) of
        the batches before it, which are in flight (wait for them, free their objects).
        """
        rows = [(_buffer_id(buffer), int(offset), int(length), int(hint))
                for buffer, offset, length, hint in _rows(jobs, "offload_buffer_batch", 3, (0,),
                                                          "(buffer, offset, length"
                                                          "[, next_use_hint])")]
        ptrs = [stream_ptr(s) for s in producer_streams] if producer_streams else None
        return _in_batches(self._session, rows, lambda part: [
            (obj, job.id) for obj, job in self._session.jobs.offload_batch(part, ptrs,
                                                                           user=True)])

    def reload_buffer_batch(self, jobs, consumer_stream=None, free_after=False):
        """tier_reload_batch: reload_buffer for many objects at once. ``jobs``: tuples (object id,
        buffer, offset, length) or (object id, buffer, offset, length, free_after); ``free_after``
        applies to every job (ORed with a job's own). Buffers as for :meth:`offload_buffer_batch`
        (host memory, or one GPU). On a GPU, ``consumer_stream`` waits (on the GPU) for every copy
        of the call before it returns, as reload_buffer does for one.

        Returns the job ids in the order of ``jobs``; each job completes or fails on its own.
        Split as :meth:`offload_buffer_batch` is; ``submitted`` on a later batch's error lists
        the job ids already in flight.
        """
        rows = [(int(object_id), _buffer_id(buffer), int(offset), int(length),
                 bool(free_after) or bool(free))
                for object_id, buffer, offset, length, free in _rows(
                    jobs, "reload_buffer_batch", 4, (False,),
                    "(object, buffer, offset, length[, free_after])")]
        ptr = stream_ptr(consumer_stream)
        return _in_batches(self._session, rows, lambda part: [
            job.id for job in self._session.jobs.reload_batch(part, ptr, user=True)])

    # ---- named, persistent objects (tier.h) ---------------------------------------------------

    def offload_persistent(self, name, buffer, offset, length, producer_streams=None, keep=None):
        """tier_offload_persistent: like offload_buffer, into a new persistent object `name` (in
        the namespace of this process's uid) that outlives the session. Returns (object id, job
        id). AlreadyExists when the name is taken; ResourceExhausted past the uid's quota.
        `keep`: anything to hold alive until the job completed (a source tensor)."""
        return self._objects.offload(name, buffer, offset, length, producer_streams, keep)

    def open_object(self, name):
        """tier_object_open: (object id, length) of the persistent object `name`, for
        reload_buffer (and free, which deletes it). NotFound."""
        return self._objects.open(name)

    def delete_object(self, name, uid=None):
        """tier_object_delete: deletes the persistent object `name` (of `uid`: root only; None:
        this process's own). NotFound."""
        self._objects.delete(name, uid)

    def object_info(self, name):
        """tier_object_stat: the :class:`ObjectInfo` of the persistent object `name`, binding
        nothing. NotFound (also before its offload has begun)."""
        return self._objects.info(name)

    def release_object(self, object_id):
        """tier_object_release: drops this session's id of a persistent object (from open_object
        or offload_persistent) once the jobs using it completed; the object stays. A session holds
        at most 4096 such ids. NotFound."""
        self._objects.release(object_id)

    # ---- jobs: results ------------------------------------------------------------------------

    def stream_wait_offload(self, job_id, stream=None):
        """tier_stream_wait_offload: makes `stream` (a torch.cuda.Stream or a raw pointer; None:
        the current stream) wait on the GPU until offload `job_id` has read its source, so work
        queued on it afterwards may overwrite the source. No host round trip."""
        self._offloads.stream_wait_offload(job_id, stream)

    def free(self, object_id):
        """tier_free: drops the object once jobs using it finish. Returns the job id."""
        with self._session.checked:
            return self._session.jobs.free(object_id, user=True).id

    def wait(self, job_id, timeout_ms=-1):
        """Waits for a job submitted with the low-level API and raises its error, if it failed
        (tier_job_wait). A result can be taken once (here or from poll())."""
        with self._session.checked:
            job = self._session.jobs.take(job_id, timeout_ms)
        err = job.error()
        if err is not None:
            raise err

    def poll(self, max_completions=POLL_BATCH):
        """Low-level jobs that finished and were not waited for, without blocking (tier_poll)."""
        with self._session.checked:
            self._session.jobs.reap()
            return [Completion(job.id, job.object, job.length, job.status)
                    for job in self._session.jobs.take_finished(max_completions)]

    def collect(self):
        """Reaps finished jobs (releasing their sources and staging buffers) and runs work queued
        by finalizers (frees of dropped handles). Never blocks on the daemon."""
        with self._session.checked:
            self._session.jobs.reap()

    def synchronize(self):
        """Waits for every job this client has in flight (their errors go to their owners)."""
        with self._session.checked:
            self._session.jobs.wait_all()
            self._session.check()  # run what the callbacks queued (frees of dropped handles)
            self._session.jobs.wait_all()
            # Staging buffers jobs held past the cache's budget are idle now: trimmed at no wait.
            self._staging.trim()

    def reload_check(self):
        """A ReloadCheck (tier/_reloads.py): called, raises if a GPU reload in use since failed."""
        return ReloadCheck(self._session)

    @property
    def jobs_in_flight(self):
        with self._session.lock:
            return len(self._session.jobs)

    # ---- tensors ----------------------------------------------------------------------------

    def offload(self, tensor, streams=None, next_use_hint=0, retain_on_failure=False):
        """Offloads a tensor's data to Tierd and returns a :class:`Handle`.

        ``streams``: the CUDA streams whose work wrote the tensor (default: the current stream);
        the daemon's copy waits for all of them on the GPU. Ignored for CPU tensors. The tensor
        must not be modified until ``handle.done()`` (the handle keeps it alive until then).
        ``retain_on_failure``: if the offload fails (pool or quota full), the handle keeps its
        source (the CUDA tensor, or the staging buffer) and reloads are served from it, so the
        data is "not offloaded" rather than lost (tier.torch's offloaders use this).
        """
        return self._offloads.offload(tensor, streams, next_use_hint, retain_on_failure)

    def offload_batch(self, tensors, streams=None, next_use_hints=None,
                      retain_on_failure=False):
        """offload() for many tensors at once: a :class:`Handle` per tensor, in order.

        CUDA tensors of one GPU (the GPU engine copies them) go as one batch sharing one ticket:
        the daemon's copies all wait, on the GPU, for ``streams`` (default: that GPU's current
        stream), which must together have written every tensor of the batch. With tensors on
        several GPUs there is one batch per GPU, and each waits for the streams of ``streams``
        on its GPU (raw stream handles: for every GPU). CPU tensors (and CUDA tensors when the
        daemon has no GPU engine) are staged as offload() stages them and go as batches of host
        jobs. More jobs than one call takes (:attr:`batch_limit`) go as several batches.

        ``next_use_hints``: one per tensor, or one int for all (default 0). Each offload
        completes or fails on its own (``handle.wait()``), as with offload(); a tensor that
        cannot be one job (over memory that cannot be registered as one range) stays on the GPU
        as with offload(). The tensors must not be modified until their handles are done.
        ``retain_on_failure`` as for offload().
        """
        return self._offloads.offload_batch(tensors, streams, next_use_hints, retain_on_failure)

    def stage_offload(self, tensor):
        """A CPU tensor's (or UntypedStorage's: as uint8 bytes) offload in two steps: its bytes
        are staged now (it may change right after) and the job is submitted later by
        :meth:`submit_staged`, with others as one batch. Returns (handle, staging buffer or None
        for an empty tensor); until submitted, the staging buffer is the caller's (give it back
        with staging_release if it is never submitted)."""
        return self._staged.stage_offload(tensor)

    def submit_staged(self, items, retain_on_failure=False):
        """Submits [(handle, staging)] from stage_offload as batches of host jobs (split at
        batch_limit); from here each staging buffer belongs to its job. If this raises, the
        items whose handle was not submitted (``not handle.submitted``) still have their
        staging buffers with the caller."""
        self._staged.submit(items, retain_on_failure)

    def staging_acquire(self, nbytes):
        """A staging buffer (a :class:`HostBuffer` of at least nbytes) from this client's cache,
        reused by size class; give it back with :meth:`staging_release` once no job uses it."""
        return self._staging.take(nbytes)

    def staging_release(self, buf):
        """Gives a buffer from :meth:`staging_acquire` back to the cache."""
        self._staging.give_back(buf)

    @property
    def staging_bytes(self):
        """Host memory this client holds as staging buffers (in use or idle)."""
        with self._session.lock:
            return self._staging.total_bytes

    @property
    def device_direct(self):
        """How CUDA tensors travel: True once tierd's GPU engine copied one, False once the
        client knows it cannot (tierd runs the host engine, or libtierclient has no GPU
        support: staged through host memory), None until the first CUDA tensor."""
        return self._offloads.device_direct

    def release_sources(self, handles, stream, device=None):
        """GPU-engine offloads still in flight: hands their sources back in stream order instead
        of when the host sees the copies complete. `stream` (the one the sources were allocated
        and produced on) waits on the GPU until the newest of these offloads has read its
        source; the offload tickets of one GPU complete in order (one offload_done counter per
        session and GPU), so that covers the older ones too. Then the jobs stop holding the
        sources: the caching allocator may hand the memory to work queued on `stream` from now
        on, which runs after the copies, while the host never waits. The price: such an offload
        can no longer fall back to its source if it fails (pool or quota full); its reload then
        raises. Returns how many sources were released. ``device``: the GPU of `stream` when it
        is a raw pointer (default: the current device)."""
        return self._offloads.release_sources(handles, stream, device)

    def reload_batch(self, handles, stream=None, free=False):
        """Handle.reload() for many handles at once: a tensor per handle, in order.

        CUDA handles of one GPU go as one batch for ``stream`` (default: that GPU's current
        stream): the destinations are allocated on it, and it waits on the GPU for every copy of
        the batch before this returns, so work queued on it may use every tensor at once (no host
        wait). CPU handles return when their data is there. ``free=True`` drops the objects after
        these reloads (a handle may then appear once). Raises for a freed handle, or one whose
        offload failed, before anything is submitted; a reload that fails raises as reload()
        does (the first such error).
        """
        return self._reloads.reload_batch(handles, stream, free)

    def start_reloads(self, handles, stream=None, free=False, prefetch=False):
        """Starts the reloads of `handles` and returns one started reload per handle, in order:
        its ``result()`` is the tensor, ordered before the work queued on the stream current at
        that call. The reloads of one GPU's handles are one batch (one ticket); staged ones (CPU,
        or CUDA without a GPU engine) go as batches of host jobs. Checks every handle before
        any is started (as reload_batch()); ``free=True`` drops the objects after the reloads.

        CUDA destinations are allocated on ``stream`` (default: the current stream), so they
        come from that stream's allocator pool. ``prefetch=False``: the stream waits (on the
        GPU) for the copies before this returns. ``prefetch=True``: it does not; each result()
        makes the stream current at that point wait for its batch's copies
        (TIER_RELOAD_DEFER_WAIT, tier_stream_wait_reload), so the work queued between here and
        the first use runs beside them. A prefetch never taken still has its wait put on the
        allocating stream before its memory is let go. This is how every offloader of
        tier.torch prefetches: no side stream, no event of its own (tier/_reloads.py)."""
        return self._reloads.start(handles, stream, free, prefetch)


def _buffer_id(buffer, device_what=None):
    """A HostBuffer's id, or a buffer id as given (device memory: refused inside a CUDA graph
    capture when device_what names the call)."""
    if isinstance(buffer, HostBuffer):
        return buffer.id
    if device_what is not None:
        refuse_in_capture(None, device_what)
    return int(buffer)


def _in_batches(session, rows, submit):
    """rows submitted by submit(part) in calls of at most batch_limit; see
    Client.offload_buffer_batch for what a later batch's error carries."""
    out = []
    with session.checked:
        for lo, hi in session.jobs.chunks(len(rows)):
            try:
                submitted = submit(rows[lo:hi])
            except errors.TierError as e:
                e.submitted = out
                raise
            out.extend(submitted)
    return out


def _rows(jobs, what, needed, defaults, shape):
    """The tuples of a *_buffer_batch call, each of `needed` fields plus the optional ones
    (`defaults` where left out)."""
    out = []
    for item in jobs:
        item = tuple(item)
        if len(item) not in (needed, needed + len(defaults)):
            raise ValueError("%s: each job is %s, got %r" % (what, shape, item))
        out.append(item + tuple(defaults[len(item) - needed:]))
    return out


_default_lock = threading.Lock()
_default = None


def default_client():
    """The process's shared Client on the default socket, opened on first use (and again after a
    fork). tier.torch uses it when no client is given."""
    global _default
    with _default_lock:
        if _default is None or _default.closed or _default._session.pid != os.getpid():
            _default = Client(name=os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0]
                              else None)
        return _default


def _close_default():
    global _default
    with _default_lock:
        if _default is not None and _default._session.pid == os.getpid():
            try:
                _default.close()
            except Exception:
                pass
        _default = None


import atexit  # noqa: E402

atexit.register(_close_default)
