"""Tensors into tierd objects: the checks, the choice of path, and tierd's GPU engine path.

CUDA tensors are copied by the daemon itself (GPU engine): their allocation is registered, the
producer streams are named on the offload, and the job record keeps the source (and the tensor
it came from) alive until the daemon's copy completed, so dropping the tensor and the handle
meanwhile cannot free memory under it. CPU tensors, and CUDA tensors when tierd runs the host
engine or libtierclient has no GPU support, are staged (tier/_staging.py). A CUDA tensor that
cannot be one job (the library answers OutOfRange: it spans physical allocations it cannot
register as one range) stays on the GPU, and its reloads hand it back.
"""

import collections
import warnings
import weakref

from . import _lib
from . import errors
from ._handle import Handle
from ._streams import (refuse_dtensor, refuse_in_capture, stream_ptr, streams_of_device,
                       torch_module, wait_stream)


def batch_hints(hints, count):
    """next_use_hints of a batch: None (0 each), one int for all, or one per job."""
    if hints is None:
        return [0] * count
    if isinstance(hints, int):
        return [int(hints)] * count
    hints = [int(h) for h in hints]
    if len(hints) != count:
        raise ValueError("%d next_use_hints for %d tensors" % (len(hints), count))
    return hints


def _retain_cuda_source(job):
    """The failure callback (Job.fail_only) of a GPU-engine offload asked to retain its source
    on failure: its job keeps (source, tensor, weakref to the handle). One function for every
    such job (no closure per offload)."""
    if job.status != errors.OK:
        keep = job.keep
        h = keep[2]() if keep is not None else None
        if h is not None:
            h.fallback = keep[0]  # intact: nothing else writes it (autograd saved it)


def _cuda_keep(handle, src, t, retain_on_failure):
    """(keep, on_done) of a GPU-engine offload's job: the job keeps the source (and the tensor it
    came from) alive until the daemon's copy completed."""
    if retain_on_failure:
        return (src, t, weakref.ref(handle)), _retain_cuda_source
    return (src, t), None


