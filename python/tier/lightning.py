"""Tierd in PyTorch Lightning, in one line::

    from tier.lightning import TierCallback
    trainer = L.Trainer(..., callbacks=[TierCallback(activations=True, optimizer_state=True)])

``activations``: tensors saved for backward by each ``training_step``'s forward go to Tierd
(tier.torch.offload_activations; ``min_bytes``, ``prefetch``, or a budget: ``max_overhead``,
``target_bytes``). ``optimizer_state``: the state of the trainer's optimizers lives in Tierd
between steps (tier.torch.offload_optimizer_state; ``group_bytes``, ``optimizer_prefetch``);
Lightning's checkpoints still see ordinary tensors. Losses and parameters are those of the same
Trainer without the callback. Works with ``lightning`` and ``pytorch_lightning``.
"""

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback

from ._trainer_hooks import TrainerOffload


class TierCallback(Callback):
    """See the module docstring. ``.offload.stats`` says what moved."""

    def __init__(self, activations=True, optimizer_state=False, **kwargs):
        super().__init__()
        self.offload = TrainerOffload(activations=activations, optimizer_state=optimizer_state,
                                      **kwargs)

    def on_train_start(self, trainer, pl_module):
        # Optimizers are set up by now; Lightning's optimizer.step(closure) reaches the torch
        # optimizer's step, which Tierd patched (the closure runs first: forward and backward).
        self.offload.begin(pl_module, trainer.optimizers)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.offload.step_begin()

    def on_before_backward(self, trainer, pl_module, loss):
        # training_step's forward is done: its saved tensors went out; backward takes them back.
        self.offload.forward_done()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.offload.forward_done()  # (manual optimization without a backward through here)

    def on_train_end(self, trainer, pl_module):
        self.offload.end()

    def on_exception(self, trainer, pl_module, exception):
        self.offload.forward_done()
