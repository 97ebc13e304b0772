"""Tierd in Hugging Face transformers' Trainer, in one line::

    from tier.hf import TierCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[TierCallback(activations=True, optimizer_state=True)])

``activations``: tensors saved for backward in each step's forwards go to Tierd
(tier.torch.offload_activations; ``min_bytes``, ``prefetch``, or a budget: ``max_overhead``,
``target_bytes``). ``optimizer_state``: the optimizer's state lives in Tierd between steps
(tier.torch.offload_optimizer_state; ``group_bytes``, ``optimizer_prefetch``); the Trainer's
own checkpoints (``optimizer.state_dict()``) still see ordinary tensors. Losses and parameters
are those of the same Trainer without the callback.
"""

from transformers import TrainerCallback

from ._trainer_hooks import TrainerOffload


class TierCallback(TrainerCallback):
    """See the module docstring. ``.offload.stats`` says what moved."""

    def __init__(self, activations=True, optimizer_state=False, **kwargs):
        self.offload = TrainerOffload(activations=activations, optimizer_state=optimizer_state,
                                      **kwargs)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        # The optimizer exists by now (Trainer creates it before this event); under accelerate
        # it is wrapped, and its step() calls the torch optimizer's, which Tierd patched.
        self.offload.begin(model, [optimizer] if optimizer is not None else [])

    def on_step_begin(self, args, state, control, **kwargs):
        # Once per optimizer step, before its first micro-batch: the forwards of every
        # micro-batch of the step run inside (each backward takes back what its forward sent).
        self.offload.step_begin()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.offload.forward_done()

    def on_step_end(self, args, state, control, **kwargs):
        self.offload.forward_done()  # (a Trainer without on_pre_optimizer_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.offload.end()
