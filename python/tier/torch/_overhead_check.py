"""The overhead budget, checked against the clock: a plan made for ``max_overhead`` predicts its
step from calibrated parts (the blocks' times per mode, the link, the host's cost per offload),
and what it leaves out (copies slowing the kernels beside them, a reload that lands late, the
allocator) shows up only when the plan runs. Once a plan has run CORRECTION_STEPS timed steps,
their median is compared with the budget; where it is over, the planner plans again with the
budget scaled by how far its predicted overhead fell short of the measured one (the plan's own
error, applied to the next plan), at most MAX_CORRECTIONS times per goal. A plan within its
budget is left alone: the check never loosens a budget (a plan measured under its prediction
keeps its margin; a looser one might not)."""

import statistics

# Timed steps of a plan before its overhead is judged (their median).
CORRECTION_STEPS = 3
# Plans made again per goal, at most, when the measured overhead is over the budget.
MAX_CORRECTIONS = 2
# The next plan aims this far inside the corrected budget.
CORRECTION_MARGIN = 0.95
# Measured overhead within this fraction of the step over the budget counts as within it.
NOISE = 0.005


class OverheadCheck:
    """``scale``: the fraction of the user's budget the planner plans with (1.0 until a plan
    measured over it); ``corrections``: the plans made again for this goal; ``settled``: no
    correction can come for the plan followed (it is measured within its budget, the goal has
    no budget, or the corrections are spent)."""

    __slots__ = ("scale", "corrections", "samples", "settled", "last")

    def __init__(self):
        self.scale = 1.0
        self.reset_goal()

    def reset_goal(self):
        """A new goal: corrections may come again (the scale learned stays: the model's error
        does not depend on the goal)."""
        self.corrections = 0
        self.new_plan()

    def new_plan(self):
        self.samples = []
        self.settled = False
        self.last = None  # (measured overhead, predicted overhead) of the last correction, s

    def budget(self, max_overhead):
        """The budget to plan with for the user's ``max_overhead`` (None: none)."""
        return None if max_overhead is None else max_overhead * self.scale

    def notes(self, planned, max_overhead):
        """What the last correction did, for the plan made with it."""
        if self.last is None:
            return []
        return ["a plan's step ran %.1f ms over its baseline where %.1f were predicted: planned "
                "within %.1f%% for the budget of %.1f%%" % (
                    1e3 * self.last[0], 1e3 * self.last[1], 100 * planned, 100 * max_overhead)]

    def observe(self, step_s, plan, max_overhead):
        """One timed step (first block's forward to the end of its backward) of ``plan`` (a
        JointPlan made for ``max_overhead``). True when the plan must be made again (with
        :meth:`budget`, which has tightened)."""
        if self.settled or plan is None:
            return False
        if max_overhead is None:
            self.settled = True
            return False
        self.samples.append(step_s)
        if len(self.samples) < CORRECTION_STEPS:
            return False
        base = plan.baseline
        allowed = max_overhead * base.step_s
        measured = statistics.median(self.samples[-CORRECTION_STEPS:]) - base.timed_s
        predicted = plan.best.timed_s - base.timed_s
        if (measured <= allowed + NOISE * base.timed_s or predicted <= 0 or
                self.corrections >= MAX_CORRECTIONS):
            self.settled = True
            return False
        # The plan's overhead ran measured/predicted times its prediction; the next one must
        # predict at most allowed / that ratio (with a margin) to land within the budget.
        self.scale = min(self.scale, CORRECTION_MARGIN * predicted / measured)
        self.corrections += 1
        self.last = (measured, predicted)
        return True
