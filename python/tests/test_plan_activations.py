"""tier.torch.plan_activations on CPU against a real tierd (host engine): calibration, the plan
followed, and results bit-identical to the same recompute without tierd (a deterministic model:
eager attention, fp32), also under delay injection."""

import copy
import time

import pytest
import torch
import torch.nn as nn

import tier
import tier.torch as tt
from tier.torch import _activation_planner as ap
from tier.torch import _plan_activations as pa
from tier.torch._calibration import TIMING_STEPS

from shifting_saves import SavesMoreEachCall

needs_sac = pytest.mark.skipif(not pa.selective_available(),
                               reason="selective checkpointing needs torch >= 2.4")


class Block(nn.Module):
    """A pre-norm MLP block with a written-out attention-like mixing (eager, deterministic)."""

    def __init__(self, d=64):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.qk = nn.Linear(d, 2 * d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, scale=None):
        h = self.norm(x)
        q, k = self.qk(h).chunk(2, dim=-1)
        att = (q @ k.transpose(-2, -1)).softmax(-1)
        h = att @ h
        out = x + self.fc2(torch.nn.functional.gelu(self.fc1(h)))
        return out * scale if scale is not None else out


class Net(nn.Module):
    def __init__(self, d=64, layers=6):
        super().__init__()
        self.inp = nn.Linear(d, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _batches(steps, shape=(4, 32, 64)):
    return [torch.randn(*shape, generator=torch.Generator().manual_seed(i)) for i in range(steps)]


def _step(model, x):
    model.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def force_modes(monkeypatch, modes):
    """The planner follows `modes` (offloading what the link hides in them) whatever the
    measurements say: CPU timings are noise, and the test wants every mode and offload at once."""
    real = ap.choose

    def forced(profile, link, **kwargs):
        jp = real(profile, link, **kwargs)
        # (Every offload the link hides, whatever the host's measured cost per offload: on the
        # host engine each one is host work, and the planner would rightly take none.)
        host, profile.offload_host_s = profile.offload_host_s, 0.0
        try:
            jp.best = ap.evaluate(profile, tuple(modes), link,
                                  offload=kwargs.get("offload", True))
        finally:
            profile.offload_host_s = host
        jp.step_plan = ap.step_plan(jp.best, link)
        jp.met_target = jp.within_budget = True
        return jp
    monkeypatch.setattr(ap, "choose", forced)


def _run_planned(client, modes, monkeypatch, steps=5, model=None, **kwargs):
    """(losses and grads per step, the modes of each step, the planner) of a planned run; and
    the same steps run by a model copy in the same modes step by step, without tierd."""
    torch.manual_seed(0)
    model = model or Net()
    ref = copy.deepcopy(model)
    force_modes(monkeypatch, modes)
    plan = tt.plan_activations(model, target_bytes=1, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False, **kwargs)
    ref_modes = pa.BlockModes(ref.layers)
    got, want, seen = [], [], []
    for x in _batches(steps):
        with plan:
            step_modes = list(plan._blocks.modes)
            got.append(_step(model, x))
        seen.append(step_modes)
        ref_modes.modes = step_modes
        ref_modes.active = True
        want.append(_step(ref, x))
        ref_modes.active = False
    return got, want, seen, plan


def _assert_identical(got, want):
    for step, ((loss, grads), (ref_loss, ref_grads)) in enumerate(zip(got, want)):
        assert torch.equal(loss, ref_loss), "step %d: loss %r, without tierd %r" % (
            step, loss, ref_loss)
        for i, (g, r) in enumerate(zip(grads, ref_grads)):
            assert torch.equal(g, r), "step %d: gradient %d differs" % (step, i)


@needs_sac
def test_planned_steps_bit_identical_to_the_same_recompute_without_tierd(client, monkeypatch):
    modes = ["keep", "keep", "selective", "full", "keep", "full"]
    got, want, seen, plan = _run_planned(client, modes, monkeypatch, steps=7)
    _assert_identical(got, want)
    # Warm-up (all full), calibration (one block per mode, in the middle: the saved tensors,
    # then the same modes timed twice without hooks), then the plan.
    assert seen[0] == ["full"] * 6
    assert seen[1] == ["full", "keep", "selective", "full", "full", "full"]
    assert seen[2] == seen[3] == seen[1]
    assert seen[4:] == [modes] * 3
    assert plan.stats.calibration_steps == 1 + TIMING_STEPS and plan.stats.plans == 1
    s = plan.offloader.stats
    assert s.offloaded_storages > 0  # the kept blocks' tensors and recomputed blocks' inputs
    assert s.reloads + s.prefetches + s.source_hits == s.offloaded_storages


@needs_sac
@pytest.mark.parametrize("slowed", range(TIMING_STEPS))
def test_a_host_slowed_for_one_timing_step_does_not_slow_the_profile(client, monkeypatch,
                                                                    slowed):
    # Every block's forward held up by 50 ms in one of the timing steps, on a clock of the
    # test's own (each reading advances it by 1 us). Once a round had one timing step, and a
    # host slowed for it (H200: full recompute's forward measured 4.56 ms, 2.0-2.2 in every other
    # run) made every plan predict its steps 20-40% slower than they ran. Each block now counts
    # the least of its times: the held step's times do not enter the profile, whichever it was.
    held = 50e-3
    clock = [time.perf_counter()]

    def tick():
        clock[0] += 1e-6
        return clock[0]
    monkeypatch.setattr(time, "perf_counter", tick)
    torch.manual_seed(0)
    model = Net()
    force_modes(monkeypatch, ["keep"] * 6)
    plan = tt.plan_activations(model, target_bytes=1, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False)

    def hold(*_):
        if plan._now == "timing" and len(plan._timings) == slowed:
            clock[0] += held
    hooks = [layer.norm.register_forward_pre_hook(hold) for layer in model.layers]
    try:
        for x in _batches(1 + 1 + TIMING_STEPS + 1):  # (a step ends as the next begins)
            with plan:
                _step(model, x)
    finally:
        for h in hooks:
            h.remove()
    assert plan.plan is not None and plan.stats.calibration_steps == 1 + TIMING_STEPS
    times = [(mode, m.fwd_s) for by_mode in plan.profile.modes.values()
             for mode, m in by_mode.items()]
    assert {mode for mode, _ in times} == set(plan.allowed), times
    assert all(0 < fwd < held / 10 for _, fwd in times), times
    # What lay outside the blocks is the least over the timing steps too (not the held step's).
    assert plan._watch.windows.outside_s < held / 10


@needs_sac
def test_the_hosts_cost_per_offload_is_measured_on_the_second_planned_step(client, monkeypatch):
    # The first planned step pays once for registrations: the second is clocked, the cost per
    # offloaded storage comes from what the offloading blocks took beyond calibration, and the
    # plan is made again with it, once (a replan, not a new calibration).
    modes = ["keep", "keep", "selective", "full", "keep", "full"]
    # (A step's end is seen when the next begins: 6 steps have seen the first planned one end.)
    got, want, _, plan = _run_planned(client, modes, monkeypatch, steps=6)
    assert plan.stats.planned_steps == 1 and plan.stats.replans == 0
    assert plan.profile.offload_host_s == 0.0
    # Each offloading block's hooks closing (its batch's flush) held up by 50 ms on the planned
    # steps, on a clock of the test's own: every reading of the host's clock advances it by 1
    # us, the hold by 50 ms. On the real clock the host engine's own cost per offload (a few us)
    # once read 0 under ctest -j2, and a real 50 ms sleep read -26 ms beside two busy loops
    # (calibration's host times swell with the load): the probe must find exactly what was held.
    import statistics
    from tier.torch._activations import ActivationOffloader
    region_exit = ActivationOffloader.region_exit
    held = 50e-3
    clock = [time.perf_counter()]

    def tick():
        clock[0] += 1e-6
        return clock[0]

    def slow_exit(self, token, *exc):
        clock[0] += held
        return region_exit(self, token, *exc)
    monkeypatch.setattr(time, "perf_counter", tick)
    monkeypatch.setattr(ActivationOffloader, "region_exit", slow_exit)
    got, want, _, plan = _run_planned(client, modes, monkeypatch, steps=8)
    _assert_identical(got, want)
    assert plan.stats.plans == 1 and plan.stats.replans == 1
    assert plan.stats.calibration_steps == 1 + TIMING_STEPS
    counted = [(n, extra) for _, n, extra, _, _ in plan.host_probe if n and extra is not None]
    assert counted, plan.host_probe  # the offloading blocks were clocked
    most = max(n for n, _ in counted)
    # Every offloading block carries its 50 ms (and the few ticks more the probe's own clocking
    # takes), and the price per offload is the median block's.
    assert all(held - 1e-4 <= extra < held + 1e-3 for _, extra in counted), plan.host_probe
    median = statistics.median(extra / n for n, extra in counted)
    assert plan.profile.offload_host_s == pytest.approx(median)
    assert plan.profile.offload_host_s >= (held - 1e-4) / most
    assert "cost per offloaded storage" in plan.summary()
    assert plan.plan.best.host_s >= 0


@needs_sac
def test_a_calibration_made_again_keeps_the_hosts_measured_cost(client, monkeypatch):
    # The host probe runs once per planner. A mismatch (a block saved otherwise than in
    # calibration) calibrates again and builds a new profile: it once lost the host's measured
    # cost there (0 again, and no probe to measure it), so every later plan took offloads as
    # free of host time.
    from tier.torch._activations import ActivationOffloader
    region_exit = ActivationOffloader.region_exit
    clock = [time.perf_counter()]

    def tick():
        clock[0] += 1e-6
        return clock[0]

    def slow_exit(self, token, *exc):
        clock[0] += 50e-3
        return region_exit(self, token, *exc)
    monkeypatch.setattr(time, "perf_counter", tick)
    monkeypatch.setattr(ActivationOffloader, "region_exit", slow_exit)
    torch.manual_seed(0)
    model = Net()
    force_modes(monkeypatch, ["keep", "keep", "selective", "full", "keep", "full"])
    plan = tt.plan_activations(model, target_bytes=1, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False)
    # One step's block 1 saves two tensors more (exp saves its result, log its input).
    extra = [False]
    hook = model.layers[1].norm.register_forward_hook(
        lambda m, i, out: out.exp().log() if extra[0] else None)
    batches = _batches(2 * (2 + TIMING_STEPS) + 6)
    mismatched = None
    try:
        for step, x in enumerate(batches):
            extra[0] = mismatched is None and plan.stats.replans == 1
            if extra[0]:  # the first step after the host probe's replan
                mismatched, measured = step, plan.profile.offload_host_s
            with plan:
                _step(model, x)
    finally:
        hook.remove()
    assert mismatched is not None and measured > 0, plan.stats
    assert plan.stats.calibration_steps == 2 * (1 + TIMING_STEPS), plan.stats
    assert plan.plan is not None and plan.stats.replans == 1, plan.stats
    assert plan.profile.offload_host_s == measured


def test_blocks_that_never_save_the_same_turn_offload_off_after_two_mismatches(client,
                                                                            monkeypatch):
    # A planned step whose blocks saved other tensors than calibration saw calibrates again; a
    # second such step keeps the modes, offloads nothing and says so. Without that bound such a
    # model calibrates for good, mostly in full recompute, with no word to the user.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ModuleList(SavesMoreEachCall() for _ in range(4)))
    layers = model[1]
    force_modes(monkeypatch, ["keep"] * 4)
    plan = tt.plan_activations(model, target_bytes=1, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False, blocks=list(layers))
    with pytest.warns(RuntimeWarning, match="saved other tensors than in calibration, twice"):
        for x in _batches(18):
            with plan:
                h = model[0](x)
                for layer in layers:
                    h = layer(h)
                h.square().mean().backward()
    # Two calibrations, not one per plan.
    assert plan.stats.calibration_steps <= 2 * (1 + TIMING_STEPS), plan.stats
    assert plan.stats.planned_steps >= 5, plan.stats      # then the plan runs, without offloads
    before = plan.offloader.stats.offloaded_storages
    with plan:
        h = model[0](_batches(1)[0])
        for layer in layers:
            h = layer(h)
        h.square().mean().backward()
    assert plan.offloader.stats.offloaded_storages == before


@needs_sac
def test_bit_identical_under_delay_injection(make_daemon, monkeypatch):
    d = make_daemon(extra=("--copy_delay_us=500",))
    with tier.Client(socket=d.socket, name="planner-delay") as c:
        got, want, _, plan = _run_planned(c, ["keep", "selective", "full", "keep", "keep",
                                              "full"], monkeypatch, steps=6)
        assert plan.offloader.stats.offloaded_storages > 0
    _assert_identical(got, want)


@needs_sac
def test_recompute_alone_is_bit_identical_to_no_recompute(client):
    """The deterministic model computes the same in every mode: the planner's recompute changes
    nothing but memory and time."""
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    plan = tt.plan_activations(model, max_overhead=0.5, client=client, min_bytes=0,
                               verbose=False, offload=False)
    for x in _batches(4):
        with plan:
            got = _step(model, x)
        _assert_identical([got], [_step(ref, x)])
    assert plan.offloader.stats.offloaded_storages == 0


def test_offload_only_when_recompute_is_not_allowed(client):
    torch.manual_seed(0)
    net = Net()
    # The largest overhead budget: the host time the calibration measures for each offload
    # grows with the machine's load, and this test is about which modes may be chosen, not how
    # many offloads a budget buys (a budget of 0.5 bought none once, on 2 cores under heavy load).
    plan = tt.plan_activations(net, max_overhead=10, recompute=(), client=client,
                               min_bytes=0, link=(1e15, 1e15), verbose=False)
    assert plan.allowed == ("keep",)
    for x in _batches(5):
        with plan:
            _step(net, x)
    assert plan.plan is not None and set(plan.modes) == {"keep"}
    assert plan.offloader.stats.offloaded_storages > 0


def test_the_summary_is_printed_and_says_what_was_chosen(client, capsys):
    torch.manual_seed(0)
    net = Net()
    plan = tt.plan_activations(net, max_overhead=0.05, client=client, min_bytes=0,
                               link=(1e15, 1e15))
    for x in _batches(5):
        with plan:
            _step(net, x)
    err = capsys.readouterr().err
    assert "tier.torch.plan_activations:" in err and "predicted: step" in err
    assert "overhead budget 5.0%" in err
    assert plan.summary().splitlines()[0] in err


def test_an_unreachable_target_warns(client):
    torch.manual_seed(0)
    net = Net(layers=3)
    plan = tt.plan_activations(net, target_bytes=1, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False)
    with pytest.warns(RuntimeWarning, match="no plan reaches the target"):
        for x in _batches(5):
            with plan:
                _step(net, x)
    assert not plan.plan.met_target


def test_few_blocks_of_a_kind_take_more_calibration_steps(client):
    torch.manual_seed(0)
    net = Net(layers=2)  # three modes to measure, two blocks: two calibration rounds
    plan = tt.plan_activations(net, max_overhead=0.05, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False)
    for x in _batches(8):
        with plan:
            _step(net, x)
    # Two blocks measure two modes per round; per round, a step that records the saved
    # tensors and TIMING_STEPS that time the blocks.
    rounds = (len(plan.allowed) + 1) // 2
    assert plan.stats.calibration_steps == (1 + TIMING_STEPS) * rounds
    assert plan.plan is not None


def test_a_model_without_blocks_plans_offload_only(client):
    net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    plan = tt.plan_activations(net, max_overhead=0.05, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False, blocks=[])
    assert plan.allowed == ("keep",) and any("no blocks" in n for n in plan.notes)


def test_remove_restores_the_blocks(client):
    net = Net(layers=2)
    before = [b.forward for b in net.layers]
    plan = tt.plan_activations(net, client=client, verbose=False)
    assert all(isinstance(b.__dict__.get("forward"), type(pa.functools.partial(print)))
               for b in net.layers)
    plan.remove()
    assert all("forward" not in b.__dict__ for b in net.layers)
    assert [b.forward.__func__ for b in net.layers] == [f.__func__ for f in before]


def test_keyword_arguments_reach_recomputed_blocks(client, monkeypatch):
    class KwNet(Net):
        def forward(self, x):
            x = self.inp(x)
            for layer in self.layers:
                x = layer(x, scale=0.5)
            return self.head(x)
    torch.manual_seed(0)
    got, want, _, _ = _run_planned(client, ["full"] * 6, monkeypatch, steps=3, model=KwNet(),
                                   recompute=("full",))
    _assert_identical(got, want)


def test_a_block_called_with_a_kv_cache_is_not_recomputed():
    blocks = pa.BlockModes([Block()])
    blocks.modes = ["full"]
    blocks.active = True
    calls = []
    blocks.observer = type("O", (), {"block_begins": lambda s, b, m, a, k: calls.append(m),
                                     "block_ends": lambda s, b, m, o, t: None})()
    x = torch.randn(2, 4, 64, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="KV cache"):
        blocks._run(0, lambda x, use_cache=None: x * 2, x, use_cache=True)
    assert calls == ["keep"]


@pytest.mark.parametrize("kwargs", [dict(max_overhead=-1), dict(target_bytes=-1),
                                    dict(recompute=("sometimes",))])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        tt.plan_activations(Net(layers=1), **kwargs)


def test_hf_llama_planned_steps_identical(client, monkeypatch):
    transformers = pytest.importorskip("transformers")
    if not pa.selective_available():
        pytest.skip("selective checkpointing needs torch >= 2.4")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=128, use_cache=False)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    ref = copy.deepcopy(model)
    modes = ["keep", "light", "selective", "full"]
    force_modes(monkeypatch, modes)
    plan = tt.plan_activations(model, target_bytes=1, client=client, min_bytes=4096,
                               link=(1e15, 1e15), verbose=False)
    ref_modes = pa.BlockModes(ref.model.layers)
    for step in range(5):
        ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(step))
        model.zero_grad()
        ref.zero_grad()
        with plan:
            step_modes = list(plan._blocks.modes)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        ref_modes.modes, ref_modes.active = step_modes, True
        ref_loss = ref(input_ids=ids, labels=ids).loss
        ref_loss.backward()
        ref_modes.active = False
        assert torch.equal(loss, ref_loss)
        for (name, p), r in zip(model.named_parameters(), ref.parameters()):
            assert torch.equal(p.grad, r.grad), name
    assert plan.modes == modes
    assert plan.offloader.stats.offloaded_storages > 0


