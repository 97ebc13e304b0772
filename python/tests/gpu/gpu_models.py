"""What the GPU test modules share: the delay-injected tierd they run against and a small MLP.

`delayed_client(name)` yields a client of a tierd whose every copy lands 5 ms late, so a missing
wait shows as a wrong value, not a rare race."""

import tier
import torch
import torch.nn as nn
from conftest import Daemon

SLOW_NS = 20_000_000  # a producer kernel that runs ~20 ms: any copy not waiting for it is early


def delayed_client(name):
    d = Daemon(pool_bytes="4G", pool_lock="best-effort", extra=["--copy_delay_us=5000"])
    with tier.Client(socket=d.socket, name=name) as c:
        assert c.engine == "cuda", "build tierd with CUDA for these tests"
        yield c
    assert d.stop() == 0


class Block(nn.Module):
    def __init__(self, d=512):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, d=512, blocks=6):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(blocks))
        self.output = nn.Linear(d, 16)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.output(x)
