"""``tier.torch.plan_activations``: keep, offload (through tierd) or recompute (PyTorch's own
checkpointing) each part of a model's activations, chosen from measurements to meet a memory
target at the least step time, or to save the most memory within an overhead budget::

    plan = tier.torch.plan_activations(model, target_bytes=6 << 30)   # or max_overhead=0.05
    for batch in data:
        with plan:
            loss = model(**batch).loss
            loss.backward()
        optimizer.step(); optimizer.zero_grad()

The model's blocks (its largest nn.ModuleList, or ``blocks=``) each run in one of three modes
(tier/torch/_activation_planner.py): ``keep`` (their saved tensors go through tierd's saved-tensor
hooks and may be offloaded), ``selective`` (torch.utils.checkpoint, non-reentrant, with the
selective checkpoint contexts of ``selective_policy``: by default the outputs of matmuls and
attention are kept, the rest recomputed) or ``full`` (torch.utils.checkpoint: the block's
forward runs again in backward). After one warm-up step, the next steps calibrate in rounds
of three, each with a mix of modes whose peak memory stays near full recompute's: per kind of
block, one block in the middle of its kind runs in each mode, the rest in full recompute (one
round is enough where every kind has three blocks or more). The round's first step records
every saved tensor through the saved-tensor hooks (bytes, when it was saved, when backward
first needs it) and, on CUDA, the activation peak (``torch.cuda.max_memory_allocated`` above the
step's start, per segment of the step); its second and third run the same modes without any
hooks and time each block's forward and backward (CUDA events, or the host clock on CPU; a block
whose host work takes longer than its GPU work counts at the host's pace; each block counts the
lesser of its two times, so a host slowed for one step does not slow every plan's prediction,
``TIMING_STEPS`` in tier/torch/_calibration.py): the step a plan predicts is
the step as it runs without tierd's hooks, so its baseline is the user's step without a plan.
The link's bandwidth comes from tierd (tier/torch/_offload_budget.measure_link). Then the plan is
chosen, printed (``verbose``) and followed from the next step on; ``plan.plan`` and
``plan.summary()`` say what was chosen and what it predicts, ``plan.stats`` how it went.

Runtime: the blocks' forwards are wrapped once (``plan.remove()`` undoes it); outside an active
step, in backward (a recompute) and in a block whose call uses a KV cache they run as they are.
Offload is an :class:`~tier.torch.ActivationOffloader` driven by a policy object with the budget's
interface (begin_step / candidate / used / step_started / end_step), so the same batches,
stream-ordered releases and planned reloads serve both. A planned step is block-scoped
(tier.torch._offload_planner.Regions): the saved-tensor hooks run only inside the blocks where the
plan offloads a tensor or starts reloads (nowhere, in a plan without offload: no Python call
per saved tensor), each such block numbering its saved tensors from its first one's index in
calibration; offloaded sources go back to the allocator at the start of a later block once
their copies should be done, the rest at the end of the last block's forward (the barrier),
and the step is timed by two CUDA events, at the first block's forward and at the end of its
backward. A block that saves other tensors than in calibration is seen at its end: the planner
calibrates again; a second such step within MISMATCH_MEMORY_STEPS clean planned steps of the
first keeps the modes, stops offloading and warns (blocks whose saves change from step to step:
a plan by position would offload the wrong tensors). tier/torch/_plan_watch.py watches a plan
once it runs: the steps' timers, the host probe, the overhead check, these mismatches.

The host's own time: offloading costs the host time per storage (the hooks, the batch the
storage joins, its release), and in forward the host has little lead on the GPU to hide it in.
The second planned step (``HOST_PROBE_STEP``) of the first plan that offloads clocks each block's
forward on the host; what an offloading block took beyond its calibrated time, per storage it
offloaded (the median block's), is that cost (each block's figure: ``host_probe``), and the plan is made again with it once (``stats.replans``):
the planner then counts the forward at the host's pace where the offloads make the host the
slower of the two, and trims offloads the host cannot issue in time
(tier/torch/_activation_planner.host_extra_s).

The clock has the last word: a plan whose steps (measured whole, from entering the context to
leaving it, less what lay outside the blocks in calibration) run slower than predicted is made
again, with the difference priced per offloaded storage where it offloads (beyond what the
same modes without offloads run over: the plan's twin runs a few steps to tell), else (over a
``max_overhead``) within a budget scaled by its own error, twice at most per goal
(tier/torch/_overhead_check.py; ``stats.corrections``, ``stats.twins``). ``planner.settling`` is True while the plan
may still change by itself (calibration, the host probe, this check).
"""

