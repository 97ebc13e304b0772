"""tier.torch.checkpoint: a model's and optimizer's state kept in tierd, outside the trainer.

A trainer that dies (SIGKILL, a lost rank, a drained node) restarts from the copy in tierd in
seconds instead of from remote storage in minutes; with an NVMe tier the copy also survives a
restart of tierd. ``save`` takes a snapshot and returns at once; the copy into tierd, the commit
and the removal of old versions run on a thread of their own.

Objects, all in the caller's uid namespace (see tier.h, "Named, persistent objects"), for a
checkpoint NAME and version V with a random token T:

- ``NAME@V.T/0`` .. ``NAME@V.T/n-1``: the data. CPU tensors are packed into chunks of about
  ``chunk_bytes``; each CUDA tensor is one object, copied by tierd straight from the GPU.
- ``NAME@V.T/meta``: the commit record, written after every data object landed: the structure of
  the state dict with each tensor replaced by (object, offset, bytes, dtype, shape, device).
- ``NAME/index.0`` .. ``NAME/index.2``: the versions kept, newest first, with a sequence number
  S, in slot S % 3; a reader takes the valid slot with the highest sequence. Before a save writes
  any data it records the version as *pending* (sequence S+1), so the objects of a save cut short
  (the trainer killed half way) are found and deleted by the next save instead of being left
  behind in the quota; its commit is sequence S+2. Both slots are free when written: after a
  commit, the save deletes the two older slots (and the versions past ``keep``), which frees the
  slots the next save writes. So nothing is deleted between a save and its commit: a delete waits
  for tierd's NVMe journal (the write-through of the data just saved), a create does not, and
  "committed in host memory" stays at the speed of host memory.

Only builtin containers and scalars are stored besides tensors (a restricted unpickler reads the
record back), so loading runs no code from the store.
"""
import secrets
import threading
import time

import torch

from .. import client as _client
from .. import errors
from ._records import (byte_view as _byte_view, check_name as _check_name,  # noqa: F401
                       delete_quietly as _delete_quietly, dumps as _dumps, error as _error,
                       loads as _loads, read_small as _read_small, write_small as _write_small)

DEFAULT_CHUNK_BYTES = 64 << 20
_ALIGN = 64
_FORMAT = 1

# One save at a time per (client, name): a second save of the same name waits for the first to
# commit, so versions are committed in order and the index is written by one thread at a time.
_saving_lock = threading.Lock()
_saving = {}  # (id(client), name) -> SaveHandle


def _object_name(name, version, token, part):
    return "%s@%d.%s/%s" % (name, version, token, part)


# ---- the record: the state dict's structure, tensors replaced by references --------------------

# A tensor is stored as (_TENSOR, its index in the record's tensors), a dtype or device as
# (_TORCH, its str()); the other values are themselves.
_TENSOR = "__tier_tensor__"
_TORCH = "__tier_torch__"


def _marker(value):
    """_TENSOR or _TORCH where `value` is such a reference, else None."""
    if type(value) is tuple and len(value) == 2 and isinstance(value[0], str) and \
            value[0] in (_TENSOR, _TORCH):
        return value[0]
    return None


def _map_tree(obj, leaf):
    """A copy of `obj` with its dicts (of the same type), lists and plain tuples rebuilt around
    leaf(value) for every other value; a reference is a value (leaf sees it whole)."""
    if isinstance(obj, dict):
        flat = {k: _map_tree(v, leaf) for k, v in obj.items()}
        return type(obj)(flat) if type(obj) is not dict else flat
    if isinstance(obj, list):
        return [_map_tree(v, leaf) for v in obj]
    if type(obj) is tuple and _marker(obj) is None:
        return tuple(_map_tree(v, leaf) for v in obj)
    return leaf(obj)


def _flatten(obj, tensors):
    """A copy of `obj` with every tensor appended to `tensors` and replaced by its reference."""
    def leaf(value):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            return (_TENSOR, len(tensors) - 1)
        if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
            return value
        if isinstance(value, (torch.dtype, torch.device)):
            return (_TORCH, str(value))
        if isinstance(value, tuple) and type(value) is not tuple:
            raise _error(errors.InvalidArgument, "checkpoint: named tuples are not stored (%s)"
                         % type(value).__name__)
        if isinstance(value, tuple):  # one that reads as a reference
            raise _error(errors.InvalidArgument, "checkpoint: the tuple (%r, x) is reserved"
                         % value[0])
        raise _error(errors.InvalidArgument, "checkpoint: cannot store a %s (tensors, dicts, "
                     "lists, tuples and scalars only)" % type(value).__name__)
    return _map_tree(obj, leaf)


