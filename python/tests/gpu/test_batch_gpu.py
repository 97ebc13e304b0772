"""Batched submission on the GPU from Python (issue 12): Client.offload_batch / reload_batch and
their use by tier.torch, under delay injection (every copy 5 ms late, so a missing wait is a
wrong value, not a rare race). On the device:

    python3 -m pytest -q python/tests/gpu/test_batch_gpu.py

Skipped where torch.cuda is unavailable (the same paths on the host engine, with CPU tensors:
python/tests/test_batch.py).
"""

import copy
import os

import pytest

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available: GPU tests skipped", allow_module_level=True)

import tier.torch as tt  # noqa: E402
from batch_counter import Installer  # noqa: E402
from gpu_models import SLOW_NS, Model, delayed_client  # noqa: E402


@pytest.fixture(scope="module")
def delayed():
    yield from delayed_client("batch-gpu")


@pytest.fixture()
def counted(delayed):
    install = Installer()
    yield install(delayed)
    install.restore()


def test_batch_of_two_fresh_producer_streams_reloaded_on_a_side_stream(delayed, counted):
    c = delayed
    x = torch.randn(4096, 1024, device="cuda")  # 16 MiB
    torch.cuda.synchronize()
    for round_ in range(3):
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()  # fresh streams, both producers
        with torch.cuda.stream(s1):
            torch.cuda._sleep(SLOW_NS)
            a = [x * (k + 2) for k in range(3)]
        with torch.cuda.stream(s2):
            torch.cuda._sleep(2 * SLOW_NS)  # the second producer is later still
            b = [x * (k + 10) for k in range(3)]
        hs = c.offload_batch(a + b, streams=[s1, s2])
        assert all(h.direct and h.submitted for h in hs)  # the GPU engine's path
        del a, b  # dropped at once: each job keeps its source until its copy completed
        with torch.cuda.stream(s1):  # memory the allocator could hand out again
            junk = [torch.full((4096, 1024), 7.0, device="cuda") for _ in range(4)]
        with torch.cuda.stream(s2):
            junk += [torch.full((4096, 1024), 9.0, device="cuda") for _ in range(4)]
        side = torch.cuda.Stream()
        outs = c.reload_batch(hs, stream=side, free=round_ == 2)
        with torch.cuda.stream(side):
            ys = [o + 0 for o in outs]  # enqueued right after reload_batch(): no host wait
        side.synchronize()
        for k, y in zip([2, 3, 4, 10, 11, 12], ys):
            assert torch.equal(y, x * k), (round_, k)
        del junk, outs, ys, hs
    # One call each way per round: the six jobs shared one ticket.
    assert counted.sizes["tier_offload_ranges"] == [6] * 3
    assert counted.sizes["tier_reload_ranges"] == [6] * 3


def test_batch_on_the_current_stream_with_a_gathered_view(delayed, counted):
    c = delayed
    x = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    user = torch.cuda.Stream()
    with torch.cuda.stream(user):  # the producer is the current (user) stream
        torch.cuda._sleep(SLOW_NS)
        ts = [x * 3, (x * 5).t(), (x * 7)[::2, 1::3], x * 9]  # two views, gathered first
        assert [t.is_contiguous() for t in ts] == [True, False, False, True]
        hs = c.offload_batch(ts)  # streams=None: the current stream
        del ts
        outs = c.reload_batch(hs)  # onto the current stream, which waits for every copy
        ys = [o + 0 for o in outs]
    user.synchronize()
    want = [x * 3, (x * 5).t(), (x * 7)[::2, 1::3], x * 9]
    for y, w in zip(ys, want):
        assert y.shape == w.shape and torch.equal(y, w)
    assert counted.sizes["tier_offload_ranges"] == [4]
    assert counted.sizes["tier_reload_ranges"] == [4]


