"""offload_activations(modules=...): only what the selected modules save is offloaded (the way
Megatron users list modules), and results stay bit-identical. CPU, real tierd (host engine)."""

import copy

import pytest
import torch
import torch.nn as nn

import tier.torch as tt


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return self.proj(a @ v)


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up_proj = nn.Linear(d, 4 * d)
        self.act_fn = nn.GELU()
        self.down_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)))


class Layer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(d)
        self.self_attn = Attention(d)
        self.post_attention_layernorm = nn.LayerNorm(d)
        self.mlp = Mlp(d)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self, d=32, layers=3):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d) for _ in range(layers))
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _run(model, x, ctx):
    model.zero_grad()
    with ctx:
        loss = model(x).square().mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _offloaded(client, model, x, **kwargs):
    off = tt.offload_activations(min_bytes=0, prefetch=1, client=client, module=model, **kwargs)
    loss, grads = _run(model, x, off)
    return off.stats, loss, grads


@pytest.fixture()
def setup():
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(2, 16, 32)
    want_loss, want_grads = _run(copy.deepcopy(model), x, tt.no_offload())
    return model, x, want_loss, want_grads


def _check(loss, grads, want_loss, want_grads):
    assert torch.equal(loss, want_loss)
    for g, w in zip(grads, want_grads):
        assert torch.equal(g, w)


def test_selection_by_class_offloads_only_inside_those_modules(client, setup):
    model, x, want_loss, want_grads = setup
    everything, loss, grads = _offloaded(client, model, x)
    _check(loss, grads, want_loss, want_grads)
    mlp_only, loss, grads = _offloaded(client, model, x, modules=[Mlp])
    _check(loss, grads, want_loss, want_grads)
    attn_only, loss, grads = _offloaded(client, model, x, modules=[Attention])
    _check(loss, grads, want_loss, want_grads)
    assert 0 < mlp_only.offloaded_tensors < everything.offloaded_tensors
    assert 0 < attn_only.offloaded_tensors < everything.offloaded_tensors
    # Every layer's MLP saves the same tensors: a multiple of the 3 layers.
    assert mlp_only.offloaded_tensors % 3 == 0
    both, _, _ = _offloaded(client, model, x, modules=[Mlp, Attention])
    assert both.offloaded_tensors == mlp_only.offloaded_tensors + attn_only.offloaded_tensors


def test_selection_by_megatron_style_names_and_instances(client, setup):
    model, x, want_loss, want_grads = setup
    all_norms, loss, grads = _offloaded(
        client, model, x, modules=["*.input_layernorm", "*.post_attention_layernorm"])
    _check(loss, grads, want_loss, want_grads)
    one_layer, loss, grads = _offloaded(client, model, x, modules=["layers.1.*"])
    _check(loss, grads, want_loss, want_grads)
    all_layers, _, _ = _offloaded(client, model, x, modules=["layers.*"])
    assert 0 < one_layer.offloaded_tensors < all_layers.offloaded_tensors
    assert all_norms.offloaded_tensors > 0
    by_instance, _, _ = _offloaded(client, model, x, modules=[model.layers[1]])
    assert by_instance.offloaded_tensors == one_layer.offloaded_tensors


@pytest.mark.parametrize("modules,error,match", [
    (["*.no_such_module"], ValueError, "matches no module"),
    ([nn.Conv2d], ValueError, "no Conv2d"),
    ([42], TypeError, "name patterns"),
])
def test_bad_selections_are_refused(client, setup, modules, error, match):
    model = setup[0]
    with pytest.raises(error, match=match):
        tt.offload_activations(client=client, module=model, modules=modules)


def test_names_and_classes_need_the_model(client):
    with pytest.raises(ValueError, match="module=<the model>"):
        tt.offload_activations(client=client, modules=["*.mlp"])
