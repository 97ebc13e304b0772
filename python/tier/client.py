"""The Python client: a session with the local tierd, over the C ABI.

Two layers:

* Low level, one method per C call: :meth:`Client.alloc_host_buffer` (a :class:`HostBuffer` with a
  memoryview / numpy / torch view of memory shared with the daemon), :meth:`Client.register_fd`,
  :meth:`Client.register_device`, :meth:`Client.unregister`, :meth:`Client.offload_buffer`,
  :meth:`Client.reload_buffer`, :meth:`Client.free`, :meth:`Client.wait`, :meth:`Client.poll`;
  batches (tier_offload_batch / tier_reload_batch, many jobs under one GPU ticket):
  :meth:`Client.offload_buffer_batch`, :meth:`Client.reload_buffer_batch`.
* Tensors: ``h = client.offload(t, streams=None)`` gives a :class:`Handle`; ``h.reload(stream=None)``
  a tensor of the same shape, dtype and device; ``h.free()``. Handles may simply be dropped.
  ``client.offload_batch(ts)`` / ``client.reload_batch(handles)`` do the same for many tensors,
  one batch per GPU (one producer wait, one consumer wait) and batches of host jobs for CPU ones.

Ownership rules (DESIGN.md section 5), and where each is kept:

* The source of an offload stays alive until its job has completed: the in-flight job record holds
  it (the CPU staging buffer, or the CUDA tensor itself), not the handle. Dropping the handle early
  is safe: its object is freed (the daemon orders a free after the offload that fills the object)
  and the source is released only when the offload's completion is reaped.
* CPU tensors go through staging buffers (host memory shared with the daemon, reused by size
  class); a staging buffer belongs to its job until the job completes.
* CUDA tensors are copied by the daemon itself (GPU engine): their allocation is registered, the
  producer streams are named on the offload, and a reload allocates its destination on the consumer
  stream, which the library makes wait (on the GPU) for the copy before tier_reload returns.

Completions. The C library hands a job's result out once (to tier_job_wait or tier_poll). This
class is the only consumer: under its lock it polls (reaping every finished job: callbacks release
the sources and staging buffers) or waits for one job. Low-level jobs submitted by the user keep
their result for :meth:`Client.wait` / :meth:`Client.poll`; the tensor API's jobs report to their
handles.

Finalizers (``Handle.__del__``) can run anywhere, including inside this class while it holds its
lock (garbage collection); they never block on the lock: if it is taken, their work is queued and
run by the next call that takes it (:meth:`Client.collect` runs it explicitly).
"""

import collections
import ctypes
import os
import sys
import threading
import time
import warnings
import weakref

from . import _cuda_graphs
from . import _lib
from . import errors

DEFAULT_STAGING_CACHE_BYTES = 256 << 20
_MIN_STAGING_BYTES = 64 << 10
_POLL_BATCH = 64


def _torch():
    import torch  # deferred: the low-level client does not need torch
    return torch