import functools
import sys
import time
import warnings

import torch

from . import _activation_planner as ap
from . import _offload_budget as ob
from . import _offload_planner as op
from ._activations import DEFAULT_MIN_BYTES, ActivationOffloader
from ._calibration import (TIMING_STEPS, Calibration, build_profile, calibration_modes, rest_mode,
                           signature)
from ._counters import Counters
from ._light_mlp import mlp_tail
from ._plan_watch import PlanWatch
from ._weights import find_blocks

try:
    from torch.utils.checkpoint import checkpoint as _checkpoint
except ImportError:  # pragma: no cover
    _checkpoint = None
try:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
except ImportError:  # torch < 2.4: no selective checkpointing
    CheckpointPolicy = create_selective_checkpoint_contexts = None

_SAVED_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_mm", "convolution",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
              "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_flash_attention_forward", "_efficient_attention_forward")


def selective_available():
    return create_selective_checkpoint_contexts is not None


def default_selective_policy():
    """Selective checkpointing's usual choice: keep the outputs of matmuls and attention (the
    expensive ops), recompute everything else (norms, activations, elementwise ops: cheap to run
    again, and most of a transformer block's saved bytes)."""
    aten = torch.ops.aten
    packets = frozenset(getattr(aten, name) for name in _SAVED_OPS if hasattr(aten, name))

    def policy(ctx, op, *args, **kwargs):
        if getattr(op, "overloadpacket", op) in packets:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def _in_backward():
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


def _first_tensor(x, need_grad=True):
    """The first tensor in x (a tensor, or nested tuples / lists / dicts of them) that requires
    grad (any tensor with need_grad False); None if there is none."""
    if isinstance(x, torch.Tensor):
        return x if (x.requires_grad or not need_grad) else None
    if isinstance(x, (tuple, list)):
        items = x
    elif isinstance(x, dict):
        items = x.values()
    else:
        return None
    for item in items:
        t = _first_tensor(item, need_grad)
        if t is not None:
            return t
    return None


def _tensor_bytes(x):
    """Bytes of the distinct storages of the tensors in x (an op's output)."""
    seen = set()
    total = 0
    stack = [x]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            try:
                storage = item.untyped_storage()
                key = (item.device, storage.data_ptr())
                if key not in seen:
                    seen.add(key)
                    total += storage.nbytes()
            except (RuntimeError, NotImplementedError):
                total += item.numel() * item.element_size()
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
    return total


def _uses_cache(kwargs):
    if kwargs.get("use_cache"):
        return True
    for name in ("past_key_values", "past_key_value", "layer_past"):
        if kwargs.get(name) is not None:
            return True
    return False


def _gated_mlps(block):
    """The gated MLPs in `block`: modules named *MLP with gate_proj, up_proj and down_proj
    (nn.Linear) and act_fn, which compute down_proj(act_fn(gate_proj(x)) * up_proj(x)) (the
    Llama family in transformers: Llama, Mistral, Qwen2/3, Gemma)."""
    out = []
    for m in block.modules():
        if not type(m).__name__.endswith("MLP"):
            continue
        if all(isinstance(getattr(m, name, None), torch.nn.Linear)
               for name in ("gate_proj", "up_proj", "down_proj")) and \
                callable(getattr(m, "act_fn", None)):
            out.append(m)
    return out


def _act_mul(act, gate, up):
    return act(gate) * up


def _act_mul_down(act, down, gate, up):
    return down(act(gate) * up)


