"""The plan checked against the clock (tier/torch/_overhead_check.py): a plan's measured steps
against its prediction; offloads that cost more than modelled get a price, and a plan made for
max_overhead that runs over its budget is made again within a tighter one."""

from types import SimpleNamespace

import pytest

from tier.torch import _overhead_check as oc


def _plan(base_s=0.100, predicted_s=0.104, offloads=0, modes=("keep", "keep")):
    """A JointPlan's parts the check reads: the baseline's step (and the timed part of it), the
    plan's timed step, its offloads and its modes."""
    return SimpleNamespace(baseline=SimpleNamespace(step_s=base_s, timed_s=base_s),
                           best=SimpleNamespace(timed_s=predicted_s, chosen=[None] * offloads,
                                                modes=modes))


def _observe(check, plan, steps, max_overhead=0.05):
    return [check.observe(s, plan, max_overhead) for s in steps]


N = oc.CORRECTION_STEPS


def test_a_plan_as_predicted_and_within_its_budget_is_left_alone():
    check = oc.OverheadCheck()
    assert _observe(check, _plan(offloads=8), [0.1042] * N) == [None] * N
    assert check.settled and check.scale == 1.0 and check.offload_step_s == 0.0
    assert check.corrections == 0 and check.budget(0.05) == 0.05
    assert check.notes(0.05, 0.05) == []
    assert check.observe(0.5, _plan(), 0.05) is None  # settled: later steps change nothing


def test_no_verdict_before_enough_steps_and_the_median_decides():
    check = oc.OverheadCheck()
    # One slow step among steps as predicted is noise, not the plan.
    steps = ([0.104] * (N - 1) + [0.140])[-N:]
    steps[0], steps[-1] = steps[-1], steps[0]
    verdicts = _observe(check, _plan(offloads=8), steps)
    assert verdicts == [None] * N and check.settled and check.offload_step_s == 0.0


def test_offloads_slower_than_predicted_get_a_price_per_offload():
    check = oc.OverheadCheck()
    # Predicted 4 ms of overhead with 10 offloads, measured 8: 0.4 ms per offload beyond the
    # model, whatever the budget.
    verdicts = _observe(check, _plan(predicted_s=0.104, offloads=10), [0.108] * N, None)
    assert verdicts[-1] == "overhead" and not check.settled
    assert check.offload_step_s == pytest.approx(0.0004)
    assert check.scale == 1.0 and check.corrections == 1
    note, = check.notes(None, None)
    assert "8.0 ms" in note and "4.0 were predicted" in note and "400 us" in note
    # The next plan (fewer offloads) runs as predicted: settled, the price kept.
    check.new_plan()
    assert _observe(check, _plan(predicted_s=0.106, offloads=4), [0.106] * N, None)[-1] is None
    assert check.settled and check.offload_step_s == pytest.approx(0.0004)


def test_an_error_within_noise_is_not_priced():
    check = oc.OverheadCheck()
    slower = 0.104 + 0.100 * oc.NOISE / 2
    assert _observe(check, _plan(offloads=10), [slower] * N)[-1] is None
    assert check.offload_step_s == 0.0 and check.settled


def test_a_plan_over_its_budget_without_offloads_tightens_the_budget_by_its_own_error():
    check = oc.OverheadCheck()
    # Predicted 4 ms of overhead (recompute), measured 8: the next plan may predict
    # 0.95 * 5 * 4/8 ms.
    verdicts = _observe(check, _plan(predicted_s=0.104), [0.108] * N)
    assert verdicts[-1] == "overhead" and not check.settled
    assert check.scale == pytest.approx(oc.CORRECTION_MARGIN * 0.004 / 0.008)
    assert check.budget(0.05) == pytest.approx(0.05 * check.scale)
    assert check.corrections == 1 and check.offload_step_s == 0.0
    note, = check.notes(check.budget(0.05), 0.05)
    assert "planned within" in note and "budget of 5.0%" in note


def test_the_budget_is_strict():
    check = oc.OverheadCheck()
    assert _observe(check, _plan(predicted_s=0.104), [0.1051] * N)[-1] == "overhead"