def _unflatten(obj, tensors):
    """The state dict that _flatten made `obj` of, with `tensors` in its references."""
    def leaf(value):
        kind = _marker(value)
        if kind == _TENSOR:
            return tensors[value[1]]
        if kind == _TORCH:
            text = value[1]
            return getattr(torch, text[len("torch."):]) if text.startswith("torch.") else \
                torch.device(text)
        return value
    return _map_tree(obj, leaf)


# Bounds on a checkpoint's records beyond the record format's own (_records.py).
_MAX_OBJECTS = 1 << 24    # data objects of a version (tierd's most names of a uid)
_MAX_VERSIONS = 4096
_MAX_INT = 1 << 62


def _is_int(value, low=0, high=_MAX_INT):
    return type(value) is int and low <= value <= high


def _bad(what, why):
    return _error(errors.DataLoss, "%s is not a valid checkpoint record: %s" % (what, why))


def _check_entry(entry, what):
    """A version's entry in the index: {"version", "token", "objects"}."""
    if not isinstance(entry, dict):
        raise _bad(what, "a version entry is a %s" % type(entry).__name__)
    if not _is_int(entry.get("version"), 1):
        raise _bad(what, "version %r" % (entry.get("version"),))
    token = entry.get("token")
    if not (isinstance(token, str) and len(token) == 8 and
            all(c in "0123456789abcdef" for c in token)):
        raise _bad(what, "token %r" % (token,))
    if not _is_int(entry.get("objects"), 0, _MAX_OBJECTS):
        raise _bad(what, "objects %r (at most %d)" % (entry.get("objects"), _MAX_OBJECTS))
    return entry


def _check_index(record, what):
    if not isinstance(record, dict):
        raise _bad(what, "a %s" % type(record).__name__)
    if not _is_int(record.get("seq")):
        raise _bad(what, "seq %r" % (record.get("seq"),))
    versions = record.get("versions")
    if not isinstance(versions, list) or len(versions) > _MAX_VERSIONS:
        raise _bad(what, "versions is not a list of at most %d" % _MAX_VERSIONS)
    for entry in versions:
        _check_entry(entry, what)
    if record.get("pending") is not None:
        _check_entry(record["pending"], what)
    if not _is_int(record.get("last_version", 0)):
        raise _bad(what, "last_version %r" % (record.get("last_version"),))
    return record


def _dtype_of(name):
    """The torch dtype `name` names, if it is one tensors can be made of; else None."""
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        return None
    try:
        torch.empty((0,), dtype=dtype)
    except (RuntimeError, TypeError, ValueError):
        return None
    return dtype


def _device_of(text):
    try:
        return torch.device(text) if isinstance(text, str) and len(text) <= 64 else None
    except (RuntimeError, ValueError, TypeError):
        return None