class BlockModes:
    """Runs each of ``blocks`` in a mode ("keep", "light", "selective", "full") set per step:
    the block's forward is wrapped once (an instance attribute over the class's method;
    :meth:`remove` restores what was there). Outside :attr:`active`, in backward (checkpoint's
    recompute calls the original forward directly, and other callers) and in a call that uses a
    KV cache (a recompute would update it twice) the block runs as it is. ``observer``: told when
    a block's forward begins (``block_begins`` returns a token), ends (``block_ends``, with the
    token) or raises (``block_aborted``): the planner's calibration stamps, and the hooks,
    releases and timer of a planned step.

    ``light``: the block runs as in keep, except that each gated MLP (:func:`_gated_mlps`) runs
    down_proj(act_fn(gate) * up) so that only gate and up are saved for it: neither
    act_fn(gate) nor the product (tokens x intermediate each) is, and backward runs the two
    elementwise kernels again (not the matmul). So a Llama block keeps about a quarter less for
    a fraction of a millisecond; loss and gradients are bit-identical to keep, and what the
    block keeps still goes through the saved-tensor hooks (offloadable). It is one autograd
    Function (tier/torch/_light_mlp.py) where that is exact (a plain nn.Linear without bias or
    hooks, outside autocast); otherwise torch.utils.checkpoint (non-reentrant) with a selective
    policy that keeps the matmul's output, which PyTorch then keeps outside the hooks
    (``extra_bytes``, tokens x hidden); without selective checkpointing (torch < 2.4) only
    act_fn(gate) * up is inside the checkpoint, and down_proj saves the product as in keep.
    (Recomputing the RMSNorms too saved 4 bytes a value of tokens x hidden twice a block more,
    but on an H200 cost a 1B Llama's backward 0.35 ms a block, as much per byte as full
    recompute.) ``light_blocks[b]``: whether block b has such an MLP."""

    def __init__(self, blocks, selective_policy=None):
        if _checkpoint is None:
            raise RuntimeError("torch.utils.checkpoint is not available")
        self.blocks = list(blocks)
        self.modes = ["keep"] * len(self.blocks)
        self.active = False
        self.observer = None
        self._policy = selective_policy
        self._sac_observer = None
        self._warned_cache = False
        self._light_on = False
        self._saved = []
        self._mlps = []  # (gated MLP, what its instance "forward" was)
        # light's MLP policy: the default selective one (the matmul's output kept).
        self._light_policy = default_selective_policy() if selective_available() else None
        self.light_blocks = []
        for b, block in enumerate(self.blocks):
            self._saved.append(block.__dict__.get("forward"))
            block.forward = functools.partial(self._run, b, block.forward)
            mlps = _gated_mlps(block)
            self.light_blocks.append(bool(mlps))
            for mlp in mlps:
                self._mlps.append((mlp, mlp.__dict__.get("forward")))
                mlp.forward = functools.partial(self._mlp, mlp, mlp.forward)

    def remove(self):
        for module, previous in list(zip(self.blocks, self._saved)) + self._mlps:
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        self.blocks = []
        self._saved = []
        self._mlps = []

    def set_all(self, mode):
        self.modes = [mode] * len(self.blocks)

    def _mlp(self, mlp, forward, x, *args, **kwargs):
        if not self._light_on or args or kwargs or _in_backward():
            return forward(x, *args, **kwargs)
        gate = mlp.gate_proj(x)
        up = mlp.up_proj(x)
        out = mlp_tail(mlp.act_fn, mlp.down_proj, gate, up)
        if out is not None:
            return out
        # No randomness in act_fn(gate) * up: no RNG state to stash.
        if self._light_policy is not None:
            out = _checkpoint(_act_mul_down, mlp.act_fn, mlp.down_proj, gate, up,
                              use_reentrant=False, preserve_rng_state=False,
                              context_fn=self._light_context)
            observer = self._sac_observer
            if observer is not None:
                # What the policy keeps is down_proj's matmul output, and the region's output
                # is a view of it (nn.Linear): counted here, on every torch (the policy is
                # handed each op's output only on recent ones).
                observer(out)
            return out
        h = _checkpoint(_act_mul, mlp.act_fn, gate, up, use_reentrant=False,
                        preserve_rng_state=False)
        return mlp.down_proj(h)

    def _light_context(self):
        return create_selective_checkpoint_contexts(self._light_policy)

    def _context_fn(self):
        policy = self._policy or default_selective_policy()
        observer = self._sac_observer
        if observer is not None:
            inner = policy

            def policy(ctx, op, *args, **kwargs):  # noqa: F811 - the calibration's counting one
                decision = inner(ctx, op, *args, **kwargs)
                if not ctx.is_recompute and decision in (CheckpointPolicy.MUST_SAVE,
                                                         CheckpointPolicy.PREFER_SAVE, True):
                    observer(getattr(ctx, "op_output", None))
                return decision
        return create_selective_checkpoint_contexts(policy)

    def _run(self, b, forward, *args, **kwargs):
        if not self.active or _in_backward():
            return forward(*args, **kwargs)
        mode = self.modes[b]
        if mode not in ("keep", "light") and _uses_cache(kwargs):
            if not self._warned_cache:
                self._warned_cache = True
                warnings.warn("tier.torch.plan_activations: a block called with a KV cache "
                              "(use_cache / past_key_values) runs without recompute: turn the "
                              "cache off for training (config.use_cache=False)", RuntimeWarning,
                              stacklevel=3)
            mode = "keep"
        observer = self.observer
        token = None
        if observer is not None:
            token = observer.block_begins(b, mode, args, kwargs)
        try:
            if mode == "keep":
                out = forward(*args, **kwargs)
            elif mode == "light":
                self._light_on = True
                try:
                    out = forward(*args, **kwargs)
                finally:
                    self._light_on = False
            elif mode == "full":
                out = _checkpoint(forward, *args, use_reentrant=False, **kwargs)
            elif mode == "selective":
                out = _checkpoint(forward, *args, use_reentrant=False,
                                  context_fn=self._context_fn, **kwargs)
            else:
                raise ValueError("unknown block mode %r" % (mode,))
        except BaseException:
            if observer is not None:
                observer.block_aborted(b, token)
            raise
        if observer is not None:
            observer.block_ends(b, mode, out, token)
        return out


