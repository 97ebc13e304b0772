"""Module weight offload: the weights of groups of blocks live in tierd between uses
(:func:`offload_module_weights`, :class:`WeightOffloader`)."""

import functools
import warnings

import torch

from .. import client as _client
from ._counters import Counters


# ---- module weight offload --------------------------------------------------------------------

class WeightStats(Counters):
    __slots__ = ("offloaded_tensors", "offloaded_bytes", "onloads", "prefetches", "releases",
                 "reoffloads", "kept_resident", "source_hits")


class _WeightSlot:
    """One parameter or buffer whose data lives in Tierd between uses."""

    __slots__ = ("tensor", "handle", "version")

    def __init__(self, tensor, handle):
        self.tensor = tensor    # the nn.Parameter / buffer object itself (identity is kept)
        self.handle = handle
        self.version = None     # tensor._version right after onload (detects in-place updates)


class _Group:
    __slots__ = ("blocks", "slots", "onloaded", "pending")

    def __init__(self, blocks):
        self.blocks = blocks
        self.slots = []
        self.onloaded = False
        self.pending = None   # [(slot, started reload)] of a prefetch


def find_blocks(module):
    if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
        return list(module)
    best = None
    for m in module.modules():
        if m is not module and isinstance(m, torch.nn.ModuleList) and len(m) > 0:
            if best is None or len(m) > len(best):
                best = m
    if best is not None:
        return list(best)
    return list(module.children())


