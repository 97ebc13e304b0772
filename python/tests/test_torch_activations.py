"""tier.torch.offload_activations on CPU models, against a real tierd (host engine)."""

import contextlib
import gc
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tier
import tier.torch as tt


class Block(nn.Module):
    """A pre-norm transformer block (attention with a fused QKV projection, GELU MLP, dropout)."""

    def __init__(self, d_model=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)  # three views of one storage
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        att = self.drop(att.masked_fill(mask, float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=97, d_model=64, layers=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx, head_region=None):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        if head_region is not None:
            with head_region():
                return self.head(self.ln(x))
        return self.head(self.ln(x))


def _train_steps(model, batches, offloader_factory=None, steps=2, head_region=None):
    """Runs a few SGD steps; returns losses and the final gradients."""
    torch.manual_seed(1234)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    stats = []
    for step in range(steps):
        idx, target = batches[step]
        opt.zero_grad()
        if offloader_factory is not None:
            with offloader_factory() as off:
                logits = model(idx, head_region)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            stats.append(off.stats)
        else:
            logits = model(idx, head_region)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        loss.backward()
        losses.append(loss.detach().clone())
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
    return losses, grads, stats


def _batches(steps=2, b=4, s=32, vocab=97):
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, vocab, (b, s), generator=g), torch.randint(0, vocab, (b, s), generator=g))
            for _ in range(steps)]


def _fresh_model(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyGPT(**kw)


@pytest.mark.parametrize("prefetch", [0, 2, 8])
def test_transformer_identical_loss_and_grads(client, daemon, prefetch):
    batches = _batches()
    ref_losses, ref_grads, _ = _train_steps(_fresh_model(), batches)
    losses, grads, stats = _train_steps(
        _fresh_model(), batches,
        lambda: tt.offload_activations(min_bytes=16 * 1024, prefetch=prefetch, client=client))
    for a, b in zip(ref_losses, losses):
        assert torch.equal(a, b)
    for a, b in zip(ref_grads, grads):
        assert torch.equal(a, b)
    for s in stats:
        assert s.offloaded_storages >= 10, s  # it really offloaded
        assert s.deduplicated >= 1, s         # a storage saved by two ops goes once
        assert (s.reloads + s.prefetches + s.source_hits
                == s.offloaded_storages + s.stayed_on_gpu_storages), s
        if prefetch == 0:
            assert s.prefetches == 0
        else:
            assert s.prefetches > 0
    del stats
    gc.collect()
    client.synchronize()
    daemon.wait_host_used(0)


def test_mlp_identical_and_counts(client):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 512), nn.Tanh(),
                        nn.Linear(512, 10))
    x = torch.randn(256, 128)

    def run(off):
        mlp.zero_grad()
        if off is not None:
            with off:
                loss = mlp(x).pow(2).mean()
        else:
            loss = mlp(x).pow(2).mean()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in mlp.parameters()]
    l0, g0 = run(None)
    off = tt.offload_activations(min_bytes=64 * 1024, prefetch=1, client=client)
    l1, g1 = run(off)
    assert torch.equal(l0, l1) and all(torch.equal(a, b) for a, b in zip(g0, g1))
    s = off.stats
    # Saved: x (128 KiB), gelu input, gelu output(=linear2 input), tanh output (shared with linear3
    # input), 3 weights (parameters: kept), ...
    assert s.offloaded_storages == 4, s
    assert s.deduplicated == 1, s  # tanh's output is also linear3's input: one storage
    assert s.kept >= 3, s          # the weights


def _views_model(x, lin, r):
    y = lin(x)                     # an activation: (256, 96)
    a, b, c = y.chunk(3, dim=1)    # three views of y's storage (offsets 0, 32, 64; stride 96)
    ab = a * b                     # mul saves a and b
    out = ab * c                   # saves ab (its own storage) and c
    return out.sum() + (y.t() @ r).sum()  # matmul saves y.t(): a transposed view, same storage


def test_shared_storage_views_offloaded_once(client):
    torch.manual_seed(5)
    lin = nn.Linear(48, 96)
    x = torch.randn(256, 48)
    r = nn.Parameter(torch.randn(256, 8))
    _views_model(x, lin, r).backward()
    expected = [lin.weight.grad.clone(), lin.bias.grad.clone(), r.grad.clone()]
    lin.zero_grad()
    r.grad = None
    off = tt.offload_activations(min_bytes=4096, prefetch=0, client=client)
    with off:
        loss = _views_model(x, lin, r)
    s = off.stats.as_dict()
    # y's storage once for a, b, c and y.t(); ab's storage; x (the input) once.
    assert s["offloaded_storages"] == 3, s
    assert s["offloaded_tensors"] == 6 and s["deduplicated"] == 3, s
    loss.backward()
    assert off.stats.reloads == 3  # one reload of y served all four views
    for got, want in zip([lin.weight.grad, lin.bias.grad, r.grad], expected):
        assert torch.equal(got, want)