class PlannerStats(Counters):
    """How the planner went: ``calibration_steps`` (steps spent calibrating: per round, one that
    records the saved tensors, TIMING_STEPS that time the blocks without hooks); ``plans`` made;
    ``planned_steps`` run under a plan; ``predicted_step_s`` / ``measured_step_s`` (the latest,
    from the first block's forward to the end of its backward: ``measured_overhead`` compares
    them); ``predicted_peak_bytes``; ``calibration_peak_bytes`` (CUDA: the activation peak
    measured in the last calibration step); ``replans`` (with the host's measured cost);
    ``corrections`` (plans made again because a plan's measured step was over the overhead
    budget: tier/torch/_overhead_check.py); ``twins`` (times a plan's twin, its modes without
    offloads, ran to tell the offloads' cost from the recompute's)."""

    __slots__ = ("calibration_steps", "plans", "planned_steps", "predicted_step_s",
                 "measured_step_s", "measured_overhead", "predicted_peak_bytes",
                 "calibration_peak_bytes", "replans", "corrections", "twins")

    def __repr__(self):
        return "PlannerStats(%s)" % ", ".join("%s=%s" % kv for kv in self.as_dict().items())


class _JointPolicy:
    """The offloader's policy for the joint planner (the interface of OffloadBudget)."""

    def __init__(self, planner):
        self._p = planner

    def begin_step(self):
        return self._p._begin_step()

    def step_started(self, device):
        pass  # a planned step is timed at its blocks (ActivationPlanner.block_begins)

    def candidate(self, site, nbytes, device, key):
        self._p._candidate(site, nbytes, device, key)

    def used(self, site, device):
        self._p._used(site, device)

    def end_step(self, count):
        self._p._end_step(count)

    @property
    def plan(self):
        return self._p.plan

    @property
    def stats(self):
        return self._p.stats


def _check_recompute(recompute):
    unknown = set(recompute or ()) - {"light", "selective", "full"}
    if unknown:
        raise ValueError("recompute= takes 'light', 'selective' and/or 'full', not %s" %
                         ", ".join(sorted(unknown)))


def _allowed_modes(recompute, block_modes, notes):
    """keep, and the modes of `recompute` that apply to these blocks (BlockModes, or None: no
    blocks) with this torch; why one does not, in `notes`."""
    recompute = tuple(recompute or ())
    if "selective" in recompute and not selective_available():
        recompute = tuple(m for m in recompute if m != "selective")
        notes.append("selective checkpointing needs torch >= 2.4 "
                     "(create_selective_checkpoint_contexts); torch %s: not used" %
                     torch.__version__)
    if block_modes is None:
        recompute = ()
        notes.append("no blocks found (pass blocks=): offload only")
    elif "light" in recompute and not all(block_modes.light_blocks):
        recompute = tuple(m for m in recompute if m != "light")
        notes.append("light recompute needs a gated MLP (gate_proj, up_proj, down_proj, "
                     "act_fn) in every block: not used")
    return ("keep",) + tuple(m for m in ("light", "selective", "full") if m in recompute)


def _goal(target_bytes, max_overhead):
    """The planner's goal, checked: (target_bytes, max_overhead); neither given: 5% of the
    step."""
    if target_bytes is None and max_overhead is None:
        max_overhead = 0.05
    if max_overhead is not None and not 0 <= max_overhead <= 10:
        raise ValueError("max_overhead is a fraction of the step (0.05 = 5%%), got %r"
                         % (max_overhead,))
    if target_bytes is not None and target_bytes < 0:
        raise ValueError("target_bytes must be >= 0")
    return target_bytes, max_overhead


