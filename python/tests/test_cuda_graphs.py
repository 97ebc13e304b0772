"""CUDA graph capture detection, on CPU: the capture check is mocked (tier/_cuda_graphs.py asks
torch.cuda.is_current_stream_capturing on a real GPU; python/tests/gpu/test_cuda_graphs_gpu.py
captures for real). Inside a capture the client refuses with a message naming the case, and
activation offload keeps the saved tensors where they are, warning once."""

import warnings

import pytest
import torch

import tier
import tier.torch as tt
from tier import _cuda_graphs


@pytest.fixture()
def capturing(monkeypatch):
    monkeypatch.setattr(_cuda_graphs, "_capturing", lambda device: device is not None)


def test_not_capturing_without_cuda():
    assert not _cuda_graphs.capturing(torch.device("cpu"))
    assert not _cuda_graphs.capturing(None)


def test_client_refuses_inside_a_capture(client, capturing):
    t = torch.randn(1024)
    with pytest.raises(tier.FailedPrecondition, match="CUDA graph capture.*reduce-overhead"):
        client.offload(t)
    with pytest.raises(tier.FailedPrecondition, match="CUDA graph capture"):
        client.offload_batch([t, t + 1])


def test_client_refuses_a_reload_inside_a_capture(client, monkeypatch):
    h = client.offload(torch.randn(1024))
    h.wait()
    monkeypatch.setattr(_cuda_graphs, "_capturing", lambda device: device is not None)
    with pytest.raises(tier.FailedPrecondition, match="CUDA graph capture"):
        h.reload()
    with pytest.raises(tier.FailedPrecondition, match="CUDA graph capture"):
        client.reload_batch([h])
    monkeypatch.setattr(_cuda_graphs, "_capturing", lambda device: False)
    assert h.reload().shape == (1024,)  # the capture over: the object is intact


def test_activation_offload_keeps_tensors_inside_a_capture(client, capturing):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64))
    x = torch.randn(32, 64)
    ref = model(x).sum()
    ref.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    off = tt.offload_activations(min_bytes=1024, client=client)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            with off:
                loss = model(x).sum()
            loss.backward()
    loud = [w for w in caught if "CUDA graph capture" in str(w.message)]
    assert len(loud) == 1, [str(w.message) for w in caught]  # once, however often
    assert off.stats.offloaded_storages == 0 and off.stats.kept > 0
    assert torch.equal(loss, ref)
    for p, g in zip(model.parameters(), ref_grads):
        assert torch.equal(p.grad, 2 * g)
