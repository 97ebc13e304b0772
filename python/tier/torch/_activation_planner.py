"""Which blocks to recompute (fully, or selectively) and which saved tensors to offload: the
arithmetic behind ``tier.torch.plan_activations``. A pure function of measurements: no torch, no
daemon, unit-tested on made-up steps (tests/test_activation_planner.py).

The model. A step is: what runs before the first block (``pre_s``), each block's forward in
order, what runs between the last block's forward and its backward (``post_s``: the head, the
loss, the head's backward), each block's backward in reverse order, then the rest (``tail_s``).
Each block runs in one of four modes, and a calibration measured each mode once per kind of
block (a signature: the same class and shapes):

* ``keep``: nothing recomputed; every tensor the block saves for backward goes through the
  saved-tensor hooks, and may be offloaded.
* ``light``: as keep, but a gated MLP's down_proj(act_fn(gate) * up) saves only gate and up:
  neither act_fn(gate) nor the product is saved, both recomputed in backward (cheap elementwise
  work; tier/torch/_light_mlp.py, or a checkpoint keeping the matmul's output, which is then
  ``extra_bytes``); what the block keeps still goes through the hooks.
* ``selective``: torch.utils.checkpoint with selective checkpoint contexts: the outputs of the
  expensive ops (matmuls, attention) are kept aside by PyTorch (``extra_bytes``, never offloaded),
  the rest is recomputed in backward; the block's inputs go through the hooks.
* ``full``: torch.utils.checkpoint: only the block's inputs are saved (through the hooks); its
  forward runs again in backward.

Per mode a block has a forward and a backward time (recompute included) and its saved tensors,
each with its bytes, when forward saved it (seconds after the block's forward began) and when
backward first needs it (seconds after the block's backward began). Views of one storage count
once (their first save); a storage also saved outside the block's window is never offloaded.

Memory. At the end of forward every block holds what it saved (less what was offloaded, which a
barrier there takes off: tier/torch/_offload_planner.py), plus what runs outside the blocks keeps;
the activation peak is that, or during a block's backward, what the blocks before it hold plus the
whole of its activations again (recomputed, or reloaded), plus what was reloaded already for earlier
blocks (a reload the link must start blocks ahead is allocated from there on), whichever is larger;
plus an offset the calibration measured (the head's logits and loss, workspaces: the same in every
plan).

Time. The blocks' times in their modes plus the outside times plus the link's overhead (the
simulation of the offloads and reloads, the barrier's stall included).

The search. Offloading is cheapest where the link has time: blocks early in forward, whose
tensors are needed late in backward. Recompute frees more bytes per second of step time than a
stall for the link would (a block recomputes several hundred MB in the milliseconds the link
needs for one hundred), so offloads are taken only as far as they hide (fill_link), and the
remaining memory is bought with recompute: the first blocks keep (and offload), the last ones
recompute. Every split (how many selective, how many full, in either order) is evaluated; the
offload-only plan of the budget (tier/torch/_offload_planner.plan, which may stall to meet a target)
is one more candidate. The answer: the least step time that meets ``target_bytes``, or the least
memory within ``max_overhead`` (both: the target at the least time within the budget; if none
does, the budget wins and the plan says how far from the target it stayed).
"""

import collections

from . import _offload_planner as op

MODES = ("keep", "light", "selective", "full")

# Reloads due within RELOAD_WINDOW_S of one another start together, while the batch stays within
# RELOAD_BATCH_BYTES (tier/torch/_offload_planner.reload_triggers).
RELOAD_WINDOW_S = 1e-3
RELOAD_BATCH_BYTES = 64 << 20

TemplateSite = collections.namedtuple("TemplateSite", "nbytes produced needed offloadable")
TemplateSite.__doc__ = """One candidate a block saves in a mode: ``nbytes`` of its storage (0 for
a later view of a storage the block saved before), ``produced`` seconds after the block's
forward began, ``needed`` seconds after its backward began, ``offloadable``: a first view whose
storage no other window saved."""