def test_weight_offload_in_batches_identical_under_delay(delayed, counted):
    torch.manual_seed(0)
    ref = Model().cuda().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(8, 128, 512, device="cuda")
    with torch.no_grad():
        want = ref(x)
    w = tt.offload_module_weights(model, group=2, client=delayed)
    per_group = 2 * 6  # two blocks of LayerNorm + 2 Linear: 6 tensors each
    assert counted.sizes["tier_offload_ranges"] == [per_group] * 3
    torch.cuda.synchronize()  # x, want: ready before another stream reads them
    # The offloads land first: a weight whose offload is still in flight is used from its source
    # (no reload; test_weight_in_flight_is_used_from_its_source), and here the reloads are tested.
    delayed.synchronize()
    user = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(user), torch.no_grad():
        for _ in range(2):
            torch.cuda._sleep(SLOW_NS)  # the compute stream is late: the onloads must not be
            got.append(model(x))
            for p in model.blocks.parameters():
                assert p.numel() == 0  # between uses the blocks' weights are away
    user.synchronize()
    for y in got:
        assert torch.equal(y, want)
    # Per pass: group 0 onloaded when it runs, groups 1 and 2 prefetched one group ahead (the
    # current stream waits for them where they run): one batch each.
    assert counted.sizes["tier_reload_ranges"] == [per_group] * 6
    assert w.stats.onloads == 6 and w.stats.prefetches == 4, w.stats
    w.remove()
    with torch.no_grad():
        assert torch.equal(model(x), want)


def test_weight_in_flight_is_used_from_its_source(delayed, counted):
    # Onloaded while the offloads are still 5 ms from their copies: the weights never left the
    # GPU, so they are used as they are (a reload then would fail if such an offload failed for
    # room), and the results are the same.
    torch.manual_seed(1)
    ref = Model(blocks=2).cuda().eval()
    model = copy.deepcopy(ref)
    x = torch.randn(4, 64, 512, device="cuda")
    with torch.no_grad():
        want = ref(x)
    torch.cuda.synchronize()
    w = tt.offload_module_weights(model, group=1, client=delayed)
    with torch.no_grad():
        got = model(x)
    assert torch.equal(got, want)
    assert w.stats.source_hits > 0, w.stats
    delayed.synchronize()
    with torch.no_grad():
        assert torch.equal(model(x), want)  # and from Tierd once the copies landed
    w.remove()


def test_activation_prefetch_in_batches_identical_under_delay(delayed, counted):
    torch.manual_seed(1)
    ref = Model().cuda()
    model = copy.deepcopy(ref)
    x = torch.randn(8, 128, 512, device="cuda")
    ref(x).square().mean().backward()
    want = [p.grad.clone() for p in ref.parameters()]
    torch.cuda.synchronize()  # x and the copied model: ready before another stream reads them
    user = torch.cuda.Stream()
    with torch.cuda.stream(user):
        off = tt.offload_activations(min_bytes=0, prefetch=4, client=delayed, module=model,
                                     max_inflight_bytes=8 << 20)
        with off:
            loss = model(x).square().mean()
        delayed.synchronize()  # every offload done: backward reloads (no source hits)
        loss.backward()
    user.synchronize()
    for g, w in zip([p.grad for p in model.parameters()], want):
        assert torch.equal(g, w)
    sizes = counted.sizes["tier_reload_ranges"]
    assert sizes and max(sizes) >= 2, sizes  # several prefetched at once went as one batch
    assert off.stats.prefetches > 0 and off.stats.fallbacks == 0, off.stats


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_batch_over_two_gpus_goes_as_one_batch_per_gpu(delayed, counted):
    c = delayed
    ts = []
    for d in (0, 1):
        with torch.cuda.device(d):
            x = torch.randn(1024, 1024, device="cuda")
            torch.cuda._sleep(SLOW_NS)
            ts += [x * 2, x * 3]
    hs = c.offload_batch([ts[0], ts[2], ts[1], ts[3]])
    assert sorted(counted.sizes["tier_offload_ranges"]) == [2, 2]
    outs = c.reload_batch(hs)
    assert sorted(counted.sizes["tier_reload_ranges"]) == [2, 2]
    for o, t in zip(outs, [ts[0], ts[2], ts[1], ts[3]]):
        assert o.device == t.device
        with torch.cuda.device(o.device):
            assert torch.equal(o + 0, t)