class ActivationPlanner:
    """See the module docstring; made by :func:`tier.torch.plan_activations`."""

    def __init__(self, model, target_bytes=None, max_overhead=None,
                 recompute=("light", "selective", "full"), offload=True, blocks=None,
                 selective_policy=None, min_bytes=1 << 20, client=None, link=None,
                 verbose=True, prefetch=2, warmup_steps=1):
        target_bytes, max_overhead = _goal(target_bytes, max_overhead)
        self.target_bytes = target_bytes
        self.max_overhead = max_overhead
        self.offload = bool(offload)
        self.verbose = verbose
        self.notes = []
        _check_recompute(recompute)
        blocks = list(blocks) if blocks is not None else find_blocks(model)
        blocks = [b for b in blocks if isinstance(b, torch.nn.Module)]
        self._blocks = BlockModes(blocks, selective_policy) if blocks else None
        self.allowed = _allowed_modes(recompute, self._blocks, self.notes)
        if self._blocks is not None:
            self._blocks.observer = self
        self._signatures = [signature(b) for b in blocks]
        self._given_link = op.Link(*link) if link is not None else None
        self._link = self._given_link
        self._link_source = "given" if link is not None else None
        self._offloader = ActivationOffloader(min_bytes=min_bytes, prefetch=prefetch,
                                                  client=client, module=model,
                                                  policy=_JointPolicy(self))
        self._ops = self._offloader  # (or, on the host probe's step, its timed view of it)
        self._measured = {}          # (signature, mode) -> [(block, sites calib, timing calibs)]
        self._profile = None
        self.plan = None             # the JointPlan being followed
        self._step_plan = None       # its StepPlan (block-scoped)
        self._now = None             # the step in progress: warmup, sites, timing, planned
        self._running = None         # the StepPlan of the planned step in progress
        self._region = None          # (block, hooks token): the block whose hooks are open
        self._calib = None
        self._pending = None         # a sites calibration waiting for its timing steps
        self._timings = []           # the timing steps of _pending so far
        self._device = None
        self._warmup_left = int(warmup_steps)
        self._watch = PlanWatch(len(self._signatures))  # the plan followed, against the clock
        self.stats = PlannerStats()

    # -- public --

    @property
    def offloader(self):
        return self._offloader

    @property
    def modes(self):
        """The blocks' modes in the plan followed (None before the plan)."""
        return None if self.plan is None else list(self.plan.best.modes)

    @property
    def profile(self):
        """What the calibration measured (tier.torch._activation_planner.StepProfile), or None."""
        return self._profile

    @property
    def settling(self):
        """Whether the plan may still change by itself (calibration, host probe, clock)."""
        return self.plan is None or not self._watch.settled(self._step_plan)

    @property
    def host_probe(self):
        """The host probe's blocks (tier/torch/_host_probe.HostProbe.blocks) of the step it
        clocked; None before."""
        return self._watch.host_probe

    def summary(self):
        if self.plan is None:
            return "tier.torch.plan_activations: calibrating (%d step(s) so far)" % (
                self.stats.calibration_steps)
        return self.plan.summary()

    def retarget(self, target_bytes=None, max_overhead=None):
        """Plans again from the same calibration for another goal (no new calibration step;
        where the planner has not calibrated yet, the goal is taken for when it has). Returns
        the new :class:`~tier.torch._activation_planner.JointPlan` (or None)."""
        target_bytes, max_overhead = _goal(target_bytes, max_overhead)
        self.target_bytes, self.max_overhead = target_bytes, max_overhead
        self._watch.overhead.reset_goal()
        if self._profile is None:
            return None
        self._choose()
        return self.plan

    def remove(self):
        """Restores the blocks' forwards; the planner cannot be used afterwards."""
        if self._blocks is not None:
            self._blocks.remove()
            self._blocks = None

    def __enter__(self):
        if self._blocks is not None:
            self._blocks.active = True
        try:
            self._offloader.__enter__()
        except BaseException:
            if self._blocks is not None:
                self._blocks.active = False
            raise
        self._watch.windows.enter(self._now, self._device)
        return self

    def __exit__(self, *exc):
        try:
            self._close_region()  # a forward that ended without its last block
            return self._offloader.__exit__(*exc)
        finally:
            self._watch.windows.exit()
            if self._blocks is not None:
                self._blocks.active = False
            if self._calib is not None:
                self._calib.window = "post"

    # -- the offloader's policy --

    def _unhooked(self):
        return op.StepPlan(0, regions=op.Regions.unhooked(len(self._signatures)))

    def _begin_step(self):
        self._running, self._ops = None, self._offloader
        if self._warmup_left > 0:
            # Before calibrating: one step as calibration's "rest" runs (the least memory),
            # not measured (a first step pays for allocator growth, library setup, caches).
            self._warmup_left -= 1
            self._now = "warmup"
            self._set_modes([rest_mode(self.allowed)] * len(self._signatures))
            return self._unhooked()
        if self._step_plan is not None:
            self._now = "planned"
            self._running = self._step_plan
            self._set_modes(self.plan.best.modes)
            self._ops = self._watch.begin(self._step_plan, self._offloader)
            return self._running
        if self._pending is not None:
            # The same modes again, without hooks: the blocks' times as a plan runs them.
            self._now = "timing"
            self._set_modes(self._pending.modes)
            self._calib = Calibration(self._pending.modes, self._device, "timing")
            return self._unhooked()
        modes = calibration_modes(self._signatures, self.allowed, self._measured)
        self._now = "sites"
        self._set_modes(modes)
        self._calib = Calibration(modes, self._device, "sites")
        return None

    def _set_modes(self, modes):
        if self._blocks is not None:
            self._blocks.modes = list(modes)
            self._blocks._sac_observer = self._sac_saved if self._now == "sites" else None

    def _candidate(self, site, nbytes, device, key):
        c = self._calib
        if c is None or c.kind != "sites":
            return
        if self._device is None:
            self._device = device
        if site == 0:
            c.start_peak(device)
        c.windows.append(c.window)
        c.sizes.append(nbytes)
        c.keys.append(key)
        c.clock.stamp(("p", site), device)

    def _used(self, site, device):
        c = self._calib
        if c is not None and c.kind == "sites":
            c.clock.stamp(("u", site), device)

    # -- block observer (BlockModes) --

    def block_begins(self, b, mode, args, kwargs):
        now = self._now
        if now == "planned":
            plan = self._running
            regions = plan.regions
            device = self._device
            timer, probe = self._watch.timer, self._watch.probe
            timed = b == 0 and timer is not None and device is not None
            x = _first_tensor((args, kwargs)) if timed or probe is not None else None
            if probe is not None:
                probe.begins(b, x, device)
            if timed:
                # Timed from here to the end of this block's backward (its input's gradient).
                timer.start(device)
                if x is not None:
                    x.register_hook(functools.partial(_end_timer, timer, device))
            self._close_region()
            due = regions.releases[b]
            if due and device is not None:
                self._ops.release_sites(due, device)
            if regions.hooked[b]:
                self._region = (b, self._ops.region_enter(regions.first[b]))
            return None
        c = self._calib
        if c is None:
            return None
        x = _first_tensor((args, kwargs))
        if self._device is None:
            # One clock for the whole step: the device of the blocks' inputs (CUDA events).
            t = x if x is not None else _first_tensor(args, need_grad=False)
            self._device = t.device if t is not None else torch.device("cpu")
        device = self._device
        c.host[("fs", b)] = time.perf_counter()
        c.clock.stamp(("fs", b), device)
        c.window = b
        if x is not None:
            # Its gradient arrives when this block's backward is done.
            x.register_hook(functools.partial(self._grad_stamp, c, ("be", b), x.device))
        if c.kind == "sites" and mode == "selective" and device.type == "cuda" and \
                not _sac_op_output():
            c.mem_before[b] = torch.cuda.memory_allocated(device)
        return None

    def _close_region(self):
        """Closes the open block's hooks and checks that it saved what calibration saw."""
        region, self._region = self._region, None
        if region is None:
            return
        b, token = region
        end = self._ops.region_exit(token)
        plan = self._running
        if plan is not None and end - plan.regions.first[b] != plan.regions.count[b]:
            self._watch.mismatch = True  # the block saved otherwise than in calibration

    def block_ends(self, b, mode, out, token):
        now = self._now
        if now == "planned":
            self._close_region()
            if b == len(self._signatures) - 1 and self._running.regions.barrier:
                self._ops.barrier(self._device)
            if self._watch.probe is not None:
                self._watch.probe.ends(b, _first_tensor(out), self._device)
            return
        c = self._calib
        if c is None:
            return
        device = self._device or torch.device("cpu")
        c.clock.stamp(("fe", b), device)
        c.host[("fe", b)] = time.perf_counter()
        # Between this block and the next: a gap of its own (never offloaded; a planned
        # step's hooks do not see it).
        c.window = "post" if b == len(self._signatures) - 1 else ("gap", b)
        y = _first_tensor(out)
        if y is not None:
            # Its gradient arrives when this block's backward begins.
            y.register_hook(functools.partial(self._grad_stamp, c, ("bs", b), y.device))
        if b in c.mem_before:
            c.mem_extra[b] = max(0, torch.cuda.memory_allocated(device) - c.mem_before[b] -
                                 _tensor_bytes(out))

    def block_aborted(self, b, token):
        self._close_region()

    def _grad_stamp(self, c, key, device, grad):
        if c is self._calib:  # (else a step calibrating no longer: its backward ran late, or never)
            c.grad_stamp(key, device, len(self._signatures) - 1)
        return None

    def _sac_saved(self, output):
        c = self._calib
        if c is not None and isinstance(c.window, int) and output is not None:
            c.sac_bytes[c.window] += _tensor_bytes(output)

    # -- calibration --

    def _end_step(self, count):
        now, self._now = self._now, None
        if now == "planned":
            self._planned_step_done()
            return
        if now not in ("sites", "timing"):
            return  # the warm-up, or a step whose plan was replaced meanwhile
        c, self._calib = self._calib, None
        if c is None:
            return
        if self._blocks is not None:
            self._blocks._sac_observer = None
        c.times = c.clock.resolve()
        if now == "sites":
            if not c.resolve(count):
                return  # no backward ran (inference): nothing learned
            self.stats.calibration_steps += 1
            if c.peak is not None:
                self.stats.calibration_peak_bytes = c.peak
            if self._blocks is None:
                self._profile = build_profile(self._signatures, self._measured, c, None)
                self._choose()
            else:
                self._pending = c
            return
        sites = self._pending
        if sites is None:
            return
        if not any(k[0] == "be" for k in c.times):
            return  # no backward ran: time the same modes again next step
        self._watch.windows.timed(sites.modes)
        self.stats.calibration_steps += 1
        self._timings.append(c)
        if len(self._timings) < TIMING_STEPS:
            return  # the same modes timed again: each block counts its lesser time
        timings, self._timings = self._timings, []
        self._pending = None
        for b, (sig, mode) in enumerate(zip(self._signatures, sites.modes)):
            self._measured.setdefault((sig, mode), []).append((b, sites, timings))
        if any((sig, m) not in self._measured for sig in self._signatures
               for m in self.allowed):
            return  # another calibration round measures the modes still missing
        self._profile = build_profile(self._signatures, self._measured, sites, timings)
        profile = self._profile
        self._watch.windows.calibrate(
            lambda modes: ap.evaluate(profile, modes, op.Link(1e12, 1e12), offload=False).timed_s)
        self._choose()

    def _choose(self, why=None):
        if self._link is None:
            if self.offload:
                self._link, self._link_source = ob.measure_link(self._offloader.client,
                                                                self._device)
            else:
                self._link, self._link_source = op.Link(1e12, 1e12), "unused"
        self._watch.learned(self._profile)
        jp = ap.choose(self._profile, op.planning_link(self._link),
                       target_bytes=self.target_bytes,
                       max_overhead=self._watch.overhead.budget(self.max_overhead),
                       modes=self.allowed, offload=self.offload)
        jp.notes = self._plan_notes(jp)
        if self._now == "planned":
            self._now = None  # the step in progress followed the plan replaced here
        self.plan = jp
        self._step_plan = jp.step_plan
        self._watch.new_plan()  # steps timed under another plan go
        if why == "host":
            self.stats.replans += 1
        elif why == "overhead":
            self.stats.corrections += 1
        else:
            self.stats.plans += 1
        self.stats.predicted_step_s = jp.best.timed_s
        self.stats.predicted_peak_bytes = jp.best.peak_bytes
        self._set_modes(jp.best.modes)
        if self.verbose:
            print(jp.summary(), file=sys.stderr, flush=True)
        if not jp.met_target or not jp.within_budget:
            why = "; ".join(n for n in jp.notes if "reach" in n) or "the plan misses its goal"
            warnings.warn("tier.torch.plan_activations: " + why, RuntimeWarning, stacklevel=4)

    def _plan_notes(self, jp):
        """A new plan's notes: the planner's own, where the link and the host's cost came from,
        the overhead check's correction, then the plan's."""
        notes = self.notes + ["link from %s, planned at %d%% of it" % (
            self._link_source, round(100 * op.PLAN_LINK_SHARE))]
        notes += self._watch.notes(self._profile, jp.max_overhead, self.max_overhead)
        notes += jp.notes
        if not _sac_op_output() and "selective" in self.allowed:
            notes.append("selective checkpointing's kept bytes measured as the allocator's "
                         "growth (this torch gives the policy no op output)")
        return notes

    def _follow_twin(self):
        """The overhead check asks for the plan's twin: its modes with nothing offloaded, for
        a few steps (tier/torch/_overhead_check.py). The modes stay; only the offloads stop."""
        link = op.planning_link(self._link)
        twin = ap.evaluate(self._profile, self.plan.best.modes, link, chosen=[])
        self._step_plan = ap.step_plan(twin, link)
        self._watch.follow_twin(twin.timed_s - self.plan.baseline.timed_s)
        self.stats.twins += 1

    def _planned_step_done(self):
        what = self._watch.done(self.plan, self._profile, self._signatures, self.max_overhead,
                                self.stats)
        if what in ("host", "overhead"):
            self._choose(what)
        elif what == "twin":
            self._follow_twin()
        elif what == "mismatch-again":
            # Blocks that do not save the same tensors from step to step (data-dependent
            # control flow): a plan by position would offload the wrong tensors. The modes stay.
            if self._step_plan.offloaded:
                warnings.warn("tier.torch.plan_activations: the blocks saved other tensors than "
                              "in calibration, twice: offload is off, the recompute plan stays",
                              RuntimeWarning, stacklevel=4)
            self._step_plan = self._unhooked()
        elif what == "mismatch":
            # Once: calibrate again (the model may have changed what it saves for good).
            self.plan = self._step_plan = None
            self._measured.clear()
            self._profile = None