ModeProfile = collections.namedtuple("ModeProfile", "fwd_s bwd_s sites extra_bytes")
ModeProfile.__doc__ = """A block of one signature in one mode: forward and backward seconds
(recompute included), its candidates in save order (TemplateSite), and ``extra_bytes`` it keeps
outside the hooks at the end of forward (selective checkpointing's saved outputs)."""


class StepProfile:
    """What a calibration measured. ``blocks``: the signature of each block, in forward order.
    ``modes``: {signature: {mode: ModeProfile}}. ``pre_sites``: the candidates saved before the
    first block (never offloaded): (nbytes, needed seconds after block 0's backward ended).
    ``post_sites``: the candidates saved after the last block's forward (never offloaded):
    their bytes. ``pre_s``, ``post_s``, ``tail_s``: the times outside the blocks (see the module
    docstring). ``gaps``: per block, the candidates saved between it and the next block (their
    bytes; never offloaded). ``peak_offset``: the measured activation peak minus the model's
    for the calibration step (0 where it cannot be measured).

    Where the allocator was measured per segment of the calibration step (CUDA), the peak is
    modelled from those instead (:meth:`Layout.peak`): ``calib_modes``, the calibration's
    modes; ``forward_peak``, the peak from the step's start to the first block's backward (the
    end of forward, the head, the loss); ``misc``, per block position, what was allocated at the
    start of its backward besides the blocks' saved bytes up to it (the gradient flowing back,
    what runs outside the blocks); ``work``, {signature: {mode: bytes}}: the peak during a
    block's backward above everything else (its activations, recomputed or reloaded, and its
    gradients' transients)."""

    def __init__(self, blocks, modes, pre_sites=(), post_sites=(), pre_s=0.0, post_s=0.0,
                 tail_s=0.0, peak_offset=0, calib_modes=None, forward_peak=None, misc=None,
                 work=None, gaps=None):
        self.blocks = list(blocks)
        self.modes = modes
        self.pre_sites = [tuple(s) for s in pre_sites]
        self.post_sites = [int(b) for b in post_sites]
        # Per block position: the candidates saved after it and before the next block (code
        # between two blocks; never offloaded): their bytes.
        self.gaps = [list(g) for g in gaps] if gaps is not None else [[] for _ in self.blocks]
        self.pre_s = float(pre_s)
        self.post_s = float(post_s)
        self.tail_s = float(tail_s)
        self.peak_offset = int(peak_offset)
        self.calib_modes = list(calib_modes) if calib_modes is not None else None
        self.forward_peak = forward_peak
        self.misc = list(misc) if misc is not None else None
        self.work = work
        # {signature: {mode: (GPU forward, GPU backward, host forward, host backward) seconds}}
        # (the calibration's; empty: the blocks' own times stand for both).
        self.host = {}
        # Host seconds a planned forward spends per offloaded storage (the hooks, the batch it
        # joins, its release): measured on a planned step (tier/torch/_plan_activations.py);
        # 0 until then.
        self.offload_host_s = 0.0
        # Step seconds per offloaded storage that the rest of the model does not explain
        # (copies slowing the kernels beside them, reloads landing late): learned from planned
        # steps' clocks (tier/torch/_overhead_check.py); 0 until then.
        self.offload_step_s = 0.0
        self._calib_kept = None

    def measured(self):
        """Whether the per-segment peak model applies (every block and mode measured)."""
        return (self.forward_peak is not None and self.misc is not None and
                self.work is not None and self.calib_modes is not None and
                len(self.misc) == len(self.blocks) and
                all(m in self.work.get(sig, {}) for sig in set(self.blocks)
                    for m in self.modes[sig]))

    def calib_kept(self):
        """The calibration step's bytes at the end of forward, by the same model."""
        if self._calib_kept is None:
            lay = Layout(self, self.calib_modes, peak_model=False)
            self._calib_kept = lay.outside_bytes + sum(lay.block_bytes)
        return self._calib_kept

    def allowed(self, modes):
        """The modes every block has a profile for, among `modes` (keep always)."""
        out = []
        for mode in MODES:
            if mode == "keep" or (mode in modes and all(mode in self.modes[sig]
                                                        for sig in self.blocks)):
                out.append(mode)
        return out


