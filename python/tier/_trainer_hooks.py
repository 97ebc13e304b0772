"""What the trainer integrations (tier.hf, tier.lightning, tier.torch's recipe pieces) share:
turning Tierd on for one model and its optimizers from a trainer's callbacks, and off again.

``TrainerOffload`` owns the offloaders of one training run: an ActivationOffloader entered
around each step's forwards (the trainer's "step begins" event) and left before the optimizer
step (its saved tensors' hooks are needed only while forward saves them), and an
OptimizerStateOffloader per optimizer (the trainer's own optimizer object, under any wrapper the
trainer put around it). A trainer with gradient accumulation enters once per optimizer step and
runs several forwards inside: each backward takes back what its forward offloaded."""

from . import torch as _tt


def unwrap_optimizer(optimizer):
    """The torch.optim optimizer under a trainer's wrappers (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer: each keeps it in ``.optimizer`` / ``._optimizer``)."""
    seen = set()
    while id(optimizer) not in seen:
        seen.add(id(optimizer))
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    return optimizer


class TrainerOffload:
    """The offloaders of one training run; see the module docstring."""

    def __init__(self, activations=True, optimizer_state=False, min_bytes=_tt.DEFAULT_MIN_BYTES,
                 prefetch=2, group_bytes=_tt.DEFAULT_GROUP_BYTES, optimizer_prefetch=1,
                 client=None, max_overhead=None, target_bytes=None):
        self.activations = bool(activations)
        self.optimizer_state = bool(optimizer_state)
        self._act_kwargs = dict(min_bytes=min_bytes, prefetch=prefetch, client=client,
                                max_overhead=max_overhead, target_bytes=target_bytes)
        self._opt_kwargs = dict(group_bytes=group_bytes, prefetch=optimizer_prefetch,
                                client=client)
        self.activation_offloader = None
        self.optimizer_offloaders = []
        self._optimizer_stats = []  # of every optimizer offloader, also after end()
        self._active = False

    def begin(self, model, optimizers):
        """The run starts: make the offloaders (optimizer state leaves the GPU now)."""
        if self.activations and self.activation_offloader is None:
            self.activation_offloader = _tt.offload_activations(module=model, **self._act_kwargs)
        if self.optimizer_state:
            done = {id(o.optimizer) for o in self.optimizer_offloaders}
            for optimizer in optimizers or ():
                optimizer = unwrap_optimizer(optimizer)
                if optimizer is None or id(optimizer) in done:
                    continue
                done.add(id(optimizer))
                off = _tt.offload_optimizer_state(optimizer, **self._opt_kwargs)
                self.optimizer_offloaders.append(off)
                self._optimizer_stats.append(off.stats)

    def step_begin(self):
        """Before the step's first forward."""
        if self.activation_offloader is not None and not self._active:
            self.activation_offloader.__enter__()
            self._active = True

    def forward_done(self):
        """After the step's forwards (before the optimizer step; or before each backward where
        the trainer runs one forward per step)."""
        if self._active:
            self._active = False
            self.activation_offloader.__exit__(None, None, None)

    def end(self):
        """The run ends: hooks off, optimizer state back on the GPU, Tierd's objects freed."""
        self.forward_done()
        for off in self.optimizer_offloaders:
            off.remove()
        self.optimizer_offloaders = []

    @property
    def stats(self):
        """{"activations": ActivationStats or None, "optimizer": [OptimizerStateStats]}"""
        return {"activations": (self.activation_offloader.stats
                                if self.activation_offloader is not None else None),
                "optimizer": list(self._optimizer_stats)}
