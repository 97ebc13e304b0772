"""What watches a joint plan once it runs (tier/torch/_plan_activations.py): each planned step
timed (a StepTimer: its first block's forward to the end of that block's backward), the one step
whose blocks the host probe clocks (tier/torch/_host_probe.py), the whole steps the overhead
check judges the plan on (tier/torch/_overhead_check.py), and whether a step's blocks saved what
calibration saw. After each planned step it tells the planner what to do: nothing, plan again
with the host's measured cost ("host"), plan again within a corrected budget ("overhead"),
follow the plan's twin for a few steps, its modes with nothing offloaded, so that the check can
tell the offloads' cost from the recompute's ("twin": then :meth:`PlanWatch.follow_twin`),
calibrate again ("mismatch"), or give up offloading ("mismatch-again")."""

from . import _offload_budget as ob
from ._host_probe import HOST_PROBE_STEP, HostProbe
from ._overhead_check import OverheadCheck, StepWindows



class PlanWatch:
    """See the module docstring. ``blocks``: how many blocks the plan covers."""

    def __init__(self, blocks):
        self._blocks = blocks
        self.overhead = OverheadCheck()  # the plan checked against the planned steps' clock
        self.windows = StepWindows()     # the whole steps it is checked on
        self.timer = None          # the StepTimer of the planned step in progress
        self.probe = None          # the HostProbe of that step, when it is the one clocked
        self.mismatch = False      # that step saved otherwise than calibration saw
        self.host_cost_s = None    # the host's cost per offloaded storage, once measured
        self.host_probe = None     # HostProbe.blocks of the step clocked
        self.steps = 0             # planned steps run under the plan followed
        self._timers = []          # the planned steps' timers not yet read
        self._timed = []           # steps the timers measured, not yet paired with a window
        self._mismatches = ob.Mismatches()  # (the budget's bound too)

    def new_plan(self):
        """A new plan is followed from the next step: what was timed under the old one goes."""
        self._forget_steps()
        self.overhead.new_plan()

    def follow_twin(self, predicted_s):
        """The plan's twin (its modes, nothing offloaded; ``predicted_s`` of overhead) is
        followed from the next step, for the overhead check."""
        self._forget_steps()
        self.overhead.start_twin(predicted_s)

    def _forget_steps(self):
        self._timers.clear()
        self._timed.clear()
        self.windows.clear()
        self.steps = 0

    @property
    def host_measured(self):
        return self.host_cost_s is not None

    def learned(self, profile):
        """Puts what the watch measured into `profile`, a new one too (a calibration made again
        keeps the host's cost: its probe runs once)."""
        profile.offload_step_s = self.overhead.offload_step_s
        if self.host_cost_s is not None:
            profile.offload_host_s = self.host_cost_s

    def settled(self, step_plan):
        """Whether nothing will change the plan by itself any more."""
        return not (step_plan.offloaded and not self.host_measured) and self.overhead.settled

    def begin(self, step_plan, offloader):
        """A planned step begins. Returns what its blocks call for their offloads: `offloader`,
        or on the step the host probe clocks, its clocked view of it."""
        self.timer = ob.StepTimer()
        self.mismatch = False
        if (not self.host_measured and step_plan.offloaded and
                self.steps + 1 == HOST_PROBE_STEP):
            self.probe = HostProbe(self._blocks)
            return self.probe.timing(offloader)
        return offloader

    def done(self, plan, profile, signatures, max_overhead, stats):
        """After a planned step of `plan`: None, "host", "overhead", "twin", "mismatch" or
        "mismatch-again" (see the module docstring). Counts the step in `stats`."""
        timer, self.timer = self.timer, None
        if self.mismatch:
            self.probe = None
            return "mismatch-again" if self._mismatches.mismatch() else "mismatch"
        self._mismatches.clean_step()
        stats.planned_steps += 1
        self.steps += 1
        if self.probe is not None:
            probe, self.probe = self.probe, None
            cost = probe.cost_s(plan.best, profile, signatures)
            self.host_probe = probe.blocks
            if cost is not None:
                self.host_cost_s = profile.offload_host_s = cost
                return "host"  # (this step's timer measured the plan before)
        if timer is not None:
            self._timers.append(timer)
        while self._timers and self._timers[0].ready():
            step = self._timers.pop(0).step_s()
            if step is None:
                continue
            # (The plan's predicted time from its first block's forward to the end of that
            # block's backward: what the timer measures.)
            stats.measured_step_s = step
            stats.measured_overhead = step / plan.best.timed_s - 1.0
            if self.windows.outside_s is None:
                verdict = self.overhead.observe(step, plan, max_overhead)
                if verdict:
                    return verdict
            else:
                self._timed.append(step)
        # The whole step where it is known (what the plan costs outside its blocks too), less
        # what lay outside the blocks in calibration; or the blocks' own timer of the same step
        # where that is longer. (The calibration's windows can hold more than the plan's outside
        # time: a 3B Llama's calibration steps, mostly recomputed, ran at the host's pace, and a
        # plan 9% over its baseline by its blocks' timer read as within 5% by its windows.)
        for step in self.windows.ready():
            if self._timed:
                step = max(step, self._timed.pop(0))
            verdict = self.overhead.observe(step, plan, max_overhead)
            if verdict:
                return verdict
        return None

    def notes(self, profile, planned_overhead, max_overhead):
        """What a new plan's notes say of the watch: the host's measured cost, the overhead
        check's correction."""
        notes = []
        if self.host_measured:
            notes.append("the host's cost per offloaded storage: %.0f us (measured on a planned "
                         "step)" % (1e6 * profile.offload_host_s))
        return notes + self.overhead.notes(planned_overhead, max_overhead)
