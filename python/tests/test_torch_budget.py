"""offload_activations(max_overhead=..., target_bytes=...): one timed calibration step, then only
the planned saved tensors are offloaded; loss and gradients stay bit-identical in every mode (CPU,
real tierd, host engine; one run under delay injection)."""

import copy

import pytest
import torch
import torch.nn as nn

import tier
import tier.torch as tt

from shifting_saves import SavesMoreEachCall, SwapsACandidateForAParameter


class Net(nn.Module):
    def __init__(self, d=64, layers=4):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            for _ in range(layers))
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def _step(model, x, ctx):
    model.zero_grad()
    with ctx:
        loss = model(x).square().mean()
        loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _train(client, steps=4, **budget):
    torch.manual_seed(0)
    ref = Net()
    model = copy.deepcopy(ref)
    off = tt.offload_activations(min_bytes=0, client=client, **budget)
    per_step = []
    for i in range(steps):
        x = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(i))
        want = _step(ref, x, tt.no_offload())
        before = off.stats.offloaded_storages
        got = _step(model, x, off)
        assert torch.equal(got[0], want[0])
        for g, w in zip(got[1], want[1]):
            assert torch.equal(g, w)
        per_step.append(off.stats.offloaded_storages - before)
    with off:  # a step's start ends the one before: its figures are in
        pass
    return off, per_step


def test_fast_link_offloads_every_site_after_calibration(client):
    off, per_step = _train(client, max_overhead=0.05, link=(1e15, 1e15))
    # The calibration step and the baseline's timed step offload nothing.
    assert per_step[0] == per_step[1] == 0
    assert per_step[2] > 0 and per_step[3] == per_step[2]
    b = off.budget
    assert b.calibrations == 1 and b.plans >= 1
    assert b.sites > 0 and b.chosen_sites == b.sites
    assert b.predicted_overhead <= 0.05
    assert off.plan.offloaded_bytes == b.planned_bytes > 0


def test_planned_steps_reload_at_the_planned_points_not_by_count(client):
    off, per_step = _train(client, max_overhead=0.05, link=(1e15, 1e15))
    s = off.stats
    assert s.planned_prefetches > 0
    # The calibration step offloads nothing; the planned steps prefetch only by the plan (the
    # count-based prefetch stays off), and every other reload starts at its own use.
    assert s.prefetches == s.planned_prefetches
    assert s.reloads + s.prefetches + s.source_hits >= sum(per_step)


def test_planned_steps_keep_the_calibrations_parameter_set(client, monkeypatch):
    """The module's parameters and buffers are walked when the budget calibrates, not at every
    planned step (the walk took 2.3 ms of each step's start on the 1B Llama, H200)."""
    torch.manual_seed(0)
    model = Net()
    walks = []
    real = Net.parameters

    def counted(self, *a, **k):
        walks.append(1)
        return real(self, *a, **k)
    monkeypatch.setattr(Net, "parameters", counted)
    off = tt.offload_activations(min_bytes=0, client=client, module=model, max_overhead=0.05,
                                 link=(1e15, 1e15))
    per_step = []
    for i in range(5):
        walks.clear()
        before = off.stats.offloaded_storages
        _step(model, torch.randn(8, 32, 64), off)
        per_step.append((len(walks), off.stats.offloaded_storages - before))
    # The calibration step walks (zero_grad and the gradient list walk twice a step); the
    # baseline's timed step and the planned ones do not walk again, and the planned ones offload.
    assert per_step[0][0] == 3 and all(w == 2 for w, _ in per_step[1:]), per_step
    assert all(n > 0 for _, n in per_step[2:]), per_step


def test_slow_link_offloads_nothing_within_the_budget(client):
    off, per_step = _train(client, max_overhead=0.05, link=(1e3, 1e3))
    assert per_step == [0, 0, 0, 0]
    assert off.budget.chosen_sites == 0 and off.budget.sites > 0


