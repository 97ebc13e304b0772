"""A session's jobs, from submission until their result is known: the job C calls
(tier_offload, tier_reload, tier_free and their batches, tier_offload_persistent, the stream
waits), reaping and waiting.

The C library hands a job's result out once (to tier_job_wait or tier_poll). This table is the
only consumer: it polls (reaping every finished job: the callbacks release the sources and
staging buffers) or waits for one job. Jobs of the low-level API (``user``) keep their result
until Client.wait or Client.poll takes it; the tensor API's jobs report to their handles.

Everything here runs under the session's lock (Session.lock) and on its current C session.
"""

import ctypes

from . import _lib
from . import errors

POLL_BATCH = 64


class Job:
    """A submitted job, from submission until its result is known (and, for user jobs, taken)."""

    __slots__ = ("id", "_what", "status", "message", "keep", "on_done", "user", "object",
                 "length", "fail_only")

    def __init__(self, job_id, what, keep=None, on_done=None, user=False, object_id=0, length=0,
                 fail_only=False):
        self.id = job_id
        self.object = object_id
        self.length = length
        # For messages: "offload of 4096 bytes (object 7)". A str, or (format, args) formatted
        # when first read: the batch paths make a Job per saved tensor, most never named.
        self._what = what
        self.status = None        # None while in flight
        self.message = ""
        self.keep = keep          # what must outlive the job (source tensor, staging buffer)
        self.on_done = on_done    # called once, under the client's lock, with this job
        self.fail_only = fail_only  # on_done only where the job failed (no call per success)
        self.user = user          # submitted through the low-level API: result kept for wait()

    @property
    def what(self):
        what = self._what
        if type(what) is tuple:
            what = self._what = what[0] % what[1]
        return what

    def error(self):
        if self.status is None or self.status == errors.OK:
            return None
        return errors.error_from_code(self.status, "%s: %s" % (self.what, self.message))


def offload_options(stream_ptrs, hint):
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


class OptionsCache:
    """tier_offload_options of the batch calls (hint 0) by producer streams, made once: a batch
    of one paid a ctypes struct, an array and a cast (5 us on the device's hosts) for the same
    few streams every time. The library only reads them during a call."""

    MAX = 16

    def __init__(self):
        self._by_streams = {}

    def get(self, stream_ptrs):
        key = tuple(stream_ptrs) if stream_ptrs else ()
        made = self._by_streams.get(key)
        if made is None:
            if len(self._by_streams) >= self.MAX:
                self._by_streams.clear()
            made = self._by_streams[key] = offload_options(key, 0)  # (options, array kept)
        return made[0]


# in_use(): finished jobs are dropped from the list once it holds this many.
IN_USE_PRUNE_AT = 4096