def _check_meta(record, what):
    """The commit record of a version: every field of the right type and within what it says."""
    if not isinstance(record, dict):
        raise _bad(what, "a %s" % type(record).__name__)
    sizes = record.get("sizes")
    if not isinstance(sizes, list) or len(sizes) > _MAX_OBJECTS or \
            not all(_is_int(n) for n in sizes):
        raise _bad(what, "sizes is not a list of byte counts")
    tensors = record.get("tensors")
    if not isinstance(tensors, list):
        raise _bad(what, "tensors is not a list")
    for i, ref in enumerate(tensors):
        if not isinstance(ref, tuple) or len(ref) != 7:
            raise _bad(what, "tensor %d is not a 7-tuple" % i)
        o, offset, nbytes, dtype, shape, device, requires_grad = ref
        if not (_is_int(o, -1, len(sizes) - 1) and _is_int(offset) and _is_int(nbytes)):
            raise _bad(what, "tensor %d: object %r, offset %r, bytes %r" % (i, o, offset, nbytes))
        if o >= 0 and offset + nbytes > sizes[o]:
            raise _bad(what, "tensor %d: bytes %d..%d past object %d of %d bytes"
                       % (i, offset, offset + nbytes, o, sizes[o]))
        kind = _dtype_of(dtype)
        if kind is None:
            raise _bad(what, "tensor %d: dtype %r" % (i, dtype))
        if not isinstance(shape, tuple) or len(shape) > 64 or not all(_is_int(d) for d in shape):
            raise _bad(what, "tensor %d: shape %r" % (i, shape))
        numel = 1
        for d in shape:
            numel *= d
        # The shape must be the bytes it names (an empty tensor, for object -1): no record makes
        # the loader allocate what it does not hold.
        if numel * kind.itemsize != (nbytes if o >= 0 else 0):
            raise _bad(what, "tensor %d: shape %r of %s is not %d bytes" % (i, shape, dtype, nbytes))
        if _device_of(device) is None:
            raise _bad(what, "tensor %d: device %r" % (i, device))
        if type(requires_grad) is not bool:
            raise _bad(what, "tensor %d: requires_grad %r" % (i, requires_grad))
    # The tree: tensor references within `tensors`, torch references that name a dtype or device.
    stack = [record.get("tree")]
    while stack:
        value = stack.pop()
        kind = _marker(value)
        if kind == _TENSOR:
            if not _is_int(value[1], 0, len(tensors) - 1):
                raise _bad(what, "a reference to tensor %r of %d" % (value[1], len(tensors)))
        elif kind == _TORCH:
            text = value[1]
            if not isinstance(text, str) or (
                    _dtype_of(text[len("torch."):]) is None if text.startswith("torch.")
                    else _device_of(text) is None):
                raise _bad(what, "torch value %r" % (text,))
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return record


# ---- the index ----------------------------------------------------------------------------------

_SLOTS = 3


def _read_index(client, name):
    """(slot, record) of the newest whole index slot, or (None, empty record)."""
    best = (None, {"seq": 0, "versions": [], "pending": None})
    for slot in range(_SLOTS):
        try:
            record = _loads(_read_small(client, "%s/index.%d" % (name, slot)),
                            "the index of checkpoint %r" % name)
        except (errors.NotFound, errors.DataLoss):
            continue
        if not isinstance(record, dict) or record.get("format") != _FORMAT:
            continue
        try:
            _check_index(record, "the index of checkpoint %r" % name)
        except errors.DataLoss:
            continue  # the other slot is whole
        if record["seq"] > best[1]["seq"]:
            best = (slot, record)
    return best


def _index_name(name, seq):
    return "%s/index.%d" % (name, seq % _SLOTS)


def _write_index(client, name, record):
    """Writes `record` (sequence S) into slot S % 3, which the save before freed; returns its
    name. (A slot still taken, as after a version of this module with two slots, is deleted
    first: never the newest, which has another number.)"""
    record = dict(record, format=_FORMAT)
    path = _index_name(name, record["seq"])
    data = _dumps(record)
    try:
        _write_small(client, path, data)
    except errors.AlreadyExists:
        _delete_quietly(client, path)
        _write_small(client, path, data)
    return path


def _delete_version(client, name, entry):
    _delete_quietly(client, _object_name(name, entry["version"], entry["token"], "meta"))
    # Objects are numbered from 0; a save cut short leaves a prefix of them or scattered few. A
    # long run of missing ones means the rest were never made: stop there.
    missing = 0
    for i in range(entry["objects"]):
        if _delete_quietly(client, _object_name(name, entry["version"], entry["token"], str(i))):
            missing = 0
        else:
            missing += 1
            if missing >= 1024:
                break


# ---- save -----------------------------------------------------------------------------------------