def test_leaf_tensors_with_grad_are_kept(client):
    # Parameters, and leaves that require grad, are not offloaded (they stay resident anyway).
    x = torch.randn(64, 32, requires_grad=True)
    w = nn.Parameter(torch.randn(64, 32))
    off = tt.offload_activations(min_bytes=1024, client=client)
    with off:
        z = x * w          # saves both leaves
        u = z.t() * w.t()  # saves a view of a parameter (and z.t(), an activation)
    u.sum().backward()
    assert off.stats.kept == 3 and off.stats.offloaded_storages == 1, off.stats


def test_storage_changed_in_place_is_offloaded_again(client):
    class Save(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, buf):
            ctx.save_for_backward(buf)
            return x * 1

        @staticmethod
        def backward(ctx, grad):
            (buf,) = ctx.saved_tensors
            Save.seen.append(buf.clone())
            return grad, None
    Save.seen = []
    buf = torch.zeros(1024)
    x = torch.randn(4, requires_grad=True)
    off = tt.offload_activations(min_bytes=1024, prefetch=0, client=client)
    with off:
        a = Save.apply(x, buf)
        buf.add_(1)  # in place: the second save sees other data in the same storage
        b = Save.apply(a, buf)
    assert off.stats.offloaded_storages == 2 and off.stats.deduplicated == 0
    b.sum().backward()
    assert torch.equal(Save.seen[0], torch.ones(1024))   # b's save (backward runs it first)
    assert torch.equal(Save.seen[1], torch.zeros(1024))  # a's save: the data at save time


def test_no_offload_region(client):
    model = _fresh_model()
    batches = _batches(steps=1)
    idx, target = batches[0]
    with tt.offload_activations(min_bytes=1024, client=client) as off:
        x = model.emb(idx)
        for b in model.blocks:
            x = b(x)
        body = off.stats.as_dict()
        with tt.no_offload():
            logits = model.head(model.ln(x))
        assert off.stats.as_dict() == body  # the head's saved tensors never reached the hooks
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    loss.backward()
    assert body["offloaded_storages"] > 0
    # Same losses and grads as without offload, with the head opted out.
    ref_losses, ref_grads, _ = _train_steps(_fresh_model(), _batches(), steps=1)
    losses, grads, _ = _train_steps(
        _fresh_model(), _batches(), steps=1, head_region=tt.no_offload,
        offloader_factory=lambda: tt.offload_activations(min_bytes=1024, client=client))
    assert torch.equal(ref_losses[0], losses[0])
    assert all(torch.equal(a, b) for a, b in zip(ref_grads, grads))


def test_module_buffers_are_skipped(client):
    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(256, 256)
            self.register_buffer("scale", torch.rand(512, 256) + 0.5)

        def forward(self, x):
            return self.lin(x) * self.scale  # mul saves the buffer (to get x's gradient)
    m = WithBuffer()
    x = torch.randn(512, 256)
    with tt.offload_activations(min_bytes=1024, client=client) as plain:
        m(x).sum().backward()
    with tt.offload_activations(min_bytes=1024, client=client, module=m) as aware:
        m(x).sum().backward()
    assert aware.stats.offloaded_storages == plain.stats.offloaded_storages - 1
    assert aware.stats.kept == plain.stats.kept + 1


def test_retain_graph_backward_twice(client):
    torch.manual_seed(3)
    mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    x = torch.randn(128, 64)
    ref = mlp(x).pow(2).sum()
    ref.backward(retain_graph=True)
    ref.backward()
    expected = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    with tt.offload_activations(min_bytes=1024, client=client):
        out = mlp(x).pow(2).sum()
    out.backward(retain_graph=True)
    out.backward()
    assert all(torch.equal(p.grad, e) for p, e in zip(mlp.parameters(), expected))


def test_small_tensors_stay(client):
    with tt.offload_activations(min_bytes=1 << 30, client=client) as off:
        x = torch.randn(100, 100, requires_grad=True)
        (x.exp() * 2).sum().backward()
    assert off.stats.offloaded_storages == 0 and off.stats.saved == off.stats.kept > 0


