"""The model block the examples train: pre-norm MLP with a residual (LayerNorm, Linear d->4d, GELU,
Linear 4d->d). Small enough to train in seconds, large enough that its saved activations and
optimizer state are worth offloading."""
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))