class SaveHandle:
    """One save in flight. ``done()``/``wait()``: the version is committed in tierd's memory (a
    trainer that dies from then on can load it). ``wait_durable()``: it is also on NVMe (it
    survives a restart of tierd)."""

    def __init__(self, client, name, version, objects, nbytes):
        self.client = client
        self.name = name
        self.version = version
        self.nbytes = nbytes
        self._objects = objects  # every object name of this version, meta included
        self._index_name = None
        self._committed = threading.Event()
        self._cleaned = threading.Event()  # the older index slots and versions deleted
        self._error = None
        self.seconds_to_commit = None
        # Where the time went (seconds): "snapshot" (in save(): registration, submission, host
        # chunks filled; "register" of it: GPU memory registered with tierd), "copies" (until every data object landed), "record" (meta and index
        # written: committed), "cleanup" (older slots and versions deleted, after the commit).
        self.phases = {}

    def done(self):
        return self._committed.is_set()

    def wait(self, timeout=None):
        """Blocks until the version is committed in tierd (host memory); raises what failed."""
        if not self._committed.wait(timeout):
            raise _error(errors.DeadlineExceeded, "checkpoint %r version %d not committed within %s s"
                                          % (self.name, self.version, timeout))
        if self._error is not None:
            raise self._error
        return self

    def durable(self):
        """Whether every object of this version (and the index naming it) is on NVMe."""
        self.wait()
        for object_name in self._objects + [self._index_name]:
            info = self.client.object_info(object_name)
            if not info.journaled:
                raise _error(errors.FailedPrecondition, 
                    "tierd keeps persistent objects in host memory only (no spill_dir): "
                    "checkpoint %r lives until tierd stops" % self.name)
            if not info.durable:
                return False
        return True

    def wait_durable(self, timeout=None, poll_s=0.005):
        """Blocks until durable() holds. FailedPrecondition when tierd has no NVMe tier."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.durable():
            if deadline is not None and time.monotonic() > deadline:
                raise _error(errors.DeadlineExceeded, "checkpoint %r version %d not on NVMe within %s s"
                                              % (self.name, self.version, timeout))
            time.sleep(poll_s)
        return self

    def __repr__(self):
        state = "committed" if self.done() and self._error is None else (
            "failed" if self._error is not None else "in flight")
        return "<tier checkpoint %r v%d, %d bytes, %s>" % (self.name, self.version, self.nbytes,
                                                          state)


def _layout(tensors, chunk_bytes):
    """Places each tensor: CUDA tensors get an object each; CPU tensors are packed in order into
    chunks of about chunk_bytes (a larger tensor gets a chunk of its own). Returns (refs, sizes,
    kinds): refs[i] = (object, offset, nbytes); kinds[o] = "cuda" or "host"."""
    refs, sizes, kinds = [], [], []
    open_chunk = None
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if nbytes == 0:
            refs.append((-1, 0, 0))  # nothing to store: made anew at load
            continue
        if t.is_cuda:
            refs.append((len(sizes), 0, nbytes))
            sizes.append(nbytes)
            kinds.append("cuda")
            continue
        if open_chunk is None or sizes[open_chunk] + nbytes > chunk_bytes:
            open_chunk = len(sizes)
            sizes.append(0)
            kinds.append("host")
        offset = sizes[open_chunk]
        refs.append((open_chunk, offset, nbytes))
        sizes[open_chunk] = offset + nbytes + (-(offset + nbytes)) % _ALIGN
    return refs, sizes, kinds


def save(state_dict, name, keep=2, client=None, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Saves `state_dict` (nested dicts, lists and tuples of tensors and scalars: a model's and
    an optimizer's ``state_dict()``, or a dict of both) into tierd as the next version of `name`,
    keeping the newest `keep` versions. Returns a :class:`SaveHandle` at once.

    What happens before it returns: the snapshot. CPU tensors are copied into tierd's shared
    buffers (memcpy speed); CUDA tensors are copied by tierd straight from the GPU, ordered after
    the work already queued on the current stream, and the current stream waits on the GPU for
    those copies before running anything queued later, so the step that follows may update the
    parameters in place. The host never waits for the GPU. The copy into tierd, the commit and
    the removal of versions past `keep` run on a thread of their own.

    Sharded state: every rank saves under its own name (e.g. ``"run7/rank%d" % rank``).
    A save of a name waits for the previous save of that name (in this process) to commit."""
    _check_name(name)
    if keep < 1:
        raise _error(errors.InvalidArgument, "keep must be at least 1 (got %r)" % (keep,))
    if chunk_bytes < _ALIGN:
        raise _error(errors.InvalidArgument, "chunk_bytes must be at least %d" % _ALIGN)
    client = client if client is not None else _client.default_client()
    key = (id(client), name)
    with _saving_lock:
        previous = _saving.get(key)
    if previous is not None:
        try:
            previous.wait()
        except errors.TierError:
            pass  # its failure was its caller's to see; this save starts clean
        # Its cleanup frees the index slots this save writes. (Saving more often than tierd's
        # NVMe journal absorbs waits here: that is the disk's speed.)
        previous._cleaned.wait()
    started = time.monotonic()

    tensors = []
    tree = _flatten(state_dict, tensors)
    tensors = [t if t.is_contiguous() else t.contiguous() for t in tensors]
    refs, sizes, kinds = _layout(tensors, chunk_bytes)
    job = _Save(client, name, keep, len(sizes))
    job.snapshot(tensors, refs, sizes, kinds)
    # Per tensor: (object index, or -1 for no bytes; offset; nbytes; dtype; shape; device;
    # requires_grad).
    tensor_refs = [(o, offset, nbytes, str(t.dtype)[len("torch."):], tuple(t.shape),
                    str(t.device), bool(t.requires_grad))
                   for t, (o, offset, nbytes) in zip(tensors, refs)]
    job.record = {"format": _FORMAT, "version": job.version, "sizes": sizes,
                  "tensors": tensor_refs, "tree": tree}
    handle = job.handle
    handle.phases["snapshot"] = time.monotonic() - started
    handle.phases["register"] = job.registering  # of the snapshot: GPU memory registered
    with _saving_lock:
        _saving[key] = handle
    threading.Thread(target=job.finish, args=(key, started), name="tier-checkpoint",
                     daemon=True).start()
    return handle