def test_planned_steps_run_without_hooks_where_nothing_is_offloaded(client, monkeypatch):
    """A planned step runs the saved-tensor hooks only inside the blocks where the plan
    offloads or starts reloads; with nothing offloaded, autograd saves as it would without
    tierd (no Python call per saved tensor)."""
    torch.manual_seed(0)
    net = Net()
    plan = tt.plan_activations(net, max_overhead=0.5, client=client, min_bytes=0,
                               verbose=False, offload=False)
    saved = []
    for x in _batches(6):
        before = plan.offloader.stats.saved
        with plan:
            _step(net, x)
        saved.append(plan.offloader.stats.saved - before)
    assert plan.plan is not None and plan.stats.planned_steps >= 1
    assert saved[1] > 0        # the calibration step that records the saved tensors
    assert saved[2] == 0       # the one that times the blocks: no hooks
    assert saved[-1] == 0      # a planned step without offload: no hooks either


def test_hooks_only_in_the_blocks_that_offload(client, monkeypatch):
    modes = ["keep", "full", "full", "full", "full", "full"]
    force_modes(monkeypatch, modes)
    torch.manual_seed(0)
    net = Net()
    plan = tt.plan_activations(net, target_bytes=1, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False)
    saved = []
    for x in _batches(6):
        before = plan.offloader.stats.saved
        with plan:
            _step(net, x)
        saved.append(plan.offloader.stats.saved - before)
    regions = plan._step_plan.regions
    assert regions.hooked[0] and plan.offloader.stats.offloaded_storages > 0
    assert 0 < saved[-1] < saved[1]  # the hooked blocks' saves, not the whole step's


