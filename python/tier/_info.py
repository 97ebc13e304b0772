"""What the client reports as plain records: :class:`SessionInfo`, :class:`ObjectInfo`,
:class:`Completion`."""

import collections

from . import errors


class SessionInfo(collections.namedtuple(
        "SessionInfo", "session_id quota_bytes ring_entries jobs_in_flight engine "
        "device_registrations device_extensions device_exports")):
    """tier_session_info: the session's id, quota, ring size, jobs in flight and the daemon's
    copy engine ("host", "cuda", "hip"); and what registering GPU memory cost so far:
    registrations and extensions sent to tierd, allocations (VMM pages) exported for them. With
    expandable segments each segment is registered once and extended as PyTorch maps pages, so
    these stay flat across training steps once the segments stop growing."""


class ObjectInfo(collections.namedtuple("ObjectInfo", "length ready durable journaled")):
    """A persistent object's state (Client.object_info): ``ready`` once its offload landed,
    ``durable`` once written through to NVMe (it survives a restart of tierd); ``journaled``
    says whether this tierd writes through at all (without it ``durable`` never comes)."""


class Completion(collections.namedtuple("Completion", "job object length status")):
    """One finished low-level job (tier_completion). ``status`` is the canonical code."""

    @property
    def ok(self):
        return self.status == errors.OK

    @property
    def code_name(self):
        return errors.code_name(self.status)

    def error(self):
        """The TierError this completion stands for, or None if it succeeded."""
        if self.ok:
            return None
        return errors.error_from_code(
            self.status, "%s from tierd for job %d" % (self.code_name, self.job))
