"""Which saved tensors to offload so that the copies hide under compute: the arithmetic behind
``tier.torch.offload_activations(max_overhead=..., target_bytes=...)``.

A step is forward then backward on one timeline (seconds from the step's start). Each saved tensor
site (its position in the forward's order of saved tensors) has a size, the time forward produced
it and the time backward first needs it. The link copies one way at a time in each direction
(full duplex): offloads in forward in production order, reloads in backward in order of use.

For a set of sites to offload, :func:`simulate` schedules the copies: each offload as soon as its
tensor exists and the D2H link is free; each reload as late as it can start and still finish
before its use, given the reloads after it (one pass from the last use back), but not before its
offload finished nor before backward began. Where a reload cannot finish in time, backward waits:
that wait is the step's overhead.

With ``barrier=True`` (what the offloader runs), every offload must have landed when forward ends:
the compute stream waits there (on the GPU) for the copies still running, so that each offloaded
tensor's memory is back with PyTorch's allocator before backward, where the activation peak is. A
copy still running then is a stall of the whole step; an offload that lands later would not come
off the peak. :func:`release_points` says where in forward each source is handed back, as soon as
its copy is predicted to be done.

:func:`reload_triggers` turns the planned reload starts into points of backward (a reload starts
when backward first uses the saved tensor used last before its planned start), so reloads begin
just early enough rather than a fixed count ahead.

:func:`plan` picks the set: sites by value (size times how long it is not needed, the largest and
longest-lived first), each kept if the step's predicted overhead stays within the budget; with a
memory target it stops once what stays on the GPU fits the target (and with both, the budget
wins: the plan says how far from the target it stayed).
"""

import collections

Site = collections.namedtuple("Site", "index nbytes produced needed")


class Link:
    """Copy bandwidths, bytes per second, in each direction."""

    __slots__ = ("d2h", "h2d")

    def __init__(self, d2h, h2d):
        if d2h <= 0 or h2d <= 0:
            raise ValueError("link bandwidths must be > 0")
        self.d2h = float(d2h)
        self.h2d = float(h2d)

    def __repr__(self):
        return "Link(d2h=%.3g GB/s, h2d=%.3g GB/s)" % (self.d2h / 1e9, self.h2d / 1e9)


class Simulation:
    __slots__ = ("overhead", "barrier_stall", "offload_done", "reload_start", "reload_end")

    def __init__(self):
        self.overhead = 0.0
        self.barrier_stall = 0.0
        self.offload_done = {}
        self.reload_start = {}
        self.reload_end = {}


# The share of the measured link a plan counts on. tierd's figure is its copies' best rate; a
# plan's copies also pay a fixed cost per job and start only when their producers finish. Planned
# at the whole figure, the 1B Llama's 5% plan on an H200 filled 95% of forward's link, and its
# offloading blocks ran 0.4 ms (15%) slower each than the calibration timed them; plans filling
# 73% and 87% ran at the calibration's time.
PLAN_LINK_SHARE = 0.9


def planning_link(link):
    """The Link a plan is made with: PLAN_LINK_SHARE of the measured one."""
    return Link(link.d2h * PLAN_LINK_SHARE, link.h2d * PLAN_LINK_SHARE)


def simulate(sites, forward_end, link, barrier=False):
    """Schedules the offloads and reloads of ``sites``; returns a :class:`Simulation` whose
    ``overhead`` (seconds) is how long the step waits for copies in all: backward for reloads,
    and with ``barrier``, the end of forward for offloads still running (``barrier_stall``; the
    whole backward moves by it)."""
    sim = Simulation()
    free = 0.0
    for s in sorted(sites, key=lambda s: (s.produced, s.index)):
        start = max(s.produced, free)
        free = start + s.nbytes / link.d2h
        sim.offload_done[s.index] = free
    stall = max(0.0, free - forward_end) if barrier and sites else 0.0
    sim.barrier_stall = stall
    by_use = sorted(sites, key=lambda s: (s.needed, s.index))
    # Latest starts, from the last use back: each reload ends by its use and before the next one
    # begins (one link), so the later reloads are not pushed.
    latest = {}
    next_start = float("inf")
    for s in reversed(by_use):
        end = min(s.needed, next_start)
        latest[s.index] = end - s.nbytes / link.h2d
        next_start = latest[s.index]
    # Then forward in time, with what can really happen: not before the offload landed, not before
    # backward began, not before the link is free. Backward waits where a reload is late, and
    # every later use moves by that wait (and by the barrier's stall, from its start).
    free = forward_end + stall
    delay = stall
    for s in by_use:
        start = max(latest[s.index] + delay, sim.offload_done[s.index], forward_end + stall, free)
        end = start + s.nbytes / link.h2d
        sim.reload_start[s.index] = start
        sim.reload_end[s.index] = end
        free = end
        delay = max(delay, end - s.needed)
    sim.overhead = delay
    return sim


