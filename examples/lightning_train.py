#!/usr/bin/env python3
"""PyTorch Lightning with Tierd in one line: a stack of MLP blocks trained for a few steps with
and without tier.lightning.TierCallback (activation and optimizer state offload); the losses and
the parameters must be identical.

    TIER_SOCKET=/path/to/tierd.sock python3 examples/lightning_train.py [--steps 8]
"""
import argparse
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

try:
    import lightning.pytorch as pl  # noqa: E402
except ImportError:
    import pytorch_lightning as pl  # noqa: E402

from tier.lightning import TierCallback  # noqa: E402
from mlp_block import Block  # noqa: E402


class Net(pl.LightningModule):
    def __init__(self, d=1024, layers=8):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.head = nn.Linear(d, d)
        self.losses = []

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.detach().float().item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def run(steps, callbacks):
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 512, 1024, generator=g),
                                          torch.randn(64, 512, 1024, generator=g))
    module = Net()
    cuda = torch.cuda.is_available()
    trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if cuda else "cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else 0
    return module.losses, {n: p.detach().cpu() for n, p in module.named_parameters()}, peak


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    torch.use_deterministic_algorithms(True, warn_only=True)  # the same kernels both runs
    ref_losses, ref_params, ref_peak = run(args.steps, [])
    cb = TierCallback(activations=True, optimizer_state=True)
    losses, params, peak = run(args.steps, [cb])
    same = losses == ref_losses and all(torch.equal(ref_params[k], params[k]) for k in params)
    act = cb.offload.stats["activations"]
    print("losses without Tierd: %s" % ref_losses)
    print("losses with Tierd:    %s" % losses)
    print("peak GPU memory: %.0f MiB without, %.0f MiB with Tierd; activations offloaded: %.0f "
          "MiB" % (ref_peak, peak, act.offloaded_bytes / 2**20))
    print("lightning_train: %s" % ("identical" if same else "MISMATCH"))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