def test_retarget_between_steps_follows_the_new_plan_without_calibrating_again(client):
    torch.manual_seed(0)
    net = Net()
    plan = tt.plan_activations(net, max_overhead=0.05, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False)
    batches = _batches(9)
    for x in batches[:6]:
        with plan:
            _step(net, x)
    calibrated = plan.stats.calibration_steps
    planned = plan.stats.planned_steps
    assert plan.plan is not None and planned >= 1
    plan.retarget(target_bytes=1)
    assert plan.stats.plans == 2
    for x in batches[6:]:
        with plan:
            _step(net, x)
    assert plan.stats.calibration_steps == calibrated
    assert plan.stats.plans == 2 and plan.stats.planned_steps == planned + 2
    assert list(plan._blocks.modes) == plan.modes


def _tiny_llama(layers=4, attn="eager"):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=256, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=128, use_cache=False)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg), cfg


def _saved_bytes(fn):
    """Bytes of the distinct storages autograd saves while fn() runs its forward."""
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def test_light_mode_saves_less_and_computes_the_same():
    """light: each gated MLP's down_proj(act_fn(gate) * up) inside torch.utils.checkpoint with
    the matmul's output kept. Neither act_fn(gate) nor the product (tokens x intermediate each,
    per block) is saved any more; loss and gradients are bit-identical to keep."""
    model, cfg = _tiny_llama()
    ref = copy.deepcopy(model)
    modes = pa.BlockModes(model.model.layers)
    assert all(modes.light_blocks)
    modes.set_all("light")
    modes.active = True
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(0))
    loss, light = _saved_bytes(lambda: model(input_ids=ids, labels=ids).loss)
    ref_loss, keep = _saved_bytes(lambda: ref(input_ids=ids, labels=ids).loss)
    loss.backward()
    ref_loss.backward()
    assert torch.equal(loss, ref_loss)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.grad, r.grad), name
    act = 2 * 48 * cfg.intermediate_size * 4  # act_fn(gate), and the product: fp32, per block
    if modes._light_policy is not None:
        assert keep - light >= cfg.num_hidden_layers * 2 * act, (keep, light)
    else:  # (no selective checkpointing: the product is saved by down_proj)
        assert keep - light >= cfg.num_hidden_layers * act, (keep, light)
    modes.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("hooked", [False, True])