def test_target_alone_offloads_what_it_takes_whatever_the_link(client):
    off, per_step = _train(client, target_bytes=0, link=(1e3, 1e3))
    assert per_step[0] == per_step[1] == 0 and per_step[2] > 0
    assert off.plan.kept_bytes == 0 and off.budget.met_target == 1


def test_half_the_activations_with_a_target(client):
    off, _ = _train(client, target_bytes=1, link=(1e15, 1e15))
    total = off.plan.offloaded_bytes + off.plan.kept_bytes
    off2, per_step = _train(client, target_bytes=total // 2, link=(1e15, 1e15))
    assert off2.plan.kept_bytes <= total // 2
    assert 0 < off2.plan.offloaded_bytes < total
    assert 0 < off2.budget.chosen_sites < off2.budget.sites
    assert per_step[2] > 0


def test_measured_link_and_delay_injection(make_daemon):
    d = make_daemon(extra=("--copy_delay_us=500",))
    with tier.Client(socket=d.socket, name="budget") as c:
        off, per_step = _train(c, steps=3, max_overhead=0.5)
    b = off.budget
    assert b.link_d2h > 0 and b.link_h2d > 0
    assert b.calibration_step_s > 0 and b.plans >= 1
    assert per_step[0] == 0


@pytest.mark.parametrize("kwargs", [dict(max_overhead=-0.1), dict(target_bytes=-1),
                                    dict(max_overhead=0.05, link=(0, 1))])
def test_bad_budgets_are_refused(kwargs):
    with pytest.raises(ValueError):
        tt.offload_activations(**kwargs)


# ---- the link figure comes from tierd (issue 24, defect 1) -------------------------------------

class _FigureClient:
    """Answers Client.link_bandwidth(device) as tierd would: None until it has copied, then
    its achieved bandwidths."""

    def __init__(self, figures):
        self.figures = list(figures)
        self.asked = []

    def link_bandwidth(self, device):
        self.asked.append(device)
        return self.figures.pop(0) if len(self.figures) > 1 else self.figures[0]


def test_the_link_figure_is_tierds_when_it_has_one():
    from tier.torch import _offload_budget as ob
    probes = []
    client = _FigureClient([(52e9, 54e9)])
    link, source = ob.measure_link(client, torch.device("cuda", 0),
                                   probe=lambda c, d, **kw: probes.append(d))
    assert (link.d2h, link.h2d, source) == (52e9, 54e9, "tierd")
    assert probes == [] and client.asked == [0]


def test_without_a_figure_yet_the_probe_runs_and_tierd_is_asked_again():
    from tier.torch import _offload_budget as ob
    probes = []
    client = _FigureClient([None, (50e9, 51e9)])

    def probe(c, d, **kw):
        probes.append(d)
        return ob.planner.Link(10e9, 11e9)  # the probe's own (too low) timing

    link, source = ob.measure_link(client, torch.device("cuda", 0), probe=probe)
    assert (link.d2h, source) == (50e9, "tierd after a probe") and len(probes) == 1


def test_the_probe_only_where_tierd_has_no_figure():
    from tier.torch import _offload_budget as ob
    for client in (_FigureClient([None]), object()):  # no figure; a library without the call
        link, source = ob.measure_link(client, torch.device("cuda", 0),
                                       probe=lambda c, d, **kw: ob.planner.Link(10e9, 11e9))
        assert (link.d2h, source) == (10e9, "probe")


def test_budget_reports_where_its_link_came_from(client):
    off, _ = _train(client, max_overhead=0.05)
    # The host engine has no per-GPU figure: tierd is asked, then the probe's timing is used.
    assert off.budget.link_source in ("probe", "tierd after a probe")
    off, _ = _train(client, max_overhead=0.05, link=(1e9, 1e9))
    assert off.budget.link_source == "given"


# ---- planned offloads leave the GPU by the end of forward (issue 24, defect 2) -----------------

def test_every_planned_offload_is_released_by_the_end_of_forward(client, monkeypatch):
    """The plan hands each offloaded source back in stream order at a point of forward (its
    release point, or the barrier after the last saved tensor), so none is still held when
    backward begins, where the activation peak is. (On CPU the bytes were staged when saved;
    this checks that the offloader follows the plan's release points.)"""
    released = []
    real = tt.ActivationOffloader._release

    def spy(self, records, device):
        released.append((self._site, [r.index for r in records]))
        return real(self, records, device)

    monkeypatch.setattr(tt.ActivationOffloader, "_release", spy)
    # Points 1 ms apart are one (RELEASE_GROUP_S): this whole forward may take less on a fast CPU.
    from tier.torch import _offload_planner
    monkeypatch.setattr(_offload_planner, "RELEASE_GROUP_S", 0.0)
    torch.manual_seed(0)
    model = Net(layers=6)
    # A link that moves each site in a fraction of the time between saves: released early.
    off = tt.offload_activations(min_bytes=0, client=client, max_overhead=0.5, link=(1e15, 1e15))
    for step in range(4):
        x = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(step))
        released.clear()
        with off:
            loss = model(x).square().mean()
            if step < 2:  # the calibration, then the baseline's timed step
                loss.backward()
                continue
            records = [ref() for ref in off._site_records.values()]
            assert records and all(r is not None and r.released for r in records)
            assert off._held == []
            # Some at release points before the barrier (the last save of forward), not all at it.
            points = off._budget._step_plan.releases
            assert points, "the plan has no release points"
            assert any(site < off._budget._step_plan.barrier + 1 for site, _ in released[:-1])
            loss.backward()


