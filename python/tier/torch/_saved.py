"""What autograd holds instead of an offloaded tensor (:class:`Saved`, :class:`KeptSite`), the
record of one offloaded storage (:class:`StorageRecord`), and the storage helpers that rebuild a
view over the storage's bytes (torch 1.13 .. 2.x)."""

import torch


def _untyped_storage_113(t):
    s = t.storage()  # torch 1.13: a TypedStorage over an UntypedStorage
    return s.untyped() if hasattr(s, "untyped") else s._storage


# torch >= 2.0: the method itself (called for every saved tensor: no wrapper).
untyped_storage = getattr(torch.Tensor, "untyped_storage", None) or _untyped_storage_113


def storage_bytes(t):
    """A flat uint8 tensor over the whole storage of t (every view of it lies inside)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(untyped_storage(t))


def view_of(flat, dtype, size, stride, offset):
    """The view (dtype, size, stride, storage offset) rebuilt over a flat byte tensor."""
    return torch.empty(0, dtype=dtype, device=flat.device).set_(
        untyped_storage(flat), offset, size, stride)


class StorageRecord:
    """One offloaded storage. Lives while any saved view of it does (the graph holds Saved
    objects); when the last goes, the handle goes and its Tierd object is freed (or was already,
    by its reload)."""

    __slots__ = ("handle", "index", "device", "nbytes", "weak_storage", "version", "tensor",
                 "pending", "released", "__weakref__")

    def __init__(self, handle, index, device, nbytes, weak_storage, version):
        self.handle = handle
        self.index = index
        self.device = device
        self.nbytes = nbytes
        self.weak_storage = weak_storage  # tells a live storage from a new one at the same address
        self.version = version
        self.tensor = None   # the bytes, back (or never gone), as a flat uint8 tensor
        self.pending = None  # a reload started but not yet taken
        self.released = False  # planned: the source went back to the allocator in stream order

    def same_storage(self, nbytes, version):
        if self.nbytes != nbytes or self.version != version:
            return False  # other data, or the same data changed in place since it was offloaded
        return self.weak_storage is not None and not self.weak_storage.expired()


class Saved:
    """What autograd holds instead of an offloaded tensor: the storage's record plus the view."""

    __slots__ = ("record", "dtype", "size", "stride", "offset", "site")

    def __init__(self, record, t, site=None):
        self.record = record
        self.site = site  # the plan's site (None without a budget)
        self.dtype = t.dtype
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


class KeptSite:
    """A saved tensor the plan keeps but whose first use in backward it must see (a reload
    trigger, the step's timing point, or every site of a calibration step)."""

    __slots__ = ("tensor", "site")

    def __init__(self, tensor, site):
        self.tensor = tensor
        self.site = site
