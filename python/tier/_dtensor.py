"""DTensors (torch.distributed.tensor: FSDP2's sharded parameters and their optimizer state,
tensor-parallel weights) through Tierd: each rank moves its local shard, through its node's tierd.

A DTensor's own ``data_ptr()`` is not its shard's (FSDP2's is 0), and its ``numel()`` is the
global size, so nothing may hand a DTensor to the client as it is. :func:`split` gives the local
shard (a plain tensor) and a :class:`Wrap` that rebuilds a DTensor of the same mesh, placements,
global shape and stride around a reloaded shard (no communication)."""

import sys

import torch


def _dtensor_class():
    # No import here: a process that never imported torch.distributed.tensor holds no DTensor
    # (and importing it costs a second).
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(t):
    cls = _dtensor_class()
    return cls is not None and isinstance(t, cls)


class Wrap:
    """Rebuilds the DTensor a local shard came from: same mesh, placements, global shape and
    stride, and requires_grad."""

    __slots__ = ("mesh", "placements", "shape", "stride", "requires_grad")

    def __init__(self, d):
        self.mesh = d.device_mesh
        self.placements = tuple(d.placements)
        self.shape = d.shape
        self.stride = d.stride()
        self.requires_grad = d.requires_grad

    def __call__(self, local):
        with torch.no_grad():
            out = _dtensor_class().from_local(local, self.mesh, self.placements, run_check=False,
                                      shape=self.shape, stride=self.stride)
        if self.requires_grad:
            out.requires_grad_(True)
        return out


def split(t):
    """(the plain tensor holding t's bytes on this rank, a Wrap or None). A plain tensor comes
    back as it is, with None."""
    if not is_dtensor(t):
        return t, None
    with torch.no_grad():
        return t.to_local(), Wrap(t)


def local_nbytes(t):
    """Bytes this rank holds of t (its shard for a DTensor)."""
    if is_dtensor(t):
        with torch.no_grad():
            t = t.to_local()
    return t.numel() * t.element_size()