# ---- one slow step does not halve the link (the first device run's 27 of 54 GB/s) ------------

class _Timed:
    def __init__(self, step_s):
        self.s = step_s

    def ready(self):
        return True

    def wait(self):
        pass

    def step_s(self):
        return self.s


def _budget_after_a_plan(monkeypatch):
    from tier.torch import _offload_budget as ob
    b = ob.OffloadBudget(lambda: None, max_overhead=0.05, link=(54e9, 54e9))
    replans = []
    monkeypatch.setattr(b, "_replan", lambda: replans.append(b._link.d2h))
    b._plan = ob.planner.Plan()
    b._plan.offloaded_bytes = 1 << 30
    b._plan.indices = frozenset(range(4))
    b._plan.predicted_overhead = 0.0075  # 5% of the step
    b._base_step = 0.150
    b._settle, b._slow = ob.SETTLE_STEPS, 0
    return b, replans


def test_a_plans_first_slow_step_and_a_lone_slow_step_do_not_replan(monkeypatch):
    b, replans = _budget_after_a_plan(monkeypatch)
    # The plan's first step pays once (registrations, the pinned pool's first touch); later a
    # lone slow step between normal ones: no re-plan, the link stays.
    for step in (0.190, 0.155, 0.190, 0.155, 0.156):
        b._timers.append(_Timed(step))
        b._read_timers()
    assert replans == [] and b._link.d2h == 54e9 and b.stats.replans == 0
    assert b.stats.link_source == "given"


def test_two_slow_steps_in_a_row_price_each_offload_where_the_link_kept_its_speed(monkeypatch):
    # The link is the user's (or tierd's figure did not fall): what the step ran over its
    # prediction is the offloads' own, shared out per offload and priced into the next plan.
    # (The budget halved the link here before, whatever the cause: half the bytes.)
    b, replans = _budget_after_a_plan(monkeypatch)
    for step in (0.155, 0.190, 0.191):
        b._timers.append(_Timed(step))
        b._read_timers()
    assert replans == [54e9] and b.stats.replans == 1 and b.stats.link_source == "given"
    assert abs(b._offload_cost_s - (0.191 - 0.150 - 0.0075) / 4) < 1e-12
    assert b.stats.offload_cost_s == b._offload_cost_s