class Evaluation:
    """One plan's predictions: ``step_s``, ``peak_bytes`` (the model's activation peak with the
    calibration's offset), ``offloaded_bytes``; and what the offloader needs: ``count``
    (candidates in the step), ``sites`` (planner Sites, global candidate index), ``chosen``
    (offloaded Sites), ``members`` ({first view: [its views]}), ``sim``, ``triggers`` (the
    reloads' start points), ``early`` (per block, the reloaded bytes of earlier blocks already
    allocated during its backward), ``timed_s`` (what the planned step's timer measures)."""

    __slots__ = ("modes", "step_s", "peak_bytes", "offloaded_bytes", "overhead_s", "count",
                 "sites", "chosen", "members", "sim", "forward_end", "timed_s", "triggers",
                 "early", "layout", "block_bytes", "how", "host_s")

    def as_dict(self):
        return {"modes": list(self.modes), "step_s": self.step_s, "peak_bytes": self.peak_bytes,
                "offloaded_bytes": self.offloaded_bytes, "overhead_s": self.overhead_s,
                "offloaded_sites": len(self.chosen), "how": self.how,
                "timed_s": self.timed_s, "early_reload_bytes": max(self.early or [0]),
                "host_s": self.host_s,
                "block_bytes": list(self.block_bytes)}


class Layout:
    """The timeline and candidates of a step in given modes (no offload decided yet)."""

    def __init__(self, profile, modes, peak_model=True):
        if len(modes) != len(profile.blocks):
            raise ValueError("%d modes for %d blocks" % (len(modes), len(profile.blocks)))
        self.profile = profile
        self.measured = peak_model and profile.measured()
        self.modes = list(modes)
        per = [profile.modes[sig][m] for sig, m in zip(profile.blocks, modes)]
        t = profile.pre_s
        self.fwd_start = []
        for p in per:
            self.fwd_start.append(t)
            t += p.fwd_s
        self.forward_end = t
        t += profile.post_s
        bwd_start = [0.0] * len(per)
        for b in range(len(per) - 1, -1, -1):
            bwd_start[b] = t
            t += per[b].bwd_s
        self.bwd_start = bwd_start
        self.blocks_end = t
        self.base_step = t + profile.tail_s
        # Candidates in save order: before the blocks, each block's, after them.
        index = len(profile.pre_sites)
        self.sites = []      # planner Sites of offloadable first views
        self.members = {}    # first view -> its later views in the same block
        self.starts = []     # per block: the index of its first candidate
        self.counts = []     # per block: its candidates
        self.block_bytes = []   # per block: the bytes it keeps at the end of forward
        for b, p in enumerate(per):
            self.starts.append(index)
            self.counts.append(len(p.sites))
            first = None
            kept = p.extra_bytes
            for s in p.sites:
                if s.nbytes > 0:
                    first = index
                    kept += s.nbytes
                    if s.offloadable:
                        self.sites.append(op.Site(index, s.nbytes, self.fwd_start[b] + s.produced,
                                                  bwd_start[b] + s.needed))
                        self.members[index] = [index]
                elif first is not None and first in self.members:
                    self.members[first].append(index)
                index += 1
            gap = profile.gaps[b] if b < len(profile.gaps) else ()
            kept += sum(gap)    # kept until backward passes the gap
            index += len(gap)
            self.block_bytes.append(kept)
        self.count = index + len(profile.post_sites)
        self.outside_bytes = sum(n for n, _ in profile.pre_sites) + sum(profile.post_sites)
        self.pre_bytes = sum(n for n, _ in profile.pre_sites)
        # The whole of a block's activations during its backward: what it saves kept, whatever
        # the mode it runs in (recomputed or reloaded, it is all there again).
        self.whole = [_keep_bytes(profile.modes[sig]) for sig in profile.blocks]

    def block_of(self, index):
        """The block whose candidates include `index` (-1 before the first block)."""
        return _bisect_right(self.starts, index) - 1

    def peak(self, offloaded_by_block, offset, early=None):
        """The model's activation peak given the bytes offloaded from each block: the end of
        forward (everything saved, less what was offloaded, plus the outside), or a block's
        backward (the blocks before it, plus its whole activations again, plus ``early[b]``:
        the bytes of earlier blocks whose reloads were started before or during this block's
        backward, so their memory is allocated again by then). Measured per segment
        (StepProfile.measured): the calibration's own figures, moved by the difference in what
        the blocks keep; else the saved bytes plus the calibration's offset."""
        kept = [k - o for k, o in zip(self.block_bytes, offloaded_by_block)]
        early = early or [0] * len(kept)
        p = self.profile
        if self.measured:
            peak = p.forward_peak - p.calib_kept() + self.outside_bytes + sum(kept)
            below = 0
            for b, (sig, mode) in enumerate(zip(p.blocks, self.modes)):
                peak = max(peak, p.misc[b] + below + p.work[sig][mode] + early[b])
                below += kept[b]
            return int(peak)
        peak = self.outside_bytes + sum(kept)
        below = self.pre_bytes
        for b in range(len(kept)):
            peak = max(peak, below + self.whole[b] + early[b])
            below += kept[b]
        return peak + offset


