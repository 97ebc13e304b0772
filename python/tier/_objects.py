"""Persistent named objects (tier.h): they outlive the session, and with an NVMe tier tierd's
restarts. The C calls behind Client.offload_persistent, open_object, delete_object,
object_info and release_object."""

import ctypes

from . import _lib
from ._host_buffer import HostBuffer
from ._info import ObjectInfo
from ._streams import refuse_in_capture, stream_ptr


class PersistentObjects:
    """Persistent objects through one session (see Client's methods for what each does)."""

    def __init__(self, session):
        self._session = session

    def offload(self, name, buffer, offset, length, producer_streams, keep):
        buffer_id = buffer.id if isinstance(buffer, HostBuffer) else int(buffer)
        if not isinstance(buffer, HostBuffer):
            refuse_in_capture(None, "offload_persistent() of device memory")
        ptrs = [stream_ptr(s) for s in producer_streams] if producer_streams else None
        with self._session.checked:
            obj, job = self._session.jobs.offload_persistent(name, buffer_id, offset, length,
                                                             ptrs, keep)
        return obj, job.id

    def open(self, name):
        s = self._session
        obj = _lib.c_object_id()
        length = ctypes.c_uint64()
        with s.checked:
            _lib.check(s.lib.tier_object_open(s.c_session, name.encode(), ctypes.byref(obj),
                                              ctypes.byref(length)),
                       "open of persistent object %r" % name)
        return obj.value, length.value

    def delete(self, name, uid):
        s = self._session
        with s.checked:
            _lib.check(s.lib.tier_object_delete(s.c_session, name.encode(),
                                                0xFFFFFFFF if uid is None else int(uid)),
                       "delete of persistent object %r" % name)

    def info(self, name):
        s = self._session
        info = _lib.new_struct(_lib.ObjectInfo)
        with s.checked:
            _lib.check(s.lib.tier_object_stat(s.c_session, name.encode(), ctypes.byref(info)),
                       "stat of persistent object %r" % name)
        return ObjectInfo(info.len, bool(info.flags & _lib.TIER_OBJECT_READY),
                          bool(info.flags & _lib.TIER_OBJECT_DURABLE),
                          bool(info.flags & _lib.TIER_OBJECT_JOURNALED))

    def release(self, object_id):
        s = self._session
        with s.checked:
            _lib.check(s.lib.tier_object_release(s.c_session, int(object_id)),
                       "release of object id %d" % object_id)