def test_two_slow_steps_plan_with_tierds_link_where_its_figure_fell(monkeypatch):
    from tier.torch import _offload_budget as ob
    b, replans = _budget_after_a_plan(monkeypatch)
    b._given_link = None  # the figure came from tierd
    monkeypatch.setattr(ob, "link_from_tierd", lambda client, device: ob.planner.Link(20e9, 20e9))
    for step in (0.155, 0.190, 0.191):
        b._timers.append(_Timed(step))
        b._read_timers()
    assert replans == [20e9] and b.stats.link_source == "tierd" and b._offload_cost_s == 0.0


def test_a_priced_offload_gives_way_to_the_large_ones():
    """plan(offload_cost_s=...): each chosen site adds its price to the predicted overhead, so
    within one budget a price keeps the large offloads and drops the small ones."""
    from tier.torch import _offload_planner as op
    link = op.Link(50e9, 50e9)
    # Ten small sites and two large ones, all long-lived: the link alone hides them all.
    sites = [op.Site(i, 4 << 20, 0.001 * i, 0.2) for i in range(10)] + \
        [op.Site(10, 256 << 20, 0.011, 0.19), op.Site(11, 256 << 20, 0.02, 0.18)]
    free = op.plan(sites, 0.1, 0.25, link, max_overhead=0.05, barrier=True)
    assert len(free.indices) == 12 and free.predicted_overhead == 0.0
    # 5 ms an offload in a budget of 12.5 ms: two fit, the largest.
    priced = op.plan(sites, 0.1, 0.25, link, max_overhead=0.05, barrier=True,
                     offload_cost_s=0.005)
    assert priced.indices == frozenset({10, 11})
    assert abs(priced.predicted_overhead - 2 * 0.005) < 1e-12


def test_the_budget_settles_once_its_plan_has_been_judged(monkeypatch):
    # A bench (or a user timing steady state) waits for `settling` to turn False: the plan
    # has run its first step and SLOW_STEPS judged ones without a re-plan.
    from tier.torch import _offload_budget as ob
    assert ob.OffloadBudget(lambda: None, max_overhead=0.05).settling  # no plan yet
    b, replans = _budget_after_a_plan(monkeypatch)
    b._replan = lambda: (replans.append(b._link.d2h), setattr(b, "_judged", 0))
    seen = []
    for step in (0.190, 0.155, 0.156):
        assert b.settling
        b._timers.append(_Timed(step))
        b._read_timers()
        seen.append(b.settling)
    assert seen == [True, True, False] and replans == []
    # Two slow steps re-plan: settling again until the new plan is judged.
    for step in (0.190, 0.191):
        b._timers.append(_Timed(step))
        b._read_timers()
    assert replans == [54e9] and b.settling


# ---- the baseline is timed as planned steps are (issue 24: the calibration step's own cost) ----

def test_the_plan_takes_the_timed_steps_baseline_and_scales_the_calibration(monkeypatch):
    """The calibration step wraps and stamps every candidate (30% of the 1B Llama's step on the
    H100). The step after it runs the plan's hooks with nothing offloaded and is timed as planned
    steps are; the plan is made from that length, the calibration's times scaled to it."""
    from tier.torch import _offload_budget as ob
    b = ob.OffloadBudget(lambda: None, max_overhead=0.05, link=(54e9, 54e9))
    made = []
    monkeypatch.setattr(b, "_replan", lambda: made.append((b._base_step, b._forward_end,
                                                           list(b._sites))))
    b._sites = [ob.planner.Site(0, 1 << 20, 0.0, 0.18), ob.planner.Site(1, 1 << 20, 0.08, 0.1)]
    b._count, b._timing_site, b._base_step, b._forward_end = 2, 0, 0.2, 0.08
    b._timing = ob.planner.StepPlan(2, (), None, None, barrier=False, timing_site=0)
    assert b.begin_step() is b._timing and b._timing.offloaded == []
    monkeypatch.setattr(b, "_timer", _Timed(0.15))
    b.end_step(2)
    assert len(made) == 1 and b._timing is None
    base, forward_end, sites = made[0]
    assert base == pytest.approx(0.15) and forward_end == pytest.approx(0.06)
    assert [s.produced for s in sites] == pytest.approx([0.0, 0.06])
    assert [s.needed for s in sites] == pytest.approx([0.135, 0.075])
    assert b.stats.timed_step_s == pytest.approx(0.15)