def _keep_bytes(modes):
    keep = modes.get("keep")
    if keep is None:
        return max(sum(s.nbytes for s in p.sites) + p.extra_bytes for p in modes.values())
    return sum(s.nbytes for s in keep.sites) + keep.extra_bytes


def evaluate(profile, modes, link, offload=True, tolerance_s=0.0, chosen=None, how=None):
    """The predictions of running the blocks in ``modes`` and offloading (by default) what the
    link moves by the end of forward without stalling it (``chosen``: these instead)."""
    lay = Layout(profile, modes)
    if chosen is None:
        chosen = op.fill_link(lay.sites, lay.forward_end, link) if offload else []
        sim = op.simulate(chosen, lay.forward_end, link, barrier=True)
        # Reloads late for their use (sites needed early in backward): drop the latest-saved
        # until the link's overhead is within the tolerance.
        while chosen and sim.overhead > tolerance_s:
            chosen = sorted(chosen, key=lambda s: (s.produced, s.index))[:-1]
            sim = op.simulate(chosen, lay.forward_end, link, barrier=True)
        trimmed = _host_trim(profile, lay, modes, chosen, tolerance_s)
        if len(trimmed) != len(chosen):
            chosen = trimmed
            sim = op.simulate(chosen, lay.forward_end, link, barrier=True)
    else:
        sim = op.simulate(chosen, lay.forward_end, link, barrier=True)
    return _finish(profile, lay, modes, chosen, sim, how or ("fill" if offload else "none"))