def reload_triggers(sites, chosen, sim, window_s=0.0, batch_bytes=0):
    """When to start each reload, in the only clock backward has: the uses of saved tensors.
    Returns {trigger site: [sites whose reload starts when backward first uses the trigger]}, the
    trigger of a reload being the last use (of any site, offloaded or not) at or before its
    planned start; a reload planned before backward's first use starts at that first use. A site
    reloads no later than its own use in any case (the offloader starts it there if nothing did).

    ``window_s`` / ``batch_bytes``: reloads due within ``window_s`` after a trigger's use join that
    trigger's batch while the batch stays within ``batch_bytes``: a few reloads started a little
    early as one batch (one ticket, one submission) instead of one submission each, where the
    host's cost per submission would otherwise add up over many small tensors."""
    uses = sorted(sites, key=lambda s: (s.needed, s.index))
    if not uses:
        return {}
    needed = [s.needed for s in uses]
    groups = []  # [trigger site or None (at its own use), time of that use, bytes, [sites]]
    for s in sorted(chosen, key=lambda s: (sim.reload_start[s.index], s.index)):
        # The last use at or before the planned start (bisect on the uses' times).
        lo, hi = 0, len(needed)
        while lo < hi:
            mid = (lo + hi) // 2
            if needed[mid] <= sim.reload_start[s.index]:
                lo = mid + 1
            else:
                hi = mid
        trigger = uses[max(lo - 1, 0)]
        at = trigger.needed
        if trigger.index == s.index:
            trigger, at = None, s.needed  # planned at its own use: that use reloads it
        if (groups and at - groups[-1][1] <= window_s
                and groups[-1][2] + s.nbytes <= batch_bytes):
            groups[-1][2] += s.nbytes
            groups[-1][3].append(s.index)
        elif trigger is not None or window_s > 0:
            groups.append([None if trigger is None else trigger.index, at, s.nbytes, [s.index]])
    triggers = {}
    for trigger, _, _, members in groups:
        if trigger is None:
            if len(members) == 1:
                continue  # alone at its own use: that use reloads it
            # The first reloads at its own use and the rest start with it, as one batch.
            trigger = members[0]
        triggers.setdefault(trigger, []).extend(members)
    return triggers


# Release points closer together than this are one point, the latest of them: each point costs
# the host a flush of the pending offloads and a stream wait (about 175 us and 17 us on an H100's
# host), and with a busy link nearly every save had one of its own (9 of 10 in the hook bench's
# planned mode), which held batches to 4-5 saves. A source then goes back at most this much later
# than its copy could allow, well inside forward, where the activation peak is not.
RELEASE_GROUP_S = 1e-3


def release_points(sites, chosen, sim, link, margin=0.1, margin_s=100e-6, group_s=None):
    """Where in forward each offloaded site's memory goes back to the allocator: at the first
    saved tensor produced after its copy is predicted to be done (with a margin of ``margin``
    of the copy's own time plus ``margin_s``), the compute stream waits there on the GPU for the
    copy (already done, if the prediction holds) and the source is released in stream order.
    Points within ``group_s`` (default RELEASE_GROUP_S) of a group's first are one, at the
    group's last. Returns ({pack
    site: [offloaded sites released there]}, [sites left for the barrier at the end of
    forward]), each list in offload order."""
    if group_s is None:
        group_s = RELEASE_GROUP_S
    packs = sorted(sites, key=lambda s: (s.produced, s.index))
    produced = [s.produced for s in packs]
    at = {}        # position in packs -> [offloaded sites released there]
    barrier = []
    for s in sorted(chosen, key=lambda s: (s.produced, s.index)):
        ready = sim.offload_done[s.index] + margin * s.nbytes / link.d2h + margin_s
        lo, hi = 0, len(produced)
        while lo < hi:  # the first pack at or after `ready`
            mid = (lo + hi) // 2
            if produced[mid] < ready:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(packs) and packs[lo].index != s.index:
            at.setdefault(lo, []).append(s.index)
        else:
            barrier.append(s.index)
    points = {}
    group, first = [], None
    for pos in sorted(at):
        if first is not None and produced[pos] - produced[first] > group_s:
            points[packs[last].index] = group
            group, first = [], None
        if first is None:
            first = pos
        group = group + at[pos]
        last = pos
    if group:
        # A later point is never a site released there (the source's own save): `last` is the
        # pack after each of its sites' ready times, so after each of those sites' saves.
        points[packs[last].index] = group
    return points, barrier


