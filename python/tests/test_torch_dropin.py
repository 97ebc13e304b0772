"""Drop-in surfaces (tier/torch/_dropin.py) on CPU models against a real tierd (host engine), each
used the way the seed's own users use the original: torchtune's OffloadActivations
(../shared/seeds/003_*.txt) and diffusers' apply_group_offloading (../shared/seeds/001_*.txt)."""

import copy

import pytest
import torch
import torch.nn as nn

import tier.torch as tt


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class TinyDecoder(nn.Module):
    """A torchtune-shaped model: embeddings, layers, norm, and an `output` head."""

    def __init__(self, vocab=64, d=32, layers=3):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.output = nn.Linear(d, vocab)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _torchtune_step(model, tokens, labels, ctx):
    # The recipe's pattern: forward under the context, loss and backward outside it.
    model.zero_grad()
    with ctx:
        logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    loss.backward()
    return loss.detach()


def test_torchtune_offload_activations_recipe_pattern(client):
    torch.manual_seed(0)
    ref = TinyDecoder()
    model = copy.deepcopy(ref)
    tokens = torch.randint(0, 64, (4, 16))
    labels = torch.randint(0, 64, (4, 16))
    want_loss = _torchtune_step(ref, tokens, labels, tt.no_offload())
    want = _grads(ref)
    ctx = tt.OffloadActivations(use_pin_memory=False, use_streams=True, max_fwd_stash_size=5,
                                min_offload_size=1024, client=client)
    for _ in range(2):  # one context, reused every step, as recipes do
        loss = _torchtune_step(model, tokens, labels, ctx)
        assert torch.equal(loss, want_loss)
        for g, w in zip(_grads(model), want):
            assert torch.equal(g, w)
    assert ctx.stats.offloaded_storages > 0, ctx.stats
    assert ctx.min_bytes == 1024 and ctx.prefetch == 2
    assert tt.OffloadActivations(use_streams=False).prefetch == 0


def test_torchtune_noop_manager_keeps_its_region(client):
    torch.manual_seed(1)
    model = TinyDecoder()
    tokens = torch.randint(0, 64, (2, 8))
    ctx = tt.OffloadActivations(min_offload_size=0, client=client)
    with ctx:
        with tt.NoOpManager():
            model(tokens).sum().backward()
    assert ctx.stats.offloaded_storages == 0, ctx.stats


def test_torchtune_ctx_manager_keeps_the_output_head_resident(client):
    torch.manual_seed(2)
    ref = TinyDecoder()
    model = copy.deepcopy(ref)
    tokens = torch.randint(0, 64, (4, 16))
    labels = torch.randint(0, 64, (4, 16))
    _torchtune_step(ref, tokens, labels, tt.no_offload())
    ctx = tt.get_act_offloading_ctx_manager(model, True, client=client)
    _torchtune_step(model, tokens, labels, ctx)
    for g, w in zip(_grads(model), _grads(ref)):
        assert torch.equal(g, w)
    offloaded_with_head_kept = ctx.stats.offloaded_storages
    assert offloaded_with_head_kept > 0
    # The same step offloading everything offloads more: the head's saved tensors were kept.
    everything = tt.OffloadActivations(client=client, module=model)
    _torchtune_step(model, tokens, labels, everything)
    assert everything.stats.offloaded_storages > offloaded_with_head_kept
    off = tt.get_act_offloading_ctx_manager(model, False)
    with off:
        pass  # disabled: a context that does nothing


@pytest.mark.parametrize("kwargs", [dict(max_fwd_stash_size=0), dict(min_offload_size=-1)])
def test_torchtune_arguments_are_checked(kwargs):
    with pytest.raises(ValueError):
        tt.OffloadActivations(**kwargs)
    with pytest.raises(TypeError):
        tt.OffloadActivations(use_streams="yes")


class DiT(nn.Module):
    """A diffusers-shaped denoiser: patch embed, transformer_blocks, norm_out, proj_out."""

    def __init__(self, d=32, blocks=4):
        super().__init__()
        self.pos_embed = nn.Linear(8, d)
        self.transformer_blocks = nn.ModuleList(Block(d) for _ in range(blocks))
        self.norm_out = nn.LayerNorm(d)
        self.proj_out = nn.Linear(d, 8)

    def forward(self, x):
        h = self.pos_embed(x)
        for block in self.transformer_blocks:
            h = block(h)
        return self.proj_out(self.norm_out(h))


@pytest.mark.parametrize("offload_type,per_group", [("block_level", 1), ("block_level", 2),
                                                    ("leaf_level", None)])
def test_diffusers_group_offloading_pipeline_pattern(client, offload_type, per_group):
    torch.manual_seed(3)
    ref = DiT().eval()
    model = copy.deepcopy(ref)
    latents = torch.randn(2, 16, 8)
    with torch.no_grad():
        want = [ref(latents * (t + 1)) for t in range(3)]
    w = tt.apply_group_offloading(model, onload_device="cpu", offload_type=offload_type,
                                  num_blocks_per_group=per_group, use_stream=True, client=client)
    # Between uses the offloaded weights are not in process memory.
    offloaded = (model.transformer_blocks if offload_type == "block_level" else model)
    assert all(p.numel() == 0 for p in offloaded.parameters())
    with torch.no_grad():
        for t in range(3):  # the denoising loop: several forwards
            assert torch.equal(model(latents * (t + 1)), want[t])
    assert w.stats.onloads > 0 and w.stats.releases == w.stats.onloads
    w.remove()
    assert all(p.numel() > 0 for p in model.parameters())


@pytest.mark.parametrize("kwargs,error", [
    (dict(offload_type="module_level"), "offload_type"),
    (dict(offload_type="block_level"), "num_blocks_per_group"),
    (dict(offload_type="leaf_level", offload_device="cuda"), "offload_device"),
    (dict(offload_type="leaf_level", onload_device="meta"), "move the module"),
])
def test_diffusers_arguments_are_checked(client, kwargs, error):
    with pytest.raises(ValueError, match=error):
        tt.apply_group_offloading(DiT(), client=client, **kwargs)
