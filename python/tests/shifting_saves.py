"""Modules whose saved tensors change from step to step, for the planner's and the budget's
tests of plans by position (tests/test_plan_activations.py, tests/test_torch_budget.py)."""

import torch
import torch.nn as nn


class SavesMoreEachCall(nn.Module):
    """Saves one tensor more at every call (data-dependent control flow, as a router or an early
    exit makes it): no planned step saves what calibration saw."""

    def __init__(self, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.fc(x)
        for _ in range(self.calls):
            h = h.sin()
        return x + h


class SwapsACandidateForAParameter(nn.Module):
    """Saves as many tensors at every call, but at one of them the second factor of a product is
    a parameter (no candidate: it stays resident) on every other call and an activation on the
    rest (`activation_first`: on the first call): the same number of saves, another candidate
    count."""

    def __init__(self, activation_first, d=64):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.w = nn.Parameter(torch.ones(d) * 0.5)
        self.activation_first = activation_first
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = self.fc(x).sin()
        activation = (self.calls % 2 == 1) == self.activation_first
        other = self.w * 1.0 if activation else self.w  # (a product with a number saves nothing)
        return (h * other).sin()
