"""tier.torch.dcp: tierd as the storage of torch.distributed.checkpoint (DCP).

DCP's planner decides what each rank writes (its shards of a sharded state dict: FSDP2,
tensor parallel, or plain tensors) and what each rank reads back (resharding included); these
classes only store and fetch the bytes, in the node's tierd::

    import torch.distributed.checkpoint as dcp
    from tier.torch import dcp as tdcp
    dcp.save(state, storage_writer=tdcp.TierWriter("run7/step100"))
    dcp.load(state, storage_reader=tdcp.TierReader("run7/step100"))
    tdcp.delete("run7/step100")

Objects, all persistent objects in the caller's uid namespace, for a checkpoint NAME:

- ``NAME/<rank>.<i>``: rank's data. Each CUDA tensor is one object, copied by tierd straight
  from the GPU (and reloaded straight into the destination tensor when a rank reads back a whole
  chunk onto the GPU); CPU tensors and DCP's byte items are packed into objects of about
  ``chunk_bytes`` from the client's staging buffers.
- ``NAME/.metadata``: DCP's Metadata, written by the coordinator after every rank's data landed
  (DCP's ``finish``): the commit. It is stored as builtins only (no DCP class is pickled) and
  read back by the same restricted unpickler as tier.torch.checkpoint's records.

tierd is per node. On several nodes each rank's shards are in its own node's tierd, and the
metadata in the coordinator's: a reader gets it from there through the process group (a
broadcast from rank 0 at load). A rank reads what its node holds, so a load must use the
ranks-to-nodes layout of the save; resharding within a node works (any rank may read any
object of its node), across nodes it does not (NotFound names the object): keep a DCP
filesystem checkpoint beside for that (tier.torch.Checkpointer keeps both).
"""

import io

import torch
from torch.futures import Future
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, MetadataIndex, StorageMeta,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from . import _ranks
from . import _records
from .. import client as _client
from ._default_client import DefaultClient
from .. import errors

DEFAULT_CHUNK_BYTES = 64 << 20
_META = ".metadata"
_FORMAT = 1

__all__ = ["TierWriter", "TierReader", "delete", "exists", "DEFAULT_CHUNK_BYTES"]


_error = _records.error


def _check_name(name):
    _records.check_name(name)  # the same rules as tier.torch.checkpoint's names


def _data_name(name, rank, i):
    return "%s/%d.%d" % (name, rank, i)


def _meta_name(name):
    return "%s/%s" % (name, _META)


# ---- Metadata as builtins -----------------------------------------------------------------------

_MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
                   "preserve": torch.preserve_format}


def _format_name(fmt):
    for k, v in _MEMORY_FORMATS.items():
        if v == fmt:
            return k
    raise _error(errors.InvalidArgument, "DCP metadata: memory format %s" % fmt)


def _dtype(text):
    dtype = getattr(torch, text, None)
    if not isinstance(dtype, torch.dtype):
        raise _error(errors.DataLoss, "DCP metadata names dtype %r" % text)
    return dtype


def _size(value):
    return None if value is None else tuple(int(v) for v in value)


def _encode(metadata):
    sdm = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            sdm[fqn] = ("bytes",)
        else:
            p = md.properties
            sdm[fqn] = ("tensor", str(p.dtype)[len("torch."):], bool(p.requires_grad),
                        _format_name(p.memory_format), bool(p.pin_memory), _size(md.size),
                        [(_size(c.offsets), _size(c.sizes)) for c in md.chunks])
    storage = [((i.fqn, _size(i.offset), i.index), tuple(v))
               for i, v in (metadata.storage_data or {}).items()]
    return {"format": _FORMAT, "state_dict_metadata": sdm, "planner_data": metadata.planner_data,
            "storage_data": storage, "version": metadata.version}