class Offloads:
    """Client.offload / offload_batch / release_sources (see them for what the caller sees).
    ``device_direct``: None until a CUDA tensor was tried, then whether the GPU engine takes them
    (forgotten at a reconnect: the next tierd may differ)."""

    def __init__(self, client, session, staged):
        self._client = client
        self._session = session
        self._staged = staged
        self._new_handle = client._new_handle  # (tensor) -> an empty Handle for it
        self.device_direct = None
        self._warned_kept = set()  # the statuses warned of (_keep_on_gpu)
        session.on_reset(self._forget)

    def _forget(self):
        self.device_direct = None

    def _check_tensor(self, tensor, what):
        torch = torch_module()
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("%s takes %s, got %s" % (
                what, "a torch.Tensor" if what == "offload()" else "torch.Tensors",
                type(tensor).__name__))
        if tensor.layout != torch.strided:
            raise TypeError("%s takes dense (strided) tensors, got %s" % (what, tensor.layout))

    def _direct_possible(self):
        """False where CUDA tensors must be staged (the first time: warned once)."""
        if self.device_direct is None and self._session.engine == "host":
            self._no_device_direct("tierd runs the host engine")
        return self.device_direct is not False

    def offload(self, tensor, streams, hint, retain_on_failure):
        self._check_tensor(tensor, "offload()")
        refuse_dtensor(tensor, "offload()")
        refuse_in_capture(tensor.device, "offload()")
        t = tensor.detach()
        handle = self._new_handle(t)
        if handle.nbytes == 0:
            return handle
        if t.device.type == "cpu":
            return self._staged.offload(handle, t, hint, retain_on_failure, None)
        if t.device.type == "cuda":
            if self._direct_possible():
                if self._offload_cuda(handle, t, streams, hint, retain_on_failure):
                    return handle
            return self._staged.offload(handle, t, hint, retain_on_failure, streams)
        raise TypeError("offload() supports cpu and cuda tensors, not %s" % t.device.type)

    def _no_device_direct(self, why):
        if self.device_direct is None:
            warnings.warn("%s: CUDA tensors are staged through host memory (synchronous copies)"
                          % why, RuntimeWarning, stacklevel=5)
        self.device_direct = False

    def _keep_on_gpu(self, handle, src, producers, status=errors.OUT_OF_RANGE):
        """A CUDA tensor that cannot be one job (status OUT_OF_RANGE), or whose registration
        failed (another status): it stays on the GPU, correct but not offloaded, and reload()
        hands it back once `producers` are followed. Warns once per client and cause."""
        if status not in self._warned_kept:
            self._warned_kept.add(status)
            why = ("cannot be registered as one range (pages of an expandable segment)"
                   if status == errors.OUT_OF_RANGE else
                   "could not be registered (%s: %s)" % (errors.code_name(status),
                                                          _lib.last_error()))
            # (stacklevel: the caller of Client.offload() / offload_batch().)
            warnings.warn("tier: a tensor over GPU memory that %s stays on the GPU (not "
                          "offloaded)" % why, RuntimeWarning, stacklevel=5)
        handle.kept = (src, producers)
        handle.direct = True

    def _offload_cuda(self, handle, t, streams, hint, retain_on_failure):
        """The GPU engine path for one tensor: a batch of one (one path for lone and batched
        GPU offloads). False if the library has no GPU support (then staging is used)."""
        return not self._offload_batch_cuda(t.device, [(handle, t, hint)], streams,
                                            retain_on_failure)

    def offload_batch(self, tensors, streams, hints, retain_on_failure):
        tensors = list(tensors)
        hints = batch_hints(hints, len(tensors))
        handles = []
        staged = []                           # (handle, tensor, hint, producer streams)
        direct = collections.OrderedDict()    # device -> [(handle, tensor, hint)]
        torch = torch_module()
        plain, strided = torch.Tensor, torch.strided
        direct_possible = None  # _direct_possible(), asked once (at the first CUDA tensor)
        client, session, pool = self._client, self._session, self._client._staging
        for tensor, hint in zip(tensors, hints):
            # Every tensor is checked before anything is submitted. (A plain strided tensor
            # passes without a call: this loop runs for every saved activation.)
            if type(tensor) is not plain or tensor.layout is not strided:
                self._check_tensor(tensor, "offload_batch()")
                refuse_dtensor(tensor, "offload_batch()")
            device = tensor.device
            device_type = device.type
            if device_type != "cpu" and device_type != "cuda":
                raise TypeError("offload_batch() supports cpu and cuda tensors, not %s" %
                                device_type)
            t = tensor.detach() if tensor.requires_grad else tensor  # (the same bytes)
            # (Client._new_handle's work, without its calls: this runs for every saved tensor.)
            handle = Handle(client, session, pool, t.shape, t.dtype, device, t.nbytes)
            handles.append(handle)
            if handle.nbytes == 0:
                continue
            if device_type == "cpu":
                staged.append((handle, t, hint, None))
                continue
            if direct_possible is None:
                direct_possible = self._direct_possible()
            if direct_possible:
                direct.setdefault(device, []).append((handle, t, hint))
            else:
                staged.append((handle, t, hint, streams_of_device(streams, device)))
        for device in set(direct) | {t.device for _, t, _, _ in staged}:
            refuse_in_capture(device, "offload_batch()")  # once per device: it costs us
        producers = {device: streams_of_device(streams, device) for device in direct}
        for device, items in direct.items():
            # The library may turn out to have no GPU support: those tensors are staged instead.
            staged.extend(self._offload_batch_cuda(device, items, producers[device],
                                                   retain_on_failure))
        if staged:
            self._staged.offload_batch(staged, retain_on_failure)
        return handles

    def offload_contiguous(self, device, producer, tensors, retain_on_failure):
        """offload_batch(tensors, [producer], None, retain_on_failure) for tensors the caller
        vouches for (tier.torch's saved activations): plain, dense, contiguous CUDA tensors of
        `device` that require no grad, written by the stream whose cudaStream_t is `producer`.
        None of offload_batch's checks per tensor, no gather: a batch of one or two (a plan's
        run of offloads) pays what submitting it needs, not the general call's."""
        if not self._direct_possible():
            return self.offload_batch(tensors, [producer], None, retain_on_failure)
        refuse_in_capture(device, "offload_batch()")
        client, session, pool = self._client, self._session, self._client._staging
        handles = []
        items = []
        for t in tensors:
            handle = Handle(client, session, pool, t.shape, t.dtype, device, t.nbytes)
            handles.append(handle)
            if handle.nbytes:
                items.append((handle, t, t, 0))
        streams = [producer]
        fallback = self._submit_ranges(items, streams, streams, retain_on_failure)
        if fallback:
            self._staged.offload_batch(fallback, retain_on_failure)
        return handles

    def _offload_batch_cuda(self, device, items, streams, retain_on_failure):
        """The GPU engine path for one GPU's tensors, as one batch (split at batch_limit): one
        ticket, one wait for the producer streams for all of them. Returns the items to stage
        instead (the library has no GPU support)."""
        torch = torch_module()
        producers = list(streams) if streams else [torch.cuda.current_stream(device)]
        contiguous = True
        for _, t, _ in items:
            if not t.is_contiguous():
                contiguous = False
                break
        if not contiguous:
            cur = torch.cuda.current_stream(device)
            # Gather on the current stream, after every producer stream. The current stream then
            # follows every producer of the batch, so it alone is the producer of all its bytes:
            # the gathered ones and the others alike (one wait for the whole batch).
            for s in producers:
                wait_stream(cur, s)
            with torch.no_grad(), torch.cuda.device(device):
                items = [(h, t, t if t.is_contiguous() else t.contiguous(), hint)
                         for h, t, hint in items]
            producers = [cur]
        else:
            items = [(h, t, t, hint) for h, t, hint in items]
        return self._submit_ranges(items, producers, streams, retain_on_failure)

    def _submit_ranges(self, items, producers, streams, retain_on_failure):
        """Submits items of (handle, tensor, contiguous source, hint) of one GPU, written by
        `producers` (streams or cudaStream_t ints), through tier_offload_ranges. Returns the
        items to stage instead (the library has no GPU support), with `streams`."""
        # Registration and submission in one library call per chunk (tier_offload_ranges): no
        # register round of its own, no rows rebuilt between them. Under the session's lock, so
        # that no reaper sees a job before it is tracked; a registration that takes a round trip
        # to tierd (an allocation's first) holds this client's other threads that long.
        if not items:
            return []
        ptrs = [stream_ptr(s) for s in producers]
        session = self._session
        jobs = session.jobs
        fallback = []
        with session.checked:
            jobs.reap()
            for lo, hi in jobs.chunks(len(items)):
                part = items[lo:hi]
                # Each job keeps its source (and the tensor it came from) alive until the
                # daemon's copy completed: dropping tensors and handles meanwhile cannot free
                # memory under it.
                kept = [_cuda_keep(handle, src, t, retain_on_failure)
                        for handle, t, src, _ in part]
                keeps = [keep for keep, _ in kept]
                dones = [done for _, done in kept] if retain_on_failure else None
                results = jobs.offload_ranges(
                    [(src.data_ptr(), handle.nbytes, hint) for handle, _, src, hint in part],
                    ptrs, keeps, dones, fail_only=True)
                for (handle, t, src, hint), result in zip(part, results):
                    if type(result) is tuple:
                        handle.object_id, handle.job = result
                        handle.direct = True
                        continue
                    if result == errors.UNIMPLEMENTED:  # no GPU support: staged from now on
                        self._no_device_direct("libtierclient has no GPU support")
                        fallback.append((handle, t, hint, streams))
                    else:  # OUT_OF_RANGE: two physical allocations; or its own error
                        self._keep_on_gpu(handle, src, producers, result)
            if self.device_direct is None and any(h.job is not None for h, _, _, _ in items):
                self.device_direct = True
        return fallback

    def stream_wait_offload(self, job_id, stream=None, device=None):
        """See Client.stream_wait_offload. device: the GPU of a raw stream pointer (None: the
        current device)."""
        if stream is None:
            stream = torch_module().cuda.current_stream()
        refuse_in_capture(device if device is not None else getattr(stream, "device", None),
                          "stream_wait_offload()")
        with self._session.checked:
            self._session.jobs.stream_wait_offload(job_id, stream_ptr(stream))

    def release_sources(self, handles, stream, device=None):
        """See Client.release_sources."""
        newest = None
        todo = []
        for h in handles:
            if not h.direct or h.kept is not None or h.job is None or h.job.status is not None:
                continue  # nothing held (kept on the GPU, empty, or already complete)
            todo.append(h)
            if newest is None or h.job.id > newest.job.id:
                newest = h
        if newest is None:
            return 0
        if stream is None:
            stream = torch_module().cuda.current_stream()
        refuse_in_capture(device if device is not None else getattr(stream, "device", None),
                          "stream_wait_offload()")
        with self._session.checked:
            # GPU-side wait (no host round trip); from here on the stream is ordered after every
            # copy of `todo`. (stream_wait_offload's work, in the same hold of the lock.)
            self._session.jobs.stream_wait_offload(newest.job.id, stream_ptr(stream))
            for h in todo:
                job = h.job
                if job.status is None:
                    job.keep = None      # the source (and the tensor it came from)
                    job.on_done = None   # its fallback closure held the source too
                h.released = True
        return len(todo)