def test_light_calibration_counts_what_its_mlp_keeps_outside_the_hooks(client, hooked):
    """light's MLP tail is one autograd Function that keeps nothing beyond gate and up; where
    it cannot be exact (here: a hook on down_proj), a checkpoint whose selective policy keeps
    down_proj's output outside the hooks. Calibration counts that as the block's extra_bytes,
    as it does selective's, so the planner's memory model includes it."""
    model, cfg = _tiny_llama()
    if hooked:
        for layer in model.model.layers:
            layer.mlp.down_proj.register_forward_hook(lambda m, i, o: None)
    plan = tt.plan_activations(model, max_overhead=0.05, client=client, min_bytes=4096,
                               verbose=False)
    if hooked and plan._blocks._light_policy is None:
        plan.remove()
        pytest.skip("this torch has no selective checkpointing")
    for step in range(8):
        ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(step))
        with plan:
            model(input_ids=ids, labels=ids).loss.backward()
        if plan.profile is not None:
            break
    modes = plan.profile.modes
    down = 2 * 48 * cfg.hidden_size * 4 if hooked else 0  # down_proj's output, fp32
    assert [m["light"].extra_bytes for m in modes.values()] == [down] * len(modes)
    assert all(m["keep"].extra_bytes == 0 for m in modes.values())
    # Either way light keeps less than keep by act_fn(gate) and the product, less what it
    # keeps outside the hooks.
    act = 2 * 48 * cfg.intermediate_size * 4
    for m in modes.values():
        keep = sum(x.nbytes for x in m["keep"].sites)
        light = sum(x.nbytes for x in m["light"].sites) + m["light"].extra_bytes
        assert keep - light >= 2 * act - down, (keep, light)
    plan.remove()