class _Save:
    """One version of `name` being saved: made pending in the index, snapshot into tierd
    (:meth:`snapshot`, in save()), then committed and the older versions cleaned up
    (:meth:`finish`, on the save's own thread)."""

    def __init__(self, client, name, keep, objects):
        self.client, self.name, self.keep = client, name, keep
        slot, index = _read_index(client, name)
        if index.get("pending"):
            _delete_version(client, name, index["pending"])  # a save cut short: its objects go
        self.kept = index["versions"]
        self.version = max([e["version"] for e in self.kept] +
                           [index.get("last_version", 0)]) + 1
        token = secrets.token_hex(4)
        self.entry = {"version": self.version, "token": token, "objects": objects}
        self.index_seq = index["seq"] + 1
        _write_index(client, name, {"seq": self.index_seq, "versions": self.kept,
                                    "pending": self.entry, "last_version": self.version})
        self.object_names = [_object_name(name, self.version, token, str(i))
                             for i in range(objects)]
        self.meta_name = _object_name(name, self.version, token, "meta")
        self.jobs, self.staging = [], []  # [(object, job)]; staging buffers the jobs read
        self.registering = 0.0
        self.record = None
        self.handle = None

    def snapshot(self, tensors, refs, sizes, kinds):
        """Host chunks filled now, CUDA tensors copied by tierd in stream order (the current
        stream waits on the GPU for their copies)."""
        client, names = self.client, self.object_names
        self.handle = SaveHandle(client, self.name, self.version, names + [self.meta_name],
                                 sum(sizes))
        try:
            host_views = {}
            for o, (size, kind) in enumerate(zip(sizes, kinds)):
                if kind == "host":
                    buf = client.staging_acquire(max(size, 1))
                    self.staging.append(buf)
                    host_views[o] = buf
            cuda_jobs = []
            for t, (o, offset, nbytes) in zip(tensors, refs):
                if o == -1:
                    continue
                if kinds[o] == "host":
                    host_views[o].tensor(torch.uint8)[offset:offset + nbytes].copy_(
                        _byte_view(t))
                else:
                    cuda_jobs.append(self._offload_cuda(t, names[o], nbytes))
            for o, buf in host_views.items():
                self.jobs.append(client.offload_persistent(names[o], buf, 0, sizes[o]))
            self.jobs.extend(cuda_jobs)
        except BaseException:
            for buf in self.staging:
                client.staging_release(buf)
            raise

    def _offload_cuda(self, t, object_name, nbytes):
        client = self.client
        stream = torch.cuda.current_stream(t.device)
        t_reg = time.monotonic()
        buffer_id, buf_offset = client.register_device(t.data_ptr(), nbytes)
        self.registering += time.monotonic() - t_reg
        obj, job = client.offload_persistent(object_name, buffer_id, buf_offset, nbytes,
                                             producer_streams=[stream], keep=t)
        client.stream_wait_offload(job, stream)
        return obj, job

    def finish(self, key, started):
        """The save's thread: commit, then (off the commit's path) clean up."""
        handle = self.handle
        committed_index = None
        try:
            committed_index = self._commit(started)
        except BaseException as e:  # noqa: B902 - reported through the handle
            handle._error = e if isinstance(e, errors.TierError) else _error(
                errors.Internal, "checkpoint %r version %d: %s" % (self.name, self.version, e))
            for buf in self.staging:
                try:
                    self.client.staging_release(buf)
                except errors.TierError:
                    pass
        finally:
            handle._committed.set()
        try:
            self._clean_up(committed_index)
        except errors.TierError:
            pass  # what is left is found and deleted by the next save (or delete())
        finally:
            handle._cleaned.set()
            with _saving_lock:
                if _saving.get(key) is handle:
                    del _saving[key]

    def _commit(self, started):
        """Waits for every data object, then writes the meta record and the index naming this
        version: committed. Returns the index object written."""
        client, handle = self.client, self.handle
        t0 = time.monotonic()
        for obj, job in self.jobs:
            client.wait(job)
            client.release_object(obj)
        for buf in self.staging:
            client.staging_release(buf)
        self.staging.clear()
        t1 = time.monotonic()
        _write_small(client, self.meta_name, _dumps(self.record))
        versions = [self.entry] + self.kept
        committed_index = _write_index(client, self.name, {
            "seq": self.index_seq + 1, "versions": versions[:self.keep], "pending": None,
            "last_version": self.version})
        handle._index_name = committed_index
        handle.seconds_to_commit = time.monotonic() - started
        handle.phases.update(copies=t1 - t0, record=time.monotonic() - t1)
        return committed_index

    def _clean_up(self, committed_index):
        """After the commit: the older index slots (freeing the slots the next save writes) and
        the versions past `keep`. Each delete may wait for tierd's journal."""
        t2 = time.monotonic()
        if committed_index is not None:
            for slot in range(_SLOTS):
                if "%s/index.%d" % (self.name, slot) != committed_index:
                    _delete_quietly(self.client, "%s/index.%d" % (self.name, slot))
            for old in ([self.entry] + self.kept)[self.keep:]:
                _delete_version(self.client, self.name, old)
        self.handle.phases["cleanup"] = time.monotonic() - t2


