"""A client's session with tierd, and the next one after tierd comes back: the C session, the
one lock the client's layers work under, finalizer work queued while it is taken, the job table,
and the session-level C calls (information, buffers, persistent objects).

Lock: one per client (:attr:`Session.lock`). Every record of the client (jobs, staging buffers,
handles' state) is read and changed under it; the C library is thread-safe, the records are not.
Finalizers (``Handle.__del__``) can run anywhere, including inside the client while it holds the
lock (garbage collection); they never block on it: :meth:`run_or_defer` queues their work, and
the next :meth:`check` (every call that takes the lock) runs it.

Reconnecting: when tierd goes away the library marks the session (TIER_SESSION_DAEMON_GONE);
:meth:`maybe_reconnect` opens a session with the next tierd on the same socket, at most once per
``reconnect_interval_s``. The old session's jobs all ended in the library (UNAVAILABLE): their
results are taken, the rest end so here, the callbacks given to :meth:`on_reset` forget what
belonged to the old session (staging buffers, what the GPU path learned), and ``generation``
counts up, which is how a handle tells that its object is gone. The old C session stays open
(its host buffers may still be viewed) until close.
"""

import collections
import ctypes
import os
import threading
import time
import warnings

from . import _lib
from . import errors
from ._host_buffer import HostBuffer
from ._info import SessionInfo
from ._jobs import JobTable

_getpid = os.getpid
_monotonic = time.monotonic

# Whether this process is a fork (a session's pid is then asked on every call: the parent's
# session is not ours). In the process that opened it, no getpid() per call.
_forked = [False]


def _after_fork():
    _forked[0] = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
else:  # pragma: no cover - every POSIX Python 3.7+
    _forked[0] = True


