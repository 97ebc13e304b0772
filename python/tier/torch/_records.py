"""What tier.torch keeps in tierd besides tensor bytes: checked names, records (builtins pickled,
read back by a restricted unpickler that refuses anything but data), and small objects written
and read whole through a staging buffer. Shared by tier.torch.checkpoint, tier.torch.dcp and the
Checkpointer."""

import io
import pickle

import torch

from .. import errors

MAX_NAME = 96  # leaves room for "@V.T/n" within tierd's 127-byte names


def error(cls, message):
    return cls(cls.code, message)


def check_name(name):
    """The rules of every name tier.torch stores things under (InvalidArgument)."""
    if not isinstance(name, str) or not name:
        raise error(errors.InvalidArgument, "a checkpoint name is a non-empty str")
    if len(name) > MAX_NAME:
        raise error(errors.InvalidArgument, "checkpoint name %r is %d bytes; at most %d"
                    % (name, len(name), MAX_NAME))
    if any(not (33 <= ord(c) <= 126) or c == "@" for c in name):
        raise error(errors.InvalidArgument,
                    "checkpoint name %r: printable ASCII, no spaces and no '@'" % name)


class _RecordUnpickler(pickle.Unpickler):
    """Builtins (what tier.torch.checkpoint's _flatten makes) and nothing else: a record is
    data, never code. (No bytearray: its opcode allocates the length it declares before reading
    a byte.)"""
    _ALLOWED = {("builtins", "complex"), ("collections", "OrderedDict")}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise error(errors.DataLoss, "checkpoint record names %s.%s: not a tierd checkpoint "
                    "record" % (module, name))


# Bounds on what a record may describe, far above any real checkpoint: a damaged or forged record
# is refused (DataLoss) before it can make the loader allocate, loop or recurse without end.
_MAX_RECORD_BYTES = 256 << 20
_MAX_NODES = 1 << 22      # containers and scalars in a record, shared ones counted each time
_MAX_DEPTH = 64           # nesting of containers


def dumps(obj):
    """A record's bytes (builtins only: see loads)."""
    return pickle.dumps(obj, protocol=4)


def _check_opcodes(data):
    """Walks the pickle's opcodes without building anything: every length it declares must lie
    within the record (pickletools reads each argument from the bytes that are there)."""
    import pickletools
    for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
        if opcode.name == "BYTEARRAY8" or opcode.name in ("NEXT_BUFFER", "READONLY_BUFFER"):
            raise ValueError("opcode %s is not in a tierd checkpoint record" % opcode.name)
        if opcode.name == "FRAME" and arg > len(data):
            raise ValueError("a frame of %d bytes in a record of %d" % (arg, len(data)))
        # The unpickler grows its memo to the index a PUT names: never past the record's size.
        if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and int(arg) > len(data):
            raise ValueError("memo index %s in a record of %d bytes" % (arg, len(data)))


def _is_container(value):
    return isinstance(value, (dict, list, tuple))


def _children(value):
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out.append(k)
            out.append(v)
        return out
    return value


def _check_value(value):
    if not (value is None or isinstance(value, (bool, int, float, complex, str, bytes))):
        raise ValueError("a %s" % type(value).__name__)


def _check_tree(obj):
    """At most _MAX_DEPTH deep and _MAX_NODES values in all, a shared value counted once per
    place it appears (what a walk of the record visits), and no container inside itself.
    Computed over the distinct containers (each once: what it holds, counted from its children's
    counts), iteratively: a record of 61 lists that share each other, 2^60 values as a walk sees
    them, is refused at once rather than after walking 4M of them."""
    if not _is_container(obj):
        _check_value(obj)
        return
    counted = {}   # id(container) -> (values in it, itself included; its height)
    open_ = set()  # ids of the containers on the walk's path (their contents being counted)
    stack = [(obj, False)]
    while stack:
        value, done = stack.pop()
        key = id(value)
        if not done and key in counted:
            continue
        children = _children(value)
        if done:
            size, height = 1, 0
            for child in children:
                if _is_container(child):
                    n, h = counted[id(child)]
                    size += n
                    height = max(height, h + 1)
                else:
                    size += 1
                    height = max(height, 1)
            if size > _MAX_NODES:
                raise ValueError("more than %d values" % _MAX_NODES)
            if height > _MAX_DEPTH:
                raise ValueError("nested more than %d deep" % _MAX_DEPTH)
            counted[key] = (size, height)
            open_.discard(key)
            continue
        if key in open_:
            raise ValueError("a container that holds itself")
        open_.add(key)
        stack.append((value, True))
        for child in children:
            if _is_container(child):
                if id(child) in open_:
                    raise ValueError("a container that holds itself")
                if id(child) not in counted:
                    stack.append((child, False))
            else:
                _check_value(child)


def loads(data, what):
    """The record in `data`, checked (DataLoss naming `what` where it is damaged or forged)."""
    try:
        if len(data) > _MAX_RECORD_BYTES:
            raise ValueError("%d bytes, at most %d" % (len(data), _MAX_RECORD_BYTES))
        _check_opcodes(data)
        record = _RecordUnpickler(io.BytesIO(data)).load()
        _check_tree(record)
        return record
    except errors.TierError:
        raise
    except Exception as e:  # a damaged record (RecursionError, MemoryError too): say so
        raise error(errors.DataLoss, "%s is not a readable checkpoint record: %s: %s"
                    % (what, type(e).__name__, e)) from None


# ---- small objects: write and read whole ------------------------------------------------------

def write_small(client, name, data):
    """A new persistent object `name` holding `data` (bytes), waited for."""
    buf = client.staging_acquire(max(len(data), 1))
    try:
        buf.view()[:len(data)] = data
        obj, job = client.offload_persistent(name, buf, 0, len(data))
        client.wait(job)
        client.release_object(obj)
    finally:
        client.staging_release(buf)


def read_small(client, name):
    """The bytes of persistent object `name` (NotFound)."""
    obj, length = client.open_object(name)
    try:
        buf = client.staging_acquire(max(length, 1))
        try:
            client.wait(client.reload_buffer(obj, buf, 0, length))
            return bytes(buf.view()[:length])
        finally:
            client.staging_release(buf)
    finally:
        client.release_object(obj)


def delete_quietly(client, name):
    """Deletes persistent object `name`; False where there was none."""
    try:
        client.delete_object(name)
        return True
    except errors.NotFound:
        return False


def byte_view(t):
    """The bytes of a contiguous, non-empty tensor, as a 1-D uint8 tensor sharing its memory."""
    return t.detach().reshape(-1).view(torch.uint8)