def test_light_mlp_tail_is_bit_identical_to_the_block_as_it_is():
    """The light MLP tail's own backward (tier/torch/_light_mlp.py) against autograd's, on a
    gated MLP alone: output and every gradient bit for bit, inputs that need no gradient
    included; and where it cannot be exact (a bias, autocast), it declines."""
    from tier.torch._light_mlp import mlp_tail
    torch.manual_seed(0)
    down = torch.nn.Linear(64, 16, bias=False)
    act = torch.nn.SiLU()
    for need_gate, need_up in ((True, True), (True, False), (False, True)):
        gate = torch.randn(3, 5, 64, requires_grad=need_gate)
        up = torch.randn(3, 5, 64, requires_grad=need_up)
        g = torch.randn(3, 5, 16)
        ref = down(act(gate) * up)
        got = mlp_tail(act, down, gate, up)
        assert torch.equal(ref, got)
        want = torch.autograd.grad(ref, [t for t in (gate, up, down.weight) if t.requires_grad],
                                   g)
        have = torch.autograd.grad(got, [t for t in (gate, up, down.weight) if t.requires_grad],
                                   g)
        assert all(torch.equal(a, b) for a, b in zip(want, have))
    biased = torch.nn.Linear(64, 16)
    assert mlp_tail(act, biased, gate, up) is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mlp_tail(act, down, gate, up) is None


