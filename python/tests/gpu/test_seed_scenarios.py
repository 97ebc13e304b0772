"""The five seed bugs (../shared/seeds/) as regression tests: each reproduces the pattern that broke
the original offloader, through tierd's API, under delay injection (every copy 5 ms late, so a
missing wait is a wrong value, not a rare race), and checks the result is exact. On the device:

    python3 -m pytest -q python/tests/gpu/test_seed_scenarios.py

Skipped where torch.cuda is unavailable (the pattern that needs no GPU, a source overwritten
right after its offload, runs in CI: python/tests/test_seed_scenarios_cpu.py).
"""

import copy
import os

import pytest

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available: GPU tests skipped", allow_module_level=True)

import tier.torch as tt  # noqa: E402
from gpu_models import SLOW_NS, Model, delayed_client  # noqa: E402



@pytest.fixture(scope="module")
def delayed():
    yield from delayed_client("seed-scenarios")


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


# Seed 000 (xtuner activation offload): the copy's event was recorded on the wrong stream, so the
# D2H copy did not wait for the stream that produced the tensor.
def test_offload_waits_for_the_producing_user_stream_not_the_default_one(delayed):
    user = torch.cuda.Stream()
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(user):  # the producer is the current (user) stream, not the default
        torch.cuda._sleep(SLOW_NS)
        t = x * 3
        h = delayed.offload(t)  # streams=None: the current stream
        del t
        out = h.reload()
        y = out + 0
    user.synchronize()
    assert torch.equal(y, x * 3)


# Seed 001 (diffusers group offloading): the onload ran on a transfer stream and the compute on a
# stream that never waited for it (the code assumed the default stream was the compute stream).
def test_group_offloading_with_a_user_stream_current(delayed):
    torch.manual_seed(0)
    ref = Model().cuda().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(8, 128, 512, device="cuda")
    with torch.no_grad():
        want = ref(x)
    w = tt.apply_group_offloading(model, onload_device="cuda", offload_type="block_level",
                                  num_blocks_per_group=2, use_stream=True, client=delayed)
    user = torch.cuda.Stream()
    with torch.cuda.stream(user), torch.no_grad():
        torch.cuda._sleep(SLOW_NS)
        got = model(x)
    user.synchronize()
    assert torch.equal(got, want)
    w.remove()


# Seed 002 (Megatron fine-grained activation offload): offload and reload events recorded and
# waited on the transfer streams by a manager, not by the streams that produce and consume, so a
# module's activations could be read back before the copy landed. Selection by module name, as
# Megatron users list modules, under a user stream.
def test_selected_modules_offload_and_reload_on_the_compute_stream(delayed):
    torch.manual_seed(1)
    ref = Model().cuda()
    model = copy.deepcopy(ref)
    x = torch.randn(8, 128, 512, device="cuda")
    ref(x).square().mean().backward()
    want = _grads(ref)
    user = torch.cuda.Stream()
    with torch.cuda.stream(user):
        off = tt.offload_activations(min_bytes=0, client=delayed, module=model,
                                     modules=["blocks.*.fc1", "blocks.*.norm"])
        with off:
            loss = model(x).square().mean()
        loss.backward()
    user.synchronize()
    for g, w in zip(_grads(model), want):
        assert torch.equal(g, w)
    assert off.stats.offloaded_storages > 0


# Seed 003 (torchtune OffloadActivations): with use_streams the consumer of a reloaded activation
# did not wait for the H2D copy, and freed sources were reused before the D2H copy read them.
def test_torchtune_offload_activations_with_streams(delayed):
    torch.manual_seed(2)
    ref = Model().cuda()
    model = copy.deepcopy(ref)
    x = torch.randn(8, 128, 512, device="cuda")
    nn.functional.cross_entropy(ref(x).flatten(0, 1), torch.zeros(8 * 128, dtype=torch.long,
                                                                  device="cuda")).backward()
    want = _grads(ref)
    ctx = tt.OffloadActivations(use_streams=True, min_offload_size=1024, client=delayed)
    with ctx:
        logits = model(x)
        # Memory the allocator could hand out again while the copies still run.
        junk = [torch.full((1024, 1024), 7.0, device="cuda") for _ in range(8)]
    # The copies land (5 ms each under delay injection): backward then reloads and prefetches
    # every storage, none is taken from a source still being copied.
    delayed.synchronize()
    nn.functional.cross_entropy(logits.flatten(0, 1), torch.zeros(8 * 128, dtype=torch.long,
                                                                  device="cuda")).backward()
    del junk
    for g, w in zip(_grads(model), want):
        assert torch.equal(g, w)
    assert ctx.stats.offloaded_storages > 0 and ctx.stats.prefetches > 0


# Seed 004 (DeepSpeed ZeRO 1/2): a reduction of a bucket filled by several producer streams
# waited on one of them only. Here one tensor is written by two streams (one half each) and
# offloaded naming both: the copy must wait for the slower one.
def test_offload_waits_for_every_producer_stream(delayed):
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    x = torch.randn(4096, 1024, device="cuda")
    bucket = torch.empty_like(x)
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        bucket[:2048].copy_(x[:2048] * 2)
    with torch.cuda.stream(s2):
        torch.cuda._sleep(SLOW_NS)  # the second producer is late
        bucket[2048:].copy_(x[2048:] * 2)
    h = delayed.offload(bucket, streams=[s1, s2])
    out = h.reload()
    assert torch.equal(out, x * 2)


# The optimizer state path on the GPU (issue 14): bit-identical parameters under delay.
def test_optimizer_state_offload_identical_on_the_gpu(delayed):
    torch.manual_seed(3)
    ref = Model().cuda()
    model = copy.deepcopy(ref)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tt.offload_optimizer_state(opt, group_bytes=8 << 20, prefetch=1, client=delayed):
        for step in range(3):
            x = torch.randn(8, 128, 512, device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(step))
            for m, o in ((ref, ref_opt), (model, opt)):
                o.zero_grad()
                m(x).square().mean().backward()
                o.step()
            for a, b in zip(ref.parameters(), model.parameters()):
                assert torch.equal(a, b)


def test_checkpoint_of_cuda_state_is_the_state_at_save_time(delayed):
    """tier.torch.checkpoint on the GPU: the parameters are written by a slow kernel, saved, and
    updated in place right after save returns, all on the current stream, with every tierd copy
    5 ms late. The saved version must hold the values between the two: the save's copy waited for
    the writer, and the update waited for the copy."""
    w = torch.zeros(4 << 20, device="cuda")
    torch.cuda._sleep(SLOW_NS)
    w.fill_(3.0)  # the producer, late on the stream
    h = tt.checkpoint.save({"w": w, "step": 7}, "gpu/ckpt", client=delayed)
    w.fill_(4.0)  # the next step's in-place update
    h.wait(timeout=60)
    torch.cuda.synchronize()
    state = tt.checkpoint.load("gpu/ckpt", client=delayed)
    assert state["w"].device == w.device and state["step"] == 7
    assert torch.equal(state["w"], torch.full_like(w, 3.0))
    assert torch.equal(w, torch.full_like(w, 4.0))
    tt.checkpoint.delete("gpu/ckpt", client=delayed)
