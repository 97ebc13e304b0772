"""FSDP2 on GPUs (NCCL), 2 and 4 ranks (as many as the machine has, at least 2) against one tierd
with its GPU engine: optimizer state offload of DTensor state (each rank's local shards, copied
by tierd from and to each GPU), activation offload of the sharded model, and a sharded
checkpoint through torch.distributed.checkpoint into tierd (GPU tensors straight from and back
into GPU memory); losses and parameters bit-identical to the same FSDP2 run without Tierd.

    python3 -m pytest -q python/tests/gpu/test_fsdp_gpu.py

Skipped with a message on a machine with fewer than 2 GPUs."""

import os

import pytest

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available: GPU tests skipped", allow_module_level=True)
if torch.cuda.device_count() < 2:
    pytest.skip("FSDP2 GPU tests need at least 2 GPUs (this machine has %d)"
                % torch.cuda.device_count(), allow_module_level=True)
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    import torch.distributed as dist
    if not dist.is_nccl_available():
        raise ImportError("no NCCL")
except Exception as e:  # noqa: BLE001 - ImportError, or an old torch failing to import
    pytest.skip("needs FSDP2 and NCCL: %s" % e, allow_module_level=True)

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import Daemon  # noqa: E402
from fsdp_ranks import check_identical, run_world  # noqa: E402

SCENARIOS = ["plain", "optimizer", "activations", "both", "dcp"]
WORLDS = [w for w in (2, 4) if w <= torch.cuda.device_count()]


@pytest.fixture(scope="module")
def gpu_daemon():
    d = Daemon(pool_bytes="4G", pool_lock="best-effort")
    yield d
    assert d.stop() == 0


@pytest.mark.parametrize("world", WORLDS)
def test_fsdp2_gpu_identical_with_tierd(gpu_daemon, world):
    results = run_world(world, gpu_daemon.socket, "cuda", SCENARIOS)
    print("\n".join(check_identical(results, SCENARIOS)))
    for rank in results:
        assert results[rank]["optimizer"]["offloaded"] > 0
        assert results[rank]["activations"]["act_offloaded"] > 0