def _finish(profile, lay, modes, chosen, sim, how):
    e = Evaluation()
    e.modes = list(modes)
    e.count = lay.count
    e.sites = lay.sites
    e.chosen = list(chosen)
    e.members = lay.members
    e.sim = sim
    e.layout = lay
    e.forward_end = lay.forward_end
    e.overhead_s = sim.overhead
    e.step_s = lay.base_step + sim.overhead
    # What the planned step's timer measures: from the first block's forward to the end of its
    # backward.
    e.timed_s = lay.blocks_end - profile.pre_s + sim.overhead
    # The host's own time for the offloads, where it outruns the GPU's lead in forward.
    e.host_s = host_extra_s(profile, modes, offloads_by_block(lay, chosen))
    e.step_s += e.host_s + len(chosen) * profile.offload_step_s
    e.timed_s += e.host_s + len(chosen) * profile.offload_step_s
    e.offloaded_bytes = sum(s.nbytes for s in chosen)
    e.how = how
    n = len(modes)
    by_block = [0] * n
    early = [0] * n
    e.triggers = {}
    if chosen:
        for s in chosen:
            by_block[lay.block_of(s.index)] += s.nbytes
        # Batched within a quarter of the shortest block's backward at most: a batch pulled
        # across blocks would bring bytes back before their block needs them.
        window = min([RELOAD_WINDOW_S] + [0.25 * profile.modes[sig][m].bwd_s
                                          for sig, m in zip(profile.blocks, modes)])
        e.triggers = op.reload_triggers(lay.sites, chosen, sim, max(0.0, window),
                                        RELOAD_BATCH_BYTES)
        size = {s.index: s.nbytes for s in chosen}
        for trigger, members in e.triggers.items():
            # Started at the trigger's first use, in the backward of block j: allocated from
            # there on, through the backward of every block between j and its own.
            j = lay.block_of(trigger)
            for m in members:
                for b in range(lay.block_of(m) + 1, j + 1):
                    early[b] += size[m]
    e.early = early
    e.block_bytes = lay.block_bytes
    e.peak_bytes = lay.peak(by_block, profile.peak_offset, early)
    return e


def offloads_by_block(lay, chosen):
    """Per block: how many storages of `chosen` it offloads."""
    counts = [0] * len(lay.modes)
    for s in chosen:
        b = lay.block_of(s.index)
        if b >= 0:
            counts[b] += 1
    return counts


def _forward_pipeline(profile, modes, offloads):
    """Per block, when the GPU ends its forward (seconds from the first block's start): the
    host issues each block's work in its calibrated host time plus ``offloads[b]`` times the
    profile's host cost per offloaded storage (it never waits for the GPU in forward), and the
    GPU runs each block in its GPU time, not before the host has issued it."""
    c = profile.offload_host_s
    host_t = gpu_t = 0.0
    ends = []
    for b, (sig, mode) in enumerate(zip(profile.blocks, modes)):
        times = profile.host.get(sig, {}).get(mode)
        if times is not None:
            gpu_f, host_f = times[0], times[2]
        else:
            gpu_f = host_f = profile.modes[sig][mode].fwd_s  # (host clock: one and the same)
        host_t += host_f + offloads[b] * c
        gpu_t = max(gpu_t + gpu_f, host_t)
        ends.append(gpu_t)
    return ends


def host_extra_s(profile, modes, offloads):
    """Seconds the forward runs longer for the host time the offloads take (``offloads``: per
    block, the storages it offloads): the pipeline of host and GPU with them, less without. 0
    before the host's cost per offload was measured (StepProfile.offload_host_s)."""
    if profile.offload_host_s <= 0 or not any(offloads):
        return 0.0
    with_them = _forward_pipeline(profile, modes, offloads)
    without = _forward_pipeline(profile, modes, [0] * len(offloads))
    return max(0.0, with_them[-1] - without[-1])


def _host_trim(profile, lay, modes, chosen, tolerance_s):
    """`chosen` less what the host cannot issue in time: while the host's extra exceeds
    ``tolerance_s``, the smallest offload saved no later than the last block where the GPU falls
    further behind the host goes (the host's time is additive: any offload before that point
    delays it alike, and the smallest frees the least memory)."""
    if profile.offload_host_s <= 0 or not chosen:
        return chosen
    chosen = list(chosen)
    counts = offloads_by_block(lay, chosen)
    base = _forward_pipeline(profile, modes, [0] * len(counts))
    while chosen:
        ends = _forward_pipeline(profile, modes, counts)
        if ends[-1] - base[-1] <= tolerance_s:  # (host_extra_s, without recomputing the base)
            break
        delay = [e - b for e, b in zip(ends, base)]
        last = max((b for b in range(len(delay))
                    if delay[b] - (delay[b - 1] if b else 0.0) > 1e-12), default=-1)
        victim = min((s for s in chosen if lay.block_of(s.index) <= last),
                     key=lambda s: (s.nbytes, -s.produced), default=None)
        if victim is None:
            break
        chosen.remove(victim)
        counts[lay.block_of(victim.index)] -= 1
    return chosen


