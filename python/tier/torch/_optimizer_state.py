"""Optimizer state offload (the ZeRO-Offload / ZeRO-Infinity job): see
:func:`tier.torch.offload_optimizer_state`.

Between steps every state tensor of the optimizer (Adam's ``exp_avg`` and ``exp_avg_sq``, SGD's
``momentum_buffer``, any per-parameter tensor of ``min_bytes`` or more) lives in Tierd: host
memory, or NVMe when the pool is full. ``optimizer.step()`` runs group by group (a group is a set
of parameters whose state is about ``group_bytes``): group i's state comes back, the optimizer
updates group i's parameters only, and group i's state goes back out, while the reloads of the next
``prefetch`` groups run. Before a group's state goes out, the host waits until the copies out of
the group two before it finished (their sources are then freed): without that wait the host,
which never waits for the GPU otherwise, would queue the whole step at once and every group's
state would be allocated on the GPU together. So the process holds at most ``3 + prefetch``
groups of state on the GPU at a time: the prefetched ones, the one being updated, two being
copied out (one group of slack keeps the host's wait off the GPU's critical path).

Stream ordering (CUDA), as in tier.torch: an offload's copy waits on the GPU for the current stream
(which ran the update); a prefetched group's reloads are allocated on the current stream, which
waits on the GPU for their copies only where the group is updated (Client.start_reloads with
``prefetch=True``: the deferred wait; no side stream, no event of our own).

Sharded parameters (FSDP2's ``fully_shard``, tensor parallel: DTensors): each rank sends and
fetches the local shard of each state tensor through its node's tierd, and the reloaded shard is
wrapped back into a DTensor of the same mesh and placements (tier/_dtensor.py).

Offloads carry ``next_use_hint`` = the position of the group in the next step, in step order, so
the spiller writes to NVMe the groups needed last and prefetches them back in step order.
"""

import collections
import types

import torch

from .. import _dtensor
from .. import client as _client
from ._counters import Counters

DEFAULT_GROUP_BYTES = 64 << 20
DEFAULT_STATE_MIN_BYTES = 4096
# Groups whose copies out may still run when the next group's state goes out.
_GROUPS_GOING_OUT = 2


class OptimizerStateStats(Counters):
    __slots__ = ("steps", "groups", "offloads", "offloaded_bytes", "reloads", "prefetched_groups",
                 "resident_tensors", "steps_kept_resident")


class _Away:
    """One state tensor in Tierd: its handle, the reload once started, and for a DTensor the
    wrap that makes the reloaded local shard a DTensor again."""

    __slots__ = ("handle", "started", "wrap")

    def __init__(self, handle, wrap=None):
        self.handle = handle
        self.started = None
        self.wrap = wrap

    def result(self):
        data = self.started.result()
        return self.wrap(data) if self.wrap is not None else data


def _nbytes(t):
    return _dtensor.local_nbytes(t)  # a DTensor's: the shard this rank holds


def _step(opt, closure=None):
    """optimizer.step, group by group (installed on the optimizer instance)."""
    return opt._tier_state_offloader._step(closure)


def _state_dict(opt):
    return opt._tier_state_offloader._state_dict()


def _load_state_dict(opt, state_dict):
    return opt._tier_state_offloader._load_state_dict(state_dict)


