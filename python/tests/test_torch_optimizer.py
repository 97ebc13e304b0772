"""tier.torch.offload_optimizer_state on CPU models, against a real tierd (host engine): the
parameters after N steps are bit-identical to the same training without offload."""

import copy
import os
import tempfile

import pytest
import torch
import torch.nn as nn

import tier
import tier.torch as tt


class Net(nn.Module):
    def __init__(self, d=48, layers=4, dtype=torch.float32):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
            for _ in range(layers))
        self.out = nn.Linear(d, 3)
        self.to(dtype)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = x + layer(x)
        return self.out(x)


OPTIMIZERS = {
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
}


def _pair(kind, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    ref = Net(dtype=dtype)
    model = copy.deepcopy(ref)
    return ref, OPTIMIZERS[kind](ref.parameters()), model, OPTIMIZERS[kind](model.parameters())


def _train_step(model, opt, x, y, accumulate=1):
    opt.zero_grad()
    for i in range(accumulate):
        loss = nn.functional.mse_loss(model(x[i::accumulate]), y[i::accumulate])
        loss.backward()
    opt.step()


def _batch(step, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + step)
    return (torch.randn(32, 16, generator=g).to(dtype), torch.randn(32, 3, generator=g).to(dtype))


def _assert_same_params(a, b):
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name


def _state_is_away(opt, min_bytes=tt.DEFAULT_STATE_MIN_BYTES):
    """Every state tensor of min_bytes or more is a placeholder between steps."""
    away = 0
    for state in opt.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.numel() == 0:
                away += 1
            elif isinstance(value, torch.Tensor):
                assert value.numel() * value.element_size() < min_bytes
    return away


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bit_identical_to_no_offload(client, daemon, kind, dtype):
    ref, ref_opt, model, opt = _pair(kind, dtype)
    # Small groups: the step runs in several groups, with prefetch.
    off = tt.offload_optimizer_state(opt, group_bytes=64 << 10, prefetch=1, client=client)
    for step in range(4):
        x, y = _batch(step, dtype)
        _train_step(ref, ref_opt, x, y)
        _train_step(model, opt, x, y)
        _assert_same_params(ref, model)
        assert _state_is_away(opt) > 0
    assert off.stats.steps == 4
    assert off.stats.groups > 1
    # Steps 2-4 (the state exists from step 1 on) prefetch each group with state away but the
    # first, once (groups of small tensors only stay resident).
    assert 0 < off.stats.prefetched_groups <= 3 * (off.stats.groups - 1)
    client.synchronize()
    assert daemon.host_used_bytes() > 0
    off.remove()
    # Back home: the state equals the reference's, tensor for tensor.
    for p_ref, p in zip(ref.parameters(), model.parameters()):
        for key, value in ref_opt.state[p_ref].items():
            assert torch.equal(opt.state[p][key], value), key
    assert "step" not in opt.__dict__


def test_gradient_accumulation_and_two_optimizers(client):
    torch.manual_seed(3)
    ref = Net()
    model = copy.deepcopy(ref)
    # Two optimizers over two halves of the model, as GANs and some fine-tuning setups have.
    ref_a = torch.optim.Adam(list(ref.inp.parameters()) + list(ref.layers[:2].parameters()), lr=1e-2)
    ref_b = torch.optim.SGD(list(ref.layers[2:].parameters()) + list(ref.out.parameters()),
                            lr=1e-2, momentum=0.9)
    opt_a = torch.optim.Adam(list(model.inp.parameters()) + list(model.layers[:2].parameters()),
                             lr=1e-2)
    opt_b = torch.optim.SGD(list(model.layers[2:].parameters()) + list(model.out.parameters()),
                            lr=1e-2, momentum=0.9)
    with tt.offload_optimizer_state(opt_a, group_bytes=32 << 10, client=client), \
            tt.offload_optimizer_state(opt_b, group_bytes=32 << 10, prefetch=2, client=client):
        for step in range(3):
            x, y = _batch(step)
            for m, opts in ((ref, (ref_a, ref_b)), (model, (opt_a, opt_b))):
                for o in opts:
                    o.zero_grad()
                for i in range(2):  # two micro-batches, one step
                    nn.functional.mse_loss(m(x[i::2]), y[i::2]).backward()
                for o in opts:
                    o.step()
            _assert_same_params(ref, model)
            assert _state_is_away(opt_a) > 0 and _state_is_away(opt_b) > 0


def test_offloading_twice_is_refused(client):
    _, _, model, opt = _pair("adam")
    with tt.offload_optimizer_state(opt, client=client):
        with pytest.raises(ValueError, match="offloaded already"):
            tt.offload_optimizer_state(opt, client=client)


def test_state_dict_sees_tensors_and_load_continues_identically(client):
    ref, ref_opt, model, opt = _pair("adamw")
    off = tt.offload_optimizer_state(opt, group_bytes=64 << 10, client=client)
    for step in range(2):
        x, y = _batch(step)
        _train_step(ref, ref_opt, x, y)
        _train_step(model, opt, x, y)
    sd = opt.state_dict()
    want = ref_opt.state_dict()
    assert sd["param_groups"] == want["param_groups"]
    assert sorted(sd["state"]) == sorted(want["state"])
    for k, state in want["state"].items():
        for key, value in state.items():
            assert torch.equal(sd["state"][k][key], value), (k, key)
    # One more step sends the state out again. What state_dict() returned holds the live state
    # tensors, as with any torch optimizer (the step updates them in place), never placeholders.
    x, y = _batch(2)
    _train_step(ref, ref_opt, x, y)
    _train_step(model, opt, x, y)
    _assert_same_params(ref, model)
    assert _state_is_away(opt) > 0
    for k, state in ref_opt.state_dict()["state"].items():
        for key, value in state.items():
            assert torch.equal(sd["state"][k][key], value), (k, key)
    off.remove()


def test_load_state_dict_into_an_offloaded_optimizer(client):
    ref, ref_opt, model, opt = _pair("adam")
    for step in range(2):
        x, y = _batch(step)
        _train_step(ref, ref_opt, x, y)
    checkpoint = copy.deepcopy(ref_opt.state_dict())
    model.load_state_dict(ref.state_dict())
    off = tt.offload_optimizer_state(opt, group_bytes=64 << 10, client=client)
    opt.load_state_dict(checkpoint)
    assert _state_is_away(opt) > 0  # loaded state goes out at once
    for step in range(2, 5):
        x, y = _batch(step)
        _train_step(ref, ref_opt, x, y)
        _train_step(model, opt, x, y)
        _assert_same_params(ref, model)
    off.remove()


def test_existing_state_goes_out_when_offload_starts(client):
    ref, ref_opt, model, opt = _pair("sgd")
    for step in range(2):
        x, y = _batch(step)
        _train_step(ref, ref_opt, x, y)
        _train_step(model, opt, x, y)
    with tt.offload_optimizer_state(opt, client=client) as off:
        assert _state_is_away(opt) > 0
        assert off.stats.offloads > 0
        x, y = _batch(2)
        _train_step(ref, ref_opt, x, y)
        _train_step(model, opt, x, y)
        _assert_same_params(ref, model)


def test_lr_scheduler_created_after_offload_counts_steps(client):
    ref, ref_opt, model, opt = _pair("adam")
    with tt.offload_optimizer_state(opt, group_bytes=64 << 10, client=client):
        ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for step in range(3):
            x, y = _batch(step)
            _train_step(ref, ref_opt, x, y)
            ref_sched.step()
            _train_step(model, opt, x, y)
            sched.step()
            _assert_same_params(ref, model)
        assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]


def test_state_larger_than_the_pool_runs_through_nvme_under_delay(make_daemon):
    spill_dir = tempfile.mkdtemp(prefix="tier-opt-spill-", dir=os.environ.get("TIER_BUILD_DIR"))
    d = make_daemon(pool_bytes="4M", extra=("--spill_dir=" + spill_dir, "--spill_bytes=64M",
                                            "--copy_delay_us=200"))
    torch.manual_seed(5)
    ref = Net(d=256, layers=4)  # ~1.6 M parameters: Adam state ~12.6 MB, three times the pool
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with tier.Client(socket=d.socket, name="optimizer-nvme") as c:
        with tt.offload_optimizer_state(opt, group_bytes=1 << 20, prefetch=1, client=c) as off:
            for step in range(3):
                x, y = _batch(step)
                _train_step(ref, ref_opt, x, y)
                _train_step(model, opt, x, y)
                _assert_same_params(ref, model)
            c.synchronize()
            spill = d.status()["tiers"]
            nvme = [t for t in spill if t["name"] == "nvme"]
            assert nvme and nvme[0]["used_bytes"] > 0, spill
            assert off.stats.groups >= 8
