"""The plan checked against the clock. A plan predicts its step from calibrated parts (the blocks'
times per mode, the link, the host's cost per offload); what those leave out (copies slowing the
kernels beside them, reloads landing late, the allocator) shows up only when the plan runs. Once
a plan has run CORRECTION_STEPS timed steps, their median is compared with the prediction:

- where the plan offloads and ran slower than predicted, the difference per offloaded storage
  becomes part of every later prediction (the profile's ``offload_step_s``), and the plan is
  made again: offloads that do not pay at that price give way to recompute or to keeping. Where
  the plan also recomputes, its excess is not all the offloads': the planner first runs the
  plan's twin (the same modes, nothing offloaded) for CORRECTION_STEPS steps, and only what the
  plan ran over beyond the twin's own excess is priced per offload; the twin's excess is the
  recompute's, and with ``max_overhead`` it scales the budget as below. (Laid all on the
  offloads, a 1B Llama's 5% plan on an H200 priced each at 1105 us, and its next plan, with
  none, still ran 7 ms over: its recompute's.)
- where a plan made for ``max_overhead`` still runs over the budget (nothing offloaded to
  blame, or the corrections spent), the budget is scaled by how far the plan's predicted
  overhead fell short of the measured one.

At most MAX_CORRECTIONS per goal; the learned cost and scale stay across goals (they are the
model's error, not the goal's), and neither is ever loosened."""

import statistics

from ._offload_budget import StepTimer

# Timed steps of a plan before it is judged (their median).
CORRECTION_STEPS = 3
# Plans made again per goal, at most.
MAX_CORRECTIONS = 2
# The next plan aims this far inside a corrected budget.
CORRECTION_MARGIN = 0.95
# A step this fraction of the baseline slower than predicted is the model's error, not noise.
NOISE = 0.005


class OverheadCheck:
    """``offload_step_s``: step seconds per offloaded storage learned beyond the model;
    ``scale``: the fraction of the user's budget the planner plans with; ``corrections``: the
    plans made again for this goal; ``settled``: no correction can come for the plan followed;
    ``last``: (kind, measured overhead s, predicted overhead s, offloads) of the last one."""

    __slots__ = ("offload_step_s", "scale", "corrections", "samples", "settled", "last",
                 "twin", "twin_predicted")

    def __init__(self):
        self.offload_step_s = 0.0
        self.scale = 1.0
        self.reset_goal()

    def reset_goal(self):
        """A new goal: corrections may come again."""
        self.corrections = 0
        self.new_plan()

    def new_plan(self):
        self.samples = []
        self.settled = False
        self.last = None
        # (measured, predicted, offloads) of a plan that ran over while its twin runs; the
        # twin's predicted overhead (start_twin).
        self.twin = None
        self.twin_predicted = None

    def start_twin(self, predicted_s):
        """The plan's twin is followed from the next step; it predicts ``predicted_s`` of
        overhead (its timed step less the baseline's)."""
        self.samples = []
        self.twin_predicted = predicted_s

    def budget(self, max_overhead):
        """The budget to plan with for the user's ``max_overhead`` (None: none)."""
        return None if max_overhead is None else max_overhead * self.scale

    def notes(self, planned, max_overhead):
        """What the last correction did, for the plan made with it."""
        if self.last is None:
            return []
        kind, measured, predicted, offloads = self.last[:4]
        said = "a plan's step ran %.1f ms over its baseline where %.1f were predicted" % (
            1e3 * measured, 1e3 * predicted)
        if kind == "cost":
            return [said + " (%d offloads): each offload costs the step %.0f us beyond the "
                    "model" % (offloads, 1e6 * self.offload_step_s)]
        if kind == "split":
            return [said + " (%d offloads), its twin without them %.1f where %.1f were "
                    "predicted: each offload costs the step %.0f us beyond the model, and "
                    "plans aim within %.0f%% of the budget" % (
                        offloads, 1e3 * self.last[4], 1e3 * self.last[5],
                        1e6 * self.offload_step_s, 100 * self.scale)]
        return [said + ": planned within %.1f%% for the budget of %.1f%%" % (
            100 * planned, 100 * max_overhead)]

    def observe(self, step_s, plan, max_overhead):
        """One timed step (first block's forward to the end of its backward) of ``plan`` (a
        JointPlan; ``max_overhead``: the user's budget or None), or of its twin once
        :meth:`start_twin` was called. Returns None; "overhead" when the plan must be made again
        (with :attr:`offload_step_s` and :meth:`budget`, one of which has moved); or "twin" when
        the plan's twin must be followed (then :meth:`start_twin`)."""
        if self.settled or plan is None:
            return None
        self.samples.append(step_s)
        if len(self.samples) < CORRECTION_STEPS:
            return None
        base, best = plan.baseline, plan.best
        measured = statistics.median(self.samples[-CORRECTION_STEPS:]) - base.timed_s
        if self.twin is not None:
            return self._split(measured, base, max_overhead)
        predicted = best.timed_s - base.timed_s
        offloads = len(best.chosen or ())
        if self.corrections < MAX_CORRECTIONS:
            error = measured - predicted
            if offloads and error > NOISE * base.timed_s:
                if any(m != "keep" for m in best.modes):
                    self.twin = (measured, predicted, offloads)
                    self.samples = []
                    return "twin"
                self.offload_step_s += error / offloads
                return self._corrected("cost", measured, predicted, offloads)
            if (max_overhead is not None and predicted > 0 and
                    measured > max_overhead * base.step_s):
                # The plan's overhead ran measured/predicted times its prediction: the next one
                # must predict at most the budget over that ratio (with a margin).
                self.scale = min(self.scale, CORRECTION_MARGIN * predicted / measured)
                return self._corrected("budget", measured, predicted, offloads)
        self.settled = True
        return None

    def _split(self, twin_measured, base, max_overhead):
        """The twin ran `twin_measured` of overhead: the plan's excess beyond the twin's is the
        offloads' (priced per offload), the twin's own the recompute's (with a budget, it
        scales the budget by how far the twin's prediction fell short)."""
        measured, predicted, offloads = self.twin
        twin_predicted = self.twin_predicted or 0.0
        self.twin = None
        twin_error = max(0.0, twin_measured - twin_predicted)
        own = (measured - predicted) - twin_error
        if own > NOISE * base.timed_s:
            self.offload_step_s += own / offloads
        if (max_overhead is not None and twin_error > NOISE * base.timed_s and
                twin_predicted > 0):
            self.scale = min(self.scale, CORRECTION_MARGIN * twin_predicted / twin_measured)
        self._corrected("split", measured, predicted, offloads, twin_measured, twin_predicted)
        return "overhead"

    def _corrected(self, kind, measured, predicted, offloads, *twin):
        self.corrections += 1
        self.last = (kind, measured, predicted, offloads) + twin
        return "overhead"