def test_corrections_are_bounded_per_goal_and_never_loosen():
    check = oc.OverheadCheck()
    scales, prices = [], []
    for _ in range(oc.MAX_CORRECTIONS + 2):
        check.new_plan()
        _observe(check, _plan(predicted_s=0.104, offloads=4), [0.120] * N)
        scales.append(check.scale)
        prices.append(check.offload_step_s)
    assert check.corrections == oc.MAX_CORRECTIONS and check.settled
    assert all(b <= a for a, b in zip(scales, scales[1:]))
    assert all(b >= a for a, b in zip(prices, prices[1:]))
    # A plan measured under its prediction loosens neither.
    check.reset_goal()
    _observe(check, _plan(predicted_s=0.104, offloads=4), [0.101] * N)
    assert (check.scale, check.offload_step_s) == (scales[-1], prices[-1]) and check.settled
    # A new goal may be corrected again.
    check.reset_goal()
    assert _observe(check, _plan(predicted_s=0.104, offloads=4), [0.120] * N)[-1]


def test_a_plan_without_overhead_or_budget_settles_after_its_steps():
    check = oc.OverheadCheck()
    assert _observe(check, _plan(), [0.5] * N, None) == [None] * N and check.settled
    assert check.budget(None) is None
    check = oc.OverheadCheck()
    # A plan that predicts no overhead and offloads nothing: nothing to scale or price.
    assert _observe(check, _plan(predicted_s=0.100), [0.2] * N)[-1] is None
    assert check.settled and check.scale == 1.0


def test_step_windows_judge_the_whole_step_less_what_lay_outside_the_blocks(monkeypatch):
    import torch
    from tier.torch import _offload_budget as ob
    clock = iter([10.0, 10.030,           # the calibration's timing step: 30 ms in all
                  20.0, 20.050,           # a planned step: 50 ms
                  30.0, 30.041,           # another: 41 ms
                  40.0])
    monkeypatch.setattr(ob.time, "perf_counter", lambda: next(clock))
    cpu = torch.device("cpu")
    w = oc.StepWindows()
    w.enter("warmup", cpu)  # not a step that is measured
    w.exit()
    w.enter("timing", cpu)
    w.exit()
    w.timed("modes")
    assert w.ready() == [] and w.outside_s is None
    w.calibrate(lambda modes: 0.025)  # the model puts 25 ms in its blocks: 5 lay outside them
    assert w.outside_s == pytest.approx(0.005)
    for _ in range(2):
        w.enter("planned", cpu)
        w.exit()
    assert w.ready() == pytest.approx([0.045, 0.036])
    assert w.ready() == []
    w.enter("planned", cpu)  # a step under a plan replaced before it is read
    w.clear()
    assert w.ready() == [] and w._open is not None


def test_what_lay_outside_the_blocks_is_the_least_over_the_timing_steps(monkeypatch):
    """A timing step slowed by something else (a loaded host, a collection) would hide as much
    of a plan's own cost: every timing step counts, each against its own modes' prediction, and
    the least is what lies outside the blocks. A timing step without backward does not count."""
    import torch
    from tier.torch import _offload_budget as ob
    clock = iter([10.0, 10.080,           # round 1's timing step: 80 ms (a stall in it)
                  20.0, 20.500,           # a timing step whose backward never ran
                  30.0, 30.050])          # round 2's: 50 ms
    monkeypatch.setattr(ob.time, "perf_counter", lambda: next(clock))
    cpu = torch.device("cpu")
    w = oc.StepWindows()
    for modes in ("round 1", None, "round 2"):
        w.enter("timing", cpu)
        w.exit()
        if modes is not None:
            w.timed(modes)
    predicted = {"round 1": 0.040, "round 2": 0.044}
    w.calibrate(predicted.__getitem__)
    assert w.outside_s == pytest.approx(0.006)  # not round 1's 40 ms, nor the 500 ms step
    w.calibrate(predicted.__getitem__)  # nothing timed since: what was learned stays
    assert w.outside_s == pytest.approx(0.006)


