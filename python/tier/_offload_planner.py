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
    __slots__ = ("overhead", "offload_done", "reload_start", "reload_end")

    def __init__(self):
        self.overhead = 0.0
        self.offload_done = {}
        self.reload_start = {}
        self.reload_end = {}


def simulate(sites, forward_end, link):
    """Schedules the offloads and reloads of ``sites``; returns a :class:`Simulation` whose
    ``overhead`` (seconds) is how long backward waits for reloads in all."""
    sim = Simulation()
    free = 0.0
    for s in sorted(sites, key=lambda s: (s.produced, s.index)):
        start = max(s.produced, free)
        free = start + s.nbytes / link.d2h
        sim.offload_done[s.index] = free
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
    # every later use moves by that wait.
    free = forward_end
    delay = 0.0
    for s in by_use:
        start = max(latest[s.index] + delay, sim.offload_done[s.index], forward_end, free)
        end = start + s.nbytes / link.h2d
        sim.reload_start[s.index] = start
        sim.reload_end[s.index] = end
        free = end
        delay = max(delay, end - s.needed)
    sim.overhead = delay
    return sim


def reload_triggers(sites, chosen, sim):
    """When to start each reload, in the only clock backward has: the uses of saved tensors.
    Returns {trigger site: [sites whose reload starts when backward first uses the trigger]}, the
    trigger of a reload being the last use (of any site, offloaded or not) at or before its
    planned start; a reload planned before backward's first use starts at that first use. A site
    reloads no later than its own use in any case (the offloader starts it there if nothing did)."""
    uses = sorted(sites, key=lambda s: (s.needed, s.index))
    if not uses:
        return {}
    needed = [s.needed for s in uses]
    triggers = {}
    for s in sorted(chosen, key=lambda s: (sim.reload_start[s.index], s.index)):
        # The last use at or before the planned start (bisect on the uses' times).
        lo, hi = 0, len(needed)
        while lo < hi:
            mid = (lo + hi) // 2
            if needed[mid] <= sim.reload_start[s.index]:
                lo = mid + 1
            else:
                hi = mid
        trigger = uses[max(lo - 1, 0)].index
        if trigger == s.index:
            continue  # planned at its own use: no prefetch, the use itself reloads it
        triggers.setdefault(trigger, []).append(s.index)
    return triggers


class Plan:
    __slots__ = ("indices", "offloaded_bytes", "kept_bytes", "predicted_overhead",
                 "step_seconds", "budget_seconds", "target_bytes", "met_target", "link",
                 "triggers")

    def as_dict(self):
        out = {name: getattr(self, name) for name in self.__slots__
               if name not in ("indices", "link", "triggers")}
        out["sites"] = len(self.indices)
        out["link_d2h"] = self.link.d2h
        out["link_h2d"] = self.link.h2d
        return out

    def __repr__(self):
        return "Plan(%d sites, %d bytes offloaded, %d kept, predicted overhead %.2f%%)" % (
            len(self.indices), self.offloaded_bytes, self.kept_bytes,
            100.0 * self.predicted_overhead / self.step_seconds if self.step_seconds else 0.0)


def plan(sites, forward_end, step_seconds, link, max_overhead=None, target_bytes=None):
    """The sites to offload. ``max_overhead``: the step may grow by at most this fraction;
    ``target_bytes``: what may stay on the GPU at the end of forward (all saved tensors are
    alive then). At least one of the two."""
    if max_overhead is None and target_bytes is None:
        raise ValueError("plan() needs max_overhead or target_bytes")
    if max_overhead is not None and max_overhead < 0:
        raise ValueError("max_overhead must be >= 0")
    budget = None if max_overhead is None else max_overhead * step_seconds
    total = sum(s.nbytes for s in sites)
    chosen = []
    offloaded = 0
    overhead = 0.0
    # Largest and longest-lived first: the most memory for the least pressure on the link.
    for s in sorted(sites, key=lambda s: (-(s.nbytes * max(s.needed - s.produced, 0.0)),
                                          s.index)):
        if target_bytes is not None and total - offloaded <= target_bytes and budget is None:
            break
        trial = simulate(chosen + [s], forward_end, link).overhead
        if budget is not None and trial > budget:
            continue
        chosen.append(s)
        offloaded += s.nbytes
        overhead = trial
        if target_bytes is not None and total - offloaded <= target_bytes and budget is not None:
            break  # the target is met within the budget: no need to move more
    p = Plan()
    p.indices = frozenset(s.index for s in chosen)
    p.triggers = reload_triggers(sites, chosen, simulate(chosen, forward_end, link))
    p.offloaded_bytes = offloaded
    p.kept_bytes = total - offloaded
    p.predicted_overhead = overhead
    p.step_seconds = step_seconds
    p.budget_seconds = budget
    p.target_bytes = target_bytes
    p.met_target = target_bytes is None or p.kept_bytes <= target_bytes
    p.link = link
    return p