def _bisect_right(a, x):
    lo, hi = 0, len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def candidates(n, allowed):
    """The mode assignments searched: the first blocks kept (all in keep, or all in light), the
    rest recomputed, selective then full or full then selective; every split."""
    sel = "selective" in allowed
    full = "full" in allowed
    kept_modes = ["keep"] + (["light"] if "light" in allowed else [])
    seen = set()
    for n_full in range(n + 1 if full else 1):
        for n_sel in range(n - n_full + 1 if sel else 1):
            n_keep = n - n_full - n_sel
            for kept in kept_modes:
                for tail in (["selective"] * n_sel + ["full"] * n_full,
                             ["full"] * n_full + ["selective"] * n_sel):
                    modes = tuple([kept] * n_keep + tail)
                    if modes not in seen:
                        seen.add(modes)
                        yield modes


class JointPlan:
    """The choice: ``best`` (an Evaluation), the ``baseline`` (every block kept, nothing
    offloaded: the step as it runs without any of this), the points of the pure strategies
    (``references``: full recompute, light and selective everywhere, offload only), whether the
    target
    was met, and the StepPlan the offloader follows."""

    __slots__ = ("best", "baseline", "references", "target_bytes", "max_overhead",
                 "met_target", "within_budget", "link", "step_plan", "allowed", "notes")

    def summary(self, mib=2**20):
        b, base = self.best, self.baseline
        counts = collections.Counter(b.modes)
        lines = ["tier.torch.plan_activations: %s" % ", ".join(
            "%d %s" % (counts[m], m) for m in MODES if counts[m]) + " block(s); offload %d MiB "
            "in %d tensor(s) (link %.1f / %.1f GB/s)" % (
                b.offloaded_bytes / mib, len(b.chosen), self.link.d2h / 1e9, self.link.h2d / 1e9)]
        lines.append("  predicted: step %.1f ms (%.3fx the step without a plan, %.1f ms), "
                     "activation peak %.0f MiB (without: %.0f MiB)" % (
                         1e3 * b.step_s, b.step_s / base.step_s, 1e3 * base.step_s,
                         b.peak_bytes / mib, base.peak_bytes / mib))
        goal = []
        if self.target_bytes is not None:
            goal.append("target %.0f MiB: %s" % (self.target_bytes / mib,
                                                 "met" if self.met_target else "NOT met"))
        if self.max_overhead is not None:
            goal.append("overhead budget %.1f%%: %s" % (
                100 * self.max_overhead, "within" if self.within_budget else "EXCEEDED"))
        if goal:
            lines.append("  " + "; ".join(goal))
        for name, ref in self.references.items():
            lines.append("  for comparison, %s: step %.3fx, peak %.0f MiB" % (
                name, ref.step_s / base.step_s, ref.peak_bytes / mib))
        lines.extend("  note: " + n for n in self.notes)
        return "\n".join(lines)


