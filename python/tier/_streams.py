"""CUDA streams as the client's layers name them, and what no job may be made of.

torch is imported on first use only: the low-level client works without it. A stream is a
``torch.cuda.Stream`` or a raw ``cudaStream_t`` (an int) wherever the client takes one.
"""

import sys

from . import _cuda_graphs


def torch_module():
    import torch  # deferred: the low-level client does not need torch
    return torch


def stream_ptr(stream):
    """A cudaStream_t as an int from a torch.cuda.Stream (or an int); None stays None."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    ptr = getattr(stream, "cuda_stream", None)
    if ptr is None:
        raise TypeError("expected a torch.cuda.Stream or a raw stream handle, got %r" % (stream,))
    return int(ptr)


_raw_stream = None  # torch._C._cuda_getCurrentRawStream, once looked up (False: torch lacks it)


def raw_stream_fn():
    """torch._C._cuda_getCurrentRawStream (device index -> cudaStream_t), or False where torch
    lacks it (then current_stream_ptr asks torch.cuda.current_stream)."""
    global _raw_stream
    raw = _raw_stream
    if raw is None:
        raw = _raw_stream = getattr(torch_module()._C, "_cuda_getCurrentRawStream", None) or False
    return raw


def current_stream_ptr(device):
    """The cudaStream_t (an int) of CUDA `device`'s current stream, without making a
    torch.cuda.Stream object (the hooks ask it for every saved tensor)."""
    raw = _raw_stream
    if raw is None:
        raw = raw_stream_fn()
    index = device.index
    if raw and index is not None:
        return raw(index)
    return torch_module().cuda.current_stream(device).cuda_stream


def wait_stream(cur, stream):
    """Makes torch stream `cur` wait (on the GPU) for everything enqueued on `stream` so far."""
    torch = torch_module()
    if stream is None:
        return
    if isinstance(stream, int):
        if stream == cur.cuda_stream:
            return
        stream = torch.cuda.ExternalStream(stream, device=cur.device)  # a producer of cur's GPU
    if stream.cuda_stream != cur.cuda_stream:
        cur.wait_stream(stream)


def consumer_stream(stream, device):
    """The torch stream a reload's destination is allocated on and used by (default: device's
    current stream). Raw handles are wrapped; a stream of another device is refused."""
    torch = torch_module()
    if stream is None:
        return torch.cuda.current_stream(device)
    if isinstance(stream, int):
        return torch.cuda.ExternalStream(stream, device=device)
    if stream.device != device:
        raise ValueError("stream of %s for a tensor on %s" % (stream.device, device))
    return stream


def streams_of_device(streams, device):
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


def refuse_in_capture(device, what):
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


def refuse_dtensor(tensor, what):
    """A DTensor's data_ptr() and numel() are not those of the shard this rank holds: moving
    it as it is would read the wrong memory (FSDP2's data_ptr() is 0)."""
    from . import _dtensor
    if _dtensor.is_dtensor(tensor):
        raise TypeError("%s takes the local shard of a DTensor (t.to_local()), not the DTensor "
                        "itself (tier.torch's optimizer state offload and checkpoints do this "
                        "for you)" % what)
