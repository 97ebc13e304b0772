"""Host memory shared with the daemon: :class:`HostBuffer` (tier_buffer_alloc_host)."""

import ctypes

from . import errors
from ._streams import torch_module


class HostBuffer:
    """Host memory shared with the daemon and registered in the session (tier_buffer_alloc_host).

    ``view()`` is a writable memoryview of the bytes; ``numpy()`` and ``tensor()`` are zero-copy
    arrays over them. The memory is unmapped by :meth:`unregister` or when the client closes: no
    view may be used after that (the library cannot revoke them; using one would fault).
    """

    def __init__(self, session, buffer_id, address, nbytes):
        self._session = session  # unregister() goes through it
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

    def check_valid(self):
        """Raises FailedPrecondition once the buffer was unregistered (its memory unmapped)."""
        self._check()

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
        """A CPU torch tensor over the buffer (uint8 unless dtype is given; the uint8 one is
        made once and kept)."""
        torch = torch_module()
        self._check()
        if self._u8 is None:
            self._u8 = torch.frombuffer(self.view(), dtype=torch.uint8)
        if dtype is None or dtype == torch.uint8:
            return self._u8
        size = torch.empty((), dtype=dtype).element_size()
        return self._u8[:self.nbytes // size * size].view(dtype)

    def unregister(self):
        """Waits for the session's jobs, then drops the buffer (the daemon closes its mapping)."""
        self._session.unregister(self)

    def invalidate(self):
        """Marks the buffer gone (its session dropped it): views must not be made any more."""
        self._valid = False
        self._u8 = None


def staging_view(buf, dtype, shape, nbytes):
    """The first `nbytes` of host buffer `buf` as a tensor of `dtype` and `shape`."""
    u8 = buf._u8 if buf._valid and buf._u8 is not None else buf.tensor()  # (hot: no call)
    v = u8[:nbytes]
    if dtype is not v.dtype:
        v = v.view(dtype)
    if len(shape) == 1 and v.shape[0] == shape[0]:
        return v  # (the 1-D flat bytes of a saved storage: already this shape)
    return v.view(shape)