def choose(profile, link, target_bytes=None, max_overhead=None, modes=MODES, offload=True,
           tolerance=0.005):
    """The plan (see the module docstring). ``modes``: the block modes allowed (keep always);
    ``offload``: whether tierd may take saved tensors; ``tolerance``: the link overhead
    accepted as noise in a plan that should not stall (a fraction of the step)."""
    if target_bytes is None and max_overhead is None:
        raise ValueError("choose() needs target_bytes or max_overhead")
    if max_overhead is not None and max_overhead < 0:
        raise ValueError("max_overhead must be >= 0")
    if target_bytes is not None and target_bytes < 0:
        raise ValueError("target_bytes must be >= 0")
    allowed = profile.allowed(modes)
    n = len(profile.blocks)
    keep_all = tuple(["keep"] * n)
    baseline = evaluate(profile, keep_all, link, offload=False, how="none")
    evaluated = _evaluated(profile, link, allowed, offload, tolerance * baseline.step_s,
                           target_bytes, max_overhead)
    budget = None if max_overhead is None else baseline.step_s * (1 + max_overhead)

    def fits(e):
        return target_bytes is None or e.peak_bytes <= target_bytes

    def within(e):
        return budget is None or e.step_s <= budget + 1e-12

    notes = []
    best = _pick(evaluated, fits, within, target_bytes is not None, max_overhead is not None,
                 notes)
    if best.step_s >= baseline.step_s and best.peak_bytes >= baseline.peak_bytes:
        best = baseline  # nothing to gain
    if offload and best.chosen and best.how != "offload-only plan":
        best = _trim_offload(profile, best, link, target_bytes)
    jp = JointPlan()
    jp.best = best
    jp.baseline = baseline
    jp.references = _references(profile, link, allowed, evaluated)
    jp.target_bytes = target_bytes
    jp.max_overhead = max_overhead
    jp.met_target = fits(best)
    jp.within_budget = within(best)
    jp.link = link
    jp.allowed = allowed
    jp.notes = notes
    jp.step_plan = step_plan(best, link)
    return jp


def _evaluated(profile, link, allowed, offload, tol, target_bytes, max_overhead):
    """Every plan choose() considers, evaluated: each candidate of modes (with its offloads,
    and fewer of them once offloads have a price), then the budget's offload-only plans."""
    n = len(profile.blocks)
    evaluated = []
    for m in candidates(n, allowed):
        e = evaluate(profile, m, link, offload=offload, tolerance_s=tol)
        evaluated.append(e)
        if e.chosen and profile.offload_step_s > 0:
            evaluated.extend(_fewer_offloads(profile, e, link))
    if not offload:
        return evaluated
    # The budget's offload-only plans (they may stall the step to reach a target): over the kept
    # blocks' sites.
    keep_all = tuple(["keep"] * n)
    lay = Layout(profile, keep_all)
    goals = ([dict(target_bytes=_site_target(profile, lay, target_bytes))]
             if target_bytes is not None else []) + \
        ([dict(max_overhead=max_overhead)] if max_overhead is not None else [])
    for kwargs in goals:
        if lay.sites:
            p = op.plan(lay.sites, lay.forward_end, lay.base_step, link, barrier=True, **kwargs)
            chosen = [s for s in lay.sites if s.index in p.indices]
            evaluated.append(evaluate(profile, keep_all, link, chosen=chosen,
                                      how="offload-only plan"))
    return evaluated


def _pick(evaluated, fits, within, has_target, has_budget, notes):
    """The least time meeting the target within the budget (a target), or the least memory
    within it (a budget); failing both, the nearest, with a note saying so."""
    both = [e for e in evaluated if fits(e) and within(e)]
    if both:
        if has_target:
            return min(both, key=lambda e: (e.step_s, e.peak_bytes))
        return min(both, key=lambda e: (e.peak_bytes, e.step_s))
    if has_budget and any(within(e) for e in evaluated):
        notes.append("the target is out of reach within the overhead budget: the least memory "
                     "within the budget instead")
        return min((e for e in evaluated if within(e)), key=lambda e: (e.peak_bytes, e.step_s))
    if has_target and any(fits(e) for e in evaluated):
        return min((e for e in evaluated if fits(e)), key=lambda e: (e.step_s, e.peak_bytes))
    notes.append("no plan reaches the target: the least memory there is instead")
    return min(evaluated, key=lambda e: (e.peak_bytes, e.step_s))