def _decode(record, what):
    if not isinstance(record, dict) or record.get("format") != _FORMAT:
        raise _error(errors.DataLoss, "%s: not a tierd DCP metadata record" % what)
    sdm = {}
    for fqn, entry in record["state_dict_metadata"].items():
        if entry[0] == "bytes":
            sdm[fqn] = BytesStorageMetadata()
            continue
        _, dtype, requires_grad, fmt, pin, size, chunks = entry
        props = TensorProperties(dtype=_dtype(dtype), requires_grad=requires_grad,
                                 memory_format=_MEMORY_FORMATS[fmt], pin_memory=pin)
        sdm[fqn] = TensorStorageMetadata(
            props, torch.Size(size),
            [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in chunks])
    storage = {MetadataIndex(fqn, None if off is None else torch.Size(off), index): value
               for (fqn, off, index), value in record["storage_data"]}
    return Metadata(state_dict_metadata=sdm, planner_data=record["planner_data"],
                    storage_data=storage, storage_meta=StorageMeta(), version=record["version"])


class _NamedCheckpoint:
    """What TierWriter and TierReader share: the checkpoint's name (its DCP checkpoint_id) and
    the client, taken when first needed."""

    def _name_it(self, name, client):
        _check_name(name)
        self.name = name
        self._client = client

    client = DefaultClient()

    @property
    def checkpoint_id(self):
        return self.name

    def reset(self, checkpoint_id=None):
        if checkpoint_id:
            _check_name(str(checkpoint_id))
            self.name = str(checkpoint_id)


# ---- writing ------------------------------------------------------------------------------------

class TierWriter(_NamedCheckpoint, StorageWriter):
    """A DCP StorageWriter into tierd: ``dcp.save(state, storage_writer=TierWriter(name))``.

    ``name``: the checkpoint's name (as tier.torch.checkpoint's: printable ASCII, no '@'); a
    save under a name that exists replaces it (each rank first deletes its own objects of it).
    ``client``: a tier.Client (default: tier.default_client()). ``chunk_bytes``: CPU tensors
    and byte items are packed into objects of about this size."""

    def __init__(self, name, client=None, chunk_bytes=DEFAULT_CHUNK_BYTES):
        super().__init__()
        self._name_it(name, client)
        self.chunk_bytes = int(chunk_bytes)
        self.rank = 0
        self.is_coordinator = True

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        self.rank = int(rank) if rank is not None else _ranks.rank()
        if is_coordinator:
            # The commit record goes first: a reader never takes the old metadata with the new
            # data (or the new metadata before every rank's data landed: finish() writes it).
            _records.delete_quietly(self.client, _meta_name(self.name))

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self.name)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        try:
            _check_name(str(checkpoint_id))
        except errors.TierError:
            return False
        return True

    def _delete_own(self):
        """Deletes this rank's objects of an earlier save under the same name (numbered from 0
        without gaps, so the first missing number ends them)."""
        i = 0
        while _records.delete_quietly(self.client, _data_name(self.name, self.rank, i)):
            i += 1

    def write_data(self, plan, planner):
        client = self.client
        self._delete_own()
        # What each item is, and where it goes: each CUDA tensor an object of its own, CPU
        # tensors and byte items packed in order into host chunks of about chunk_bytes.
        items = []  # (item, payload, nbytes, kind, object index, offset)
        host_sizes = {}
        count = 0
        open_chunk = None
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                payload = data.getbuffer() if isinstance(data, io.BytesIO) else bytes(data)
                nbytes = len(payload)
                kind = ("b",)
                cuda = False
            else:
                payload = data.detach()
                if not payload.is_contiguous():
                    payload = payload.contiguous()
                nbytes = payload.numel() * payload.element_size()
                kind = ("t", str(payload.dtype)[len("torch."):], tuple(payload.shape))
                cuda = payload.is_cuda and nbytes > 0
            if cuda:
                items.append((item, payload, nbytes, kind, count, 0))
                count += 1
                continue
            if open_chunk is None or (host_sizes[open_chunk] > 0 and
                                      host_sizes[open_chunk] + nbytes > self.chunk_bytes):
                open_chunk = count
                host_sizes[open_chunk] = 0
                count += 1
            offset = host_sizes[open_chunk]
            items.append((item, payload, nbytes, kind, open_chunk, offset))
            host_sizes[open_chunk] = offset + nbytes + (-(offset + nbytes)) % 64
        jobs = []     # (object id, job id)
        staging = {}  # object index -> host buffer, ours until its job completed
        results = []
        try:
            for index, size in host_sizes.items():
                staging[index] = client.staging_acquire(max(size, 1))
            for item, payload, nbytes, kind, index, offset in items:
                object_name = _data_name(self.name, self.rank, index)
                results.append(WriteResult(item.index, nbytes,
                                           (object_name, offset, nbytes) + kind))
                if index not in staging:
                    # CUDA: copied by tierd from the GPU after the work queued on the current
                    # stream (which produced it); write_data waits for the copy below, so the
                    # tensor cannot change under it.
                    stream = torch.cuda.current_stream(payload.device)
                    buffer_id, buf_offset = client.register_device(payload.data_ptr(), nbytes)
                    jobs.append(client.offload_persistent(object_name, buffer_id, buf_offset,
                                                          nbytes, producer_streams=[stream],
                                                          keep=payload))
                    continue
                if nbytes == 0:
                    continue
                view = staging[index].tensor(torch.uint8)[offset:offset + nbytes]
                if kind[0] == "b":
                    view.copy_(torch.frombuffer(payload, dtype=torch.uint8))
                else:
                    view.copy_(_records.byte_view(payload))
            for index, size in host_sizes.items():
                jobs.append(client.offload_persistent(_data_name(self.name, self.rank, index),
                                                      staging[index], 0, max(size, 1)))
            for obj, job in jobs:
                client.wait(job)
                client.release_object(obj)
        finally:
            for buf in staging.values():
                client.staging_release(buf)
        fut = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results):
        storage = {}
        for rank_results in results:
            for r in rank_results:
                storage[r.index] = r.storage_data
        metadata.storage_data = storage
        _records.delete_quietly(self.client, _meta_name(self.name))
        _records.write_small(self.client, _meta_name(self.name),
                                 _records.dumps(_encode(metadata)))