def test_a_plan_over_its_budget_by_its_blocks_timer_is_corrected_whatever_its_windows_say():
    # Calibration's windows held more than a planned step's outside time (its steps ran at the
    # host's pace), so the whole-step measure read this plan within its budget: 104 ms against
    # a 100 ms baseline. Its blocks' own timer read 110 ms for the same steps: the larger
    # counts, and the plan is made again within a tighter budget.
    from tier.torch._plan_activations import PlannerStats
    from tier.torch._plan_watch import PlanWatch

    class Timer:
        def __init__(self, step_s):
            self._s = step_s

        def ready(self):
            return True

        def step_s(self):
            return self._s

    def run(block_s, window_s):
        watch = PlanWatch(2)
        watch.windows.outside_s = 0.0
        stats = PlannerStats()
        verdicts = []
        for _ in range(N):
            watch.timer = Timer(block_s)
            watch.windows._planned.append(Timer(window_s))
            verdicts.append(watch.done(_plan(), None, None, 0.05, stats))
        return verdicts, watch
    verdicts, watch = run(0.110, 0.104)
    assert verdicts == [None] * (N - 1) + ["overhead"] and watch.overhead.scale < 1.0
    verdicts, watch = run(0.1041, 0.1042)  # both as predicted: left alone
    assert verdicts == [None] * N and watch.overhead.settled and watch.overhead.scale == 1.0
    verdicts, watch = run(0.1041, 0.110)  # over by the window alone (outside the blocks)
    assert verdicts[-1] == "overhead"


# ---- a plan that recomputes and offloads: its twin tells the two excesses apart ---------------

def _twin_run(check, plan_steps, twin_predicted_s, twin_steps, max_overhead=0.05):
    plan = _plan(predicted_s=0.104, offloads=10, modes=("keep", "full"))
    verdicts = _observe(check, plan, plan_steps, max_overhead)
    assert verdicts == [None] * (N - 1) + ["twin"] and not check.settled
    check.start_twin(twin_predicted_s)
    return _observe(check, plan, twin_steps, max_overhead)


def test_only_the_excess_beyond_the_twins_is_priced_per_offload():
    check = oc.OverheadCheck()
    # The plan: 4 ms predicted, 15 measured (11 over). Its twin (the same modes, nothing
    # offloaded): 3 ms predicted, 7 measured (4 over, the recompute's). The offloads' own: 7 ms
    # over 10 offloads; the recompute's error scales the budget by 0.95 * 3 / 7.
    verdicts = _twin_run(check, [0.115] * N, 0.003, [0.107] * N)
    assert verdicts == [None] * (N - 1) + ["overhead"]
    assert check.offload_step_s == pytest.approx(0.0007)
    assert check.scale == pytest.approx(0.95 * 3 / 7)
    assert check.corrections == 1
    note, = check.notes(0.05 * check.scale, 0.05)
    assert "twin without them 7.0 where 3.0" in note and "700 us" in note, note


def test_a_twin_that_runs_as_predicted_leaves_the_whole_excess_to_the_offloads():
    check = oc.OverheadCheck()
    verdicts = _twin_run(check, [0.115] * N, 0.003, [0.103] * N)
    assert verdicts[-1] == "overhead"
    assert check.offload_step_s == pytest.approx(0.0011) and check.scale == 1.0


def test_an_excess_that_is_all_the_recomputes_prices_no_offload():
    # The twin runs as far over as the plan did: the offloads cost nothing beyond the model.
    check = oc.OverheadCheck()
    verdicts = _twin_run(check, [0.115] * N, 0.003, [0.114] * N)
    assert verdicts[-1] == "overhead"
    assert check.offload_step_s == 0.0 and check.scale < 1.0


def test_a_plan_that_only_offloads_needs_no_twin():
    check = oc.OverheadCheck()
    verdicts = _observe(check, _plan(predicted_s=0.104, offloads=10), [0.108] * N)
    assert verdicts[-1] == "overhead" and check.twin is None
    assert check.offload_step_s == pytest.approx(0.0004)


def test_a_new_plan_forgets_a_twin_in_progress():
    check = oc.OverheadCheck()
    _observe(check, _plan(predicted_s=0.104, offloads=10, modes=("full",)), [0.115] * N)
    assert check.twin is not None
    check.new_plan()  # (a recalibration, or a new goal)
    assert check.twin is None and check.twin_predicted is None
