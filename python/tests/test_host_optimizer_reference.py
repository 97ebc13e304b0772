"""The optimizer reference of tests/multigpu/rank_overhead.py (tests/multigpu/host_optimizer.py):
AdamW moved a group at a time through host memory must compute what one AdamW computes, or the
per-rank overhead it bounds would compare different work."""

import os
import sys

import torch

from conftest import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "multigpu"))

from host_optimizer import HostGroupedAdamW  # noqa: E402


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])


def test_grouped_host_adamw_matches_one_adamw():
    a, b = _model(), _model()
    ref = torch.optim.AdamW(a.parameters(), lr=1e-3)
    grouped = HostGroupedAdamW(list(b.parameters()), torch.device("cpu"), group_bytes=40000,
                               lr=1e-3)
    assert len(grouped.opts) > 2  # several groups, prefetch and the host waits exercised
    for step in range(5):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(step))
        for model, opt in ((a, ref), (b, grouped)):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.equal(p, q), "step %d" % step
    # Between steps the state is in host memory, not on the device.
    assert all(host.device.type == "cpu" for group in grouped.host for _, _, host in group)