# ---- load, list, delete --------------------------------------------------------------------------

def versions(name, client=None):
    """The committed versions of `name` kept in tierd, newest first."""
    _check_name(name)
    client = client if client is not None else _client.default_client()
    return [e["version"] for e in _read_index(client, name)[1]["versions"]]


def _read_version(client, name, entry, map_location):
    record = _loads(_read_small(client, _object_name(name, entry["version"], entry["token"],
                                                     "meta")),
                    "checkpoint %r version %d" % (name, entry["version"]))
    if not isinstance(record, dict) or record.get("format") != _FORMAT:
        raise _error(errors.DataLoss, "checkpoint %r version %d: unknown record format"
                              % (name, entry["version"]))
    _check_meta(record, "checkpoint %r version %d" % (name, entry["version"]))
    sizes = record["sizes"]
    by_object = {}
    for i, ref in enumerate(record["tensors"]):
        by_object.setdefault(ref[0], []).append(i)
    tensors = [None] * len(record["tensors"])
    for i, (o, _, _, dtype, shape, device, requires_grad) in enumerate(record["tensors"]):
        if o == -1:
            tensors[i] = torch.empty(shape, dtype=getattr(torch, dtype),
                                     device=_target_device(device, map_location))
            tensors[i].requires_grad_(requires_grad)
    direct = _read_direct(client, name, entry, record, by_object, map_location, tensors)
    for o, size in enumerate(sizes):
        if o in direct:
            continue
        object_name = _object_name(name, entry["version"], entry["token"], str(o))
        obj, length = client.open_object(object_name)
        try:
            if length != size:
                raise _error(errors.DataLoss, "checkpoint %r version %d: %s holds %d bytes, the record "
                                      "says %d" % (name, entry["version"], object_name, length,
                                                   size))
            buf = client.staging_acquire(max(length, 1))
            try:
                client.wait(client.reload_buffer(obj, buf, 0, length))
                data = buf.tensor(torch.uint8)
                for i in by_object.get(o, []):
                    _, offset, nbytes, dtype, shape, device, requires_grad = record["tensors"][i]
                    t = torch.empty(shape, dtype=getattr(torch, dtype))
                    _byte_view(t).copy_(data[offset:offset + nbytes])
                    target = _target_device(device, map_location)
                    if target.type != "cpu":
                        t = t.to(target)
                    tensors[i] = t.requires_grad_(requires_grad)
            finally:
                client.staging_release(buf)
        finally:
            client.release_object(obj)
    return _unflatten(record["tree"], tensors)


