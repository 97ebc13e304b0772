"""Tierd inside CUDA graph capture, on the GPU (tier/_cuda_graphs.py): refused with a message
naming the case (the client's tensor API), or avoided (activation offload keeps the captured
step's saved tensors on the GPU, warning once; torch.compile mode="reduce-overhead" runs
Tierd's graphs without CUDA graphs), never undefined.

    python3 -m pytest -q -s python/tests/gpu/test_cuda_graphs_gpu.py"""

import os
import warnings

import pytest

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available: GPU tests skipped", allow_module_level=True)

import torch.nn as nn  # noqa: E402

import tier  # noqa: E402
import tier.torch as tt  # noqa: E402
from conftest import Daemon  # noqa: E402


@pytest.fixture(scope="module")
def client():
    d = Daemon(pool_bytes="4G", pool_lock="best-effort")
    with tier.Client(socket=d.socket, name="cuda-graphs-gpu") as c:
        assert c.engine == "cuda", "build tierd with CUDA for these tests"
        yield c
    assert d.stop() == 0


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()


def test_offload_inside_a_capture_is_refused(client):
    x = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2  # warm up
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(tier.FailedPrecondition, match="CUDA graph capture") as e:
        with torch.cuda.graph(g):
            y = x * 2
            client.offload(y)
    print("refused: %s" % e.value)
    h = client.offload(x * 3)  # outside a capture it works, the client intact
    assert torch.equal(h.reload(), x * 3)


def test_whole_step_capture_with_activation_offload(client):
    model = _model()
    static_x = torch.randn(64, 1024, device="cuda")
    ref_loss = model(static_x).square().mean()
    ref_loss.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    # No graph of an eager step may outlive it: a live one keeps the parameters' AccumulateGrad
    # nodes of the default stream, and the captured backward would then make the legacy stream
    # wait on the capturing one (cudaErrorStreamCaptureImplicit), as PyTorch warns.
    ref_loss = ref_loss.detach()
    off = tt.offload_activations(min_bytes=1 << 16, client=client)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (not captured): offloaded as usual
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            with off:
                loss = model(static_x).square().mean()
            loss.backward()
    del loss
    torch.cuda.current_stream().wait_stream(side)
    offloaded_warm = off.stats.offloaded_storages
    model.zero_grad(set_to_none=True)
    g = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(g):
            with off:
                static_loss = model(static_x).square().mean()
            static_loss.backward()
    loud = [w for w in caught if "CUDA graph capture" in str(w.message)]
    assert len(loud) == 1, [str(w.message) for w in caught]
    assert off.stats.offloaded_storages == offloaded_warm  # nothing offloaded in the capture
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_loss, ref_loss)
    for p, r in zip(model.parameters(), ref_grads):
        assert torch.equal(p.grad, r)
    print("whole-step capture: %d saved tensors kept on the GPU, replay identical"
          % off._capture.kept)


def test_compile_reduce_overhead_with_offload(client):
    model = _model()
    x = torch.randn(64, 1024, device="cuda")
    torch._dynamo.reset()
    ref = torch.compile(model, mode="reduce-overhead")
    ref_losses = []
    for _ in range(3):
        ref_losses.append(ref(x).square().mean().item())
    torch._dynamo.reset()
    compiled = torch.compile(model, mode="reduce-overhead")
    off = tt.offload_activations(min_bytes=1 << 16, client=client)
    losses = []
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        with off:
            loss = compiled(x).square().mean()
        loss.backward()
        losses.append(loss.item())
    assert losses == ref_losses
    torch._dynamo.reset()
    from tier.torch import _compile
    _compile.uninstall()
