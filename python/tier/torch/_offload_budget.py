"""The learning half of ``offload_activations(max_overhead=..., target_bytes=...)``: it watches one
step with nothing offloaded (the calibration step), takes the link's bandwidth from tierd, asks
the planner (tier/torch/_offload_planner.py) which saved tensors hide under compute, and from the
next step on hands the offloader a :class:`~tier.torch._offload_planner.StepPlan`: for each saved
tensor in forward order, keep it or offload it, where to release offloaded sources, where to
start reloads. It re-plans when a step takes longer than the plan predicted.

A site is a saved tensor's position among the step's candidates (tensors the offloader could
offload: big enough, not parameters); a model whose forward saves the same tensors in the same
order every step (the usual case) has the same sites every step. When the count changes, it
calibrates again. Views of one storage are one site for the planner (the storage's first save;
its bytes once; needed at the first use of any of them), and the plan offloads all of them or
none.

Times: the calibration step is not the step a plan runs. Every candidate there goes through a
wrapper and a CUDA event, which cost the 1B Llama's 150 ms step 30% on the H100; planned from that
step, a 5% budget saw room that was not there and offloaded 2.5x what the link carries in forward
(1.15-1.69x none). So a second step follows the calibration, under the plan's own hooks with
nothing offloaded, timed as planned steps are (the baseline ``measured_overhead`` is measured
against), and the calibration's times are scaled to it before planning.

The link: tierd sees every byte it copies for every process of the node, so its figure for the
GPU (``Client.link_bandwidth``) is the one to plan with. Where tierd has none yet (no copies
on that GPU so far, the host engine, or a tierd without the call) the budget times a probe of its
own through tierd and asks again (tierd then saw the probe's copies); only if tierd still has no
figure does it plan with the probe's own timing, and ``stats.link_source`` says which it was.

Times: CUDA tensors are timed with CUDA events on the current stream (the host runs ahead of the
GPU), CPU tensors with the host clock.
"""

import time
import warnings

import torch

from . import _offload_planner as planner
from .. import errors as _errors
from ._counters import Counters

PROBE_BYTES = 64 << 20
PROBE_BYTES_CPU = 4 << 20
PROBE_CHUNKS = 4
PROBE_ROUNDS = 2
# Reloads due within RELOAD_WINDOW_S of one another start together, while the batch stays within
# RELOAD_BATCH_BYTES (tier/torch/_offload_planner.reload_triggers): many small reloads cost one
# submission each otherwise.
RELOAD_WINDOW_S = 1e-3
RELOAD_BATCH_BYTES = 64 << 20
# A plan's first SETTLE_STEPS timed steps are not judged; SLOW_STEPS slow ones in a row re-plan.
SETTLE_STEPS = 1
SLOW_STEPS = 2
# Clean planned steps after which an earlier mismatch (a step that saved other candidates than
# calibration counted) is forgotten: a second one sooner says the model's saves change from step
# to step, and a plan by position cannot follow it (the budget then stops offloading; so does the
# joint planner, tier/torch/_plan_watch.py).
MISMATCH_MEMORY_STEPS = 8


class Mismatches:
    """Steps that saved other candidates than calibration counted, for a plan by position (the
    budget's, the joint planner's): the first one calibrates again; a second within
    MISMATCH_MEMORY_STEPS clean planned steps of it says the saves change from step to step."""

    __slots__ = ("_count", "_clean")

    def __init__(self):
        self._count = 0  # mismatched steps not yet forgotten
        self._clean = 0  # clean planned steps since the last one

    def clean_step(self):
        self._clean += 1
        if self._clean >= MISMATCH_MEMORY_STEPS:
            self._count = 0

    def mismatch(self):
        """Counts a mismatched step; True where it is the second not forgotten (stop planning
        by position)."""
        self._count += 1
        self._clean = 0
        return self._count > 1


