"""FSDP2 (fully_shard) on CPU with gloo, 2 and 4 ranks against one tierd (host engine): optimizer
state offload of DTensor state, activation offload of the sharded model, and a sharded checkpoint
through torch.distributed.checkpoint into tierd (tier.torch.dcp); losses and parameters
bit-identical to the same FSDP2 run without Tierd. The GPU twin (NCCL, 2 GPUs) is
python/tests/gpu/test_fsdp_gpu.py."""

import pytest

torch = pytest.importorskip("torch")
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (torch >= 2.6)
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed as dist
    HAVE_FSDP2 = dist.is_available() and dist.is_gloo_available()
except Exception:  # noqa: BLE001 - ImportError, or an old torch's modules failing to import
    HAVE_FSDP2 = False

pytestmark = pytest.mark.skipif(not HAVE_FSDP2, reason="needs torch with FSDP2 (fully_shard) "
                                                      "and gloo")

from fsdp_ranks import check_identical, run_world  # noqa: E402

SCENARIOS = ["plain", "optimizer", "activations", "both", "dcp"]


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_identical_with_tierd(daemon, world):
    results = run_world(world, daemon.socket, "cpu", SCENARIOS)
    lines = check_identical(results, SCENARIOS)
    print("\n".join(lines))
    for rank in results:
        assert results[rank]["optimizer"]["offloaded"] > 0
        assert results[rank]["activations"]["act_offloaded"] > 0
    daemon.wait_host_used(0)  # every object freed (the checkpoint deleted)
