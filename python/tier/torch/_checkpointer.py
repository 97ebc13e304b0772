"""tier.torch.Checkpointer: what a torchtitan / torchtune-style recipe saves through, kept in two
places: every ``save`` goes to the node's tierd (a restart in seconds), every ``dcp_every``-th
also to a torch.distributed.checkpoint directory (durable, any node, any sharding). ``load``
takes the newer of the two.

    ckpt = tier.torch.Checkpointer("run7", dcp_dir="/ckpt/run7", dcp_every=1000)
    for step in range(start, steps):
        ...
        if step % 100 == 0:
            ckpt.save({"model": msd, "optim": osd}, step)   # msd, osd: get_state_dict(...)
    ...
    step = ckpt.load(state)    # in place, as dcp.load; None when there is nothing to load

Both copies go through DCP's planner, so a sharded state dict (FSDP2, tensor parallel) is saved
and loaded shard by shard on every rank; the tierd copy through tier.torch.dcp. Every rank calls
``save`` and ``load`` (they are collective, as dcp.save and dcp.load are).

In tierd, for a checkpointer NAME: ``NAME/s<step>`` (a DCP checkpoint, tier/torch/_dcp.py) for each
step kept (the newest ``keep``), and ``NAME/steps``, the list of those steps, newest first,
written after the save committed, so a step listed is whole.
"""

import os

from . import _dcp
from . import _ranks
from . import _records
from ._default_client import DefaultClient
from .. import errors

_INDEX_FORMAT = 1


class Checkpointer:
    """See the module docstring. ``name``: the tierd name (printable ASCII, no '@').
    ``dcp_dir``: where DCP filesystem checkpoints go (``<dcp_dir>/step-<step>``), None for tierd
    only. ``dcp_every``: a DCP copy on every step divisible by it (default: every save).
    ``keep``: tierd versions kept."""

    def __init__(self, name, dcp_dir=None, dcp_every=None, keep=2, client=None):
        _records.check_name(name + "/s0")
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.name = name
        self.dcp_dir = dcp_dir
        self.dcp_every = dcp_every
        self.keep = int(keep)
        self._client = client

    client = DefaultClient()

    def _step_name(self, step):
        return "%s/s%d" % (self.name, step)

    def _dcp_path(self, step):
        return os.path.join(self.dcp_dir, "step-%d" % step)

    # ---- the list of steps in tierd ----------------------------------------------------------

    def tierd_steps(self):
        """The steps whose checkpoint this node's tierd holds whole, newest first."""
        try:
            record = _records.loads(_records.read_small(self.client,
                                                                "%s/steps" % self.name),
                                        "the step list of checkpointer %r" % self.name)
        except errors.NotFound:
            return []
        if not isinstance(record, dict) or record.get("format") != _INDEX_FORMAT:
            raise errors.DataLoss(errors.DATA_LOSS, "the step list of checkpointer %r is not "
                                  "one" % self.name)
        return [int(s) for s in record["steps"]]

    def _write_steps(self, steps):
        index = "%s/steps" % self.name
        _records.delete_quietly(self.client, index)
        _records.write_small(self.client, index, _records.dumps(
            {"format": _INDEX_FORMAT, "steps": list(steps)}))

    def dcp_steps(self):
        """The steps of the DCP directory with committed metadata, newest first."""
        if self.dcp_dir is None or not os.path.isdir(self.dcp_dir):
            return []
        steps = []
        for entry in os.listdir(self.dcp_dir):
            if entry.startswith("step-") and os.path.exists(
                    os.path.join(self.dcp_dir, entry, ".metadata")):
                try:
                    steps.append(int(entry[len("step-"):]))
                except ValueError:
                    continue
        return sorted(steps, reverse=True)

    # ---- save and load -----------------------------------------------------------------------

    def save(self, state_dict, step):
        """Saves `state_dict` as `step`: into tierd, and into the DCP directory when due.
        Collective: every rank calls it. Returns where it went ("tierd", "dcp")."""
        import torch.distributed.checkpoint as dcp
        step = int(step)
        where = []
        steps = self.tierd_steps() if _ranks.is_coordinator() else None
        dcp.save(state_dict, storage_writer=_dcp.TierWriter(self._step_name(step),
                                                            client=self.client))
        where.append("tierd")
        if _ranks.is_coordinator():
            # Listed once every rank's data and the metadata are in: a listed step is whole.
            # (dcp.save returns on every rank after the coordinator's finish.)
            steps = [step] + [s for s in steps if s != step]
            self._write_steps(steps[:self.keep])
        _ranks.barrier()
        old = _ranks.broadcast_from_coordinator(
            steps[self.keep:] if steps is not None else None) or []
        for s in old:
            _dcp.delete(self._step_name(s), client=self.client,
                        ranks=[_ranks.rank()] if _ranks.process_group() is not None else None)
        if self.dcp_dir is not None and (self.dcp_every is None or step % self.dcp_every == 0):
            dcp.save(state_dict, checkpoint_id=self._dcp_path(step))
            where.append("dcp")
        return where

    def load(self, state_dict):
        """Loads the newest step kept into `state_dict` in place (as dcp.load): from tierd when
        its newest step is at least the DCP directory's, else from DCP (also when tierd lost
        it). Returns the step, or None when neither holds one. Collective."""
        import torch.distributed.checkpoint as dcp
        tierd = self.tierd_steps() if _ranks.is_coordinator() else None
        tierd = _ranks.broadcast_from_coordinator(tierd) or []
        disk = _ranks.broadcast_from_coordinator(
            self.dcp_steps() if _ranks.is_coordinator() else None) or []
        if tierd and (not disk or tierd[0] >= disk[0]):
            try:
                dcp.load(state_dict, storage_reader=_dcp.TierReader(self._step_name(tierd[0]),
                                                                    client=self.client))
                return tierd[0]
            except Exception:  # noqa: BLE001 - a rank whose node lost it: every rank falls back
                if not disk:
                    raise
        if disk:
            dcp.load(state_dict, checkpoint_id=self._dcp_path(disk[0]))
            return disk[0]
        return None

    def delete(self):
        """Deletes every step of this checkpointer from this node's tierd (not the DCP
        directory)."""
        for s in self.tierd_steps():
            _dcp.delete(self._step_name(s), client=self.client)
        _records.delete_quietly(self.client, "%s/steps" % self.name)

