"""A tensor's data offloaded to tierd: :class:`Handle`."""

import warnings

from . import errors
from ._host_buffer import HostBuffer


class Handle:
    """Data offloaded from a tensor. ``reload()`` as often as needed; ``free()`` or drop it.

    What the client's layers keep here (read it, never change it): ``object_id`` (None: nothing
    went to tierd), ``job`` (the offload's job record; None until submitted), ``direct`` (tierd's
    GPU engine copies it), ``kept`` ((tensor, producer streams) of a CUDA tensor that stayed on
    the GPU), ``fallback`` (the data a failed offload left here, when asked to retain it),
    ``reloads`` (GPU reload jobs not yet known done), ``released`` (the source went back in
    stream order), ``freed`` and ``generation`` (the session its object lives in).
    """

    def __init__(self, client, session, staging, shape, dtype, device, nbytes):
        self._client = client
        self._session = session
        self._staging = staging
        self.generation = session.generation  # the session its object lives in
        self.object_id = None
        self.job = None            # the offload's job record (None for an empty tensor)
        self.direct = False        # CUDA through the GPU engine (no host staging)
        self.reloads = []          # GPU reload jobs not yet known to be done
        self.freed = False
        self.fallback = None       # the data, kept after a failed offload (retain_on_failure)
        self.kept = None           # (tensor, producer streams): not offloadable, kept on the GPU
        self.released = False      # the source went back in stream order (release_sources)
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device
        self.nbytes = nbytes

    def __repr__(self):
        state = "freed" if self.freed else ("done" if self.job is None or
                                            self.job.status is not None else "in flight")
        return "Handle(object=%s, shape=%s, dtype=%s, device=%s, %s)" % (
            self.object_id, list(self.shape), self.dtype, self.device, state)

    @property
    def client(self):
        return self._client

    @property
    def failed(self):
        """True once the offload is known to have failed (see wait() for the error)."""
        return self.job is not None and self.job.status not in (None, errors.OK)

    @property
    def stayed_on_gpu(self):
        """True for a CUDA tensor that could not be one job (memory the library cannot register
        as one range): it was not offloaded, and reloads hand it back as it is."""
        return self.kept is not None

    @property
    def submitted(self):
        """True once the offload is a job of tierd (False: an empty tensor, one that stayed on
        the GPU, or a staged offload not submitted yet)."""
        return self.job is not None

    @property
    def in_flight(self):
        """True while the offload is submitted and its result not yet known to the client
        (reads the client's records only: no reaping, no lock; see done())."""
        return self.job is not None and self.job.status is None

    def done(self):
        """True once the offload completed (successfully or not). Never blocks."""
        if self.job is None or self.job.status is not None:
            return True
        with self._session.checked:
            self._session.jobs.reap()
        return self.job.status is not None

    def wait_offload(self, timeout_ms=-1):
        """Waits for the offload's result without raising it (see wait(), failed)."""
        if self.job is None or self.job.status is not None:
            return
        with self._session.checked:
            self._session.jobs.wait(self.job, timeout_ms)

    def wait(self, timeout_ms=-1):
        """Waits for the offload (and reloads still in flight on the GPU); raises the first error
        (tier.ResourceExhausted when the quota or the pool is full, ...)."""
        jobs = self._session.jobs
        with self._session.checked:
            if self.job is not None:
                jobs.wait(self.job, timeout_ms)
            reloads, self.reloads = self.reloads, []
            for job in reloads:
                jobs.wait(job, timeout_ms)
        if self.job is not None and self.job.error() is not None:
            raise self.job.error()
        for job in reloads:
            if job.error() is not None:
                raise job.error()

    def reload(self, stream=None, free=False):
        """A new tensor with the offloaded data (same shape, dtype and device; contiguous).

        CUDA: allocated on ``stream`` (default: the current stream), which already waits on the GPU
        for the copy when this returns: use it on that stream at once, no host wait. CPU: returns
        when the data is there. ``free=True`` drops the object after this reload.
        """
        return self._client.start_reloads([self], stream, free)[0].result()

    def stream_wait_offload(self, stream):
        """Makes `stream` wait (on the GPU, no host wait) until a GPU-engine offload still in
        flight has read its source, so work queued on it afterwards may overwrite the source
        (:meth:`Client.stream_wait_offload`). Nothing to do otherwise (staged, kept, done)."""
        if not self.direct or not self.in_flight:
            return
        self._client.stream_wait_offload(self.job.id, stream)

    def lost(self):
        """The object lived in a tierd that went away (the client reconnected since): its data
        is gone, and its id may name another object of the new session."""
        return (self.object_id is not None and self.kept is None and self.fallback is None
                and self.generation != self._session.generation)

    def raise_lost(self):
        raise errors.DataLoss(errors.DATA_LOSS, (
            "object %d (%d bytes) was offloaded to a tierd that went away (this client has "
            "reconnected since): its data is lost" % (self.object_id, self.nbytes)))

    def pending_source(self, reap=True):
        """CUDA: the source tensor while the offload is still in flight (its data is intact and
        alive), or the one kept after a failed offload; else None. Lets a consumer skip a reload of
        data that never left the GPU. reap=False: the caller reaped just before (collect())."""
        if not self.direct or self.job is None:
            return None
        if self.job.status is not None:
            return self.fallback
        # (reap=False reads the records only: the lock, without a call's checks.)
        with self._session.checked if reap else self._session.lock:
            if reap:
                self._session.jobs.reap()
            keep = self.job.keep
            if self.job.status is not None or keep is None:
                return self.fallback
            return keep[0]

    def free(self):
        """Drops the object (its memory returns to the pool once jobs using it finish). The source
        of an offload still in flight stays owned by that job until it completes (unless
        :meth:`Client.release_sources` handed it back in stream order)."""
        if self.freed:
            return
        self.freed = True
        session = self._session
        with session.lock:
            if session.closed:
                return
            session.check()
            self._free_locked()

    def _free_locked(self):
        lost = self.lost()
        self.kept = None
        fallback, self.fallback = self.fallback, None
        if isinstance(fallback, HostBuffer):
            self._staging.release(fallback)
        if self.object_id is None or lost:
            return  # (lost: its tierd freed it; the id may be another object's now)
        offload = self.job
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
        self._session.jobs.free(self.object_id, report)

    def __del__(self):
        try:
            if self.freed or (self.object_id is None and self.fallback is None
                              and self.kept is None):
                return
            self.freed = True
            self._session.run_or_defer(self._free_locked)
        except Exception:  # interpreter shutdown
            pass
