"""Errors from Tierd as Python exceptions.

The daemon, the gRPC wire, the C ABI (``tier_status``) and Python share one vocabulary: the
canonical status codes (the numbers of ``absl::StatusCode`` / ``grpc::StatusCode``). Every failure
arrives as a :class:`TierError` carrying ``.code`` (int), ``.code_name`` ("NOT_FOUND") and the
library's message; common codes have their own subclass so callers can write
``except tier.ResourceExhausted``.
"""

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

CODE_NAMES = {
    OK: "OK",
    CANCELLED: "CANCELLED",
    UNKNOWN: "UNKNOWN",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
    NOT_FOUND: "NOT_FOUND",
    ALREADY_EXISTS: "ALREADY_EXISTS",
    PERMISSION_DENIED: "PERMISSION_DENIED",
    RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    FAILED_PRECONDITION: "FAILED_PRECONDITION",
    ABORTED: "ABORTED",
    OUT_OF_RANGE: "OUT_OF_RANGE",
    UNIMPLEMENTED: "UNIMPLEMENTED",
    INTERNAL: "INTERNAL",
    UNAVAILABLE: "UNAVAILABLE",
    DATA_LOSS: "DATA_LOSS",
    UNAUTHENTICATED: "UNAUTHENTICATED",
}


def code_name(code):
    """The canonical name of a status code ("NOT_FOUND"); "UNKNOWN" for numbers out of range."""
    return CODE_NAMES.get(int(code), "UNKNOWN")


class TierError(Exception):
    """A failure reported by libtierclient or the daemon.

    ``code`` is the canonical status code (an int, ``tier.NOT_FOUND`` ...), ``code_name`` its name,
    ``message`` the library's description (``tier_last_error()`` or the job's completion).
    """

    code = UNKNOWN

    def __init__(self, code, message=""):
        self.code = int(code)
        self.code_name = code_name(self.code)
        self.message = message
        super().__init__("%s: %s" % (self.code_name, message) if message else self.code_name)

    def __reduce__(self):  # picklable (multiprocessing, torch.distributed) despite the 2-arg init
        return (error_from_code, (self.code, self.message))


class Cancelled(TierError):
    code = CANCELLED


class InvalidArgument(TierError, ValueError):
    code = INVALID_ARGUMENT


class DeadlineExceeded(TierError, TimeoutError):
    code = DEADLINE_EXCEEDED


class NotFound(TierError, LookupError):
    code = NOT_FOUND


class AlreadyExists(TierError):
    code = ALREADY_EXISTS


class PermissionDenied(TierError, PermissionError):
    code = PERMISSION_DENIED


class ResourceExhausted(TierError):
    code = RESOURCE_EXHAUSTED


class FailedPrecondition(TierError):
    code = FAILED_PRECONDITION


class Aborted(TierError):
    code = ABORTED


class OutOfRange(TierError, IndexError):
    code = OUT_OF_RANGE


class Unimplemented(TierError, NotImplementedError):
    code = UNIMPLEMENTED


class Internal(TierError):
    code = INTERNAL


class Unavailable(TierError, ConnectionError):
    code = UNAVAILABLE


class DataLoss(TierError):
    code = DATA_LOSS


class Unauthenticated(TierError):
    code = UNAUTHENTICATED


_CLASSES = {
    cls.code: cls
    for cls in (Cancelled, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
                Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}


def error_from_code(code, message=""):
    """The exception for a status code: its subclass where one exists, else TierError."""
    cls = _CLASSES.get(int(code))
    if cls is None:
        return TierError(code, message)
    return cls(code, message)
