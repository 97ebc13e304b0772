"""What autograd holds instead of an offloaded tensor (:class:`Saved`, :class:`KeptSite`), the
record of one offloaded storage (:class:`StorageRecord`), and the storage helpers that rebuild a
view over the storage's bytes (torch 1.13 .. 2.x)."""

import weakref

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


try:
    from torch.multiprocessing.reductions import StorageWeakRef as _StorageWeakRef
except ImportError:  # pragma: no cover - present in every torch this supports
    _StorageWeakRef = None

_expired = getattr(getattr(torch, "UntypedStorage", None), "_expired", None)
_free_weak_ref = getattr(getattr(torch, "UntypedStorage", None), "_free_weak_ref", None)
_RAW_WEAK = (_expired is not None and _free_weak_ref is not None
             and hasattr(torch.Tensor, "untyped_storage"))  # torch >= 2.0


class StorageRecord:
    """One offloaded storage. Lives while any saved view of it does (the graph holds Saved
    objects); when the last goes, the handle goes and its Tierd object is freed (or was already,
    by its reload)."""

    __slots__ = ("handle", "index", "device", "nbytes", "weak_storage", "version", "tensor",
                 "pending", "released", "whole", "__weakref__")

    def __init__(self, handle, index, device, nbytes, storage, version):
        self.handle = handle
        self.index = index
        self.device = device
        self.nbytes = nbytes
        # A weak reference to `storage`: tells a live storage from a new one at the same address.
        # torch >= 2: torch's own (an int, freed in __del__), without StorageWeakRef's Python
        # calls on every save and every lookup.
        if _RAW_WEAK:
            self.weak_storage = storage._weak_ref()
        else:
            self.weak_storage = _StorageWeakRef(storage) if _StorageWeakRef is not None else None
        self.version = version
        # The bytes, back (or never gone): a flat uint8 tensor, or, where the saved tensor was
        # its whole storage (contiguous, offset 0), a tensor of its dtype, shape and strides.
        self.tensor = None
        self.whole = False
        self.pending = None  # a reload started but not yet taken
        self.released = False  # planned: the source went back to the allocator in stream order

    def same_storage(self, nbytes, version):
        if self.nbytes != nbytes or self.version != version:
            return False  # other data, or the same data changed in place since it was offloaded
        weak = self.weak_storage
        if type(weak) is int:
            return not _expired(weak)
        return weak is not None and not weak.expired()

    def __del__(self):
        weak = self.weak_storage
        if type(weak) is int:
            self.weak_storage = None
            try:
                _free_weak_ref(weak)
            except Exception:  # noqa: BLE001  (interpreter shutdown)
                pass


class StorageIndex(dict):
    """(device, data_ptr) -> weakref to the StorageRecord offloaded from there: a
    WeakValueDictionary's work without its Python-level calls on every saved tensor (get is
    dict's own); dead entries are dropped as it grows."""

    __slots__ = ("compact_at",)

    def __init__(self):
        super().__init__()
        self.compact_at = 1024

    def remember(self, key, record):
        self[key] = weakref.ref(record)
        if len(self) >= self.compact_at:
            self.compact()

    def compact(self):
        """Drops the entries whose records are gone (the caller adds while len >= compact_at)."""
        live = [(k, r) for k, r in self.items() if r() is not None]
        self.clear()
        self.update(live)
        self.compact_at = max(1024, 2 * len(self))


class Saved:
    """What autograd holds instead of an offloaded tensor: the storage's record plus the view."""

    __slots__ = ("record", "dtype", "size", "stride", "offset", "site", "whole")

    def __init__(self, record, t, site=None, whole=False):
        self.record = record
        self.site = site  # the plan's site (None without a budget)
        # t is the record's whole source (record.whole): unpacked as record.tensor itself.
        self.whole = whole
        self.dtype = t.dtype
        if whole:  # (nothing to rebuild: no view read per save)
            self.size = self.stride = self.offset = None
            return
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
