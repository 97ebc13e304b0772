"""CUDA graph capture and Tierd: detected, and refused or avoided, never left undefined.

A tierd job is host work (a ring entry the daemon reads, a registration, a completion the client
reaps) tied to GPU work (a ticket written on the producer stream, a wait on the consumer
stream). Captured into a CUDA graph (``torch.cuda.graph``, whole-step capture as Megatron does,
``torch.compile(mode="reduce-overhead")``'s CUDA graph trees), only the GPU half would be
recorded: a replay would wait for tickets no job answers, or copy nothing while the host thinks
it did. So inside a capture:

* the client's tensor API and the registration it needs refuse with ``tier.FailedPrecondition``
  naming the case (:func:`refuse_if_capturing`);
* activation offload keeps the saved tensor on the GPU, with one loud warning per offloader
  (:class:`CaptureGuard`): the captured step runs as it would without Tierd.

Which stream is capturing is asked of the tensor's device (``torch.cuda.is_current_stream_capturing``
on the current stream, the one a capture runs on).
"""

import warnings

from . import errors

UNSUPPORTED = ("inside a CUDA graph capture (torch.cuda.graph / CUDAGraph.capture_begin, "
               "whole-step capture, torch.compile mode='reduce-overhead'): a tierd job is host "
               "work plus GPU waits, and a graph replay would repeat only the GPU half. Not "
               "supported: run offload and reload outside the captured region")


_cuda_seen = False  # torch.cuda was seen initialized (a CUDA context exists)
# torch and the C calls asked for every saved tensor, looked up once (_torch_calls).
_torch = _get_device = _stream_capturing = None


def _torch_calls():
    global _torch, _get_device, _stream_capturing
    import torch
    # What current_device() and torch.cuda.is_current_stream_capturing ask, without their
    # Python layers.
    _get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    _stream_capturing = (getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or
                         torch.cuda.is_current_stream_capturing)
    _torch = torch
    return torch


def _capturing(device):
    """Whether the current stream of `device` (a CUDA device) is capturing a CUDA graph."""
    if device is None:
        return False
    torch = _torch or _torch_calls()
    if type(device) is not torch.device:
        device = torch.device(device)
    if device.type != "cuda":
        return False
    global _cuda_seen
    if not _cuda_seen:
        if not torch.cuda.is_initialized():
            return False  # nothing can be capturing on a context that does not exist yet
        _cuda_seen = True  # (initialized stays so: not asked again for every saved tensor)
    if device.index is None or device.index == _get_device():
        return bool(_stream_capturing())
    with torch.cuda.device(device):
        return bool(torch.cuda.is_current_stream_capturing())


def capturing(device):
    return _capturing(device)


def refuse_if_capturing(device, what):
    """Raises tier.FailedPrecondition if `device`'s current stream is capturing."""
    if capturing(device):
        raise errors.FailedPrecondition(errors.FAILED_PRECONDITION,
                                        "tier: %s %s" % (what, UNSUPPORTED))


class CaptureGuard:
    """For activation offload: keep(t) says whether t must stay where it is because a capture
    is under way on its device; warns once (per guard) when it first does."""

    __slots__ = ("_warned", "kept")

    def __init__(self):
        self._warned = False
        self.kept = 0

    def keep(self, tensor):
        if not _capturing(tensor.device):
            return False
        self.kept += 1
        self.warn_once(stacklevel=4)
        return True

    def warn_once(self, stacklevel=3):
        if not self._warned:
            self._warned = True
            warnings.warn("tier: activation offload %s. Saved tensors of the captured region "
                          "stay on the GPU (not offloaded); the capture runs as it would "
                          "without Tierd" % UNSUPPORTED.split(": a tierd")[0].rstrip(),
                          RuntimeWarning, stacklevel=stacklevel)
