"""A module whose saved tensors change from step to step, for the planner's and the budget's
tests of plans by position (tests/test_plan_activations.py, tests/test_torch_budget.py)."""

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