def _references(profile, link, allowed, evaluated):
    """What the plan is judged against: recompute everywhere (each mode allowed), and the best
    offload-only plan evaluated."""
    n = len(profile.blocks)
    references = {}
    for mode, name in (("full", "full recompute"), ("light", "light everywhere"),
                       ("selective", "selective everywhere")):
        if mode in allowed and n:
            references[name] = evaluate(profile, tuple([mode] * n), link, offload=False)
    keep_all = ["keep"] * n
    offload_only = [e for e in evaluated if e.modes == keep_all and e.chosen]
    if offload_only:
        references["offload only"] = min(offload_only, key=lambda e: e.peak_bytes)
    return references


def _fewer_offloads(profile, e, link):
    """Where offloads cost the step time of their own (``offload_step_s``): the same modes with
    the largest half of ``e``'s offloads, and with none (the bytes per offload pay the price)."""
    biggest = sorted(e.chosen, key=lambda s: (-s.nbytes, s.index))
    return [evaluate(profile, e.modes, link, chosen=sorted(biggest[:k], key=lambda s: s.index))
            for k in sorted({len(biggest) // 2, 0}, reverse=True)]


def _site_target(profile, lay, target_bytes):
    """The budget planner's target is over the sites it may offload: the peak target less what
    it cannot touch (the model's peak without offload, less the sites' bytes)."""
    fixed = lay.peak([0] * len(lay.block_bytes), profile.peak_offset) - \
        sum(s.nbytes for s in lay.sites)
    return max(0, target_bytes - fixed)


def _trim_offload(profile, e, link, target_bytes):
    """With a target, no more offload than it takes: the latest-saved offloads go first while the
    target still holds (less link traffic, the same step)."""
    if target_bytes is None or e.peak_bytes > target_bytes:
        return e
    chosen = sorted(e.chosen, key=lambda s: (s.produced, s.index))
    while chosen:
        trial = evaluate(profile, e.modes, link, chosen=chosen[:-1], how=e.how)
        if trial.peak_bytes > target_bytes or trial.step_s > e.step_s + 1e-9:
            break
        chosen = chosen[:-1]
        e = trial
    return e


def step_plan(e, link):
    """The StepPlan the offloader follows for Evaluation ``e``: block-scoped (``regions``): the
    saved-tensor hooks run only inside blocks with an offloaded site or a reload trigger, each
    block's sites are numbered from its first candidate's index, the sources of offloads whose
    copies should be done go back at the start of a later block, the rest at the end of the
    last block's forward (the barrier), and the step is timed from the first block's forward to
    the end of its backward (no hooks for that)."""
    lay = e.layout
    n = len(e.modes)
    offload = [m for s in e.chosen for m in e.members[s.index]]
    hooked = [False] * n
    for index in offload:
        hooked[lay.block_of(index)] = True
    for index in e.triggers:
        hooked[lay.block_of(index)] = True
    regions = op.Regions(lay.starts, lay.counts, hooked, block_releases(e, link),
                         barrier=bool(offload))
    return op.StepPlan(e.count, offload, e.triggers, None, barrier=False, regions=regions)


def block_releases(e, link, margin=0.1, margin_s=100e-6):
    """Per block: the offloaded sites whose sources go back to the allocator when the block's
    forward begins, the first block that begins after the site's copy is predicted done (with a
    margin of ``margin`` of the copy's own time plus ``margin_s``); the others at the barrier."""
    lay = e.layout
    n = len(e.modes)
    out = [[] for _ in range(n)]
    for s in sorted(e.chosen, key=lambda s: (s.produced, s.index)):
        ready = e.sim.offload_done[s.index] + margin * s.nbytes / link.d2h + margin_s
        for b in range(lay.block_of(s.index) + 1, n):
            if lay.fwd_start[b] >= ready:
                out[b].append(s.index)
                break
    return [tuple(r) for r in out]
