"""tier: the Python client of Tierd, the per-node GPU memory-tiering daemon.

    import tier
    with tier.Client() as client:             # $TIER_SOCKET or the default socket
        h = client.offload(t)                 # t: a CPU or CUDA tensor
        t2 = h.reload()                       # same shape, dtype, device
        h.free()                              # or just drop h

PyTorch integration (activation and weight offload) lives in :mod:`tier.torch`. Errors from the
daemon arrive as :class:`TierError` subclasses carrying the canonical status code.
"""

from .errors import (  # noqa: F401
    OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS,
    PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE,
    UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS, UNAUTHENTICATED,
    TierError, Cancelled, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
    PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented,
    Internal, Unavailable, DataLoss, Unauthenticated, code_name, error_from_code,
)
from .client import (  # noqa: F401
    Client, Handle, HostBuffer, SessionInfo, Completion, ObjectInfo, default_client,
)
from ._lib import library_path, version as library_version  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "Client", "Handle", "HostBuffer", "SessionInfo", "Completion", "ObjectInfo", "default_client",
    "library_path", "library_version", "code_name", "error_from_code",
    "TierError", "Cancelled", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists",
    "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
    "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
]