def fill_link(sites, forward_end, link, allowance=0.0):
    """The sites whose offloads the D2H link finishes by ``forward_end + allowance``, taken in
    production order (the longest-lived first, the link kept busy from the start), each taken if
    the link's backlog still ends in time. O(n); the joint planner's inner choice, where a stall
    at the barrier is never worth its time next to recomputing (a block's recompute frees more
    bytes per second than the link moves)."""
    chosen = []
    free = 0.0
    deadline = forward_end + allowance
    for s in sorted(sites, key=lambda s: (s.produced, s.index)):
        if s.nbytes <= 0:
            continue
        end = max(s.produced, free) + s.nbytes / link.d2h
        if end <= deadline:
            chosen.append(s)
            free = end
    return chosen


class Plan:
    __slots__ = ("indices", "offloaded_bytes", "kept_bytes", "predicted_overhead",
                 "step_seconds", "budget_seconds", "target_bytes", "met_target", "link",
                 "triggers", "releases", "barrier")

    def as_dict(self):
        out = {name: getattr(self, name) for name in self.__slots__
               if name not in ("indices", "link", "triggers", "releases", "barrier")}
        out["sites"] = len(self.indices)
        out["link_d2h"] = self.link.d2h
        out["link_h2d"] = self.link.h2d
        return out

    def __repr__(self):
        return "Plan(%d sites, %d bytes offloaded, %d kept, predicted overhead %.2f%%)" % (
            len(self.indices), self.offloaded_bytes, self.kept_bytes,
            100.0 * self.predicted_overhead / self.step_seconds if self.step_seconds else 0.0)


def plan(sites, forward_end, step_seconds, link, max_overhead=None, target_bytes=None,
         barrier=False, window_s=0.0, batch_bytes=0, offload_cost_s=0.0):
    """The sites to offload. ``max_overhead``: the step may grow by at most this fraction;
    ``target_bytes``: what may stay on the GPU at the end of forward (all saved tensors are
    alive then). At least one of the two. ``barrier``: offloads must land by the end of forward
    (see :func:`simulate`); the plan then also says where each source is released.
    ``offload_cost_s``: what each offload costs the step besides the link's time (the host's
    work for it, measured on planned steps: tier/torch/_offload_budget.py), added to the
    predicted overhead per chosen site."""
    if max_overhead is None and target_bytes is None:
        raise ValueError("plan() needs max_overhead or target_bytes")
    if max_overhead is not None and max_overhead < 0:
        raise ValueError("max_overhead must be >= 0")
    budget = None if max_overhead is None else max_overhead * step_seconds
    total = sum(s.nbytes for s in sites)
    chosen = []
    offloaded = 0
    # Largest and longest-lived first: the most memory for the least pressure on the link.
    for s in sorted(sites, key=lambda s: (-(s.nbytes * max(s.needed - s.produced, 0.0)),
                                          s.index)):
        if target_bytes is not None and total - offloaded <= target_bytes and budget is None:
            break
        trial = simulate(chosen + [s], forward_end, link, barrier).overhead + \
            (len(chosen) + 1) * offload_cost_s
        if budget is not None and trial > budget:
            continue
        chosen.append(s)
        offloaded += s.nbytes
        if target_bytes is not None and total - offloaded <= target_bytes and budget is not None:
            break  # the target is met within the budget: no need to move more
    return make_plan(sites, chosen, forward_end, step_seconds, link, budget, target_bytes,
                     barrier, window_s, batch_bytes, offload_cost_s)


def make_plan(sites, chosen, forward_end, step_seconds, link, budget_seconds=None,
              target_bytes=None, barrier=False, window_s=0.0, batch_bytes=0, offload_cost_s=0.0):
    """The :class:`Plan` that offloads ``chosen`` among ``sites`` (``offload_cost_s``: see
    :func:`plan`)."""
    total = sum(s.nbytes for s in sites)
    offloaded = sum(s.nbytes for s in chosen)
    sim = simulate(chosen, forward_end, link, barrier)
    p = Plan()
    p.indices = frozenset(s.index for s in chosen)
    p.triggers = reload_triggers(sites, chosen, sim, window_s, batch_bytes)
    if barrier:
        p.releases, p.barrier = release_points(sites, chosen, sim, link)
    else:
        p.releases, p.barrier = {}, []
    p.offloaded_bytes = offloaded
    p.kept_bytes = total - offloaded
    p.predicted_overhead = sim.overhead + len(chosen) * offload_cost_s
    p.step_seconds = step_seconds
    p.budget_seconds = budget_seconds
    p.target_bytes = target_bytes
    p.met_target = target_bytes is None or p.kept_bytes <= target_bytes
    p.link = link
    return p