def test_a_timed_step_unlike_the_calibration_calibrates_again(monkeypatch):
    from tier.torch import _offload_budget as ob
    b = ob.OffloadBudget(lambda: None, max_overhead=0.05, link=(54e9, 54e9))
    monkeypatch.setattr(b, "_replan", lambda: pytest.fail("planned from a step of other sites"))
    b._sites = [ob.planner.Site(0, 1 << 20, 0.0, 0.18)]
    b._count, b._timing_site, b._base_step, b._forward_end = 1, 0, 0.2, 0.08
    b._timing = ob.planner.StepPlan(1, (), None, None, barrier=False, timing_site=0)
    b.begin_step()
    b.end_step(3)
    assert b._timing is None and b._step_plan is None
    assert b.begin_step() is None  # the next step calibrates


def test_a_planned_offload_is_submitted_when_saved(client, monkeypatch):
    """Under a plan the deferred offloads go after each run of planned offloads saved back to
    back: a copy deferred to a later point waits there for everything queued since, and the
    release point after its predicted end stalls the stream (issue 24, the 1B Llama's forward)."""
    from tier.torch import _save_batches
    flushed_at = []
    real = _save_batches.SaveBatches.flush

    def spy(self):
        if self:
            flushed_at.append(off._site)
        return real(self)

    probe, _ = _train(client, target_bytes=1, link=(1e15, 1e15))
    total = probe.plan.offloaded_bytes + probe.plan.kept_bytes
    monkeypatch.setattr(_save_batches.SaveBatches, "flush", spy)
    torch.manual_seed(0)
    model = Net(layers=6)
    off = tt.offload_activations(min_bytes=0, client=client, target_bytes=total // 2,
                                 link=(1e15, 1e15))
    for step in range(3):
        x = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(step))
        with off:
            model(x).square().mean().backward()
    plan = off._budget._step_plan
    flushed_at.clear()
    x = torch.randn(8, 32, 64, generator=torch.Generator().manual_seed(9))
    with off:
        loss = model(x).square().mean()
        runs_end = [i + 1 for i in plan.offloaded
                    if i + 1 >= plan.count or plan.actions[i + 1] != ob_offload()]
        assert runs_end and set(runs_end) <= set(flushed_at), (runs_end, flushed_at)
        loss.backward()


def ob_offload():
    from tier.torch import _offload_planner
    return _offload_planner.OFFLOAD


def test_reloads_started_together_go_as_batches_in_the_order_given():
    """A plan starts many reloads at one trigger (those due early in backward): one batch would be
    one ticket, and the first tensor's user would wait for all of them (the 1B Llama's first
    backward block waited 13 ms on the H100 for reloads due blocks later)."""
    import types
    from tier.torch import _backward_reloads as br

    calls = []

    class Client:
        def collect(self):
            pass

        def start_reloads(self, handles, free, prefetch):
            calls.append([h.name for h in handles])
            return [object() for _ in handles]

    class Offloader:  # (weakly referenced by BackwardReloads)
        client = Client()
        stats = types.SimpleNamespace(prefetches=0, reloads=0, fallbacks=0)

    off = Offloader()
    reloads = br.BackwardReloads(off, batches=None)
    MiB = 1 << 20
    records = [types.SimpleNamespace(tensor=None, pending=None, device=torch.device("cpu"),
                                     nbytes=n * MiB, released=False,
                                     handle=types.SimpleNamespace(name=i, job=None))
               for i, n in enumerate((8, 40, 20, 30, 64, 1))]
    reloads.start(records, prefetch=True)
    assert calls == [[0, 1], [2, 3], [4], [5]]
    assert all(r.pending is not None for r in records) and off.stats.prefetches == 6