class StepWindows:
    """The whole planned step as the planner's context sees it, from entering it to leaving it
    after backward (CUDA events on the current stream, or the host's clock): what a plan costs
    outside its blocks (the offloader's work at the step's ends, a wait there) is seen here and
    not by the block timer. ``outside_s``: what lies outside the blocks without a plan, the
    least over the calibration's timing steps of a step's window less the model's prediction of
    that step's blocks (the least: a step slowed by the host, a collection or another process
    would hide as much of a plan's own cost); :meth:`ready` gives planned windows less that,
    comparable with a plan's ``timed_s``."""

    __slots__ = ("outside_s", "_open", "_timing", "_timed", "_planned")

    def __init__(self):
        self.outside_s = None
        self._open = None      # (kind, timer, device) of the step in progress
        self._timing = None    # the last calibration timing step's window
        self._timed = []       # (window, modes) of each timing step that ran its backward
        self._planned = []     # planned steps' windows, oldest first

    def enter(self, kind, device):
        self._open = None
        if kind in ("timing", "planned") and device is not None:
            timer = StepTimer()
            timer.start(device)
            self._open = (kind, timer, device)

    def exit(self):
        if self._open is None:
            return
        (kind, timer, device), self._open = self._open, None
        timer.end(device)
        if kind == "timing":
            self._timing = timer
        else:
            self._planned.append(timer)

    def timed(self, modes):
        """The timing step just ended ran its backward under ``modes``: its window counts."""
        timer, self._timing = self._timing, None
        if timer is not None:
            self._timed.append((timer, modes))

    def calibrate(self, predict):
        """After the calibration's last timing step: what lay outside the blocks, from every
        timing step (a host wait for their GPU work, once). ``predict(modes)``: the model's time
        of a step's blocks under those modes."""
        timed, self._timed = self._timed, []
        outside = []
        for timer, modes in timed:
            timer.wait()
            step = timer.step_s()
            if step is not None:
                outside.append(max(0.0, step - predict(modes)))
        if outside:
            self.outside_s = min(outside)

    def clear(self):
        """A new plan: windows of steps under the old one are not its."""
        self._planned.clear()

    def ready(self):
        """The planned windows whose GPU work is done, oldest first, less ``outside_s`` (none
        until it is known)."""
        out = []
        while self._planned and self._planned[0].ready():
            step = self._planned.pop(0).step_s()
            if step is not None and self.outside_s is not None:
                out.append(step - self.outside_s)
        return out