def test_light_is_planned_where_every_block_has_a_gated_mlp(client):
    model, _ = _tiny_llama()
    plan = tt.plan_activations(model, client=client, verbose=False)
    assert "light" in plan.allowed
    plan.remove()
    plan = tt.plan_activations(Net(), client=client, verbose=False)
    assert "light" not in plan.allowed and plan.allowed[0] == "keep"


class GapNet(Net):
    """Saves a tensor between two blocks (tanh saves its output; after the last block, it is
    the head's): calibration numbers it in a gap after the block, outside every block's sites
    (a planned step's hooks never see it, and every block of a kind keeps one template)."""

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def test_what_runs_between_blocks_is_numbered_outside_them(client, monkeypatch):
    torch.manual_seed(0)
    modes = ["keep", "full", "keep", "full", "full", "full"]
    got, want, seen, plan = _run_planned(client, modes, monkeypatch, steps=7, model=GapNet())
    _assert_identical(got, want)
    assert seen[4:] == [modes] * 3
    assert plan.stats.plans == 1 and plan.stats.planned_steps >= 2  # no mismatch, no recalibration
    assert plan.offloader.stats.offloaded_storages > 0


# The planned steps' extra time in the two tests below, on a clock of the test's own: every reading
# of the host's clock advances it by 1 us, the sleep by SLOW_STEP_S. On the real clock a loaded
# 2-core CI host (ctest -j2 beside torch.compile's test) ran the calibration's steps 80 ms over
# their blocks, and that hid a real 60 ms sleep from the check (corrections 0 where 2 were due);
# once it hid 20 ms when one calibration step alone said what lay outside the blocks. The
# check's arithmetic is what these tests judge; the clock's noise on a GPU is the device tests'.
SLOW_STEP_S = 0.06