class JobTable:
    """The jobs of one session (see the module docstring). Under the session's lock."""

    def __init__(self, session):
        self._session = session
        self._inflight = {}   # job id -> Job: submitted, result not yet taken from the library
        self._unwaited = {}   # job id -> Job: user jobs, finished, result not yet taken
        # GPU reloads that work has been ordered after (a stream waits on them), as (number, job):
        # see in_use(). _noted: how many were ever noted (the next one's number).
        self._in_use = []
        self._noted = 0
        self._poll_batch = (_lib.Completion * POLL_BATCH)()
        self._options = OptionsCache()

    def __len__(self):
        return len(self._inflight)

    def _track(self, record):
        self._inflight[record.id] = record
        return record

    def chunks(self, count):
        """(start, end) of the consecutive calls a batch of `count` jobs is split into."""
        step = self._session.batch_limit
        return [(lo, min(lo + step, count)) for lo in range(0, count, step)]

    # ---- submission -----------------------------------------------------------------------

    def offload(self, buffer_id, offset, length, stream_ptrs, hint, keep, on_done=None,
                user=False):
        """tier_offload; returns (object id, Job)."""
        s = self._session
        options, _streams = offload_options(stream_ptrs, hint)  # (_streams: alive for the call)
        obj = _lib.c_object_id()
        job = _lib.c_job_id()
        _lib.check(s.lib.tier_offload(s.c_session, int(buffer_id), int(offset), int(length),
                                      ctypes.byref(options), ctypes.byref(obj),
                                      ctypes.byref(job)),
                   "offload of %d bytes from buffer %d" % (length, buffer_id))
        return obj.value, self._track(Job(job.value, ("offload of %d bytes (object %d, job %d)", (
            length, obj.value, job.value)), keep, on_done, user, obj.value, length))

    def offload_persistent(self, name, buffer_id, offset, length, stream_ptrs, keep):
        """tier_offload_persistent (a user job); returns (object id, Job)."""
        s = self._session
        options, _streams = offload_options(stream_ptrs, 0)
        obj = _lib.c_object_id()
        job = _lib.c_job_id()
        _lib.check(s.lib.tier_offload_persistent(
            s.c_session, name.encode(), int(buffer_id), int(offset), int(length),
            ctypes.byref(options), ctypes.byref(obj), ctypes.byref(job)),
            "persistent offload of %d bytes as %r" % (length, name))
        return obj.value, self._track(Job(job.value, "offload of %d bytes as %r (object %d, job %d)"
                                          % (length, name, obj.value, job.value), keep, None,
                                          True, obj.value, length))

    def reload(self, object_id, buffer_id, offset, length, stream_ptr, free_after, keep=None,
               on_done=None, user=False, defer=False):
        """tier_reload; returns the Job. defer: TIER_RELOAD_DEFER_WAIT."""
        s = self._session
        options = _lib.new_struct(_lib.ReloadOptions)
        options.flags = ((_lib.TIER_RELOAD_FREE_AFTER if free_after else 0)
                         | (_lib.TIER_RELOAD_DEFER_WAIT if defer else 0))
        options.consumer_stream = stream_ptr
        job = _lib.c_job_id()
        _lib.check(s.lib.tier_reload(s.c_session, int(object_id), int(buffer_id), int(offset),
                                     int(length), ctypes.byref(options), ctypes.byref(job)),
                   "reload of object %d" % object_id)
        return self._track(Job(job.value, ("reload of object %d (%d bytes, job %d)", (
            object_id, length, job.value)), keep, on_done, user, object_id, length))

    def free(self, object_id, on_done=None, user=False):
        """tier_free; returns the Job."""
        s = self._session
        job = _lib.c_job_id()
        _lib.check(s.lib.tier_free(s.c_session, int(object_id), ctypes.byref(job)),
                   "free of object %d" % object_id)
        return self._track(Job(job.value, "free of object %d (job %d)" % (object_id, job.value),
                               None, on_done, user, object_id))

    def offload_batch(self, rows, stream_ptrs, keeps=None, on_dones=None, user=False):
        """One tier_offload_batch (at most batch_limit rows of (buffer id, offset, length,
        next_use_hint)), all sharing the producer streams. Returns (object id, Job) per row. A
        batch of one is a plain tier_offload (the same job)."""
        s = self._session
        n = len(rows)
        keeps = keeps or [None] * n
        on_dones = on_dones or [None] * n
        if n == 1:
            buffer_id, offset, length, hint = rows[0]
            return [self.offload(buffer_id, offset, length, stream_ptrs, hint, keeps[0],
                                 on_dones[0], user)]
        options = self._options.get(stream_ptrs)
        # The array packed whole from the rows (no ctypes attribute set per field).
        jobs = _lib.pack_batch([(0, buffer_id, offset, length, hint, 0)
                                for buffer_id, offset, length, hint in rows])
        _lib.check(s.lib.tier_offload_batch(s.c_session, jobs, n, ctypes.byref(options)),
                   "batch of %d offloads" % n)
        records = self._submitted(jobs, "offload", keeps, on_dones, user)
        return [(record.object, record) for record in records]

    def offload_ranges(self, rows, stream_ptrs, keeps=None, on_dones=None, fail_only=False):
        """One tier_offload_ranges: raw memory (GPU, or in the session's host buffers) registered
        and offloaded in one call, at most batch_limit rows of (ptr, length, next_use_hint), all
        sharing the producer streams. Returns per row (object id, Job), or the tier_status code
        of why that row was not offloaded (the others still went). Raises when nothing could
        go (tierd gone, ...). fail_only: each on_done is called only where its job failed."""
        s = self._session
        n = len(rows)
        keeps = keeps or [None] * n
        on_dones = on_dones or [None] * n
        options = self._options.get(stream_ptrs)
        ranges = _lib.pack_ranges(rows)
        _lib.check(s.lib.tier_offload_ranges(s.c_session, ranges, n, ctypes.byref(options)),
                   "offload of %d ranges" % n)
        out = []
        inflight = self._inflight
        ok = errors.OK
        for i, (status, obj, job_id, length) in enumerate(_lib.unpack_ranges(ranges)):
            if status != ok:
                out.append(status)
                continue
            record = Job(job_id, ("offload of object %d (%d bytes, job %d, in a batch of %d)",
                                  (obj, length, job_id, n)), keeps[i], on_dones[i], False, obj,
                         length, fail_only)
            inflight[job_id] = record
            out.append((obj, record))
        if errors.UNAVAILABLE in out and not any(type(r) is tuple for r in out):
            # tierd went away before anything was pushed: a call-level error, as a refused push.
            raise errors.error_from_code(errors.UNAVAILABLE,
                                         "offload of %d ranges: %s" % (n, _lib.last_error()))
        return out

    def reload_ranges(self, rows, stream_ptr, free_after, defer=False):
        """One tier_reload_ranges: reloads into raw memory (GPU, or in the session's host
        buffers) registered and submitted in one call, at most batch_limit rows of (object id,
        ptr, length), all for one consumer stream. All or nothing: a destination that cannot be
        registered raises, with nothing submitted. Returns a Job per row. defer:
        TIER_RELOAD_DEFER_WAIT."""
        s = self._session
        n = len(rows)
        options = _lib.new_struct(_lib.ReloadOptions)
        options.consumer_stream = stream_ptr
        options.flags = _lib.TIER_RELOAD_DEFER_WAIT if defer else 0
        flags = _lib.TIER_RELOAD_FREE_AFTER if free_after else 0
        ranges = _lib.pack_reload_ranges([(obj, ptr, length, flags) for obj, ptr, length in rows])
        _lib.check(s.lib.tier_reload_ranges(s.c_session, ranges, n, ctypes.byref(options)),
                   "reload of %d ranges" % n)
        out = []
        inflight = self._inflight
        for status, job_id, obj, length in _lib.unpack_reload_ranges(ranges):
            record = Job(job_id, ("reload of object %d (%d bytes, job %d, in a batch of %d)",
                                  (obj, length, job_id, n)), None, None, False, obj, length)
            inflight[job_id] = record
            out.append(record)
        return out

    def reload_batch(self, rows, stream_ptr, keeps=None, on_dones=None, user=False, defer=False):
        """One tier_reload_batch (at most batch_limit rows of (object id, buffer id, offset,
        length, free_after)) for one consumer stream. Returns a Job per row. A batch of one is a
        plain tier_reload (the same job). defer: TIER_RELOAD_DEFER_WAIT (the stream waits only
        where tier_stream_wait_reload puts the wait)."""
        s = self._session
        n = len(rows)
        keeps = keeps or [None] * n
        on_dones = on_dones or [None] * n
        if n == 1:
            object_id, buffer_id, offset, length, free_after = rows[0]
            return [self.reload(object_id, buffer_id, offset, length, stream_ptr, free_after,
                                keeps[0], on_dones[0], user, defer)]
        options = _lib.new_struct(_lib.ReloadOptions)
        options.consumer_stream = stream_ptr
        options.flags = _lib.TIER_RELOAD_DEFER_WAIT if defer else 0
        free = _lib.TIER_RELOAD_FREE_AFTER
        jobs = _lib.pack_batch([(free if free_after else 0, buffer_id, offset, length, 0,
                                 object_id)
                                for object_id, buffer_id, offset, length, free_after in rows])
        _lib.check(s.lib.tier_reload_batch(s.c_session, jobs, n, ctypes.byref(options)),
                   "batch of %d reloads" % n)
        return self._submitted(jobs, "reload", keeps, on_dones, user)

    def _submitted(self, jobs, kind, keeps, on_dones, user):
        """A Job per row of a batch tierd took (kind: "offload" or "reload"), now in flight."""
        n = len(jobs)
        out = []
        inflight = self._inflight
        for i, (job_id, obj, length) in enumerate(_lib.unpack_batch(jobs)):
            record = Job(job_id, ("%s of object %d (%d bytes, job %d, in a batch of %d)",
                                  (kind, obj, length, job_id, n)), keeps[i], on_dones[i], user,
                         obj, length)
            inflight[job_id] = record
            out.append(record)
        return out

    # ---- GPU-side waits (no host round trip) ----------------------------------------------

    def stream_wait_offload(self, job_id, stream_ptr):
        """tier_stream_wait_offload: the stream waits until offload `job_id` read its source."""
        s = self._session
        _lib.check(s.lib.tier_stream_wait_offload(s.c_session, int(job_id),
                                                  ctypes.c_void_p(stream_ptr)),
                   "stream wait for offload job %d" % job_id)

    def stream_wait_reload(self, job_id, stream_ptr):
        """tier_stream_wait_reload: the stream waits for a deferred reload's copy (and, one
        ticket per batch, for every copy of its batch)."""
        s = self._session
        _lib.check(s.lib.tier_stream_wait_reload(s.c_session, int(job_id), stream_ptr),
                   "ordering a prefetched reload before its use")

    # ---- results --------------------------------------------------------------------------

    def _finish(self, job, status, message):
        job.status = int(status)
        job.message = message
        callback, job.on_done = job.on_done, None
        if job.user:
            self._unwaited[job.id] = job
        try:
            if callback is not None and (job.status != errors.OK or not job.fail_only):
                callback(job)
        finally:
            job.keep = None  # the source / staging buffer is no longer the job's

    def reap(self):
        """Takes every finished job's result from the library (tier_poll); never blocks."""
        s = self._session
        batch = self._poll_batch
        count = ctypes.c_size_t()
        while True:
            _lib.check(s.lib.tier_poll(s.c_session, batch, POLL_BATCH, ctypes.byref(count)))
            inflight = self._inflight
            for i in range(count.value):
                c = batch[i]
                job = inflight.pop(c.job, None)
                if job is not None:
                    status = c.status
                    if status == errors.OK and not job.user and (
                            job.on_done is None or job.fail_only):
                        job.on_done = None
                        job.status = errors.OK  # (_finish's work for the common case: no call)
                        job.keep = None
                        continue
                    self._finish(job, status, "" if status == errors.OK else
                                 "%s from tierd for job %d" % (errors.code_name(status), c.job))
            if count.value < POLL_BATCH:
                return

    def wait(self, job, timeout_ms=-1):
        """Waits for one job and records its result (raises only DeadlineExceeded)."""
        if job.status is not None:
            return job.status
        s = self._session
        status = s.lib.tier_job_wait(s.c_session, job.id, int(timeout_ms))
        if status == errors.DEADLINE_EXCEEDED and timeout_ms >= 0:
            raise errors.DeadlineExceeded(errors.DEADLINE_EXCEEDED,
                                          "%s not done within %d ms" % (job.what, timeout_ms))
        message = _lib.last_error() if status != errors.OK else ""
        self._inflight.pop(job.id, None)
        self._finish(job, status, message)
        return job.status

    def take(self, job_id, timeout_ms=-1):
        """The result of user job `job_id`, waited for if need be and taken (once)."""
        job = self._unwaited.pop(job_id, None)
        if job is None:
            job = self._inflight.get(job_id)
            if job is None or not job.user:
                raise errors.NotFound(errors.NOT_FOUND,
                                      "job %d is unknown or was already waited for" % job_id)
            self.wait(job, timeout_ms)
            self._unwaited.pop(job_id, None)
        return job

    def take_finished(self, max_count):
        """Up to max_count finished user jobs not yet taken (after a reap)."""
        out = []
        for job_id in list(self._unwaited)[:max_count]:
            out.append(self._unwaited.pop(job_id))
        return out

    # ---- GPU reloads already in use --------------------------------------------------------

    def in_use(self, jobs):
        """A stream now waits on these GPU reloads, and work queued after it reads their data.
        Should tierd die before they finish, the library releases the waiting streams (a stream
        must never wait for ever), and that work reads memory the copies never filled: only
        verify_in_use() can then tell the caller."""
        in_use = self._in_use
        for job in jobs:
            in_use.append((self._noted, job))
            self._noted += 1
        if len(in_use) > IN_USE_PRUNE_AT:
            self._in_use = [(n, j) for n, j in in_use if j.status is None or j.status != errors.OK]

    @property
    def noted(self):
        """How many GPU reloads in_use() has noted so far (a mark for verify_in_use)."""
        return self._noted

    def verify_in_use(self, since=0):
        """Waits for the GPU reloads in_use() noted from number `since` on, and forgets every
        noted one; raises :class:`tier.Unavailable` if any of those did not complete (tierd went
        away while they were in flight): the work queued after them read lost data."""
        jobs, self._in_use = self._in_use, []
        failed = []
        for n, job in jobs:
            if n < since:
                continue  # noted before the caller's mark: another step's, not checked here
            status = job.status
            if status is None:
                status = self.wait(job, -1)
            if status != errors.OK:
                failed.append(job)
        if failed:
            raise errors.Unavailable(
                errors.UNAVAILABLE,
                "%d GPU reload(s) (%d bytes) did not complete (%s) after work on the GPU had been "
                "queued to use their data: that work read memory the copies never filled, so its "
                "results (this backward's gradients) are not valid; run the step again" % (
                    len(failed), sum(j.length for j in failed),
                    failed[0].message or errors.code_name(failed[0].status)))

    def wait_all(self, quiet=False):
        """Waits for every job in flight (quiet: their errors are swallowed)."""
        for job in list(self._inflight.values()):
            try:
                self.wait(job, -1)
            except errors.TierError:
                if not quiet:
                    raise

    def end_all(self, status, message):
        """Every job still in flight ends with `status` (its session is gone)."""
        for job in list(self._inflight.values()):
            self._finish(job, status, message)
        self._inflight.clear()