# ---- reading ------------------------------------------------------------------------------------

def _read_metadata(client, name):
    what = "DCP checkpoint %r in tierd" % name
    return _decode(_records.loads(_records.read_small(client, _meta_name(name)), what),
                   what)


class TierReader(_NamedCheckpoint, StorageReader):
    """A DCP StorageReader from tierd: ``dcp.load(state, storage_reader=TierReader(name))``."""

    def __init__(self, name, client=None):
        super().__init__()
        self._name_it(name, client)
        self.storage_data = None

    def reset(self, checkpoint_id=None):
        self.storage_data = None
        super().reset(checkpoint_id)

    def read_metadata(self, *args, **kwargs):
        if kwargs.get("rank") is not None:
            # DCP's fallback to per-rank metadata (after the global one failed): there is none.
            raise _error(errors.NotFound, "DCP checkpoint %r: no per-rank metadata in tierd"
                         % self.name)
        # Every rank asks its own node's tierd; the coordinator's answer goes to all (on another
        # node the metadata is not there). A failure there fails every rank alike.
        try:
            encoded = _encode(_read_metadata(self.client, self.name))
            problem = None
        except errors.TierError as e:
            encoded, problem = None, "%s: %s" % (type(e).__name__, e)
        encoded, problem = _ranks.broadcast_from_coordinator((encoded, problem))
        if encoded is None:
            raise _error(errors.NotFound, "DCP checkpoint %r: no committed metadata in tierd "
                         "(%s)" % (self.name, problem))
        return _decode(encoded, "DCP checkpoint %r" % self.name)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return TierWriter.validate_checkpoint_id(checkpoint_id)

    def read_data(self, plan, planner):
        client = self.client
        by_object = {}
        for req in plan.items:
            by_object.setdefault(self.storage_data[req.storage_index][0], []).append(req)
        for object_name, reqs in by_object.items():
            try:
                obj, length = client.open_object(object_name)
            except errors.NotFound:
                raise _error(errors.NotFound, "DCP checkpoint %r: this node's tierd does not "
                             "hold %s (written on another node, or lost in a restart of tierd "
                             "without NVMe)" % (self.name, object_name)) from None
            try:
                if not self._read_direct(client, obj, length, reqs, planner):
                    self._read_staged(client, obj, length, reqs, planner)
            finally:
                client.release_object(obj)
        fut = Future()
        fut.set_result(None)
        return fut

    def _read_direct(self, client, obj, length, reqs, planner):
        """One whole stored tensor into a contiguous CUDA destination of the same bytes: tierd
        copies it straight there, on the current stream (which waits on the GPU for the copy
        before anything queued after; the destination was allocated on it)."""
        if len(reqs) != 1 or reqs[0].type == LoadItemType.BYTE_IO:
            return False
        req = reqs[0]
        _, offset, nbytes, kind, dtype, shape = self.storage_data[req.storage_index]
        target = planner.resolve_tensor(req).detach()
        if (not target.is_cuda or not target.is_contiguous() or offset != 0 or nbytes != length
                or tuple(target.shape) != tuple(shape) or str(target.dtype) != "torch." + dtype
                or any(o != 0 for o in req.storage_offsets) or nbytes == 0):
            return False
        stream = torch.cuda.current_stream(target.device)
        buffer_id, buf_offset = client.register_device(target.data_ptr(), nbytes)
        client.wait(client.reload_buffer(obj, buffer_id, buf_offset, nbytes,
                                         consumer_stream=stream))
        planner.commit_tensor(req, target)
        return True

    def _read_staged(self, client, obj, length, reqs, planner):
        buf = client.staging_acquire(max(length, 1))
        try:
            client.wait(client.reload_buffer(obj, buf, 0, length))
            data = buf.tensor(torch.uint8)
            for req in reqs:
                entry = self.storage_data[req.storage_index]
                _, offset, nbytes = entry[:3]
                if offset + nbytes > length:
                    raise _error(errors.DataLoss, "DCP checkpoint %r: %s holds %d bytes, the "
                                 "metadata says %d at %d" % (self.name, entry[0], length, nbytes,
                                                             offset))
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(bytes(data[offset:offset + nbytes]
                                                             .numpy())))
                    continue
                _, _, _, _, dtype, shape = entry
                stored = data[offset:offset + nbytes].view(_dtype(dtype)).view(shape)
                for dim, (start, size) in enumerate(zip(req.storage_offsets, req.lengths)):
                    stored = stored.narrow(dim, start, size)
                target = planner.resolve_tensor(req).detach()
                if target.size() != stored.size():
                    raise _error(errors.DataLoss, "DCP checkpoint %r: %s is %s, the request "
                                 "wants %s" % (self.name, entry[0], tuple(stored.size()),
                                               tuple(target.size())))
                target.copy_(stored)
                planner.commit_tensor(req, target)
        finally:
            client.staging_release(buf)


# ---- management ---------------------------------------------------------------------------------

def exists(name, client=None):
    """Whether this node's tierd holds the committed metadata of DCP checkpoint `name`."""
    _check_name(name)
    client = client if client is not None else _client.default_client()
    try:
        client.object_info(_meta_name(name))
        return True
    except errors.NotFound:
        return False


def delete(name, client=None, ranks=None):
    """Deletes DCP checkpoint `name` from this node's tierd: the metadata, then the data of
    `ranks` (default: every rank the metadata names, else rank 0 .. 63). Returns how many
    objects went."""
    _check_name(name)
    client = client if client is not None else _client.default_client()
    names = set()
    try:
        for value in _read_metadata(client, name).storage_data.values():
            names.add(value[0])
    except (errors.NotFound, errors.DataLoss):
        pass
    gone = 0
    if _records.delete_quietly(client, _meta_name(name)):
        gone += 1
    if ranks is None:
        ranks = sorted({int(n[len(name) + 1:].split(".")[0]) for n in names}) or range(64)
    for rank in ranks:
        i = 0
        while _records.delete_quietly(client, _data_name(name, rank, i)):
            gone += 1
            i += 1
    return gone