class Clock:
    """Seconds since the step began, on the GPU's timeline for CUDA tensors."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._cuda_start = {}   # device -> event recorded at its first stamp
        self._stamps = []       # (key, device or None, event or host time)

    def stamp(self, key, device):
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(device))
            if device not in self._cuda_start:
                self._cuda_start[device] = (event, time.perf_counter() - self._t0)
            self._stamps.append((key, device, event))
        else:
            self._stamps.append((key, None, time.perf_counter() - self._t0))

    def resolve(self):
        """{key: seconds}; waits for the CUDA events."""
        out = {}
        for key, device, value in self._stamps:
            if device is None:
                out[key] = value
            else:
                start, host_offset = self._cuda_start[device]
                value.synchronize()
                out[key] = host_offset + start.elapsed_time(value) / 1e3
        return out


class StepTimer:
    """The length of a step that follows a plan, at the cost of two CUDA events (the step's
    start and its timing site's first use in backward) and read without waiting: per-site
    events and a host wait for them at every step cost a 24 ms step a third of its time on the
    H100, which the policy then took for link time."""

    __slots__ = ("_device", "_start", "_end", "_host")

    def __init__(self):
        self._device = None
        self._start = self._end = None
        self._host = [None, None]

    def start(self, device):
        if device.type == "cuda":
            self._device = device
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(device))
        else:
            self._host[0] = time.perf_counter()

    def end(self, device):
        if device.type == "cuda":
            if self._start is None:
                return
            if self._end is None:
                self._end = torch.cuda.Event(enable_timing=True)
            self._end.record(torch.cuda.current_stream(device))
        elif self._host[0] is not None:
            self._host[1] = time.perf_counter()

    def ready(self):
        return self._end is None or self._end.query()

    def wait(self):
        """Until the timed step's GPU work is done (a host wait: once per calibration)."""
        if self._end is not None:
            self._end.synchronize()

    def step_s(self):
        """Seconds from the step's start to its timing site's use; None if not both seen."""
        if self._start is not None and self._end is not None:
            return self._start.elapsed_time(self._end) / 1e3
        if self._host[0] is not None and self._host[1] is not None:
            return self._host[1] - self._host[0]
        return None


class BudgetStats(Counters):
    """What the policy chose and how it went (``off.budget``). ``link_source``: where the link
    figure came from ("tierd", "tierd after a probe", "probe", "given"); ``replans``: how often
    slow steps made it plan again; ``offload_cost_s``: what each offload costs the step beyond
    the link's time, learned from those steps (0 until one ran over for another reason than the
    link)."""

    __slots__ = ("calibrations", "plans", "replans", "sites", "chosen_sites", "planned_bytes",
                 "predicted_overhead", "measured_overhead", "calibration_step_s", "timed_step_s",
                 "last_step_s", "offload_cost_s",
                 "link_d2h", "link_h2d", "met_target", "link_source", "mismatches")

    def __init__(self):
        super().__init__()
        self.link_source = "none"

    def __repr__(self):
        return ("BudgetStats(%d of %d sites, %d bytes, predicted overhead %.1f%%, measured %.1f%%, "
                "step %.1f ms (calibration %.1f ms), link %.2f/%.2f GB/s from %s)" % (
                    self.chosen_sites, self.sites, self.planned_bytes,
                    100 * self.predicted_overhead, 100 * self.measured_overhead,
                    1e3 * self.last_step_s, 1e3 * self.calibration_step_s,
                    self.link_d2h / 1e9, self.link_h2d / 1e9, self.link_source))


# What a budget that stopped planning gives every step: no hooks at all (a block-scoped plan of
# no blocks), so it costs nothing.
_NO_HOOKS = planner.StepPlan(0, regions=planner.Regions.unhooked(0))


def link_from_tierd(client, device):
    """tierd's achieved D2H / H2D bandwidth of `device`'s link (``Client.link_bandwidth``), as a
    :class:`~tier.torch._offload_planner.Link`; None where tierd has no figure (no copies on that
    GPU yet, the host engine, a CPU device, or a library without the call)."""
    if device is None or device.type != "cuda":
        return None
    ask = getattr(client, "link_bandwidth", None)
    if ask is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        figure = ask(index)
    except (_errors.TierError, NotImplementedError):
        return None
    if not figure:
        return None
    d2h, h2d = figure
    if not (d2h and h2d and d2h > 0 and h2d > 0):
        return None
    return planner.Link(d2h, h2d)


def probe_link(client, device, nbytes=PROBE_BYTES, chunks=PROBE_CHUNKS, rounds=PROBE_ROUNDS):
    """Times offloads and reloads of ``chunks`` x ``nbytes`` through tierd on ``device``, each
    direction as one batch kept in flight together (a lone copy and a host round trip per copy
    measured a fifth of the link on the H100): one untimed round first (registration, the lane's
    start), then the best of ``rounds``. A :class:`~tier.torch._offload_planner.Link`."""
    probes = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(chunks)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    best_d2h = best_h2d = float("inf")
    for round_ in range(1 + rounds):
        sync()
        t0 = time.perf_counter()
        handles = client.offload_batch(probes)
        client.synchronize()
        t1 = time.perf_counter()
        back = client.reload_batch(handles, free=True)
        sync()
        t2 = time.perf_counter()
        del back
        if round_ > 0:
            best_d2h, best_h2d = min(best_d2h, t1 - t0), min(best_h2d, t2 - t1)
    total = nbytes * chunks
    return planner.Link(total / max(best_d2h, 1e-6), total / max(best_h2d, 1e-6))


def measure_link(client, device, probe=probe_link):
    """(Link, source): tierd's figure, else tierd's after a probe, else the probe's own."""
    link = link_from_tierd(client, device)
    if link is not None:
        return link, "tierd"
    device = device if device is not None else torch.device("cpu")
    if device.type == "cuda":
        probed = probe(client, device)
    else:  # the host engine's memcpy: a small probe says as much
        probed = probe(client, device, nbytes=PROBE_BYTES_CPU)
    link = link_from_tierd(client, device)
    if link is not None:
        return link, "tierd after a probe"
    return probed, "probe"


class OffloadBudget:
    """The offloader's policy (see tier.torch.ActivationOffloader): begin_step() gives the step's
    StepPlan (None: this step calibrates, every candidate stamped), candidate() and used() take
    the calibration's stamps, step_started() and used(timing site) time a planned step,
    end_step(count) learns."""

    def __init__(self, client_fn, max_overhead=None, target_bytes=None, link=None):
        if max_overhead is None and target_bytes is None:
            raise ValueError("a budget needs max_overhead or target_bytes")
        if max_overhead is not None and not 0 <= max_overhead <= 10:
            raise ValueError("max_overhead is a fraction of the step (0.05 = 5%%), got %r"
                             % (max_overhead,))
        if target_bytes is not None and target_bytes < 0:
            raise ValueError("target_bytes must be >= 0")
        self._client_fn = client_fn
        self.max_overhead = max_overhead
        self.target_bytes = target_bytes
        self._given_link = planner.Link(*link) if link is not None else None
        self._link = self._given_link
        self._plan = None         # planner.Plan over first-view sites
        self._step_plan = None    # its StepPlan over every candidate
        self._timing = None       # after a calibration: the StepPlan of the baseline's timed step
        self._base_step = None
        self._clock = None
        self._timer = None
        self._timers = []         # plan-following steps not read yet (their GPU work may run)
        self._device = None
        self._calib = []          # this calibration's candidates: (nbytes, device, group)
        self._groups = {}         # storage key -> first site with it (calibration)
        self._settle = SETTLE_STEPS
        self._slow = 0
        self._judged = 0          # the plan's steps judged so far
        self._mismatches = Mismatches()
        self._gave_up = False     # the saves change from step to step: nothing is offloaded
        self._offload_cost_s = 0.0  # each offload's step time beyond the link (slow steps)
        self.stats = BudgetStats()
        if self._given_link is not None:
            self.stats.link_source = "given"

    @property
    def plan(self):
        return self._plan

    @property
    def settling(self):
        """Whether the plan may still change by itself: calibrating, or fewer than SLOW_STEPS
        of its steps judged (slow ones re-plan)."""
        if self._gave_up:
            return False
        return self._plan is None or self._timing is not None or self._judged < SLOW_STEPS

    # -- the offloader's calls --

    def begin_step(self):
        """The plan this step follows, or None: it calibrates."""
        if self._gave_up:
            return _NO_HOOKS
        if self._timing is not None:
            self._timer = StepTimer()
            return self._timing
        if self._step_plan is None:
            self._clock = Clock()
            self._calib = []
            self._groups = {}
            return None
        self._timer = StepTimer()
        return self._step_plan

    def step_started(self, device):
        """The first candidate of a planned step."""
        if self._timer is not None:
            self._timer.start(device)

    def candidate(self, site, nbytes, device, key):
        """A candidate of the calibration step (stamped kept); `key` names its storage."""
        self._calib.append((nbytes, device, self._groups.setdefault(key, site)))
        self._clock.stamp(("p", site), device)

    def used(self, site, device):
        """Backward uses `site` (first use counts): calibration, or the planned timing site."""
        plan = self._timing if self._timing is not None else self._step_plan
        if plan is None:
            if self._clock is not None:
                self._clock.stamp(("u", site), device)
        elif self._timer is not None and site == plan.timing_site:
            self._timer.end(device)

    def end_step(self, count):
        """The step that began with begin_step() is over (its backward ran); `count`: the
        candidates it saw."""
        if self._gave_up:
            return
        if self._timing is not None:
            self._end_timing_step(count)
            return
        if self._step_plan is not None:
            timer, self._timer = self._timer, None
            if count != self._step_plan.count:
                # Other sites than the calibration's: calibrate again (next step, by stamps).
                self._plan = self._step_plan = None
                self._timers.clear()
                self._mismatched()
                return
            self._mismatches.clean_step()
            if timer is not None:
                self._timers.append(timer)
            self._read_timers()
            return
        clock, self._clock = self._clock, None
        if clock is None:
            return
        times = clock.resolve()
        produced = {k[1]: v for k, v in times.items() if k[0] == "p"}
        needed = {}
        for k, v in times.items():
            if k[0] == "u" and k[1] not in needed:
                needed[k[1]] = v
        if not produced or not needed or len(self._calib) != count:
            return  # no backward ran (inference, or no candidates): nothing to learn
        step = max(needed.values())
        self.stats.calibrations += 1
        self._base_step = step
        self.stats.calibration_step_s = step
        self.stats.last_step_s = step
        # One planner site per storage: its first save, its bytes once, needed at the first use
        # of any of its views.
        first_use = {}
        for site, (_, _, group) in enumerate(self._calib):
            if site in needed:
                first_use[group] = min(first_use.get(group, needed[site]), needed[site])
        self._sites = [planner.Site(i, nbytes, produced[i], first_use[i])
                       for i, (nbytes, _, group) in enumerate(self._calib)
                       if group == i and i in first_use]
        self._members = {}
        for site, (_, _, group) in enumerate(self._calib):
            self._members.setdefault(group, []).append(site)
        self._count = count
        self._timing_site = max(needed, key=lambda i: (needed[i], i))
        self._forward_end = max(produced.values())
        self._device = next((d for _, d, _ in self._calib if d.type == "cuda"),
                            self._calib[0][1] if self._calib else None)
        if self._link is None:
            self._link, self.stats.link_source = measure_link(self._client_fn(), self._device)
        # Next: the baseline, timed as planned steps are (see the module docstring).
        self._timing = planner.StepPlan(count, (), None, None, barrier=False,
                                        timing_site=self._timing_site)

    def _end_timing_step(self, count):
        """The step after a calibration ran the plan's hooks with nothing offloaded: its length
        is the baseline; the calibration's times are scaled to it, then the plan is made."""
        timer, self._timer = self._timer, None
        self._timing = None
        step = None
        if timer is not None and count == self._count:
            timer.wait()
            step = timer.step_s()
        if step is None or step <= 0 or self._base_step <= 0:
            self._sites = None
            if count != self._count:
                self._mismatched()
            return  # not a step like the calibration's: calibrate again
        scale = step / self._base_step
        if scale < 1.0:
            self._sites = [s._replace(produced=s.produced * scale, needed=s.needed * scale)
                           for s in self._sites]
            self._forward_end *= scale
        self._base_step = step
        self.stats.timed_step_s = step
        self.stats.last_step_s = step
        self._replan()

    def _mismatched(self):
        """A step saved other candidates than calibration counted: calibrate again, or, the
        second time within MISMATCH_MEMORY_STEPS clean steps, stop: no hooks, nothing offloaded,
        and a warning (by position a plan would offload the wrong tensors)."""
        self.stats.mismatches += 1
        if not self._mismatches.mismatch():
            return
        self._gave_up = True
        self._plan = self._step_plan = self._timing = None
        warnings.warn("tier.torch.offload_activations: the steps saved other tensors than in "
                      "calibration, twice: a plan by position cannot follow them, so nothing is "
                      "offloaded from now on", RuntimeWarning, stacklevel=4)

    def _read_timers(self):
        """Takes the measured length of every timed step whose GPU work has finished, in order.
        A step slower than planned re-plans with less link only when the next one is too: the
        first steps of a plan pay once for what calibration never saw (new registrations in
        tierd, the pinned pool's first touch), and one slow step halved the link of the first
        device run's budget (27 of 54 GB/s) for good."""
        while self._timers and self._timers[0].ready():
            step = self._timers.pop(0).step_s()
            if step is None or self._plan is None:
                continue
            self.stats.last_step_s = step
            self.stats.measured_overhead = max(0.0, step / self._base_step - 1.0)
            if self._settle > 0:
                self._settle -= 1
                continue
            self._judged += 1
            slow = (self.max_overhead is not None and self._plan.offloaded_bytes > 0 and
                    self.stats.measured_overhead > max(2 * self.max_overhead,
                                                       self.max_overhead + 0.02))
            self._slow = self._slow + 1 if slow else 0
            if self._slow >= SLOW_STEPS:
                # Slower than predicted, twice. Where tierd's figure for the link fell (other
                # processes share it), the link is slower than planned: plan with tierd's.
                # Otherwise the link is not what ran late, and the time is the offloads' own
                # (the host's work per offload, a release point waiting for a copy): what the
                # step ran over its prediction, shared out per offload, is priced into every
                # later plan, so offloads that do not pay for it give way and the large ones
                # stay. (Halving the link instead, as this did before, moved the budget to half
                # the bytes whatever the cause: the 1B Llama's budget offloaded about half of
                # what the link carries in forward, H200, and the 3B's a quarter.)
                fresh = None if self._given_link is not None else \
                    link_from_tierd(self._client_fn(), self._device)
                if fresh is not None and fresh.d2h < 0.9 * self._link.d2h:
                    self._link, self.stats.link_source = fresh, "tierd"
                else:
                    self._price_offloads(step)
                self.stats.replans += 1
                self._replan()
                self._timers.clear()  # steps timed under the old plan

    def _price_offloads(self, step):
        """A planned step of `step` seconds ran over its prediction, and not for the link: the
        difference per offload of the plan goes into the price of every later offload
        (``stats.offload_cost_s``)."""
        offloads = len(self._plan.indices) if self._plan.indices else 0
        over = step - self._base_step - self._plan.predicted_overhead
        if offloads and over > 0:
            self._offload_cost_s += over / offloads
        self.stats.offload_cost_s = self._offload_cost_s

    def _replan(self):
        p = planner.plan(self._sites, self._forward_end, self._base_step,
                         planner.planning_link(self._link),
                         max_overhead=self.max_overhead, target_bytes=self.target_bytes,
                         barrier=True, window_s=RELOAD_WINDOW_S,
                         batch_bytes=RELOAD_BATCH_BYTES, offload_cost_s=self._offload_cost_s)
        self._plan = p
        offload = [m for i in p.indices for m in self._members[i]]
        self._step_plan = planner.StepPlan(self._count, offload, p.triggers, p.releases,
                                           barrier=True, timing_site=self._timing_site)
        self.stats.plans += 1
        self._settle = SETTLE_STEPS
        self._slow = 0
        self._judged = 0
        self.stats.sites = len(self._sites)
        self.stats.chosen_sites = len(p.indices)
        self.stats.planned_bytes = p.offloaded_bytes
        self.stats.predicted_overhead = (p.predicted_overhead / self._base_step
                                         if self._base_step else 0.0)
        self.stats.link_d2h = self._link.d2h
        self.stats.link_h2d = self._link.h2d
        self.stats.met_target = int(p.met_target)