class WeightOffloader:
    """Keeps the weights of groups of blocks in Tierd between uses; see
    :func:`offload_module_weights`. Also a context manager (exit = :meth:`remove`)."""

    def __init__(self, module, group=1, client=None, blocks=None):
        if group < 1:
            raise ValueError("group must be >= 1")
        self._client = client if client is not None else _client.default_client()
        blocks = list(blocks) if blocks is not None else find_blocks(module)
        self._groups = [_Group(blocks[i:i + group]) for i in range(0, len(blocks), group)]
        self._hooks = []
        self._warned = False
        self._check = None   # the running forward's Client.reload_check()
        self.stats = WeightStats()

        # Tensors owned by more than one module (tied weights) stay resident: another module
        # outside the group could use them while they are away.
        owners = {}
        for m in module.modules():
            for t in list(m._parameters.values()) + list(m._buffers.values()):
                if t is not None:
                    owners[id(t)] = owners.get(id(t), 0) + 1
        taken = set()
        for g in self._groups:
            for block in g.blocks:
                for m in block.modules():
                    for t in list(m._parameters.values()) + list(m._buffers.values()):
                        if t is None or id(t) in taken or owners.get(id(t), 0) > 1:
                            continue
                        if t.numel() == 0 or t.layout != torch.strided:
                            continue
                        taken.add(id(t))
                        g.slots.append(_WeightSlot(t, None))
        for g in self._groups:
            self._offload_slots(g.slots)  # a group's weights as one batch
        for gi, g in enumerate(self._groups):
            for bi, block in enumerate(g.blocks):
                self._hooks.append(block.register_forward_pre_hook(
                    functools.partial(self._pre_hook, gi)))
                if bi == len(g.blocks) - 1:
                    self._hooks.append(block.register_forward_hook(
                        functools.partial(self._post_hook, gi)))
        # The forward as a whole is checked at its end: had tierd gone away while a group's
        # reload was in flight, the library would have released the streams waiting on it (a
        # stream never waits for ever) and the forward would have read memory the copy never
        # filled. The check waits (host) for this forward's reloads and raises tier.Unavailable
        # if one did not complete; by the forward's end its last group's copies are due anyway.
        self._hooks.append(module.register_forward_pre_hook(self._forward_begins))
        self._hooks.append(module.register_forward_hook(self._forward_ends))

    @property
    def groups(self):
        return len(self._groups)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def _offload_slots(self, slots):
        # One batch per device (Client.offload_batch). CUDA: the daemon's copies wait for the
        # current stream; each job keeps its old data alive until its copy completed, so the
        # swap to a placeholder below frees nothing early.
        if not slots:
            return
        # retain_on_failure: a failed offload (pool full) keeps the data in the handle, so the
        # weights come back from there: never lost.
        handles = self._client.offload_batch([slot.tensor.data for slot in slots], None, 0,
                                             retain_on_failure=True)
        for slot, handle in zip(slots, handles):
            t = slot.tensor
            old, slot.handle = slot.handle, handle
            if old is not None:
                old.free()
            self.stats.offloaded_tensors += 1
            self.stats.offloaded_bytes += t.numel() * t.element_size()
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)

    def _prefetch(self, gi):
        g = self._groups[gi]
        if g.onloaded or g.pending is not None or not g.slots:
            return
        # The group as one batch, allocated on the current stream while the group before runs;
        # that stream waits for the copies only where the group is onloaded (_onload: result()).
        g.pending = self._start_group(g, prefetch=True)
        self.stats.prefetches += 1

    def _start_group(self, g, prefetch):
        """(slot, started reload) for each of the group's weights, the reloads as one batch
        (Client.start_reloads). A weight whose offload is still in flight never left the GPU:
        its source is used as it is (a reload now would fail if that offload then failed for
        room, and the weight with it)."""
        started = [None] * len(g.slots)
        todo = []
        for i, slot in enumerate(g.slots):
            source = None
            if slot.tensor.device.type == "cuda":
                source = slot.handle.pending_source()
            if source is not None:
                started[i] = _client.Ready(source)
                self.stats.source_hits += 1
            else:
                todo.append(i)
        if todo:
            reloads = self._client.start_reloads([g.slots[i].handle for i in todo],
                                                 prefetch=prefetch)
            for i, reload in zip(todo, reloads):
                started[i] = reload
        return list(zip(g.slots, started))

    def _onload(self, gi):
        g = self._groups[gi]
        if g.onloaded:
            return
        if g.pending is None:
            # Not prefetched: the group as one batch on the current stream (it waits on the GPU
            # for every copy of it).
            pending = self._start_group(g, prefetch=False)
        else:
            pending, g.pending = g.pending, None
        for slot, started in pending:
            # A prefetch's result() makes the current stream wait (GPU) for its batch's copies.
            data = started.result()
            slot.tensor.data = data
            slot.version = slot.tensor._version
        g.onloaded = True
        self.stats.onloads += 1

    def _release(self, gi):
        g = self._groups[gi]
        if not g.onloaded:
            return
        if torch.is_grad_enabled():
            # Autograd may have saved these very tensors for backward: they must stay.
            self.stats.kept_resident += 1
            if not self._warned:
                self._warned = True
                warnings.warn("tier.torch.offload_module_weights: forward ran with grad enabled, "
                              "so weights stay resident after use (offload applies under "
                              "torch.no_grad() / inference)", RuntimeWarning, stacklevel=3)
            return
        changed = []
        for slot in g.slots:
            if slot.tensor._version != slot.version:
                # Changed in place while resident (optimizer step, running stats): Tierd's copy is
                # stale, so offload the new data.
                self.stats.reoffloads += 1
                changed.append(slot)
            else:
                slot.tensor.data = torch.empty(0, dtype=slot.tensor.dtype,
                                               device=slot.tensor.device)
        self._offload_slots(changed)  # as one batch
        g.onloaded = False
        self.stats.releases += 1

    def _pre_hook(self, gi, module, args):
        self._onload(gi)
        if gi + 1 < len(self._groups):
            self._prefetch(gi + 1)  # one group ahead, while this group computes

    def _post_hook(self, gi, module, args, output):
        self._release(gi)

    def _forward_begins(self, module, args):
        if self._check is None:  # (a re-entered forward is checked by the outer one)
            self._check = self._client.reload_check()

    def _forward_ends(self, module, args, output):
        check, self._check = self._check, None
        if check is not None:
            check()  # raises tier.Unavailable if a reload of this forward did not complete

    def remove(self):
        """Makes every weight resident again, frees the Tierd objects, removes the hooks."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for gi, g in enumerate(self._groups):
            if not g.onloaded:
                self._onload(gi)
            for slot in g.slots:
                if slot.handle is not None:
                    slot.handle.free()
                    slot.handle = None
        self._groups = []


def offload_module_weights(module, group=1, client=None, blocks=None):
    """Keeps the weights of ``module``'s blocks in Tierd between uses.

    Blocks are ``module``'s largest nn.ModuleList (or its children; or ``blocks``), taken ``group``
    at a time. A forward pre-hook on a group's blocks onloads the group (if its prefetch has not
    already) and starts the next group's onload (CUDA: allocated on the current stream, which
    waits on the GPU for the copies only when that group runs; synchronously staged on CPU), so
    copies overlap compute. After
    the group's last block, its weights leave again (they are already in Tierd: nothing is
    copied, unless they changed in place). Outputs are identical to running without offload.

    For inference or frozen weights under ``torch.no_grad()``: with grad enabled, weights a
    backward may need stay resident after use (a warning says so once). Tied weights (owned by
    more than one module) stay resident. At the end of ``module``'s forward the host waits for that
    forward's reloads and raises :class:`tier.Unavailable` if one did not complete (tierd went
    away): the output is then not to be trusted. Call ``.remove()`` (or use ``with``) before changing
    weights or moving the module.
    """
    return WeightOffloader(module, group=group, client=client, blocks=blocks)