def _read_direct(client, name, entry, record, by_object, map_location, tensors):
    """The objects that each hold one whole tensor going to a GPU (each CUDA tensor of a save)
    are reloaded by tierd straight into their new GPU tensors: one batch per GPU, the
    destinations allocated on its current stream, which waits (on the GPU) for the batch's
    copies; then this waits for them on the host, so the tensors are whole when load returns.
    Returns the indices of the objects read so."""
    if client.engine == "host" or client.device_direct is False:
        return set()  # no GPU engine: through host memory
    per_device = {}  # device -> [(object index, tensor index)]
    for o, size in enumerate(record["sizes"]):
        refs = by_object.get(o, [])
        if len(refs) != 1:
            continue
        _, offset, nbytes, _, _, device, _ = record["tensors"][refs[0]]
        target = _target_device(device, map_location)
        if target.type == "cuda" and offset == 0 and nbytes == size and nbytes > 0:
            per_device.setdefault(target, []).append((o, refs[0]))
    done = set()
    for device, items in per_device.items():
        opened, rows = [], []
        stream = torch.cuda.current_stream(device)
        try:
            for o, i in items:
                object_name = _object_name(name, entry["version"], entry["token"], str(o))
                obj, length = client.open_object(object_name)
                opened.append(obj)
                _, _, nbytes, dtype, shape, _, requires_grad = record["tensors"][i]
                if length != nbytes:
                    raise _error(errors.DataLoss, "checkpoint %r version %d: %s holds %d bytes, "
                                 "the record says %d" % (name, entry["version"], object_name,
                                                         length, nbytes))
                with torch.cuda.device(device), torch.cuda.stream(stream):
                    t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                try:
                    buffer_id, offset = client.register_device(t.data_ptr(), nbytes)
                except errors.Unimplemented:
                    return done  # a library without GPU support: the rest through host memory
                rows.append((obj, buffer_id, offset, nbytes))
                tensors[i] = t.requires_grad_(requires_grad)
            for job in client.reload_buffer_batch(rows, consumer_stream=stream):
                client.wait(job)
        finally:
            for obj in opened:
                client.release_object(obj)
        done.update(o for o, _ in items)
    return done


def _target_device(saved, map_location):
    if map_location is None:
        return torch.device(saved)
    if callable(map_location):
        return torch.device(map_location(saved))
    if isinstance(map_location, dict):
        return torch.device(map_location.get(saved, saved))
    return torch.device(map_location)


def load(name, version=None, client=None, map_location=None):
    """The state dict of the newest committed version of `name` (or of `version`), its tensors on
    the devices they were saved from (or as `map_location` says: a device, a dict from saved
    device to device, or a function). NotFound when tierd holds no whole version; a version whose
    objects did not survive (not yet on NVMe when tierd restarted) is skipped for the one before
    it, and a damaged one raises DataLoss."""
    _check_name(name)
    client = client if client is not None else _client.default_client()
    _, index = _read_index(client, name)
    entries = index["versions"]
    if version is not None:
        entries = [e for e in entries if e["version"] == version]
    missing = []
    for entry in entries:
        try:
            return _read_version(client, name, entry, map_location)
        except errors.NotFound:
            missing.append(entry["version"])
    if missing:
        raise _error(errors.NotFound, "checkpoint %r: no whole version in tierd (versions %s lost objects:"
                              " not on NVMe when tierd restarted?)" % (name, missing))
    raise _error(errors.NotFound, "checkpoint %r%s not in tierd" % (
        name, "" if version is None else " version %d" % version))


def delete(name, client=None):
    """Deletes every version of `name` and its index. Returns how many versions went."""
    _check_name(name)
    client = client if client is not None else _client.default_client()
    _, index = _read_index(client, name)
    for entry in index["versions"] + ([index["pending"]] if index.get("pending") else []):
        _delete_version(client, name, entry)
    for slot in range(_SLOTS):
        _delete_quietly(client, "%s/index.%d" % (name, slot))
    return len(index["versions"])