def test_objects_freed_after_backward(client, daemon):
    model = _fresh_model()
    idx, target = _batches(steps=1)[0]
    client.synchronize()
    daemon.wait_host_used(0)
    with tt.offload_activations(min_bytes=1024, client=client) as off:
        logits = model(idx)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    client.synchronize()
    assert daemon.host_used_bytes() > 0  # the activations live in tierd now
    assert off.stats.offloaded_bytes > 0
    loss.backward()  # frees each saved tensor as its node runs
    del loss, logits
    gc.collect()
    client.synchronize()
    daemon.wait_host_used(0)


def test_default_client(daemon, monkeypatch):
    monkeypatch.setenv("TIER_SOCKET", daemon.socket)
    from tier import client as client_mod
    client_mod._close_default()
    try:
        torch.manual_seed(0)
        lin = nn.Linear(64, 64)
        x = torch.randn(64, 64)
        with tt.offload_activations(min_bytes=1024) as off:
            y = lin(x).exp().sum()
        y.backward()
        assert off.stats.offloaded_storages > 0
        assert tier.default_client() is off.client
    finally:
        client_mod._close_default()


def test_full_quota_keeps_tensors_instead_of_failing(daemon):
    # A session quota far below the activations: offloads fail with RESOURCE_EXHAUSTED, and
    # backward still gets every tensor (kept by its handle) and the same gradients.
    batches = _batches(steps=1)
    ref_losses, ref_grads, _ = _train_steps(_fresh_model(), batches, steps=1)
    with tier.Client(socket=daemon.socket, quota_bytes=256 * 1024) as small:
        losses, grads, stats = _train_steps(
            _fresh_model(), batches, steps=1,
            offloader_factory=lambda: tt.offload_activations(min_bytes=16 * 1024, client=small))
        small.synchronize()
    assert torch.equal(ref_losses[0], losses[0])
    assert all(torch.equal(a, b) for a, b in zip(ref_grads, grads))
    assert stats[0].fallbacks > 0, stats[0]
    assert stats[0].fallbacks < stats[0].offloaded_storages, stats[0]  # some did fit


@pytest.mark.parametrize("prefetch", [0, 2])
def test_saved_storages_go_out_in_batches(client, daemon, prefetch, monkeypatch):
    # On a GPU the saved storages are submitted in batches (one ticket each); here the same
    # bookkeeping runs on the host engine: batches of at most BATCH_TENSORS, the rest when the
    # context ends, results identical to no offload.
    batches = _batches()
    ref_losses, ref_grads, _ = _train_steps(_fresh_model(), batches)
    sizes = []
    real = client.offload_batch

    def counting(tensors, *args, **kwargs):
        tensors = list(tensors)
        sizes.append(len(tensors))
        return real(tensors, *args, **kwargs)
    monkeypatch.setattr(client, "offload_batch", counting)

    def deferring():
        off = tt.offload_activations(min_bytes=1024, prefetch=prefetch, client=client)
        off._defer_cpu = True
        return off
    losses, grads, stats = _train_steps(_fresh_model(), batches, deferring)
    for a, b in zip(losses + grads, ref_losses + ref_grads):
        assert torch.equal(a, b)
    limit = tt.ActivationOffloader.BATCH_TENSORS
    assert sizes and max(sizes) == limit and min(sizes) >= 1, sizes
    for s in stats:
        assert s.offloaded_storages >= 10, s
        assert (s.reloads + s.prefetches + s.source_hits
                == s.offloaded_storages + s.stayed_on_gpu_storages), s
    assert sum(sizes) == sum(s.offloaded_storages for s in stats)


def test_a_saved_tensor_that_is_its_whole_storage_is_offloaded_as_itself(client, daemon,
                                                                         monkeypatch):
    """A saved tensor that is its whole storage (contiguous, offset 0: most activations) is
    the offload's source itself, detached (a job holds no autograd graph), and comes back in its
    own shape; any other saved tensor goes as its storage's flat bytes, and every view (another
    view of a storage already offloaded included) is rebuilt exactly."""
    sent = []
    real = client.offload_batch

    def spy(tensors, *args, **kwargs):
        tensors = list(tensors)
        sent.extend(tensors)
        return real(tensors, *args, **kwargs)

    def run(offloader):
        torch.manual_seed(0)
        x = torch.randn(64, 64, requires_grad=True)
        with offloader:
            a = x * 2                  # its whole storage, requires grad
            b = torch.sin(a)           # saves a
            t = a.t()                  # a's storage again, transposed: a view of the record
            c = t @ t                  # saves t
            w = (x * 3)[:, :32]        # a part of a storage no one offloaded yet: flat bytes
            loss = b.sum() + c.sum() + (w * w).sum()
        loss.backward()
        return loss.detach(), x.grad

    ref = run(contextlib.nullcontext())
    monkeypatch.setattr(client, "offload_batch", spy)
    off = tt.offload_activations(min_bytes=0, client=client)
    off._defer_cpu = True  # (the GPU's path: deferred, sent as batches of tensors)
    got = run(off)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    whole = [s for s in sent if s.dtype == torch.float32 and s.shape == (64, 64)]
    flat = [s for s in sent if s.dtype == torch.uint8]
    assert whole and all(s.grad_fn is None and not s.requires_grad for s in whole), sent
    assert any(s.numel() == 64 * 64 * 4 for s in flat), sent
    assert off.stats.deduplicated >= 1, off.stats