def plan_activations(model, target_bytes=None, max_overhead=None,
                     recompute=("light", "selective", "full"), offload=True, blocks=None,
                     selective_policy=None, min_bytes=DEFAULT_MIN_BYTES, client=None, link=None,
                     verbose=True):
    """Plans, for each of ``model``'s blocks, whether its activations are kept (and which of its
    saved tensors tierd offloads) or recomputed in backward by PyTorch's own checkpointing
    (``torch.utils.checkpoint``, non-reentrant: around a gated MLP's activation, product and
    down projection with the matmul's output kept, "light";
    selectively, with selective checkpoint contexts; or fully), to meet ``target_bytes`` of
    activation memory (``torch.cuda.max_memory_allocated`` above the step's start) at the least
    step time, or to save the most memory within ``max_overhead`` (a fraction of the step; the
    default, 0.05, when neither is given). Create it once and enter it every step::

        plan = tier.torch.plan_activations(model, target_bytes=8 << 30)
        for batch in data:
            with plan:
                loss = model(**batch).loss
                loss.backward()
            optimizer.step(); optimizer.zero_grad()

    After a warm-up step, two steps calibrate (more where a kind of block occurs fewer than four
    times): one records the saved tensors, one times the blocks without hooks; then the plan is
    printed (``verbose``) and followed. ``recompute``: the recompute modes allowed (``()``:
    offload only; "light" where every block has a gated MLP); ``offload=False``: recompute
    only; ``blocks``: the modules to plan (default: the model's largest nn.ModuleList);
    ``selective_policy``: a policy function for ``create_selective_checkpoint_contexts``
    (default: keep matmul and attention outputs).
    ``link``: ``(d2h, h2d)`` bytes/s instead of tierd's figure. Returns the
    :class:`~tier.torch._plan_activations.ActivationPlanner` (``.plan``, ``.summary()``, ``.stats``,
    ``.remove()``). See tier/torch/_plan_activations.py and tier/torch/_activation_planner.py.
    """
    return ActivationPlanner(model, target_bytes=target_bytes, max_overhead=max_overhead,
                             recompute=recompute, offload=offload, blocks=blocks,
                             selective_policy=selective_policy, min_bytes=min_bytes,
                             client=client, link=link, verbose=verbose)


def _end_timer(timer, device, grad):
    timer.end(device)
    return None


@functools.lru_cache(maxsize=None)
def _sac_op_output():
    """Whether this torch hands the selective policy each op's output (ctx.op_output)."""
    try:
        from torch.utils.checkpoint import SelectiveCheckpointContext
    except ImportError:
        return False
    import inspect
    try:
        return "op_output" in inspect.signature(SelectiveCheckpointContext.__init__).parameters
    except (TypeError, ValueError):
        return False