class Session:
    """See the module docstring."""

    RECONNECT_TIMEOUT_MS = 500  # one attempt's connect limit, so a call is never held long

    def __init__(self, socket=None, name=None, quota_bytes=0, ring_entries=0,
                 connect_timeout_ms=0, reconnect=True, reconnect_interval_s=1.0,
                 daemon_wait_ms=0):
        self.lib = _lib.load()
        self.c_session = None  # the C session (tier_session_t*) of the current tierd
        self.closed = True
        self.pid = os.getpid()
        # Kept for reconnecting (and the bytes alive while the options point at them).
        self._socket_bytes = os.fsencode(socket) if socket is not None else None
        self._name_bytes = name.encode() if name is not None else None
        self._quota_bytes = int(quota_bytes)
        self._ring_entries = int(ring_entries)
        self.reconnect_enabled = bool(reconnect)
        self.reconnect_interval_s = float(reconnect_interval_s)
        self._next_reconnect = 0.0
        self._dead_sessions = []  # sessions of tierds that went away: closed with the client
        self.generation = 0
        self.c_session = self._open(int(connect_timeout_ms), int(daemon_wait_ms))
        self.closed = False
        self.lock = threading.Lock()
        self._unlocked_calls = 0  # library calls made without the lock (register_device)
        self._unlocked_done = threading.Condition(self.lock)
        self._deferred = collections.deque()  # callables queued by finalizers (run under the lock)
        self._resets = []
        # A context: the lock, taken, and check() done (every call of the client starts so).
        # An attribute, not a method: `with session.checked:` (this is on every call's path).
        self.checked = _Checked(self)
        self.jobs = JobTable(self)
        with self.checked:
            self._learn_info()

    def _open(self, connect_timeout_ms, daemon_wait_ms):
        """A session with tierd. daemon_wait_ms: how long to wait for a tierd that is starting
        (0: the library's 60 s; < 0: one attempt, what a reconnect from a running trainer wants)."""
        options = _lib.new_struct(_lib.SessionOptions)
        options.socket_path = self._socket_bytes
        options.name = self._name_bytes
        options.quota_bytes = self._quota_bytes
        options.ring_entries = self._ring_entries
        options.connect_timeout_ms = int(connect_timeout_ms)
        options.daemon_wait_ms = int(daemon_wait_ms)
        session = ctypes.c_void_p()
        _lib.check(self.lib.tier_session_open(ctypes.byref(options), ctypes.byref(session)),
                   "opening a session with tierd")
        return session

    def _learn_info(self):
        info = self.info_locked()
        self.session_id = info.session_id
        self.engine = info.engine
        # Jobs per tier_offload_batch / tier_reload_batch call; larger batches go as several.
        self.batch_limit = max(1, min(info.ring_entries, _lib.TIER_MAX_BATCH_JOBS))

    def on_reset(self, fn):
        """fn() runs under the lock when what belonged to the session is gone: at a reconnect
        (before the new session is used) and at close."""
        self._resets.append(fn)

    def _reset(self):
        for fn in self._resets:
            fn()

    # ---- the lock ---------------------------------------------------------------------------

    def check_open(self):
        """Raises if the client is closed, or this process is a fork of the one that opened it."""
        if self.closed:
            raise errors.FailedPrecondition(errors.FAILED_PRECONDITION, "the client is closed")
        if os.getpid() != self.pid:
            raise errors.FailedPrecondition(
                errors.FAILED_PRECONDITION,
                "this session belongs to process %d; open a new Client after fork" % self.pid)

    def check(self):
        """What every call does first, under the lock: check_open, a reconnect when due, and
        the work finalizers queued."""
        # (On every call's path: the common case costs no method call here.)
        if self.closed or _getpid() != self.pid:
            self.check_open()
        if (self.reconnect_enabled and self.c_session is not None
                and _monotonic() >= self._next_reconnect
                and self.lib.tier_session_flags(self.c_session) & _lib.TIER_SESSION_DAEMON_GONE):
            self.maybe_reconnect()
        while self._deferred:
            fn = self._deferred.popleft()
            try:
                fn()
            except errors.TierError:
                pass

    def run_or_defer(self, fn):
        """For finalizers: runs fn under the lock if it is free, else queues it. Never blocks."""
        if self.closed:
            return
        if self.lock.acquire(blocking=False):
            try:
                if not self.closed:
                    fn()
            except errors.TierError:
                pass
            finally:
                self.lock.release()
        else:
            self._deferred.append(fn)

    # ---- reconnecting ----------------------------------------------------------------------

    def flags(self):
        return self.lib.tier_session_flags(self.c_session)

    def maybe_reconnect(self, force=False):
        """The session's tierd went away: opens a session with the next one, at most once per
        reconnect_interval_s (force: now). Under the lock. Returns True if it did."""
        if not self.reconnect_enabled or self.c_session is None:
            return False
        if not self.flags() & _lib.TIER_SESSION_DAEMON_GONE:
            return False
        now = time.monotonic()
        if not force and now < self._next_reconnect:
            return False
        self._next_reconnect = now + self.reconnect_interval_s
        try:
            session = self._open(self.RECONNECT_TIMEOUT_MS, -1)
        except errors.TierError:
            return False  # not up yet: calls go on failing with UNAVAILABLE
        self.jobs.reap()  # the old session's results (its jobs all ended)
        self.jobs.end_all(errors.UNAVAILABLE, "tierd went away")
        self._reset()
        self._dead_sessions.append(self.c_session)
        self.c_session = session
        self.generation += 1
        self._learn_info()
        warnings.warn("tier: tierd went away and is back; this client opened session %d with it. "
                      "What it had offloaded before is lost." % self.session_id, RuntimeWarning)
        return True

    # ---- closing ---------------------------------------------------------------------------

    def close(self):
        """Waits for every job (each owner learns its status; sources are released), then
        closes the C sessions. Host buffers and their views become invalid."""
        if self.closed:
            return
        with self.lock:
            if self.closed:
                return
            if os.getpid() != self.pid:
                # A forked child: the session (its ring, token, gRPC channel) is the parent's.
                self.closed = True
                self.c_session = None
                return
            while self._unlocked_calls:
                self._unlocked_done.wait()
            self.jobs.wait_all(quiet=True)
            self.closed = True
            self._deferred.clear()
            self._reset()
            session, self.c_session = self.c_session, None
            self.lib.tier_session_close(session)
            for dead in self._dead_sessions:
                self.lib.tier_session_close(dead)
            self._dead_sessions = []

    # ---- session-level C calls (under the lock unless said) ------------------------------

    def info_locked(self):
        """tier_session_get_info: a :class:`SessionInfo`."""
        info = _lib.new_struct(_lib.SessionInfo)
        _lib.check(self.lib.tier_session_get_info(self.c_session, ctypes.byref(info)))
        return SessionInfo(info.session_id, info.quota_bytes, info.ring_entries,
                           info.jobs_in_flight, info.engine.decode(), info.device_registrations,
                           info.device_extensions, info.device_exports)

    def link_rate(self, device):
        """tier_link_rate of this process's GPU `device`: (d2h, h2d) bytes/s, or None."""
        d2h = ctypes.c_double()
        h2d = ctypes.c_double()
        with self.checked:
            status = self.lib.tier_link_rate(self.c_session, int(device), ctypes.byref(d2h),
                                             ctypes.byref(h2d))
        if status == errors.NOT_FOUND:
            return None
        _lib.check(status, "reading the link rate of GPU %d" % int(device))
        if d2h.value <= 0 or h2d.value <= 0:
            return None
        return (d2h.value, h2d.value)

    def register_fd(self, fd, nbytes):
        """tier_buffer_register_fd; returns the buffer id."""
        buffer_id = _lib.c_buffer_id()
        with self.checked:
            _lib.check(self.lib.tier_buffer_register_fd(self.c_session, int(fd), int(nbytes),
                                                        ctypes.byref(buffer_id)),
                       "registering fd %d" % fd)
        return buffer_id.value

    def alloc_host_locked(self, nbytes):
        """tier_buffer_alloc_host: a :class:`HostBuffer` of this session."""
        ptr = ctypes.c_void_p()
        buffer_id = _lib.c_buffer_id()
        _lib.check(self.lib.tier_buffer_alloc_host(self.c_session, int(nbytes), ctypes.byref(ptr),
                                                   ctypes.byref(buffer_id)),
                   "allocating a host buffer of %d bytes" % nbytes)
        return HostBuffer(self, buffer_id.value, ptr.value, int(nbytes))

    def unregister_locked(self, buf):
        """tier_buffer_unregister of a HostBuffer or a buffer id (waits for the session's jobs)."""
        buffer_id = buf.id if isinstance(buf, HostBuffer) else int(buf)
        _lib.check(self.lib.tier_buffer_unregister(self.c_session, buffer_id),
                   "unregistering buffer %d" % buffer_id)
        if isinstance(buf, HostBuffer):
            buf.invalidate()

    def unregister(self, buf):
        """unregister_locked, taking the lock."""
        with self.checked:
            self.unregister_locked(buf)

    def register_device(self, device_ptr, nbytes=None):
        """tier_buffer_register_device_range: (buffer id, offset) of the range at device_ptr
        (nbytes, or None for the whole allocation). Takes the lock itself (see
        Client.register_device). The library owns the registration (it unregisters it at
        close). (Batches register inside tier_offload_ranges / tier_reload_ranges.)"""
        buffer_id = _lib.c_buffer_id()
        offset = ctypes.c_uint64()
        with self.checked:
            session = self.c_session
            self._unlocked_calls += 1
        # Outside the lock: the library is thread-safe, and a registration may take a round trip
        # to tierd (export, IPC open there) that other threads of this client need not wait for.
        # close() waits for calls like this one before it closes the session.
        try:
            status = self.lib.tier_buffer_register_device_range(
                session, int(device_ptr), 0 if nbytes is None else int(nbytes),
                ctypes.byref(buffer_id), ctypes.byref(offset))
        finally:
            with self.lock:
                self._unlocked_calls -= 1
                self._unlocked_done.notify_all()
        _lib.check(status, "registering device memory at 0x%x" % int(device_ptr))
        return buffer_id.value, offset.value


class _Checked:
    """Session.checked: a plain class, not a generator (this is on every call's path).
    (Callable too, returning itself: ``with session.checked:`` reads as it did.)"""

    __slots__ = ("_session",)

    def __init__(self, session):
        self._session = session

    def __enter__(self):
        session = self._session
        session.lock.acquire()
        try:
            # check()'s common case inline (one Python call less on every call of the client).
            if (session.closed or (_forked[0] and _getpid() != session.pid) or
                    session._deferred or
                    (session.reconnect_enabled and session.c_session is not None
                     and _monotonic() >= session._next_reconnect
                     and session.lib.tier_session_flags(session.c_session)
                     & _lib.TIER_SESSION_DAEMON_GONE)):
                session.check()
        except BaseException:
            session.lock.release()
            raise

    def __exit__(self, *exc):
        self._session.lock.release()

    def __call__(self):
        return self