# ---- the plan as the offloader follows it -----------------------------------------------------

KEEP, STAMP, OFFLOAD = 0, 1, 2


class StepPlan:
    """A plan by candidate index (the n-th saved tensor of a step the offloader could offload),
    in the form the saved-tensor hooks read in O(1):

    * ``actions[i]``: KEEP (returned as it is, no wrapper), STAMP (kept, wrapped so that its
      first use in backward is seen: a reload trigger or the step's timing point) or OFFLOAD.
    * ``triggers``: {i: (sites)}: the reloads started when backward first uses i.
    * ``releases``: {i: (sites)}: offloaded sites whose sources go back to the allocator (in
      stream order) when forward saves i.
    * ``barrier``: the candidate after whose save every offload still held is released (the end
      of forward), -1 for none.
    * ``timing_site``: the candidate whose first use in backward ends the timed step, -1 for none.
    * ``count``: the candidates the plan expects; a step with another count calibrates again.
    * ``regions``: None (the hooks see the whole step, as above), or :class:`Regions`: the
      hooks run only inside the blocks it names, whose sites it numbers (the joint planner).
    * ``plain[i]``: 1 where the hook returns candidate i as it is and does nothing else: KEEP,
      no release point, not the barrier, and not candidate 0 (whose save starts the step's
      timer). The one statement of that rule, read by both hooks (_activations.py,
      _save_shape.py).
    """

    __slots__ = ("count", "actions", "triggers", "releases", "barrier", "timing_site",
                 "regions", "plain")

    def __init__(self, count, offload=(), triggers=None, releases=None, barrier=True,
                 timing_site=-1, regions=None):
        self.regions = regions
        self.count = int(count)
        actions = bytearray(self.count)
        self.triggers = {k: tuple(v) for k, v in (triggers or {}).items() if v}
        self.releases = {k: tuple(v) for k, v in (releases or {}).items() if v}
        for i in self.triggers:
            actions[i] = STAMP
        if 0 <= timing_site < self.count:
            actions[timing_site] = STAMP
        for i in offload:
            actions[i] = OFFLOAD
        self.actions = bytes(actions)
        self.barrier = self.count - 1 if barrier and self.count and any(
            a == OFFLOAD for a in actions) else -1
        self.timing_site = timing_site if 0 <= timing_site < self.count else -1
        self.plain = bytes(
            1 if a == KEEP and i and i not in self.releases and i != self.barrier else 0
            for i, a in enumerate(self.actions))

    @property
    def offloaded(self):
        return [i for i, a in enumerate(self.actions) if a == OFFLOAD]

    def __repr__(self):
        return "StepPlan(%d candidates, %d offloaded, %d triggers, %d release points)" % (
            self.count, len(self.offloaded), len(self.triggers), len(self.releases))


class Regions:
    """A block-scoped StepPlan's blocks: ``first[b]`` / ``count[b]``: the index of block b's
    first candidate and how many it saves; ``hooked[b]``: whether the saved-tensor hooks run in
    its forward (an offloaded site or a reload trigger there; elsewhere autograd saves as it
    would without tierd); ``releases[b]``: offloaded sites whose sources go back (in stream
    order) when its forward begins; ``barrier``: every offload still held goes back at the end
    of the last block's forward."""

    __slots__ = ("first", "count", "hooked", "releases", "barrier")

    def __init__(self, first, count, hooked, releases=None, barrier=False):
        self.first = tuple(first)
        self.count = tuple(count)
        self.hooked = tuple(bool(h) for h in hooked)
        n = len(self.first)
        self.releases = tuple(tuple(r) for r in releases) if releases is not None else \
            ((),) * n
        if not len(self.count) == len(self.hooked) == len(self.releases) == n:
            raise ValueError("Regions: one entry per block in each field")
        self.barrier = bool(barrier)

    @classmethod
    def unhooked(cls, n):
        """n blocks, no hooks anywhere (a step that only runs the blocks' modes)."""
        return cls([0] * n, [0] * n, [False] * n)

    def __repr__(self):
        return "Regions(%d blocks, %d hooked, %d release points%s)" % (
            len(self.first), sum(self.hooked), sum(1 for r in self.releases if r),
            ", barrier" if self.barrier else "")