def _is_tensor(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _stream_ptr(stream):
    """A cudaStream_t as an int from a torch.cuda.Stream (or an int); None stays None."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "cuda_stream", None)
    if ptr is None:
        raise TypeError("expected a torch.cuda.Stream or a raw stream handle, got %r" % (stream,))
    return int(ptr)


def _offload_options(stream_ptrs, hint):
    """tier_offload_options for producer streams `stream_ptrs` (ints, or None) and a next-use
    hint; returns (options, the stream array the options point into: keep it for the call)."""
    options = _lib.new_struct(_lib.OffloadOptions)
    options.next_use_hint = int(hint)
    streams = None
    if stream_ptrs:
        streams = (ctypes.c_void_p * len(stream_ptrs))(*stream_ptrs)
        options.num_producer_streams = len(stream_ptrs)
        options.producer_streams = ctypes.cast(streams, ctypes.POINTER(ctypes.c_void_p))
    return options, streams


def _staging_class(nbytes):
    """Staging buffers come in size classes: 64 KiB, then four classes per power of two (at most
    25% waste), so buffers are reused across tensors of nearby sizes."""
    if nbytes <= _MIN_STAGING_BYTES:
        return _MIN_STAGING_BYTES
    step = 1 << max(nbytes.bit_length() - 3, 0)
    return (nbytes + step - 1) // step * step


class SessionInfo(collections.namedtuple(
        "SessionInfo", "session_id quota_bytes ring_entries jobs_in_flight engine "
        "device_registrations device_extensions device_exports")):
    """tier_session_info: the session's id, quota, ring size, jobs in flight and the daemon's
    copy engine ("host", "cuda", "hip"); and what registering GPU memory cost so far:
    registrations and extensions sent to tierd, allocations (VMM pages) exported for them. With
    expandable segments each segment is registered once and extended as PyTorch maps pages, so
    these stay flat across training steps once the segments stop growing."""


class ObjectInfo(collections.namedtuple("ObjectInfo", "length ready durable journaled")):
    """A persistent object's state (Client.object_info): ``ready`` once its offload landed,
    ``durable`` once written through to NVMe (it survives a restart of tierd); ``journaled``
    says whether this tierd writes through at all (without it ``durable`` never comes)."""


class Completion(collections.namedtuple("Completion", "job object length status")):
    """One finished low-level job (tier_completion). ``status`` is the canonical code."""

    @property
    def ok(self):
        return self.status == errors.OK

    @property
    def code_name(self):
        return errors.code_name(self.status)

    def error(self):
        """The TierError this completion stands for, or None if it succeeded."""
        if self.ok:
            return None
        return errors.error_from_code(
            self.status, "%s from tierd for job %d" % (self.code_name, self.job))


class _Job:
    """A submitted job, from submission until its result is known (and, for user jobs, taken)."""

    __slots__ = ("id", "what", "status", "message", "keep", "on_done", "user", "object", "length")

    def __init__(self, job_id, what, keep=None, on_done=None, user=False, object_id=0, length=0):
        self.id = job_id
        self.object = object_id
        self.length = length
        self.what = what          # for messages: "offload of 4096 bytes (object 7)"
        self.status = None        # None while in flight
        self.message = ""
        self.keep = keep          # what must outlive the job (source tensor, staging buffer)
        self.on_done = on_done    # called once, under the client's lock, with this job
        self.user = user          # submitted through the low-level API: result kept for wait()

    def error(self):
        if self.status is None or self.status == errors.OK:
            return None
        return errors.error_from_code(self.status, "%s: %s" % (self.what, self.message))


class HostBuffer:
    """Host memory shared with the daemon and registered in the session (tier_buffer_alloc_host).

    ``view()`` is a writable memoryview of the bytes; ``numpy()`` and ``tensor()`` are zero-copy
    arrays over them. The memory is unmapped by :meth:`unregister` or when the client closes: no
    view may be used after that (the library cannot revoke them; using one would fault).
    """

    def __init__(self, client, buffer_id, address, nbytes):
        self._client = client
        self.id = buffer_id
        self.address = address
        self.nbytes = nbytes
        self._array = (ctypes.c_ubyte * nbytes).from_address(address)
        self._valid = True
        self._u8 = None  # cached torch.uint8 view (staging)

    def __len__(self):
        return self.nbytes

    def __repr__(self):
        return "HostBuffer(id=%d, nbytes=%d%s)" % (self.id, self.nbytes,
                                                   "" if self._valid else ", unregistered")

    @property
    def valid(self):
        return self._valid

    def _check(self):
        if not self._valid:
            raise errors.FailedPrecondition(errors.FAILED_PRECONDITION,
                                            "host buffer %d was unregistered" % self.id)

    def view(self):
        """A writable memoryview (format 'B') of the whole buffer."""
        self._check()
        return memoryview(self._array).cast("B")

    def numpy(self, dtype="uint8"):
        """A writable numpy array over the buffer (as many whole elements of dtype as fit)."""
        import numpy as np
        self._check()
        dt = np.dtype(dtype)
        return np.frombuffer(self.view(), dtype=dt, count=self.nbytes // dt.itemsize)

    def tensor(self, dtype=None):
        """A CPU torch tensor over the buffer (uint8 unless dtype is given)."""
        torch = _torch()
        self._check()
        u8 = self._uint8()
        if dtype is None or dtype == torch.uint8:
            return u8
        size = _element_size(dtype)
        return u8[:self.nbytes // size * size].view(dtype)

    def _uint8(self):
        if self._u8 is None:
            self._u8 = _torch().frombuffer(self.view(), dtype=_torch().uint8)
        return self._u8

    def unregister(self):
        """Waits for the session's jobs, then drops the buffer (the daemon closes its mapping)."""
        self._client.unregister(self)

    def _invalidate(self):
        self._valid = False
        self._u8 = None


def _element_size(dtype):
    return _torch().empty((), dtype=dtype).element_size()


class _StagingPool:
    """Reusable staging buffers by size class. Used under the client's lock."""

    def __init__(self, client, cache_bytes):
        self._client = client
        self._cache_bytes = cache_bytes
        self._idle = collections.OrderedDict()  # buffer id -> HostBuffer, least recently used first
        self._idle_bytes = 0
        self._all = {}

    def acquire(self, nbytes):
        size = _staging_class(nbytes)
        for buffer_id, buf in self._idle.items():
            if buf.nbytes == size:
                del self._idle[buffer_id]
                self._idle_bytes -= size
                return buf
        self._trim(self._cache_bytes - size)
        buf = self._client._alloc_host_locked(size)
        self._all[buf.id] = buf
        return buf

    def release(self, buf):
        if buf.id not in self._all or not buf.valid:
            return
        self._idle[buf.id] = buf
        self._idle_bytes += buf.nbytes

    def _trim(self, keep_bytes):
        # tier_buffer_unregister waits for every job of the session; it only runs when the cache
        # exceeds its budget, and never from a completion callback.
        while self._idle and self._idle_bytes > max(keep_bytes, 0):
            buffer_id, buf = self._idle.popitem(last=False)
            self._idle_bytes -= buf.nbytes
            del self._all[buffer_id]
            try:
                self._client._unregister_locked(buf)
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
            buf._invalidate()
        self._all.clear()
        self._idle.clear()
        self._idle_bytes = 0


class Client:
    """A session with tierd.

    ``socket``: the daemon's control socket (None: ``$TIER_SOCKET``, else
    ``$XDG_RUNTIME_DIR/tierd/tierd.sock`` when it exists, else ``/run/tierd/tierd.sock``).
    ``name``: shown by ``tierctl clients``. ``quota_bytes``: 0 takes the daemon's default.
    ``staging_cache_bytes``: idle staging memory kept for reuse (CPU tensors).

    Thread-safe. Use as a context manager or call :meth:`close`.

    When tierd goes away (killed, restarted, upgraded), the client opens a session with the next
    tierd on the same socket by itself, at the first call after it is up (tried at most once per
    ``reconnect_interval_s``; offload contexts try when they are entered). Until then calls fail
    with :class:`tier.Unavailable` and the torch integration keeps data on the GPU. What was
    offloaded to the tierd that went away is lost and reported so (:class:`tier.DataLoss` from a
    handle's reload), never read from the new one. ``generation`` counts the sessions opened.
    ``reconnect=False`` turns this off.
    """

    RECONNECT_TIMEOUT_MS = 500  # one attempt's connect limit, so a call is never held long

    def __init__(self, socket=None, name=None, quota_bytes=0, ring_entries=0,
                 connect_timeout_ms=0, staging_cache_bytes=DEFAULT_STAGING_CACHE_BYTES,
                 reconnect=True, reconnect_interval_s=1.0):
        self._c = _lib.load()
        self._session = None
        self._closed = True
        self._pid = os.getpid()
        # Kept for reconnecting (and the bytes alive while the options point at them).
        self._socket_bytes = os.fsencode(socket) if socket is not None else None
        self._name_bytes = name.encode() if name is not None else None
        self._quota_bytes = int(quota_bytes)
        self._ring_entries = int(ring_entries)
        self._reconnect = bool(reconnect)
        self._reconnect_interval_s = float(reconnect_interval_s)
        self._next_reconnect = 0.0
        self._dead_sessions = []  # sessions of tierds that went away: closed with the client
        self.generation = 0
        self._session = self._open_session(int(connect_timeout_ms))
        self._closed = False
        self._lock = threading.Lock()
        self._unlocked_calls = 0  # library calls made without the lock (register_device)
        self._unlocked_done = threading.Condition(self._lock)
        self._inflight = {}     # job id -> _Job: submitted, result not yet taken from the library
        self._unwaited = {}     # job id -> _Job: user jobs, finished, result not yet taken
        self._deferred = collections.deque()  # callables queued by finalizers (run under the lock)
        self._staging = _StagingPool(self, staging_cache_bytes)
        self._device_buffers = {}  # buffer id -> registrations that returned it
        self._device_direct = None  # None: not tried; False: no GPU engine, CUDA via staging
        self._warned_kept = False
        self._poll_batch = (_lib.Completion * _POLL_BATCH)()
        info = self.info()
        self.session_id = info.session_id
        self.engine = info.engine
        # Jobs per tier_offload_batch / tier_reload_batch call; larger batches go as several.
        self._batch_limit = max(1, min(info.ring_entries, _lib.TIER_MAX_BATCH_JOBS))

    def _open_session(self, connect_timeout_ms):
        options = _lib.new_struct(_lib.SessionOptions)
        options.socket_path = self._socket_bytes
        options.name = self._name_bytes
        options.quota_bytes = self._quota_bytes
        options.ring_entries = self._ring_entries
        options.connect_timeout_ms = int(connect_timeout_ms)
        session = ctypes.c_void_p()
        _lib.check(self._c.tier_session_open(ctypes.byref(options), ctypes.byref(session)),
                   "opening a session with tierd")
        return session

    def _daemon_flags_locked(self):
        return self._c.tier_session_flags(self._session)

    def _maybe_reconnect_locked(self, force=False):
        """The session's tierd went away: opens a session with the next one, at most once per
        reconnect_interval_s (force: now). Jobs of the old session all ended (UNAVAILABLE, in the
        library) and are taken first; its buffers, staging and registrations are dropped; handles
        of its objects become lost (Handle._lost). The old session stays open (its host buffers may
        still be viewed) until the client closes."""
        if not self._reconnect or self._session is None:
            return False
        if not self._daemon_flags_locked() & _lib.TIER_SESSION_DAEMON_GONE:
            return False
        now = time.monotonic()
        if not force and now < self._next_reconnect:
            return False
        self._next_reconnect = now + self._reconnect_interval_s
        try:
            session = self._open_session(self.RECONNECT_TIMEOUT_MS)
        except errors.TierError:
            return False  # not up yet: calls go on failing with UNAVAILABLE
        self._reap_locked()  # the old session's results (its jobs all ended)
        for job in list(self._inflight.values()):
            self._finish_locked(job, errors.UNAVAILABLE, "tierd went away")
        self._inflight.clear()
        self._staging.invalidate_all()
        self._device_buffers.clear()
        self._device_direct = None
        self._dead_sessions.append(self._session)
        self._session = session
        self.generation += 1
        info = self._info_locked()
        self.session_id = info.session_id
        self.engine = info.engine
        self._batch_limit = max(1, min(info.ring_entries, _lib.TIER_MAX_BATCH_JOBS))
        warnings.warn("tier: tierd went away and is back; this client opened session %d with it. "
                      "What it had offloaded before is lost." % self.session_id, RuntimeWarning)
        return True

    def reconnect(self):
        """Opens a session with the next tierd now if the current one's went away (else nothing).
        Returns True if it did."""
        with self._lock:
            self._check_closed_locked()
            return self._maybe_reconnect_locked(force=True)

    def ensure_connected(self):
        """False while tierd is gone (a new session is tried, at most once per
        reconnect_interval_s) or draining (it refuses offloads, and will exit); True when it
        serves. For offload contexts, at their start: cheap (no message to tierd)."""
        with self._lock:
            self._check_closed_locked()
            self._maybe_reconnect_locked()
            return self._daemon_flags_locked() == 0

    # ---- lifetime ---------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone
            pass

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Waits for this client's jobs, then closes the session: the daemon frees every object it
        held and drops every buffer. Host buffers and their views become invalid."""
        if self._closed:
            return
        with self._lock:
            if self._closed:
                return
            if os.getpid() != self._pid:
                # A forked child: the session (its ring, token, gRPC channel) is the parent's.
                self._closed = True
                self._session = None
                return
            while self._unlocked_calls:
                self._unlocked_done.wait()
            # Take every result, so each job's owner learns its status and its source is released.
            for job in list(self._inflight.values()):
                try:
                    self._wait_job_locked(job, -1)
                except errors.TierError:
                    pass
            self._closed = True
            self._deferred.clear()
            self._staging.invalidate_all()
            session, self._session = self._session, None
            self._c.tier_session_close(session)
            for dead in self._dead_sessions:
                self._c.tier_session_close(dead)
            self._dead_sessions = []

    def _check_closed_locked(self):
        if self._closed:
            raise errors.FailedPrecondition(errors.FAILED_PRECONDITION, "the client is closed")
        if os.getpid() != self._pid:
            raise errors.FailedPrecondition(
                errors.FAILED_PRECONDITION,
                "this session belongs to process %d; open a new Client after fork" % self._pid)

    def _check_locked(self):
        self._check_closed_locked()
        if self._reconnect and time.monotonic() >= self._next_reconnect:
            self._maybe_reconnect_locked()
        while self._deferred:
            fn = self._deferred.popleft()
            try:
                fn()
            except errors.TierError:
                pass

    def _run_or_defer(self, fn):
        """For finalizers: runs fn under the lock if it is free, else queues it. Never blocks."""
        if self._closed:
            return
        if self._lock.acquire(blocking=False):
            try:
                if not self._closed:
                    fn()
            except errors.TierError:
                pass
            finally:
                self._lock.release()
        else:
            self._deferred.append(fn)

    # ---- session ----------------------------------------------------------------------------

    def info(self):
        """The session's state (tier_session_get_info)."""
        with self._lock:
            self._check_locked()
            return self._info_locked()

    def _info_locked(self):
        info = _lib.new_struct(_lib.SessionInfo)
        _lib.check(self._c.tier_session_get_info(self._session, ctypes.byref(info)))
        return SessionInfo(info.session_id, info.quota_bytes, info.ring_entries,
                           info.jobs_in_flight, info.engine.decode(), info.device_registrations,
                           info.device_extensions, info.device_exports)

    def link_bandwidth(self, device):
        """What the link of this process's GPU ``device`` achieved for tierd's copies lately, as
        tierd measured them (it sees every byte it moves, for every process of the node):
        ``(d2h_bytes_per_s, h2d_bytes_per_s)``, or None while tierd has no figure yet (too few
        bytes moved) or serves no such GPU (the host engine). One control call (tier_link_rate):
        for planning, not for the hot path."""
        d2h = ctypes.c_double()
        h2d = ctypes.c_double()
        with self._lock:
            self._check_locked()
            status = self._c.tier_link_rate(self._session, int(device), ctypes.byref(d2h),
                                            ctypes.byref(h2d))
        if status == errors.NOT_FOUND:
            return None
        _lib.check(status, "reading the link rate of GPU %d" % int(device))
        if d2h.value <= 0 or h2d.value <= 0:
            return None
        return (d2h.value, h2d.value)

    # ---- buffers ----------------------------------------------------------------------------

    def _alloc_host_locked(self, nbytes):
        ptr = ctypes.c_void_p()
        buffer_id = _lib.c_buffer_id()
        _lib.check(self._c.tier_buffer_alloc_host(self._session, int(nbytes), ctypes.byref(ptr),
                                                  ctypes.byref(buffer_id)),
                   "allocating a host buffer of %d bytes" % nbytes)
        return HostBuffer(self, buffer_id.value, ptr.value, int(nbytes))

    def alloc_host_buffer(self, nbytes):
        """Host memory shared with the daemon, registered (tier_buffer_alloc_host)."""
        with self._lock:
            self._check_locked()
            return self._alloc_host_locked(nbytes)

    def register_fd(self, fd, nbytes):
        """Registers a memfd sealed with F_SEAL_SHRINK (tier_buffer_register_fd); returns its id."""
        buffer_id = _lib.c_buffer_id()
        with self._lock:
            self._check_locked()
            _lib.check(self._c.tier_buffer_register_fd(self._session, int(fd), int(nbytes),
                                                       ctypes.byref(buffer_id)),
                       "registering fd %d" % fd)
        return buffer_id.value

    def register_device(self, device_ptr, nbytes=None):
        """Registers the GPU allocation holding device_ptr (once per allocation: the library returns
        the id it already gave for pointers inside it). Returns (buffer id, offset of device_ptr in
        the allocation). With nbytes, raises tier.OutOfRange when [device_ptr, +nbytes) crosses
        what the library can register as one range (an expandable segment is registered whole,
        so only ranges over pages of different sizes, or a tierd without segments). Raises
        tier.Unimplemented without a GPU engine. The id stays registered in tierd until a job
        names it (tier.h), even if another registration finds its memory remapped meanwhile:
        register again for every job rather than keeping ids of memory the allocator may free."""
        buffer_id = _lib.c_buffer_id()
        offset = ctypes.c_uint64()
        with self._lock:
            self._check_locked()
            session = self._session
            self._unlocked_calls += 1
        # Outside the lock: the library is thread-safe, and a registration may take a round trip
        # to tierd (export, IPC open there) that other threads of this client need not wait for.
        # close() waits for calls like this one before it closes the session.
        try:
            if nbytes is None:
                status = self._c.tier_buffer_register_device(
                    session, ctypes.c_void_p(int(device_ptr)), ctypes.byref(buffer_id),
                    ctypes.byref(offset))
            else:
                status = self._c.tier_buffer_register_device_range(
                    session, ctypes.c_void_p(int(device_ptr)), ctypes.c_uint64(int(nbytes)),
                    ctypes.byref(buffer_id), ctypes.byref(offset))
            _lib.check(status, "registering device memory at 0x%x" % int(device_ptr))
        finally:
            with self._lock:
                self._unlocked_calls -= 1
                self._unlocked_done.notify_all()
        with self._lock:
            # The library owns the registrations (it unregisters them at close); we only count.
            self._device_buffers[buffer_id.value] = self._device_buffers.get(buffer_id.value, 0) + 1
        return buffer_id.value, offset.value

    def _unregister_locked(self, buf):
        buffer_id = buf.id if isinstance(buf, HostBuffer) else int(buf)
        _lib.check(self._c.tier_buffer_unregister(self._session, buffer_id),
                   "unregistering buffer %d" % buffer_id)
        if isinstance(buf, HostBuffer):
            buf._invalidate()
        self._device_buffers.pop(buffer_id, None)

    def unregister(self, buffer):
        """Waits for the session's jobs, then drops the buffer (a HostBuffer or a buffer id)."""
        with self._lock:
            self._check_locked()
            self._unregister_locked(buffer)

    # ---- jobs: low level --------------------------------------------------------------------

    def _submit_offload_locked(self, buffer_id, offset, length, stream_ptrs, hint, keep,
                               on_done=None, user=False):
        options, _streams = _offload_options(stream_ptrs, hint)  # (_streams: alive for the call)
        obj = _lib.c_object_id()
        job = _lib.c_job_id()
        _lib.check(self._c.tier_offload(self._session, int(buffer_id), int(offset), int(length),
                                        ctypes.byref(options), ctypes.byref(obj),
                                        ctypes.byref(job)),
                   "offload of %d bytes from buffer %d" % (length, buffer_id))
        record = _Job(job.value, "offload of %d bytes (object %d, job %d)" % (
            length, obj.value, job.value), keep, on_done, user, obj.value, length)
        self._inflight[record.id] = record
        return obj.value, record

    def _submit_reload_locked(self, object_id, buffer_id, offset, length, stream_ptr, free_after,
                              keep=None, on_done=None, user=False, defer=False):
        options = _lib.new_struct(_lib.ReloadOptions)
        options.flags = ((_lib.TIER_RELOAD_FREE_AFTER if free_after else 0)
                         | (_lib.TIER_RELOAD_DEFER_WAIT if defer else 0))
        options.consumer_stream = stream_ptr
        job = _lib.c_job_id()
        _lib.check(self._c.tier_reload(self._session, int(object_id), int(buffer_id), int(offset),
                                       int(length), ctypes.byref(options), ctypes.byref(job)),
                   "reload of object %d" % object_id)
        record = _Job(job.value, "reload of object %d (%d bytes, job %d)" % (
            object_id, length, job.value), keep, on_done, user, object_id, length)
        self._inflight[record.id] = record
        return record

    def _submit_free_locked(self, object_id, on_done=None, user=False):
        job = _lib.c_job_id()
        _lib.check(self._c.tier_free(self._session, int(object_id), ctypes.byref(job)),
                   "free of object %d" % object_id)
        record = _Job(job.value, "free of object %d (job %d)" % (object_id, job.value), None,
                      on_done, user, object_id)
        self._inflight[record.id] = record
        return record

    def offload_buffer(self, buffer, offset, length, producer_streams=None, next_use_hint=0):
        """tier_offload: copies buffer[offset, +length) into a new daemon object. Returns
        (object id, job id); wait for the job before changing the bytes."""
        buffer_id = buffer.id if isinstance(buffer, HostBuffer) else int(buffer)
        if not isinstance(buffer, HostBuffer):
            _refuse_in_capture(None, "offload_buffer() of device memory")
        ptrs = [_stream_ptr(s) for s in producer_streams] if producer_streams else None
        with self._lock:
            self._check_locked()
            obj, job = self._submit_offload_locked(buffer_id, offset, length, ptrs, next_use_hint,
                                                   None, user=True)
        return obj, job.id

    def reload_buffer(self, object_id, buffer, offset, length, consumer_stream=None,
                      free_after=False):
        """tier_reload: copies the object (length must equal its length) into buffer at offset.
        Returns the job id."""
        buffer_id = buffer.id if isinstance(buffer, HostBuffer) else int(buffer)
        if not isinstance(buffer, HostBuffer):
            _refuse_in_capture(None, "reload_buffer() into device memory")
        with self._lock:
            self._check_locked()
            job = self._submit_reload_locked(object_id, buffer_id, offset, length,
                                             _stream_ptr(consumer_stream), free_after, user=True)
        return job.id

    # ---- jobs: batches ------------------------------------------------------------------------

    @property
    def device_direct(self):
        """How CUDA tensors travel: True once tierd's GPU engine copied one, False once the
        client knows it cannot (tierd runs the host engine, or libtierclient has no GPU
        support: staged through host memory), None until the first CUDA tensor."""
        return self._device_direct

    @property
    def batch_limit(self):
        """Jobs per batch call: min(the session's ring_entries, 1024). Larger batches given to the
        *_batch methods are split into several calls of at most this many jobs."""
        return self._batch_limit

    def _chunks(self, count):
        """(start, end) of the consecutive calls a batch of `count` jobs is split into."""
        step = self._batch_limit
        return [(lo, min(lo + step, count)) for lo in range(0, count, step)]

    def _offload_batch_locked(self, rows, stream_ptrs, keeps=None, on_dones=None, user=False):
        """One tier_offload_batch (at most batch_limit rows of (buffer id, offset, length,
        next_use_hint)), all sharing the producer streams. Returns (object id, _Job) per row. A
        batch of one is a plain tier_offload (the same job)."""
        n = len(rows)
        keeps = keeps or [None] * n
        on_dones = on_dones or [None] * n
        if n == 1:
            buffer_id, offset, length, hint = rows[0]
            return [self._submit_offload_locked(buffer_id, offset, length, stream_ptrs, hint,
                                                keeps[0], on_dones[0], user)]
        options, _streams = _offload_options(stream_ptrs, 0)  # (_streams: alive for the call)
        jobs = _lib.new_batch(n)
        for job, (buffer_id, offset, length, hint) in zip(jobs, rows):
            job.buffer = int(buffer_id)
            job.offset = int(offset)
            job.len = int(length)
            job.next_use_hint = int(hint)
        _lib.check(self._c.tier_offload_batch(self._session, jobs, n, ctypes.byref(options)),
                   "batch of %d offloads" % n)
        out = []
        for i, job in enumerate(jobs):
            record = _Job(job.job, "offload of %d bytes (object %d, job %d, in a batch of %d)" % (
                job.len, job.object, job.job, n), keeps[i], on_dones[i], user, job.object, job.len)
            self._inflight[record.id] = record
            out.append((job.object, record))
        return out

    def _reload_batch_locked(self, rows, stream_ptr, keeps=None, on_dones=None, user=False,
                             defer=False):
        """One tier_reload_batch (at most batch_limit rows of (object id, buffer id, offset,
        length, free_after)) for one consumer stream. Returns a _Job per row. A batch of one is a
        plain tier_reload (the same job). defer: TIER_RELOAD_DEFER_WAIT (the stream waits only
        where tier_stream_wait_reload puts the wait)."""
        n = len(rows)
        keeps = keeps or [None] * n
        on_dones = on_dones or [None] * n
        if n == 1:
            object_id, buffer_id, offset, length, free_after = rows[0]
            return [self._submit_reload_locked(object_id, buffer_id, offset, length, stream_ptr,
                                               free_after, keeps[0], on_dones[0], user, defer)]
        options = _lib.new_struct(_lib.ReloadOptions)
        options.consumer_stream = stream_ptr
        options.flags = _lib.TIER_RELOAD_DEFER_WAIT if defer else 0
        jobs = _lib.new_batch(n)
        for job, (object_id, buffer_id, offset, length, free_after) in zip(jobs, rows):
            job.object = int(object_id)
            job.buffer = int(buffer_id)
            job.offset = int(offset)
            job.len = int(length)
            job.flags = _lib.TIER_RELOAD_FREE_AFTER if free_after else 0
        _lib.check(self._c.tier_reload_batch(self._session, jobs, n, ctypes.byref(options)),
                   "batch of %d reloads" % n)
        out = []
        for i, job in enumerate(jobs):
            record = _Job(job.job, "reload of object %d (%d bytes, job %d, in a batch of %d)" % (
                job.object, job.len, job.job, n), keeps[i], on_dones[i], user, job.object,
                job.len)
            self._inflight[record.id] = record
            out.append(record)
        return out

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
        rows = []
        for item in jobs:
            item = tuple(item)
            if len(item) not in (3, 4):
                raise ValueError("offload_buffer_batch: each job is (buffer, offset, length"
                                 "[, next_use_hint]), got %r" % (item,))
            buffer, offset, length = item[:3]
            hint = item[3] if len(item) == 4 else 0
            rows.append((buffer.id if isinstance(buffer, HostBuffer) else int(buffer),
                         int(offset), int(length), int(hint)))
        ptrs = [_stream_ptr(s) for s in producer_streams] if producer_streams else None
        out = []
        with self._lock:
            self._check_locked()
            for lo, hi in self._chunks(len(rows)):
                try:
                    submitted = self._offload_batch_locked(rows[lo:hi], ptrs, user=True)
                except errors.TierError as e:
                    e.submitted = out
                    raise
                out.extend((obj, job.id) for obj, job in submitted)
        return out

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
        rows = []
        for item in jobs:
            item = tuple(item)
            if len(item) not in (4, 5):
                raise ValueError("reload_buffer_batch: each job is (object, buffer, offset, "
                                 "length[, free_after]), got %r" % (item,))
            object_id, buffer, offset, length = item[:4]
            free = bool(free_after) or (len(item) == 5 and bool(item[4]))
            rows.append((int(object_id), buffer.id if isinstance(buffer, HostBuffer)
                         else int(buffer), int(offset), int(length), free))
        ptr = _stream_ptr(consumer_stream)
        out = []
        with self._lock:
            self._check_locked()
            for lo, hi in self._chunks(len(rows)):
                try:
                    submitted = self._reload_batch_locked(rows[lo:hi], ptr, user=True)
                except errors.TierError as e:
                    e.submitted = out
                    raise
                out.extend(job.id for job in submitted)
        return out

    # ---- named, persistent objects (tier.h) ---------------------------------------------------

    def offload_persistent(self, name, buffer, offset, length, producer_streams=None, keep=None):
        """tier_offload_persistent: like offload_buffer, into a new persistent object `name` (in
        the namespace of this process's uid) that outlives the session. Returns (object id, job
        id). AlreadyExists when the name is taken; ResourceExhausted past the uid's quota.
        `keep`: anything to hold alive until the job completed (a source tensor)."""
        buffer_id = buffer.id if isinstance(buffer, HostBuffer) else int(buffer)
        if not isinstance(buffer, HostBuffer):
            _refuse_in_capture(None, "offload_persistent() of device memory")
        options, _streams = _offload_options(
            [_stream_ptr(s) for s in producer_streams] if producer_streams else None, 0)
        obj = _lib.c_object_id()
        job = _lib.c_job_id()
        with self._lock:
            self._check_locked()
            _lib.check(self._c.tier_offload_persistent(
                self._session, name.encode(), int(buffer_id), int(offset), int(length),
                ctypes.byref(options), ctypes.byref(obj), ctypes.byref(job)),
                "persistent offload of %d bytes as %r" % (length, name))
            record = _Job(job.value, "offload of %d bytes as %r (object %d, job %d)" % (
                length, name, obj.value, job.value), keep, None, True, obj.value, length)
            self._inflight[record.id] = record
        return obj.value, job.value

    def stream_wait_offload(self, job_id, stream=None):
        """tier_stream_wait_offload: makes `stream` (a torch.cuda.Stream or a raw pointer; None:
        the current stream) wait on the GPU until offload `job_id` has read its source, so work
        queued on it afterwards may overwrite the source. No host round trip."""
        if stream is None:
            stream = _torch().cuda.current_stream()
        _refuse_in_capture(getattr(stream, "device", None), "stream_wait_offload()")
        with self._lock:
            self._check_locked()
            _lib.check(self._c.tier_stream_wait_offload(self._session, int(job_id),
                                                        ctypes.c_void_p(_stream_ptr(stream))),
                       "stream wait for offload job %d" % job_id)

    def open_object(self, name):
        """tier_object_open: (object id, length) of the persistent object `name`, for
        reload_buffer (and free, which deletes it). NotFound."""
        obj = _lib.c_object_id()
        length = ctypes.c_uint64()
        with self._lock:
            self._check_locked()
            _lib.check(self._c.tier_object_open(self._session, name.encode(), ctypes.byref(obj),
                                                ctypes.byref(length)),
                       "open of persistent object %r" % name)
        return obj.value, length.value

    def delete_object(self, name, uid=None):
        """tier_object_delete: deletes the persistent object `name` (of `uid`: root only; None:
        this process's own). NotFound."""
        with self._lock:
            self._check_locked()
            _lib.check(self._c.tier_object_delete(self._session, name.encode(),
                                                  0xFFFFFFFF if uid is None else int(uid)),
                       "delete of persistent object %r" % name)

    def object_info(self, name):
        """tier_object_stat: the :class:`ObjectInfo` of the persistent object `name`, binding
        nothing. NotFound (also before its offload has begun)."""
        info = _lib.new_struct(_lib.ObjectInfo)
        with self._lock:
            self._check_locked()
            _lib.check(self._c.tier_object_stat(self._session, name.encode(), ctypes.byref(info)),
                       "stat of persistent object %r" % name)
        return ObjectInfo(info.len, bool(info.flags & _lib.TIER_OBJECT_READY),
                          bool(info.flags & _lib.TIER_OBJECT_DURABLE),
                          bool(info.flags & _lib.TIER_OBJECT_JOURNALED))

    def release_object(self, object_id):
        """tier_object_release: drops this session's id of a persistent object (from open_object
        or offload_persistent) once the jobs using it completed; the object stays. A session holds
        at most 4096 such ids. NotFound."""
        with self._lock:
            self._check_locked()
            _lib.check(self._c.tier_object_release(self._session, int(object_id)),
                       "release of object id %d" % object_id)

    def free(self, object_id):
        """tier_free: drops the object once jobs using it finish. Returns the job id."""
        with self._lock:
            self._check_locked()
            return self._submit_free_locked(object_id, user=True).id

    def wait(self, job_id, timeout_ms=-1):
        """Waits for a job submitted with the low-level API and raises its error, if it failed
        (tier_job_wait). A result can be taken once (here or from poll())."""
        with self._lock:
            self._check_locked()
            job = self._unwaited.pop(job_id, None)
            if job is None:
                job = self._inflight.get(job_id)
                if job is None or not job.user:
                    raise errors.NotFound(errors.NOT_FOUND,
                                          "job %d is unknown or was already waited for" % job_id)
                self._wait_job_locked(job, timeout_ms)
                self._unwaited.pop(job_id, None)
        err = job.error()
        if err is not None:
            raise err

    def poll(self, max_completions=_POLL_BATCH):
        """Low-level jobs that finished and were not waited for, without blocking (tier_poll)."""
        with self._lock:
            self._check_locked()
            self._reap_locked()
            out = []
            for job_id in list(self._unwaited)[:max_completions]:
                job = self._unwaited.pop(job_id)
                out.append(Completion(job.id, job.object, job.length, job.status))
            return out

    def collect(self):
        """Reaps finished jobs (releasing their sources and staging buffers) and runs work queued
        by finalizers (frees of dropped handles). Never blocks on the daemon."""
        with self._lock:
            self._check_locked()
            self._reap_locked()

    def synchronize(self):
        """Waits for every job this client has in flight (their errors go to their owners)."""
        with self._lock:
            self._check_locked()
            for job in list(self._inflight.values()):
                self._wait_job_locked(job, -1)
            self._check_locked()  # run what the callbacks queued (frees of dropped handles)
            for job in list(self._inflight.values()):
                self._wait_job_locked(job, -1)

    @property
    def jobs_in_flight(self):
        with self._lock:
            return len(self._inflight)

    @property
    def staging_bytes(self):
        """Host memory this client holds as staging buffers (in use or idle)."""
        with self._lock:
            return self._staging.total_bytes

    # ---- completions ------------------------------------------------------------------------

    def _finish_locked(self, job, status, message):
        job.status = int(status)
        job.message = message
        callback, job.on_done = job.on_done, None
        if job.user:
            self._unwaited[job.id] = job
        try:
            if callback is not None:
                callback(job)
        finally:
            job.keep = None  # the source / staging buffer is no longer the job's

    def _reap_locked(self):
        """Takes every finished job's result from the library (tier_poll); never blocks."""
        batch = self._poll_batch
        count = ctypes.c_size_t()
        while True:
            _lib.check(self._c.tier_poll(self._session, batch, _POLL_BATCH, ctypes.byref(count)))
            for i in range(count.value):
                c = batch[i]
                job = self._inflight.pop(c.job, None)
                if job is not None:
                    self._finish_locked(job, c.status, "%s from tierd for job %d" % (
                        errors.code_name(c.status), c.job))
            if count.value < _POLL_BATCH:
                return

    def _wait_job_locked(self, job, timeout_ms):
        """Waits for one job and records its result (raises only DeadlineExceeded)."""
        if job.status is not None:
            return job.status
        status = self._c.tier_job_wait(self._session, job.id, int(timeout_ms))
        if status == errors.DEADLINE_EXCEEDED and timeout_ms >= 0:
            raise errors.DeadlineExceeded(errors.DEADLINE_EXCEEDED,
                                          "%s not done within %d ms" % (job.what, timeout_ms))
        message = _lib.last_error() if status != errors.OK else ""
        self._inflight.pop(job.id, None)
        self._finish_locked(job, status, message)
        return job.status

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
        return self._offload(tensor, streams, next_use_hint, retain_on_failure)

    def _offload(self, tensor, streams, hint, retain_on_failure):
        """offload(); with retain_on_failure, a failed offload keeps its source (the CUDA tensor or
        the staging buffer) in the handle, and reloads are served from it (tier.torch uses this
        so that a full pool degrades to "not offloaded" instead of losing activations)."""
        torch = _torch()
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("offload() takes a torch.Tensor, got %s" % type(tensor).__name__)
        if tensor.layout != torch.strided:
            raise TypeError("offload() takes dense (strided) tensors, got %s" % tensor.layout)
        _refuse_dtensor(tensor, "offload()")
        _refuse_in_capture(tensor.device, "offload()")
        t = tensor.detach()
        nbytes = t.numel() * t.element_size()
        handle = Handle(self, None, None, t.shape, t.dtype, t.device, nbytes, direct=False)
        if nbytes == 0:
            return handle
        if t.device.type == "cpu":
            return self._offload_staged(handle, t, hint, retain_on_failure, None)
        if t.device.type == "cuda":
            if self._device_direct is None and self.engine == "host":
                self._no_device_direct("tierd runs the host engine")
            if self._device_direct is not False:
                if self._offload_cuda(handle, t, streams, hint, retain_on_failure):
                    return handle
            return self._offload_staged(handle, t, hint, retain_on_failure, streams)
        raise TypeError("offload() supports cpu and cuda tensors, not %s" % t.device.type)

    def stage_offload(self, tensor):
        """A CPU tensor's offload in two steps, for batching without changing what is offloaded:
        its bytes are staged now (the tensor may change right after) and the job is submitted
        later by :meth:`submit_staged`, with others as one batch. Returns (handle, staging
        buffer or None for an empty tensor); until submitted, the staging buffer is the
        caller's (give it back with staging_release if it is never submitted)."""
        t = tensor.detach()
        nbytes = t.numel() * t.element_size()
        handle = Handle(self, None, None, t.shape, t.dtype, t.device, nbytes, direct=False)
        if nbytes == 0:
            return handle, None
        return handle, self._stage(handle, t, None)

    def submit_staged(self, items, retain_on_failure):
        """Submits [(handle, staging)] from stage_offload as batches of host jobs (split at
        batch_limit); from here each staging buffer belongs to its job. If this raises, the
        items whose handle has no job (``handle._job is None``) were not submitted: their
        staging buffers are still the caller's."""
        items = [(h, s) for h, s in items if s is not None]
        if not items:
            return
        rows = [(staging.id, 0, handle.nbytes, 0) for handle, staging in items]
        stagings = [staging for _, staging in items]
        dones = [self._staged_offload_done(handle, staging, retain_on_failure)
                 for handle, staging in items]
        with self._lock:
            self._check_locked()
            for lo, hi in self._chunks(len(rows)):
                jobs = self._offload_batch_locked(rows[lo:hi], None, stagings[lo:hi],
                                                  dones[lo:hi])
                for (handle, _), (obj, job) in zip(items[lo:hi], jobs):
                    handle._object, handle._job = obj, job

    def staging_acquire(self, nbytes):
        with self._lock:
            self._check_locked()
            self._reap_locked()  # completed jobs give their staging buffers back first
            return self._staging.acquire(nbytes)

    def staging_release(self, staging):
        with self._lock:
            self._staging.release(staging)

    def _offload_staged(self, handle, t, hint, retain_on_failure, streams):
        """Through a staging buffer: CPU tensors, and CUDA tensors when the daemon has no GPU
        engine (then the copy runs on the current stream after the producer streams, and copy_
        into pageable memory returns only when the bytes are on the host)."""
        staging = self._stage(handle, t, streams)
        done = self._staged_offload_done(handle, staging, retain_on_failure)
        try:
            with self._lock:
                self._check_locked()
                obj, job = self._submit_offload_locked(staging.id, 0, handle.nbytes, None, hint,
                                                       staging, done)
                handle._object, handle._job = obj, job
        except BaseException:
            self.staging_release(staging)
            raise
        return handle

    def _stage(self, handle, t, streams):
        """A staging buffer holding t's bytes (a CUDA t is copied on the current stream after the
        producer streams; copy_ into pageable memory returns once the bytes are on the host)."""
        torch = _torch()
        nbytes = handle.nbytes
        if t.device.type == "cuda":
            cur = torch.cuda.current_stream(t.device)
            for s in streams or ():
                _wait_stream(cur, s)
        staging = self.staging_acquire(nbytes)
        try:
            with torch.no_grad():
                if t.device.type == "cuda":
                    with torch.cuda.device(t.device):
                        _staging_view(staging, t.dtype, t.shape, nbytes).copy_(t)
                else:
                    _staging_view(staging, t.dtype, t.shape, nbytes).copy_(t)  # any strides
        except BaseException:
            self.staging_release(staging)
            raise
        return staging

    def _staged_offload_done(self, handle, staging, retain_on_failure):
        """The completion callback of a staged offload."""
        weak_handle = weakref.ref(handle)

        def done(job):
            # The staging buffer was the job's until now; it goes back to the pool, or stays with
            # the handle as the only copy of the data if the offload failed and that was asked.
            h = weak_handle() if retain_on_failure and job.status != errors.OK else None
            if h is not None:
                h._fallback = staging
            else:
                self._staging.release(staging)
        return done

    def _no_device_direct(self, why):
        if self._device_direct is None:
            warnings.warn("%s: CUDA tensors are staged through host memory (synchronous copies)"
                          % why, RuntimeWarning, stacklevel=4)
        self._device_direct = False

    def _keep_on_gpu(self, handle, src, producers):
        """A CUDA tensor that cannot be one job (the library answered OutOfRange: it spans two
        physical allocations, e.g. pages of an expandable segment it could not register as one):
        it stays on the GPU, correct but not offloaded, and reload() hands it back once
        `producers` are followed. Warns once per client."""
        if not self._warned_kept:
            self._warned_kept = True
            # (stacklevel: the caller of offload() / offload_batch(), as before this helper.)
            warnings.warn("tier: a tensor over GPU memory that cannot be registered as one range "
                          "(pages of an expandable segment) stays on the GPU (not offloaded)",
                          RuntimeWarning,
                          stacklevel=5)
        handle._kept = (src, producers)
        handle._direct = True

    def _offload_cuda(self, handle, t, streams, hint, retain_on_failure):
        """The GPU engine path; False if the library has no GPU support (then staging is used)."""
        torch = _torch()
        device = t.device
        cur = torch.cuda.current_stream(device)
        producers = list(streams) if streams else [cur]
        src = t
        if not t.is_contiguous():
            # Gather on the current stream, after every producer stream: the gather is then the
            # only producer of the bytes the daemon copies.
            for s in producers:
                _wait_stream(cur, s)
            with torch.no_grad(), torch.cuda.device(device):
                src = t.contiguous()
            producers = [cur]
        try:
            buffer_id, offset = self.register_device(src.data_ptr(), handle.nbytes)
        except errors.Unimplemented:
            self._no_device_direct("libtierclient has no GPU support")
            return False
        except errors.OutOfRange:
            self._keep_on_gpu(handle, src, producers)
            return True
        self._device_direct = True
        ptrs = [_stream_ptr(s) for s in producers]
        weak_handle = weakref.ref(handle)

        def done(job):
            if retain_on_failure and job.status != errors.OK:
                h = weak_handle()
                if h is not None:
                    h._fallback = src  # intact: nothing else writes it (autograd saved it)
        with self._lock:
            self._check_locked()
            self._reap_locked()
            # The job keeps the source (and the tensor it came from) alive until the daemon's copy
            # completed: dropping the tensor and the handle meanwhile cannot free memory under it.
            obj, job = self._submit_offload_locked(buffer_id, offset, handle.nbytes, ptrs, hint,
                                                   (src, t), done)
            handle._object, handle._job = obj, job
            handle._direct = True
        return True

    def release_sources(self, handles, stream):
        """GPU-engine offloads still in flight: hands their sources back in stream order instead
        of when the host sees the copies complete. `stream` (the one the sources were allocated
        and produced on) waits on the GPU until the newest of these offloads has read its
        source; the offload tickets of one GPU complete in order (one offload_done counter per
        session and GPU), so that covers the older ones too. Then the jobs stop holding the
        sources: the caching allocator may hand the memory to work queued on `stream` from now
        on, which runs after the copies, while the host never waits. The price: such an offload
        can no longer fall back to its source if it fails (pool or quota full); its reload then
        raises. Returns how many sources were released."""
        newest = None
        todo = []
        for h in handles:
            if not h._direct or h._kept is not None or h._job is None or h._job.status is not None:
                continue  # nothing held (kept on the GPU, empty, or already complete)
            todo.append(h)
            if newest is None or h._job.id > newest._job.id:
                newest = h
        if newest is None:
            return 0
        # GPU-side wait (no host round trip); from here on the stream is ordered after every
        # copy of `todo`.
        self.stream_wait_offload(newest._job.id, stream)
        with self._lock:
            for h in todo:
                job = h._job
                if job.status is None:
                    job.keep = None      # the source (and the tensor it came from)
                    job.on_done = None   # its fallback closure held the source too
                h._released = True
        return len(todo)

    # ---- tensors, in batches -------------------------------------------------------------------

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
        return self._offload_batch(tensors, streams, next_use_hints, retain_on_failure)

    def _offload_batch(self, tensors, streams, hints, retain_on_failure):
        """offload_batch(); retain_on_failure as in _offload (tier.torch uses it)."""
        torch = _torch()
        tensors = list(tensors)
        hints = _batch_hints(hints, len(tensors))
        handles = []
        staged = []                           # (handle, tensor, hint, producer streams)
        direct = collections.OrderedDict()    # device -> [(handle, tensor, hint)]
        for tensor, hint in zip(tensors, hints):
            # Every tensor is checked before anything is submitted.
            if not isinstance(tensor, torch.Tensor):
                raise TypeError("offload_batch() takes torch.Tensors, got %s" %
                                type(tensor).__name__)
            if tensor.layout != torch.strided:
                raise TypeError("offload_batch() takes dense (strided) tensors, got %s" %
                                tensor.layout)
            if tensor.device.type not in ("cpu", "cuda"):
                raise TypeError("offload_batch() supports cpu and cuda tensors, not %s" %
                                tensor.device.type)
            _refuse_dtensor(tensor, "offload_batch()")
            t = tensor.detach()
            nbytes = t.numel() * t.element_size()
            handle = Handle(self, None, None, t.shape, t.dtype, t.device, nbytes, direct=False)
            handles.append(handle)
            if nbytes == 0:
                continue
            if t.device.type == "cpu":
                staged.append((handle, t, hint, None))
                continue
            if self._device_direct is None and self.engine == "host":
                self._no_device_direct("tierd runs the host engine")
            if self._device_direct is not False:
                direct.setdefault(t.device, []).append((handle, t, hint))
            else:
                staged.append((handle, t, hint, _streams_of_device(streams, t.device)))
        for device in set(direct) | {t.device for _, t, _, _ in staged}:
            _refuse_in_capture(device, "offload_batch()")  # once per device: it costs us
        producers = {device: _streams_of_device(streams, device) for device in direct}
        for device, items in direct.items():
            # The library may turn out to have no GPU support: those tensors are staged instead.
            staged.extend(self._offload_batch_cuda(device, items, producers[device],
                                                   retain_on_failure))
        if staged:
            self._offload_batch_staged(staged, retain_on_failure)
        return handles

    def _offload_batch_cuda(self, device, items, streams, retain_on_failure):
        """_offload_cuda for one GPU's tensors, as one batch (split at batch_limit): one ticket,
        one wait for the producer streams for all of them. Returns the items to stage instead
        (the library has no GPU support)."""
        torch = _torch()
        cur = torch.cuda.current_stream(device)
        producers = list(streams) if streams else [cur]
        if any(not t.is_contiguous() for _, t, _ in items):
            # Gather on the current stream, after every producer stream. The current stream then
            # follows every producer of the batch, so it alone is the producer of all its bytes:
            # the gathered ones and the others alike (one wait for the whole batch).
            for s in producers:
                _wait_stream(cur, s)
            with torch.no_grad(), torch.cuda.device(device):
                items = [(h, t, t if t.is_contiguous() else t.contiguous(), hint)
                         for h, t, hint in items]
            producers = [cur]
        else:
            items = [(h, t, t, hint) for h, t, hint in items]
        rows, batch, fallback = [], [], []
        for i, (handle, t, src, hint) in enumerate(items):
            try:
                buffer_id, offset = self.register_device(src.data_ptr(), handle.nbytes)
            except errors.Unimplemented:
                self._no_device_direct("libtierclient has no GPU support")
                fallback = [(h, tt, hh, streams) for h, tt, _, hh in items[i:]]
                break
            except errors.OutOfRange:
                self._keep_on_gpu(handle, src, producers)
                continue
            self._device_direct = True
            rows.append((buffer_id, offset, handle.nbytes, hint))
            batch.append((handle, t, src))
        if not batch:
            return fallback
        # Each id stays registered in tierd until a job names it, even if registering a later
        # range of the batch found its memory remapped (the library's registration holds).
        ptrs = [_stream_ptr(s) for s in producers]
        # Each job keeps its source (and the tensor it came from) alive until the daemon's copy
        # completed: dropping tensors and handles meanwhile cannot free memory under it.
        keeps = [(src, t) for _, t, src in batch]
        dones = [_cuda_offload_done(handle, src, retain_on_failure) for handle, _, src in batch]
        with self._lock:
            self._check_locked()
            self._reap_locked()
            for lo, hi in self._chunks(len(rows)):
                submitted = self._offload_batch_locked(rows[lo:hi], ptrs, keeps[lo:hi],
                                                       dones[lo:hi])
                for (handle, _, _), (obj, job) in zip(batch[lo:hi], submitted):
                    handle._object, handle._job = obj, job
                    handle._direct = True
        return fallback

    def _staged_chunks(self, items, nbytes_of):
        """Consecutive runs of items of at most batch_limit items and at most the staging
        cache's bytes (at least one item each): the staging buffers of a batch are all taken
        before it is submitted, so a large batch must not hold all of its staging memory at
        once."""
        budget = self._staging._cache_bytes
        chunk, used = [], 0
        for item in items:
            nbytes = nbytes_of(item)
            if chunk and (len(chunk) >= self._batch_limit or used + nbytes > budget):
                yield chunk
                chunk, used = [], 0
            chunk.append(item)
            used += nbytes
        if chunk:
            yield chunk

    def _offload_batch_staged(self, items, retain_on_failure):
        """_offload_staged for many tensors: each staged as it would be alone, then submitted as
        batches of host jobs."""
        for chunk in self._staged_chunks(items, lambda item: item[0].nbytes):
            stagings = []
            try:
                for handle, t, _, streams in chunk:
                    stagings.append(self._stage(handle, t, streams))
                rows = [(staging.id, 0, handle.nbytes, hint)
                        for (handle, _, hint, _), staging in zip(chunk, stagings)]
                dones = [self._staged_offload_done(handle, staging, retain_on_failure)
                         for (handle, _, _, _), staging in zip(chunk, stagings)]
                with self._lock:
                    self._check_locked()
                    submitted = self._offload_batch_locked(rows, None, stagings, dones)
            except BaseException:
                for staging in stagings:  # none was submitted: they are still ours
                    self.staging_release(staging)
                raise
            for (handle, _, _, _), (obj, job) in zip(chunk, submitted):
                handle._object, handle._job = obj, job

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
        handles = list(handles)
        self._check_reload_batch(handles, stream, free)
        out = []
        # Staged reloads hold a staging buffer each until their results are taken: bounded.
        for chunk in self._staged_chunks(handles, _staged_reload_bytes):
            out.extend(started.result()
                       for started in self.start_reloads(chunk, stream, free))
        return out

    def _check_reload_batch(self, handles, stream, free):
        """What Handle._start_reload refuses, checked for every handle before any is started."""
        seen = set()
        for h in handles:
            if not isinstance(h, Handle) or h._client is not self:
                raise ValueError("reload_batch() takes handles of this client, got %r" % (h,))
            if h._freed:
                raise errors.FailedPrecondition(errors.FAILED_PRECONDITION,
                                                "reload of a freed handle")
            if free and id(h) in seen:
                raise ValueError("reload_batch(free=True): a handle appears twice")
            if h._lost():
                h._raise_lost()
            seen.add(id(h))
            if h.device.type == "cuda":
                _consumer_stream(stream, h.device)  # refuses a stream of another device
        for h in handles:
            if h._kept is not None or h._object is None:
                continue
            if not h._direct:
                h.wait_offload()  # staged: the offload's own result comes first
            if h.failed and h._fallback is None:
                raise h._job.error()

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
        tier.torch prefetches: no side stream, no event of its own."""
        handles = list(handles)
        self._check_reload_batch(handles, stream, free)
        for device in {h.device for h in handles}:
            _refuse_in_capture(device, "reload")
        started = [None] * len(handles)
        defer = prefetch
        direct = collections.OrderedDict()  # device -> [index]
        staged = []
        for i, h in enumerate(handles):
            if h._kept is not None:
                started[i] = Ready(h._from_kept(stream, free))
            elif h._object is None:
                started[i] = Ready(h._empty(stream))
            elif h.failed:
                if h._fallback is None:
                    raise h._job.error()
                started[i] = Ready(h._from_fallback(stream))
            elif h._direct:
                direct.setdefault(h.device, []).append(i)
            else:
                staged.append(i)
        for device, indices in direct.items():
            dsts, jobs, consumer = self._reload_batch_cuda([handles[i] for i in indices], device,
                                                           stream, free, defer)
            batch = _DeferredBatch(self, jobs, consumer) if defer else None
            for i, dst in zip(indices, dsts):
                started[i] = _DeferredReload(batch, dst) if defer else Ready(dst)
        if staged:
            for i, s in zip(staged, self._reload_batch_staged([handles[i] for i in staged],
                                                              stream, free)):
                started[i] = s
        return started

    def _reload_batch_cuda(self, handles, device, stream, free, defer=False):
        """Handle._reload_cuda for one GPU's handles, as one batch (split at batch_limit).
        Returns (destinations, the jobs, the consumer stream)."""
        torch = _torch()
        stream = _consumer_stream(stream, device)
        # As in _reload_cuda: every destination is allocated on the consumer stream before the
        # batch's ticket is taken on it in tier_reload_batch, so no copy can overwrite memory
        # still in use; when it returns, `stream` waits (on the GPU) for every copy of the
        # batch, and a destination dropped early is reused only by work ordered after them.
        with torch.cuda.device(device), torch.cuda.stream(stream):
            dsts = [torch.empty(h.shape, dtype=h.dtype, device=h.device) for h in handles]
        ids = [self.register_device(dst.data_ptr(), h.nbytes) for h, dst in zip(handles, dsts)]
        rows = [(h._object, b, o, h.nbytes, free) for h, (b, o) in zip(handles, ids)]
        ptr = _stream_ptr(stream)
        submitted = []
        with self._lock:
            self._check_locked()
            self._reap_locked()
            for lo, hi in self._chunks(len(rows)):
                jobs = self._reload_batch_locked(rows[lo:hi], ptr, defer=defer)
                submitted.extend(jobs)
                for h, job in zip(handles[lo:hi], jobs):
                    h._reloads = [j for j in h._reloads if j.status is None]
                    h._reloads.append(job)
                    if free:
                        h._freed = True
        return dsts, submitted, stream

    def _reload_batch_staged(self, handles, stream, free):
        """Handle._start_reload's staging path for many handles, as batches of host jobs."""
        streams = [_consumer_stream(stream, h.device) if h.device.type == "cuda" else stream
                   for h in handles]
        stagings = []
        out = []
        try:
            for h in handles:
                stagings.append(self.staging_acquire(h.nbytes))
            with self._lock:
                self._check_locked()
                for lo, hi in self._chunks(len(handles)):
                    rows = [(h._object, staging.id, 0, h.nbytes, free)
                            for h, staging in zip(handles[lo:hi], stagings[lo:hi])]
                    jobs = self._reload_batch_locked(rows, None)
                    # Submitted: each staging buffer now belongs to its started reload.
                    for h, staging, job, s in zip(handles[lo:hi], stagings[lo:hi], jobs,
                                                  streams[lo:hi]):
                        out.append(_StagedReload(h, staging, job, s))
                        if free:
                            h._freed = True
        except BaseException:
            for staging in stagings[len(out):]:
                self.staging_release(staging)
            raise
        return out


def _refuse_in_capture(device, what):
    """tier.FailedPrecondition when `device`'s current stream (None: the current device's)
    is capturing a CUDA graph: a job's host half would not be in the graph (_cuda_graphs)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return  # no torch, no CUDA graph
    if device is None:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return
        device = torch.device("cuda", torch.cuda.current_device())
    _cuda_graphs.refuse_if_capturing(device, what)


def _refuse_dtensor(tensor, what):
    """A DTensor's data_ptr() and numel() are not those of the shard this rank holds: moving
    it as it is would read the wrong memory (FSDP2's data_ptr() is 0)."""
    from . import _dtensor
    if _dtensor.is_dtensor(tensor):
        raise TypeError("%s takes the local shard of a DTensor (t.to_local()), not the DTensor "
                        "itself (tier.torch's optimizer state offload and checkpoints do this "
                        "for you)" % what)


def _batch_hints(hints, count):
    """next_use_hints of a batch: None (0 each), one int for all, or one per job."""
    if hints is None:
        return [0] * count
    if isinstance(hints, int):
        return [int(hints)] * count
    hints = [int(h) for h in hints]
    if len(hints) != count:
        raise ValueError("%d next_use_hints for %d tensors" % (len(hints), count))
    return hints


def _streams_of_device(streams, device):
    """The producer streams of `streams` on `device` (raw stream handles count for every device);
    None when streams is None or empty (the device's current stream is then the producer)."""
    if not streams:
        return None
    mine = [s for s in streams
            if isinstance(s, int) or getattr(s, "device", None) in (None, device)]
    if not mine:
        raise ValueError("streams: none of %r is a stream of %s, where tensors of the batch are"
                         % (list(streams), device))
    return mine


def _cuda_offload_done(handle, src, retain_on_failure):
    """The completion callback of a GPU-engine offload (as in Client._offload_cuda)."""
    weak_handle = weakref.ref(handle)

    def done(job):
        if retain_on_failure and job.status != errors.OK:
            h = weak_handle()
            if h is not None:
                h._fallback = src  # intact: nothing else writes it (autograd saved it)
    return done


def _staged_reload_bytes(h):
    """Staging bytes a reload of handle h takes until its result is taken (0: none)."""
    if h._direct or h._kept is not None or h._object is None:
        return 0
    return h.nbytes


def _wait_stream(cur, stream):
    """Makes torch stream `cur` wait (on the GPU) for everything enqueued on `stream` so far."""
    torch = _torch()
    if stream is None:
        return
    if isinstance(stream, int):
        if stream == cur.cuda_stream:
            return
        stream = torch.cuda.ExternalStream(stream)
    if stream.cuda_stream != cur.cuda_stream:
        cur.wait_stream(stream)


def _consumer_stream(stream, device):
    """The torch stream a reload's destination is allocated on and used by (default: device's
    current stream). Raw handles are wrapped; a stream of another device is refused."""
    torch = _torch()
    if stream is None:
        return torch.cuda.current_stream(device)
    if isinstance(stream, int):
        return torch.cuda.ExternalStream(stream, device=device)
    if stream.device != device:
        raise ValueError("stream of %s for a tensor on %s" % (stream.device, device))
    return stream


def _staging_view(staging, dtype, shape, nbytes):
    torch = _torch()
    v = staging._uint8()[:nbytes]
    if dtype != torch.uint8:
        v = v.view(dtype)
    return v.view(shape)


class Ready:
    """A reload whose tensor is already usable (CUDA: the stream waits on the GPU)."""

    __slots__ = ("_tensor",)

    def __init__(self, tensor):
        self._tensor = tensor

    def result(self):
        return self._tensor


class _DeferredBatch:
    """The jobs of one deferred GPU reload batch (TIER_RELOAD_DEFER_WAIT) and the streams already
    made to wait for them. One ticket per chunk of the batch, so waiting on each chunk's last job
    waits for all of its copies."""

    __slots__ = ("_client", "_jobs", "_allocating", "_waited", "__weakref__")

    def __init__(self, client, jobs, allocating_stream):
        self._client = client
        self._jobs = jobs
        self._allocating = allocating_stream
        self._waited = set()  # stream pointers

    def wait_on(self, stream):
        ptr = _stream_ptr(stream)
        if ptr in self._waited:
            return
        client = self._client
        with client._lock:
            if client._session is None:
                return  # closed: every job ended, nothing left to wait for
            for lo, hi in client._chunks(len(self._jobs)):
                _lib.check(client._c.tier_stream_wait_reload(client._session,
                                                             self._jobs[hi - 1].id, ptr),
                           "ordering a prefetched reload before its use")
        self._waited.add(ptr)

    def waited(self):
        return bool(self._waited)


class _DeferredReload:
    """A prefetched GPU reload into the consumer's memory (see Client.start_reloads):
    result() orders the copy before the current stream's later work and returns the tensor."""

    __slots__ = ("_batch", "_tensor")

    def __init__(self, batch, tensor):
        self._batch = batch
        self._tensor = tensor

    def result(self):
        torch = _torch()
        stream = torch.cuda.current_stream(self._tensor.device)
        self._batch.wait_on(stream)
        if _stream_ptr(stream) != _stream_ptr(self._batch._allocating):
            self._tensor.record_stream(stream)  # allocator lifetime only: the wait orders
        return self._tensor

    def __del__(self):
        # Never taken: the allocating stream must still wait for the copy before the memory goes
        # back to its pool, or a later allocation there could be overwritten by the copy.
        batch = self._batch
        if batch is not None and not batch.waited():
            try:
                batch.wait_on(batch._allocating)
            except Exception:  # noqa: BLE001  (a closed or dead session has no copy in flight)
                pass


class _StagedReload:
    """A reload into a staging buffer: result() waits for the job and copies out."""

    def __init__(self, handle, staging, job, stream):
        self._handle = handle
        self._staging = staging
        self._job = job
        self._stream = stream
        self._tensor = None

    def result(self):
        if self._tensor is not None:
            return self._tensor
        h = self._handle
        client = h._client
        torch = _torch()
        with client._lock:
            client._check_locked()
            client._wait_job_locked(self._job, -1)
        staging, self._staging = self._staging, None
        try:
            err = self._job.error()
            if err is not None:
                if self._job.status == errors.ABORTED:
                    h.wait()  # the reload failed because the offload did: raise the offload's error
                raise err
            src = _staging_view(staging, h.dtype, h.shape, h.nbytes)
            if h.device.type == "cuda":
                # From pageable memory: copy_ returns once the bytes left the staging buffer.
                with torch.cuda.device(h.device), torch.cuda.stream(self._stream):
                    out = torch.empty(h.shape, dtype=h.dtype, device=h.device)
                    out.copy_(src)
            else:
                out = src.clone()
        finally:
            client.staging_release(staging)
        self._tensor = out
        return out

    def __del__(self):
        staging = getattr(self, "_staging", None)
        if staging is None:
            return
        client = self._handle._client
        job = self._job

        def release():
            if job.status is not None:
                client._staging.release(staging)
            else:
                job.on_done = lambda j: client._staging.release(staging)
        try:
            client._run_or_defer(release)
        except Exception:
            pass


class Handle:
    """Data offloaded from a tensor. ``reload()`` as often as needed; ``free()`` or drop it."""

    def __init__(self, client, object_id, job, shape, dtype, device, nbytes, direct):
        self._client = client
        self._generation = client.generation  # the session its object lives in
        self._object = object_id
        self._job = job            # the offload's job record (None for an empty tensor)
        self._direct = direct      # CUDA through the GPU engine (no host staging)
        self._reloads = []         # GPU reload jobs not yet known to be done
        self._freed = False
        self._fallback = None      # the data, kept after a failed offload (retain_on_failure)
        self._kept = None          # (tensor, producer streams): not offloadable, kept on the GPU
        self._released = False     # the source went back in stream order (release_sources)
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device
        self.nbytes = nbytes

    def __repr__(self):
        state = "freed" if self._freed else ("done" if self._job is None or
                                             self._job.status is not None else "in flight")
        return "Handle(object=%s, shape=%s, dtype=%s, device=%s, %s)" % (
            self._object, list(self.shape), self.dtype, self.device, state)

    @property
    def object_id(self):
        return self._object

    @property
    def freed(self):
        return self._freed

    @property
    def failed(self):
        """True once the offload is known to have failed (see wait() for the error)."""
        return self._job is not None and self._job.status not in (None, errors.OK)

    @property
    def client(self):
        return self._client

    @property
    def direct(self):
        """True when tierd's GPU engine copies the data (a CUDA tensor, no host staging)."""
        return self._direct

    @property
    def stayed_on_gpu(self):
        """True for a CUDA tensor that could not be one job (memory the library cannot register
        as one range): it was not offloaded, and reloads hand it back as it is."""
        return self._kept is not None

    @property
    def submitted(self):
        """True once the offload is a job of tierd (False: an empty tensor, one that stayed on
        the GPU, or a staged offload not submitted yet)."""
        return self._job is not None

    @property
    def in_flight(self):
        """True while the offload is submitted and its result not yet known to the client
        (reads the client's records only: no reaping, no lock; see done())."""
        return self._job is not None and self._job.status is None

    @property
    def released(self):
        """True once the offload's source went back in stream order
        (:meth:`Client.release_sources`)."""
        return self._released

    def done(self):
        """True once the offload completed (successfully or not). Never blocks."""
        if self._job is None or self._job.status is not None:
            return True
        with self._client._lock:
            self._client._check_locked()
            self._client._reap_locked()
        return self._job.status is not None

    def wait_offload(self, timeout_ms=-1):
        """Waits for the offload's result without raising it (see wait(), failed)."""
        if self._job is None or self._job.status is not None:
            return
        c = self._client
        with c._lock:
            c._check_locked()
            c._wait_job_locked(self._job, timeout_ms)

    def wait(self, timeout_ms=-1):
        """Waits for the offload (and reloads still in flight on the GPU); raises the first error
        (tier.ResourceExhausted when the quota or the pool is full, ...)."""
        c = self._client
        with c._lock:
            c._check_locked()
            if self._job is not None:
                c._wait_job_locked(self._job, timeout_ms)
            reloads, self._reloads = self._reloads, []
            for job in reloads:
                c._wait_job_locked(job, timeout_ms)
        if self._job is not None and self._job.error() is not None:
            raise self._job.error()
        for job in reloads:
            if job.error() is not None:
                raise job.error()

    def reload(self, stream=None, free=False):
        """A new tensor with the offloaded data (same shape, dtype and device; contiguous).

        CUDA: allocated on ``stream`` (default: the current stream), which already waits on the GPU
        for the copy when this returns: use it on that stream at once, no host wait. CPU: returns
        when the data is there. ``free=True`` drops the object after this reload.
        """
        return self._start_reload(stream, free).result()

    def _empty(self, stream):
        torch = _torch()
        if self.device.type == "cuda":
            with torch.cuda.device(self.device), torch.cuda.stream(
                    _consumer_stream(stream, self.device)):
                return torch.empty(self.shape, dtype=self.dtype, device=self.device)
        return torch.empty(self.shape, dtype=self.dtype, device=self.device)

    def _from_fallback(self, stream):
        torch = _torch()
        data = self._fallback
        if isinstance(data, HostBuffer):
            out = self._empty(stream)
            with torch.no_grad():
                if self.device.type == "cuda":
                    with torch.cuda.device(self.device), torch.cuda.stream(
                            _consumer_stream(stream, self.device)):
                        out.copy_(_staging_view(data, self.dtype, self.shape, self.nbytes))
                else:
                    out.copy_(_staging_view(data, self.dtype, self.shape, self.nbytes))
            return out
        # The source tensor itself (a contiguous CUDA tensor): used where it is, like the data
        # of an offload still in flight (see pending_source).
        return data.view(self.shape)

    def _lost(self):
        """The object lived in a tierd that went away (the client reconnected since): its data
        is gone, and its id may name another object of the new session."""
        return (self._object is not None and self._kept is None and self._fallback is None
                and self._generation != self._client.generation)

    def _raise_lost(self):
        raise errors.DataLoss(errors.DATA_LOSS, (
            "object %d (%d bytes) was offloaded to a tierd that went away (this client has "
            "reconnected since): its data is lost" % (self._object, self.nbytes)))

    def _start_reload(self, stream=None, free=False):
        """reload() in two steps: submit now, result() later (prefetch)."""
        if self._freed:
            raise errors.FailedPrecondition(errors.FAILED_PRECONDITION,
                                            "reload of a freed handle")
        if self._lost():
            self._raise_lost()
        _refuse_in_capture(self.device, "reload()")
        c = self._client
        if self._kept is not None:
            return Ready(self._from_kept(stream, free))
        if self._object is None:
            return Ready(self._empty(stream))
        if not self._direct:
            self.wait_offload()  # staged: the offload's own result comes first
        if self.failed:
            if self._fallback is not None:
                return Ready(self._from_fallback(stream))
            raise self._job.error()
        if self._direct:
            return Ready(self._reload_cuda(stream, free))
        if self.device.type == "cuda":
            stream = _consumer_stream(stream, self.device)
        staging = c.staging_acquire(self.nbytes)
        try:
            with c._lock:
                c._check_locked()
                job = c._submit_reload_locked(self._object, staging.id, 0, self.nbytes, None, free)
        except BaseException:
            c.staging_release(staging)
            raise
        if free:
            self._freed = True
        return _StagedReload(self, staging, job, stream)

    def _from_kept(self, stream, free):
        src, producers = self._kept
        stream = _consumer_stream(stream, self.device)
        for p in producers:
            _wait_stream(stream, p)
        if free:
            self._kept = None
            self._freed = True
        return src.view(self.shape)

    def _reload_cuda(self, stream, free):
        torch = _torch()
        c = self._client
        stream = _consumer_stream(stream, self.device)
        # The destination is allocated on the consumer stream: the caching allocator only hands
        # out memory whose earlier users are ordered before this point of `stream`, and the
        # daemon's H2D copy waits for a ticket the library writes on `stream` in tier_reload. So the
        # copy cannot overwrite memory still in use, and nothing is host-synchronized.
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            dst = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        buffer_id, offset = c.register_device(dst.data_ptr(), self.nbytes)
        with c._lock:
            c._check_locked()
            c._reap_locked()
            # When tier_reload returns, `stream` already waits (on the GPU) for the copy's
            # completion value: work enqueued on it from now on sees the data. If dst is dropped
            # early its memory can only be reused by work on `stream`, which is ordered after the
            # copy as well.
            job = c._submit_reload_locked(self._object, buffer_id, offset, self.nbytes,
                                          _stream_ptr(stream), free)
            self._reloads = [j for j in self._reloads if j.status is None]
            self._reloads.append(job)
        if free:
            self._freed = True
        return dst

    def stream_wait_offload(self, stream):
        """Makes `stream` wait (on the GPU, no host wait) until a GPU-engine offload still in
        flight has read its source, so work queued on it afterwards may overwrite the source
        (:meth:`Client.stream_wait_offload`). Nothing to do otherwise (staged, kept, done)."""
        if not self._direct or not self.in_flight:
            return
        self._client.stream_wait_offload(self._job.id, stream)

    def pending_source(self, reap=True):
        """CUDA: the source tensor while the offload is still in flight (its data is intact and
        alive), or the one kept after a failed offload; else None. Lets a consumer skip a reload of
        data that never left the GPU. reap=False: the caller reaped just before (collect())."""
        if not self._direct or self._job is None:
            return None
        if self._job.status is not None:
            return self._fallback
        c = self._client
        with c._lock:
            c._check_locked()
            if reap:
                c._reap_locked()
            keep = self._job.keep
            if self._job.status is not None or keep is None:
                return self._fallback
            return keep[0]

    def free(self):
        """Drops the object (its memory returns to the pool once jobs using it finish). The source
        of an offload still in flight stays owned by that job until it completes (unless
        :meth:`Client.release_sources` handed it back in stream order)."""
        if self._freed:
            return
        self._freed = True
        c = self._client
        with c._lock:
            if c._closed:
                return
            c._check_locked()
            self._free_locked()

    def _free_locked(self):
        c = self._client
        lost = self._lost()
        self._kept = None
        fallback, self._fallback = self._fallback, None
        if isinstance(fallback, HostBuffer):
            c._staging.release(fallback)
        if self._object is None or lost:
            return  # (lost: its tierd freed it; the id may be another object's now)
        offload = self._job
        if offload is not None and offload.status is not None and offload.status != errors.OK:
            return  # a failed offload leaves no object behind

        def report(job):
            # NOT_FOUND is expected when the offload failed meanwhile; UNAVAILABLE: daemon gone
            # (it freed everything).
            if job.status in (errors.OK, errors.UNAVAILABLE):
                return
            if job.status == errors.NOT_FOUND and offload is not None and offload.status != 0:
                return
            warnings.warn("tier: %s failed: %s" % (job.what, job.message), RuntimeWarning)
        c._submit_free_locked(self._object, report)

    def __del__(self):
        try:
            if self._freed or (self._object is None and self._fallback is None
                               and self._kept is None):
                return
            self._freed = True
            self._client._run_or_defer(self._free_locked)
        except Exception:  # interpreter shutdown
            pass


_default_lock = threading.Lock()
_default = None


def default_client():
    """The process's shared Client on the default socket, opened on first use (and again after a
    fork). tier.torch uses it when no client is given."""
    global _default
    with _default_lock:
        if _default is None or _default.closed or _default._pid != os.getpid():
            _default = Client(name=os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0]
                              else None)
        return _default


def _close_default():
    global _default
    with _default_lock:
        if _default is not None and _default._pid == os.getpid():
            try:
                _default.close()
            except Exception:
                pass
        _default = None


import atexit  # noqa: E402

atexit.register(_close_default)