class OptimizerStateOffloader:
    """Keeps an optimizer's state in Tierd between steps; see :func:`offload_optimizer_state`.
    Also a context manager (exit = :meth:`remove`)."""

    def __init__(self, optimizer, group_bytes=DEFAULT_GROUP_BYTES, prefetch=1,
                 min_bytes=DEFAULT_STATE_MIN_BYTES, client=None):
        if group_bytes < 1:
            raise ValueError("group_bytes must be >= 1")
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        if getattr(optimizer, "_tier_state_offloader", None) is not None:
            raise ValueError("this optimizer's state is offloaded already")
        self._opt = optimizer
        self._client = client if client is not None else _client.default_client()
        self._group_bytes = int(group_bytes)
        self._prefetch = int(prefetch)
        self._min_bytes = int(min_bytes)
        self._away = {}           # (id(param), key) -> _Away
        self._step_index = 0
        self.stats = OptimizerStateStats()
        # The optimizer's own methods, bound to the optimizer itself, so that wrappers that
        # re-bind opt.step (lr schedulers count steps that way) still reach these.
        optimizer._tier_state_offloader = self
        optimizer.step = types.MethodType(_step, optimizer)
        optimizer.state_dict = types.MethodType(_state_dict, optimizer)
        optimizer.load_state_dict = types.MethodType(_load_state_dict, optimizer)
        # State that exists already (an optimizer that stepped, or loaded a checkpoint) goes now.
        groups = self._groups()
        for gi, group in enumerate(groups):
            self._offload_group(group, self._hint(gi, len(groups)))

    @property
    def optimizer(self):
        """The optimizer whose state this keeps in Tierd."""
        return self._opt

    # ---- groups ------------------------------------------------------------------------------

    def _params(self):
        seen = set()
        for pg in self._opt.param_groups:
            for p in pg["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def _state_bytes(self, p):
        state = self._opt.state.get(p)
        if not state:
            return _nbytes(p)  # not created yet: about one tensor like the parameter
        total = 0
        for key, value in state.items():
            away = self._away.get((id(p), key))
            if away is not None:
                total += away.handle.nbytes
            elif isinstance(value, torch.Tensor):
                total += _nbytes(value)
        return total

    def _groups(self):
        """The parameters in param_groups order, cut into groups of about group_bytes of state."""
        groups, current, size = [], [], 0
        for p in self._params():
            b = self._state_bytes(p)
            if current and size + b > self._group_bytes:
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += b
        if current:
            groups.append(current)
        return groups

    def _hint(self, gi, ngroups):
        # Next use: group gi of the next step (smaller = sooner; never 0, which means "no hint").
        return (self._step_index + 1) * ngroups + gi + 1

    # ---- moving state ------------------------------------------------------------------------

    def _offload_group(self, group, hint):
        """Sends a group's state out, as one batch per device; returns the handles (each keeps
        its source until copied)."""
        keys, values, wraps = [], [], []
        for p in group:
            state = self._opt.state.get(p)
            if not state:
                continue
            for key, value in list(state.items()):
                if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
                    continue
                if _nbytes(value) < self._min_bytes:
                    self.stats.resident_tensors += 1
                    continue
                keys.append((p, key))
                # A DTensor goes as its local shard (its own data_ptr() is not the shard's).
                local, wrap = _dtensor.split(value)
                values.append(local)
                wraps.append(wrap)
        if not values:
            return []
        # retain_on_failure: a failed offload (pool and NVMe full) keeps the data in the handle,
        # and the reload serves it from there: state is never lost.
        handles = self._client.offload_batch(values, None, [hint] * len(values),
                                             retain_on_failure=True)
        for (p, key), value, wrap, handle in zip(keys, values, wraps, handles):
            self._away[(id(p), key)] = _Away(handle, wrap)
            self._opt.state[p][key] = torch.empty(0, dtype=value.dtype, device=value.device)
            self.stats.offloads += 1
            self.stats.offloaded_bytes += _nbytes(value)
        return handles

    @staticmethod
    def _await_copied_out(handles):
        """Waits until the offloads' copies finished, so their GPU sources are freed. A failed
        offload keeps its data in the handle (retain_on_failure): nothing is raised here."""
        for handle in handles:
            handle.wait_offload()

    def _start_group(self, gi, group, prefetch):
        """Starts the reloads of a group's state not started yet, as one batch per device. On
        CUDA they are allocated on the current stream like any reload; a prefetch's wait is put
        where the state is first used (the client's deferred reload, as activation prefetches:
        one stream's allocator pool, no side stream and no event of our own)."""
        todo = collections.OrderedDict()  # device -> [away]
        for p in group:
            for key in list(self._opt.state.get(p, {}).keys()):
                away = self._away.get((id(p), key))
                if away is None or away.started is not None:
                    continue
                todo.setdefault(away.handle.device, []).append(away)
        if not todo:
            return
        for device, aways in todo.items():
            started = self._client.start_reloads([a.handle for a in aways], free=True,
                                                 prefetch=prefetch)
            for away, reload in zip(aways, started):
                away.started = reload
            self.stats.reloads += len(aways)
        if prefetch:
            self.stats.prefetched_groups += 1

    def _finish_group(self, gi, group):
        """The group's state back in the optimizer, ordered before the update on CUDA (the
        deferred reload's result() makes the current stream wait for its copies)."""
        for p in group:
            state = self._opt.state.get(p)
            if not state:
                continue
            for key in list(state.keys()):
                away = self._away.pop((id(p), key), None)
                if away is None:
                    continue
                if away.started is None:  # not started ahead: on the current stream
                    away.started = self._client.start_reloads([away.handle], free=True)[0]
                    self.stats.reloads += 1
                state[key] = away.result()

    def _onload_all(self):
        groups = self._groups()
        for gi, group in enumerate(groups):
            self._start_group(gi, group, prefetch=False)
            self._finish_group(gi, group)

    # ---- the optimizer's methods -------------------------------------------------------------

    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        opt = self._opt
        groups = self._groups()
        members = [set(map(id, g)) for g in groups]
        saved = [pg["params"] for pg in opt.param_groups]
        class_step = type(opt).step
        going_out = collections.deque()  # the handles of the last groups' offloads
        # While tierd is gone or draining (a restart), the state comes back and stays resident:
        # the step costs GPU memory, never the state. Offloading resumes once tierd serves.
        serving = self._client.ensure_connected()
        if not serving:
            self.stats.steps_kept_resident += 1
        check = self._client.reload_check()
        try:
            for gi in range(min(len(groups), 1 + self._prefetch)):
                self._start_group(gi, groups[gi], prefetch=gi > 0)
            for gi, group in enumerate(groups):
                ahead = gi + self._prefetch
                if ahead < len(groups):
                    self._start_group(ahead, groups[ahead], prefetch=True)
                self._finish_group(gi, group)
                # Only this group's parameters: the optimizer (plain, foreach or fused) updates
                # what its param_groups hold.
                for pg, params in zip(opt.param_groups, saved):
                    pg["params"] = [p for p in params if id(p) in members[gi]]
                try:
                    class_step(opt)
                finally:
                    for pg, params in zip(opt.param_groups, saved):
                        pg["params"] = params
                if not serving:
                    continue
                if len(going_out) == _GROUPS_GOING_OUT:
                    self._await_copied_out(going_out.popleft())
                going_out.append(self._offload_group(group, self._hint(gi, len(groups))))
        except BaseException:
            # Whatever was reloaded stays resident (state is never lost); the rest stays away.
            for gi, group in enumerate(groups):
                if any(a.started is not None for (pid, _), a in self._away.items()
                       if pid in members[gi]):
                    self._finish_group(gi, group)
            raise
        # A tierd that died with a reload of this step in flight had the library release the
        # stream waiting on it: the update read state the copy never filled. Said here, loudly.
        check()
        self._step_index += 1
        self.stats.steps += 1
        self.stats.groups = len(groups)
        return loss

    def _state_dict(self):
        # Checkpointing sees ordinary tensors: the state comes back and stays until the next step
        # sends each group out again. The per-parameter dicts are copied, so that sending the
        # state out later does not change what the caller holds.
        self._onload_all()
        sd = type(self._opt).state_dict(self._opt)
        sd["state"] = {k: dict(v) for k, v in sd["state"].items()}
        return sd

    def _load_state_dict(self, state_dict):
        # The loaded state replaces ours: drop what is away, load, and send the new state out.
        for away in self._away.values():
            away.handle.free()
        self._away.clear()
        type(self._opt).load_state_dict(self._opt, state_dict)
        groups = self._groups()
        for gi, group in enumerate(groups):
            self._offload_group(group, self._hint(gi, len(groups)))

    def remove(self):
        """Brings the state back, frees the Tierd objects, and gives the optimizer its own methods
        back."""
        opt = self._opt
        if getattr(opt, "_tier_state_offloader", None) is not self:
            return
        self._onload_all()
        for name in ("step", "state_dict", "load_state_dict"):
            if name in opt.__dict__ and getattr(opt.__dict__[name], "__func__", None) in (
                    _step, _state_dict, _load_state_dict):
                del opt.__dict__[name]
        del opt._tier_state_offloader

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def offload_optimizer_state(optimizer, group_bytes=DEFAULT_GROUP_BYTES, prefetch=1,
                            min_bytes=DEFAULT_STATE_MIN_BYTES, client=None):
    """Keeps ``optimizer``'s state tensors in Tierd between steps (host memory, or NVMe past the
    pool).

    ``optimizer.step()`` then runs group by group: each group of parameters (about
    ``group_bytes`` of state) gets its state back, is updated, and sends it out again, while the
    next ``prefetch`` groups' state is reloaded. State tensors under ``min_bytes`` (Adam's step
    count) stay resident. Works with ``torch.optim`` optimizers that update what their
    ``param_groups`` hold (Adam, AdamW, SGD with momentum; plain, foreach or fused), gradient
    accumulation, several optimizers per process, and ``state_dict()`` / ``load_state_dict()``
    (checkpoints see ordinary tensors). Returns an :class:`OptimizerStateOffloader`;
    ``remove()`` brings everything back.
    """
    return OptimizerStateOffloader(optimizer, group_bytes=group_bytes, prefetch=prefetch,
                                   min_bytes=min_bytes, client=client)