def test_deferred_storages_of_a_dropped_graph_are_not_sent(client, daemon):
    off = tt.offload_activations(min_bytes=1024, client=client)
    off._defer_cpu = True
    model = _fresh_model()
    idx, _ = _batches(1)[0]
    with off:
        model(idx)  # the graph is dropped at once: nothing will need what it saved
        gc.collect()
    assert off.stats.offloaded_storages < off.stats.saved - off.stats.kept, off.stats
    client.synchronize()


def test_deferred_storages_refused_stay_where_they_are(client, daemon, monkeypatch):
    # A batch refused before anything was submitted (tierd gone, ...): the saved bytes stay in
    # place and backward uses them; a warning says so; results identical to no offload.
    batches = _batches(1)
    ref_losses, ref_grads, _ = _train_steps(_fresh_model(), batches, steps=1)

    def refuse(*args, **kwargs):
        raise tier.errors.Unavailable(tier.errors.UNAVAILABLE, "tierd went away (test)")
    monkeypatch.setattr(client, "offload_batch", refuse)

    def deferring():
        off = tt.offload_activations(min_bytes=1024, prefetch=2, client=client)
        off._defer_cpu = True
        return off
    with pytest.warns(RuntimeWarning, match="stay on the GPU"):
        losses, grads, stats = _train_steps(_fresh_model(), batches, deferring, steps=1)
    for a, b in zip(losses + grads, ref_losses + ref_grads):
        assert torch.equal(a, b)
    assert stats[0].offloaded_storages == 0 and stats[0].fallbacks >= 10, stats[0]


# ---- reloads in use when tierd died (the GPU case: tests/gpu/test_gpu_training.py) -------------

def test_backward_that_reloaded_ends_by_verifying_its_reloads(client, monkeypatch):
    """At the end of every backward that reloaded, the offloader asks the client whether the
    reloads it used completed; an error there fails loss.backward() (on the GPU, a tierd that
    died with reloads in flight had the library release the waiting streams, and the gradients
    were computed from memory the copies never filled)."""
    calls = []

    def fail():
        calls.append(1)
        raise tier.Unavailable(tier.errors.UNAVAILABLE, "1 GPU reload(s) did not complete")

    torch.manual_seed(0)
    lin = nn.Linear(64, 64)
    x = torch.randn(32, 64)
    off = tt.offload_activations(min_bytes=0, client=client)
    with off:
        loss = torch.tanh(lin(x)).square().sum()
    loss.backward()  # verified, nothing failed
    monkeypatch.setattr(client, "reload_check", lambda: fail)
    with off:
        loss = torch.tanh(lin(x)).square().sum()
    with pytest.raises(Exception, match="did not complete"):
        loss.backward()
    assert len(calls) == 1  # once per backward, not per saved tensor


def test_verify_in_use_raises_for_a_failed_reload_noted_since_the_mark():
    from tier import _jobs, errors

    class Job:
        def __init__(self, status):
            self.status, self.message, self.length = status, "", 4096

    table = _jobs.JobTable.__new__(_jobs.JobTable)
    table._in_use, table._noted = [], 0
    table.in_use([Job(errors.UNAVAILABLE)])     # an earlier step's: not this one's to report
    mark = table.noted
    table.in_use([Job(errors.OK), Job(errors.OK)])
    table.verify_in_use(mark)                   # nothing failed since the mark
    assert table._in_use == []
    table.in_use([Job(errors.OK), Job(errors.UNAVAILABLE)])
    with pytest.raises(errors.Unavailable, match="1 GPU reload"):
        table.verify_in_use(table.noted - 2)
    assert table._in_use == []