def test_the_budget_plans_with_a_share_of_the_measured_link(client, monkeypatch):
    """tierd's figure is its copies' best rate; a plan counts on PLAN_LINK_SHARE of it (per-job
    costs, producers that finish late), and reports the figure itself."""
    from tier.torch import _offload_planner as op
    seen = []
    real = op.plan

    def spy(sites, forward_end, step_seconds, link, **kwargs):
        seen.append(link)
        return real(sites, forward_end, step_seconds, link, **kwargs)

    monkeypatch.setattr(op, "plan", spy)
    off, _ = _train(client, max_overhead=0.05, link=(10e9, 20e9))
    assert seen and all(l.d2h == pytest.approx(10e9 * op.PLAN_LINK_SHARE) and
                        l.h2d == pytest.approx(20e9 * op.PLAN_LINK_SHARE) for l in seen)
    assert 0.5 < op.PLAN_LINK_SHARE < 1.0
    assert off.budget.link_d2h == 10e9 and off.budget.link_h2d == 20e9


def test_a_model_whose_saves_never_repeat_stops_calibrating_and_says_so(client):
    # A planned step with other candidates than calibration's calibrates again; a second one
    # within a few clean steps keeps everything from then on, with no hooks and a warning.
    # Without that bound such a model calibrates every other step for good (stamping every
    # saved tensor), in silence.
    model = SavesMoreEachCall()
    off = tt.offload_activations(min_bytes=0, client=client, max_overhead=0.05,
                                 link=(1e15, 1e15))
    with pytest.warns(RuntimeWarning, match="saved other tensors than in calibration, twice"):
        for i in range(16):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(i))
            with off:
                model(x).square().mean().backward()
    assert off.budget.calibrations <= 3 and off.budget.mismatches == 2, off.budget
    assert not off.settling  # nothing will change by itself any more
    saved, offloaded = off.stats.saved, off.stats.offloaded_storages
    with off:
        model(torch.randn(8, 64)).square().mean().backward()
    assert off.stats.saved == saved  # no hook ran
    assert off.stats.offloaded_storages == offloaded


@pytest.mark.parametrize("activation_first", [True, False])
def test_planned_steps_whose_candidates_differ_from_calibration(client, activation_first):
    # Planned steps index their saves by the calibration's shape (tier/torch/_save_shape.py):
    # a save the table returns is not asked whether it is a candidate. Calibrated on a step
    # with the activation, the plan offloads it, and the next step has a parameter there: the
    # full hook keeps it, the rest of that step is kept, and the step reports a count no plan
    # has: calibration again. Calibrated with the parameter there, a step with the activation
    # keeps it (the table says: no candidate) and follows the plan. Results unchanged in both.
    torch.manual_seed(0)
    ref = SwapsACandidateForAParameter(activation_first)
    model = copy.deepcopy(ref)
    off = tt.offload_activations(min_bytes=0, client=client, max_overhead=10.0,
                                 link=(1e15, 1e15))
    offloaded = []
    for i in range(6):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(i))
        model.zero_grad()
        ref.zero_grad()
        with tt.no_offload():
            ref(x).square().mean().backward()
        before = off.stats.saved, off.stats.offloaded_storages
        with off:
            model(x).square().mean().backward()
        saves = off.stats.saved - before[0]
        offloaded.append(off.stats.offloaded_storages - before[1])
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p.grad, q.grad), i
        if not off.budget.mismatches:
            assert saves == 6, (i, off.stats)  # every save counted, table hits included
    assert off.stats.saved == off.stats.kept + off.stats.offloaded_tensors, off.stats
    if activation_first:
        assert off.budget.mismatches >= 1, off.budget
    else:
        assert off.budget.mismatches == 0, off.budget
        assert all(n > 0 for n in offloaded[2:]), offloaded  # after calibration and timing
