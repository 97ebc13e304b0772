"""tier.torch.offload_module_weights on CPU models, against a real tierd (host engine)."""

import copy
import gc
import warnings

import pytest
import torch
import torch.nn as nn

import tier
import tier.torch as tt


class Net(nn.Module):
    def __init__(self, d=64, layers=5):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
            for _ in range(layers))
        self.norm = nn.BatchNorm1d(d)  # buffers outside the blocks
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = x + layer(x)
        return self.out(self.norm(x))


def _model(seed=0):
    torch.manual_seed(seed)
    m = Net()
    m.eval()
    return m


@pytest.mark.parametrize("group", [1, 2, 5])
def test_same_outputs(client, daemon, group):
    ref = _model()
    m = _model()
    x = torch.randn(32, 16)
    with torch.no_grad():
        want = ref(x)
    w = tt.offload_module_weights(m, group=group, client=client)
    assert w.groups == -(-5 // group)
    # Between uses the blocks' weights are not in process memory; the rest is.
    for layer in m.layers:
        for p in layer.parameters():
            assert p.numel() == 0
    assert m.inp.weight.numel() == 16 * 64
    client.synchronize()
    assert daemon.host_used_bytes() > 0
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(m(x), want)
            for p in m.layers.parameters():
                assert p.numel() == 0
    assert w.stats.onloads == 3 * w.groups and w.stats.releases == 3 * w.groups
    if w.groups > 1:
        assert w.stats.prefetches == 3 * (w.groups - 1)  # every group but the first, each pass
    w.remove()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    with torch.no_grad():
        assert torch.equal(m(x), want)
    client.synchronize()
    daemon.wait_host_used(0)


def test_context_manager_and_parameter_identity(client):
    m = _model()
    params = [id(p) for p in m.parameters()]
    x = torch.randn(4, 16)
    with torch.no_grad():
        want = m(x)
    with tt.offload_module_weights(m, group=2, client=client), torch.no_grad():
        assert torch.equal(m(x), want)
    assert [id(p) for p in m.parameters()] == params  # optimizers keep working
    with torch.no_grad():
        assert torch.equal(m(x), want)


def test_grad_enabled_keeps_weights_and_gradients_match(client):
    ref = _model()
    m = _model()
    x = torch.randn(8, 16)
    ref(x).sum().backward()
    w = tt.offload_module_weights(m, group=1, client=client)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m(x).sum().backward()
    assert any("grad enabled" in str(c.message) for c in caught)
    assert w.stats.kept_resident == 5
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)
    w.remove()


def test_in_place_updates_are_offloaded_again(client):
    ref = _model()
    m = _model()
    x = torch.randn(8, 16)
    w = tt.offload_module_weights(m, group=1, client=client)
    # A training step while the weights are resident (grad enabled keeps them), then inference.
    for model in (ref, m):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "grad enabled": expected here
            model(x).pow(2).sum().backward()
        opt.step()
    with torch.no_grad():
        assert torch.equal(m(x), ref(x))   # releases: the updated weights go back to Tierd
        assert torch.equal(m(x), ref(x))   # ... and come back updated
    assert w.stats.reoffloads == sum(len(list(layer.parameters())) for layer in m.layers)
    w.remove()


def test_tied_weights_stay_resident(client):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(32, 32), nn.Linear(32, 32)])
            self.head = nn.Linear(32, 32)
            self.head.weight = self.blocks[0].weight  # shared with a module outside the blocks

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(x)
    torch.manual_seed(0)
    m = Tied()
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = m(x)
    w = tt.offload_module_weights(m, client=client)
    assert m.blocks[0].weight.numel() == 32 * 32  # tied: kept
    assert m.blocks[1].weight.numel() == 0
    with torch.no_grad():
        assert torch.equal(m(x), want)
    w.remove()


def test_blocks_of_a_sequential(client, daemon):
    torch.manual_seed(1)
    seq = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    x = torch.randn(2, 64)
    with torch.no_grad():
        want = seq(x)
    w = tt.offload_module_weights(copy.deepcopy(seq), group=3, client=client)
    del w
    w = tt.offload_module_weights(seq, group=3, client=client)
    assert w.groups == 2
    with torch.no_grad():
        assert torch.equal(seq(x), want)
    w.remove()
    gc.collect()
    client.synchronize()
    daemon.wait_host_used(0)


def test_full_quota_keeps_weights(daemon):
    import tier
    ref = _model()
    m = _model()
    x = torch.randn(8, 16)
    with torch.no_grad():
        want = ref(x)
    with tier.Client(socket=daemon.socket, quota_bytes=64 * 1024) as small:
        w = tt.offload_module_weights(m, group=1, client=small)
        with torch.no_grad():
            assert torch.equal(m(x), want)
            assert torch.equal(m(x), want)
        w.remove()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_a_forward_whose_reloads_did_not_complete_raises(client, monkeypatch):
    # Had tierd gone away while a group's reload was in flight, the library releases the streams
    # waiting on it (never a wait for ever) and the forward reads memory the copy never filled:
    # the forward must raise at its end, once per forward, not return that output.
    calls = []

    def fail():
        calls.append(1)
        raise tier.Unavailable(tier.errors.UNAVAILABLE, "1 GPU reload(s) did not complete")

    m = _model()
    x = torch.randn(8, 16)
    with torch.no_grad():
        want = m(x)
    with tt.offload_module_weights(m, group=2, client=client), torch.no_grad():
        assert torch.equal(m(x), want)  # checked, nothing failed
        monkeypatch.setattr(client, "reload_check", lambda: fail)
        with pytest.raises(Exception, match="did not complete"):
            m(x)
        assert len(calls) == 1
        monkeypatch.undo()
        assert torch.equal(m(x), want)  # the next forward has a check of its own
