"""Activation offload inside torch.compile graphs (tier/torch/_compile.py), on CPU against a real
tierd (host engine). The GPU test of the memory it frees is python/tests/gpu/test_compile_gpu.py.

What is checked here is the mechanism: the compiled forward returns handles (8-byte tensors)
where it returned the activations, so autograd holds no activation of the graph; backward gets
them back through tierd; losses and gradients are bit-identical to the same compiled model
without Tierd; every tierd object is freed once backward is done."""

import warnings

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch, "compile") or not hasattr(torch.library, "custom_op"):
    pytest.skip("needs torch.compile and torch.library.custom_op", allow_module_level=True)

import torch.nn as nn  # noqa: E402

import tier.torch as tt  # noqa: E402
from tier.torch import _compile  # noqa: E402


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 8))


X = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))


def _run(compiled, model, hooks=None):
    """(loss, grads, bytes of each tensor autograd saved)"""
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t
    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(X).sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()], saved


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    _compile.uninstall()


def test_aot_graph_holds_handles_and_matches_bit_for_bit(client, daemon):
    model = _model()
    plain, _ = _compile.compile_backend(min_bytes=1 << 40, devices=("cpu",))  # rewrites nothing
    ref_loss, ref_grads, ref_saved = _run(torch.compile(model, backend=plain), model)
    offloaded0 = _compile.compile_stats().offloaded
    tier_backend, part = _compile.compile_backend(min_bytes=1024, client=client,
                                                  devices=("cpu",))
    compiled = torch.compile(model, backend=tier_backend)
    for _ in range(2):
        loss, grads, saved = _run(compiled, model)
        assert torch.equal(loss, ref_loss)
        for g, r in zip(grads, ref_grads):
            assert torch.equal(g, r)
    # (part.offloaded counts graphs partitioned in this process: none when a cache served it)
    # Where the graph saved four 64 KiB activations, autograd now holds four 8-byte handles.
    assert ref_saved.count(65536) == 4
    assert saved.count(8) == 4 and 65536 not in saved
    stats = _compile.compile_stats()
    assert stats.offloaded - offloaded0 == 8 and stats.reloads >= 8
    daemon.wait_host_used(0)  # every handle freed once backward was done


def test_inductor_compile_options_match_bit_for_bit(client, daemon):
    model = _model()
    ref_loss, ref_grads, _ = _run(torch.compile(model), model)
    torch._dynamo.reset()
    opts = tt.compile_options(min_bytes=1024, client=client, devices=("cpu",))
    ops0 = _compile.compile_stats().offloaded
    loss, grads, saved = _run(torch.compile(model, options=opts), model)
    assert _compile.compile_stats().offloaded - ops0 == 4
    assert saved.count(8) == 4
    assert torch.equal(loss, ref_loss)
    for g, r in zip(grads, ref_grads):
        assert torch.equal(g, r)
    daemon.wait_host_used(0)


def test_offload_activations_rewrites_graphs_compiled_inside(client, daemon, monkeypatch):
    monkeypatch.setattr(_compile, "AUTO_DEVICES", ("cpu", "cuda"))
    model = _model()
    compiled = torch.compile(model)  # imports dynamo: entering the offloader installs
    off = tt.offload_activations(min_bytes=1024, client=client)
    ops0 = _compile.compile_stats().offloaded
    with off:
        loss = compiled(X).sum()  # first call: compiled here, with Tierd's partitioner
    loss.backward()
    assert _compile._installed is not None
    assert _compile.compile_stats().offloaded - ops0 == 4
    # The graph's four, and its input X (saved as it is in eager mode: the hooks take it).
    assert off.stats.offloaded_storages == 5 and off.stats.reloads == 5
    grads = [p.grad.clone() for p in model.parameters()]
    # Outside an offloader the same graph keeps its tensors (and stays correct).
    kept0 = _compile.compile_stats().kept
    loss2, grads2, _ = _run(compiled, model)
    assert _compile.compile_stats().kept - kept0 == 4
    assert torch.equal(loss, loss2)
    for g, r in zip(grads, grads2):
        assert torch.equal(g, r)
    daemon.wait_host_used(0)