def _slow_planned_steps(client, monkeypatch, module_of):
    """(planner, max_overhead budgets planned with) of a run whose planned steps sleep
    SLOW_STEP_S before module_of(model) (nothing before the plan is followed), stopped once it
    settles."""
    torch.manual_seed(0)
    model = Net()
    budgets = []
    force_modes(monkeypatch, ["full"] * 6)
    real = ap.choose
    clock = [time.perf_counter()]

    def tick():
        clock[0] += 1e-6
        return clock[0]
    monkeypatch.setattr(time, "perf_counter", tick)

    def recording(profile, link, **kwargs):
        budgets.append(kwargs.get("max_overhead"))
        jp = real(profile, link, **kwargs)
        # Predictions of 1 ms, 10% over it: the sleep is far over any budget of them.
        jp.baseline.timed_s = jp.baseline.step_s = 1e-3
        jp.best.timed_s = jp.best.step_s = 1.1e-3
        return jp
    monkeypatch.setattr(ap, "choose", recording)
    # (A link of 1 byte/s: nothing offloaded, no host probe; the recompute is the overhead.)
    plan = tt.plan_activations(model, max_overhead=0.05, client=client, min_bytes=0,
                               link=(1.0, 1.0), verbose=False)

    def sleep(*_):
        if plan.plan is not None:
            clock[0] += SLOW_STEP_S
    slow = module_of(model).register_forward_pre_hook(sleep)
    steps = 0
    try:
        for x in _batches(16):
            with plan:
                _step(model, x)
            steps += 1
            if not plan.settling:
                break
    finally:
        slow.remove()
    assert not plan.settling, "still settling after %d steps: %r" % (steps, plan.stats)
    return plan, budgets


def test_a_plan_slower_than_predicted_is_made_again_within_a_tighter_budget(client, monkeypatch):
    # Planned steps SLOW_STEP_S slower than the calibration says (a sleep before the third block):
    # the measured overhead is far over the 5% budget, so the planner plans again with its
    # budget scaled by the plan's own error, twice at most, then settles.
    plan, budgets = _slow_planned_steps(client, monkeypatch, lambda m: m.layers[2])
    assert plan.stats.corrections == 2 and plan.stats.plans == 1
    # (The host probe's replan, where the plan offloads, keeps the user's budget.)
    assert budgets[:-2] == [0.05] * (len(budgets) - 2)
    assert 0 < budgets[-1] <= budgets[-2] < 0.05
    assert "planned within" in " ".join(plan.plan.notes)
    assert plan.plan.max_overhead == budgets[-1]


