"""The overhead check (tier/torch/_overhead_check.py): a plan made for max_overhead is judged by
its measured steps, and planned again with a tighter budget where it ran over."""

from types import SimpleNamespace

import pytest

from tier.torch import _overhead_check as oc


def _plan(base_s=0.100, predicted_s=0.104):
    """A JointPlan's parts the check reads: the baseline's step (and the timed part of it) and
    the plan's timed step."""
    return SimpleNamespace(baseline=SimpleNamespace(step_s=base_s, timed_s=base_s),
                           best=SimpleNamespace(timed_s=predicted_s))


def _observe(check, plan, steps, max_overhead=0.05):
    return [check.observe(s, plan, max_overhead) for s in steps]


def test_a_plan_within_its_budget_is_left_alone():
    check = oc.OverheadCheck()
    assert _observe(check, _plan(), [0.1045] * oc.CORRECTION_STEPS) == \
        [False] * oc.CORRECTION_STEPS
    assert check.settled and check.scale == 1.0 and check.corrections == 0
    assert check.budget(0.05) == 0.05 and check.notes(0.05, 0.05) == []
    assert check.observe(0.5, _plan(), 0.05) is False  # settled: later steps change nothing


def test_no_verdict_before_enough_steps_and_the_median_decides():
    check = oc.OverheadCheck()
    # One slow step among fast ones is noise, not the plan.
    steps = [0.103, 0.140, 0.103][:oc.CORRECTION_STEPS]
    verdicts = _observe(check, _plan(), steps)
    assert verdicts[:-1] == [False] * (len(steps) - 1)
    assert verdicts[-1] is False and check.settled


def test_a_plan_over_its_budget_tightens_the_budget_by_its_own_error():
    check = oc.OverheadCheck()
    # Predicted 4 ms of overhead, measured 8: the next plan may predict 0.95 * 5 * 4/8 ms.
    verdicts = _observe(check, _plan(predicted_s=0.104), [0.108] * oc.CORRECTION_STEPS)
    assert verdicts[-1] is True and not check.settled
    assert check.scale == pytest.approx(oc.CORRECTION_MARGIN * 0.004 / 0.008)
    assert check.budget(0.05) == pytest.approx(0.05 * check.scale)
    assert check.corrections == 1
    note, = check.notes(check.budget(0.05), 0.05)
    assert "8.0 ms" in note and "4.0 were predicted" in note and "budget of 5.0%" in note


def test_within_noise_of_the_budget_counts_as_within():
    check = oc.OverheadCheck()
    over = 0.100 * (1.05 + oc.NOISE / 2)
    assert _observe(check, _plan(), [over] * oc.CORRECTION_STEPS)[-1] is False


def test_corrections_are_bounded_per_goal_and_never_loosen():
    check = oc.OverheadCheck()
    scales = []
    for _ in range(oc.MAX_CORRECTIONS + 2):
        check.new_plan()
        _observe(check, _plan(predicted_s=0.104), [0.120] * oc.CORRECTION_STEPS)
        scales.append(check.scale)
    assert check.corrections == oc.MAX_CORRECTIONS and check.settled
    assert all(b <= a for a, b in zip(scales, scales[1:]))
    # A plan measured under its prediction does not loosen the budget learned.
    check.reset_goal()
    _observe(check, _plan(predicted_s=0.104), [0.101] * oc.CORRECTION_STEPS)
    assert check.scale == scales[-1] and check.settled
    # A new goal may be corrected again.
    check.reset_goal()
    assert _observe(check, _plan(predicted_s=0.104), [0.120] * oc.CORRECTION_STEPS)[-1]


def test_a_goal_without_a_budget_or_a_plan_without_overhead_settles_at_once():
    check = oc.OverheadCheck()
    assert check.observe(0.5, _plan(), None) is False and check.settled
    assert check.budget(None) is None
    check = oc.OverheadCheck()
    # A plan that predicts no overhead (the baseline itself): nothing of its own to scale.
    assert _observe(check, _plan(predicted_s=0.100), [0.2] * oc.CORRECTION_STEPS)[-1] is False
    assert check.settled and check.scale == 1.0