def test_a_budget_offloaders_steps_are_followed_by_the_graphs_it_compiled(client, monkeypatch):
    # The ops of a graph compiled to follow the active offloader find it through the
    # saved-tensor hooks on top. A budget's steps install a hook of their own (the calibration's
    # recording one, then the planned steps' table by save: tier/torch/_save_shape.py), not the
    # offloader's bound method: the graph must still find the offloader, in every step.
    monkeypatch.setattr(_compile, "AUTO_DEVICES", ("cpu", "cuda"))
    model = _model()
    compiled = torch.compile(model)
    off = tt.offload_activations(min_bytes=1024, client=client, max_overhead=10.0,
                                 link=(1e15, 1e15))
    for step in range(4):  # calibration, the timed step, planned steps
        kept0 = _compile.compile_stats().kept
        with off:
            assert _compile._RUNTIME._follow() is off, step
            loss = compiled(X).sum()
        loss.backward()
        assert _compile.compile_stats().kept == kept0, step  # the graph offloaded its four


@pytest.mark.parametrize("budget", [{}, {"max_overhead": 10.0, "link": (1e15, 1e15)}])
def test_hooks_warn_once_for_a_graph_tierd_did_not_rewrite(client, budget):
    model = _model()
    plain, _ = _compile.compile_backend(min_bytes=1 << 40, devices=("cpu",))
    compiled = torch.compile(model, backend=plain)
    _compile._RUNTIME._warned.discard("hooks")
    off = tt.offload_activations(min_bytes=1024, client=client, **budget)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):  # (a budget offloads from its third step)
            with off:
                loss = compiled(X).sum()
            loss.backward()
    loud = [w for w in caught if "torch.compile graph" in str(w.message)]
    assert len(loud) == 1, [str(w.message) for w in caught]
    assert "compile_options" in str(loud[0].message)


class _Block(nn.Module):
    """A GPT block with what compiled graphs make of it: layer norm (several outputs), views,
    a masked softmax, dropout (the partitioner's RNG handling)."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = self.drop(att.masked_fill(mask[:s, :s], float("-inf")).softmax(-1))
        x = x + self.drop(self.proj((att @ v).transpose(1, 2).reshape(b, s, d)))
        return x + self.drop(self.fc2(nn.functional.gelu(self.fc1(self.ln2(x)))))


class _GPT(nn.Module):
    def __init__(self, vocab=128, d=64, seq=32, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_Block(d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def forward(self, idx):
        x = self.tok(idx)
        for b in self.blocks:
            x = b(x, self.mask)
        return self.head(x)


def test_inductor_gpt_with_dropout_matches_bit_for_bit(client, daemon):
    idx = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(3))

    def run(options):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = _GPT()
        compiled = torch.compile(model, options=options) if options else torch.compile(model)
        out = []
        for step in range(2):
            torch.manual_seed(100 + step)  # dropout: the same masks in both runs
            model.zero_grad()
            loss = nn.functional.cross_entropy(compiled(idx).view(-1, 128), idx.view(-1))
            loss.backward()
            out.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        return out

    # One thread: the CPU kernels' reductions then run in one order in both runs (with several,
    # how the work splits follows the machine's load, and the last bits of a gradient with it).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = run(None)
        ops0 = _compile.compile_stats().offloaded
        got = run(tt.compile_options(min_bytes=4096, client=client, devices=("cpu",)))
    finally:
        torch.set_num_threads(threads)
    assert _compile.compile_stats().offloaded - ops0 >= 2 * 8  # several per block, each step
    for (ref_loss, ref_grads), (loss, grads) in zip(ref, got):
        assert torch.equal(loss, ref_loss)
        for g, r in zip(grads, ref_grads):
            assert torch.equal(g, r)
    daemon.wait_host_used(0)