def test_what_a_plan_costs_outside_its_blocks_is_judged_too(client, monkeypatch):
    # The sleep before the first block (in the model's input layer): outside the block timer's
    # window, inside the planner's context. The whole step, less what lay outside the blocks in
    # calibration, is what the check judges: the plan is made again.
    plan, budgets = _slow_planned_steps(client, monkeypatch, lambda m: m.inp)
    assert plan.stats.corrections == 2
    assert 0 < budgets[-1] < 0.05
    assert plan._watch.windows.outside_s is not None


def test_a_model_with_no_candidate_still_gets_a_plan(client):
    # Every saved tensor under min_bytes: nothing to offload, but the calibration must still end
    # (it ran most blocks in full recompute) and a plan be followed, or the steps would stay in
    # calibration's modes for good.
    torch.manual_seed(0)
    model = Net()
    plan = tt.plan_activations(model, max_overhead=0.05, client=client, min_bytes=1 << 40,
                               verbose=False)
    for x in _batches(10):
        with plan:
            _step(model, x)
    assert plan.plan is not None, plan.stats
    assert plan.stats.calibration_steps >= 2 and plan.stats.plans == 1
    assert plan.plan.best.offloaded_bytes == 0
    assert not plan._step_plan.offloaded


@pytest.mark.parametrize("slow_when", ["offloading", "always"])
def test_a_slow_plan_that_offloads_and_recomputes_runs_its_twin_to_price_the_offloads(
        client, monkeypatch, slow_when):
    # Keep blocks that offload beside full-recompute blocks; planned steps sleep SLOW_STEP_S (on
    # the test's clock, as above): only those that offload, or every one. The check runs the
    # plan's twin (the same modes, nothing offloaded) and prices the offloads with what the plan
    # ran over beyond the twin: the whole sleep where only offloading steps sleep, nothing where
    # the twin sleeps too. Before the twin, the check laid the whole excess on the offloads in
    # both cases.
    torch.manual_seed(0)
    model = Net()
    force_modes(monkeypatch, ["keep", "full"] * 3)
    clock = [time.perf_counter()]

    def tick():
        clock[0] += 1e-6
        return clock[0]
    monkeypatch.setattr(time, "perf_counter", tick)
    plan = tt.plan_activations(model, max_overhead=0.05, client=client, min_bytes=0,
                               link=(1e15, 1e15), verbose=False)

    def sleep(*_):
        step_plan = plan._step_plan
        if plan.plan is not None and step_plan is not None and (
                slow_when == "always" or step_plan.offloaded):
            clock[0] += SLOW_STEP_S
    slow = model.layers[2].register_forward_pre_hook(sleep)
    per_step = []  # (candidates the step plan offloads, storages offloaded, twins so far)
    try:
        for x in _batches(24):
            before = plan.offloader.stats.offloaded_storages
            with plan:
                held = len(plan._step_plan.offloaded) if plan._step_plan is not None else 0
                _step(model, x)
            per_step.append((held, plan.offloader.stats.offloaded_storages - before,
                             plan.stats.twins))
            if not plan.settling:
                break
    finally:
        slow.remove()
    assert not plan.settling, per_step
    assert plan.stats.twins >= 1, per_step
    twin_steps = [s for s in per_step if s[2] >= 1 and s[0] == 0]
    assert len(twin_steps) >= 3 and all(n == 0 for _, n, _ in twin_steps), per_step
    # Priced per storage offloaded (the planner's sites); the twin's own excess on this clock
    # is a few ticks.
    offloads = max(n for _, n, _ in per_step)
    price = plan._watch.overhead.offload_step_s
    if slow_when == "offloading":
        assert SLOW_STEP_S / offloads * 0.95 <= price <= SLOW_STEP_S / offloads * 1.05, \
            (price, offloads, per_step)
    else:
        # (The budget's scale needs a twin predicted to cost something; on this clock its
        # recompute is a few ticks: test_overhead_check.py covers the scale.)
        assert price < 0.05 * SLOW_STEP_S / offloads, (price, offloads, per_step)
