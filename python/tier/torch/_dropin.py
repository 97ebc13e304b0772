"""Drop-in surfaces for the offloaders users already know, over tier.torch's own: a torchtune or
torchtitan recipe, or a diffusers pipeline, switches to Tierd by changing one import.

* ``OffloadActivations`` / ``NoOpManager`` / ``get_act_offloading_ctx_manager``: torchtune's
  activation offloading (torchtune.training), with its arguments.
* ``CPUOffloadOptimizer``: torchao's optimizer offload, as torchtune recipes configure it.
* ``apply_group_offloading``: diffusers' group offloading (diffusers.hooks), block level and leaf
  level, for inference of a model whose weights do not fit.

The arguments that tune the original's own copy machinery are accepted and checked, and say what
Tierd does instead: Tierd's pool is pinned once at start (``use_pin_memory``), the daemon keeps
each source alive until its copy has read it (``max_fwd_stash_size``, ``record_stream``), and
every wait is a GPU-side stream wait on whatever stream is current (the seeds' bugs were waits
recorded on the wrong stream and a default-stream assumption).
"""

import contextlib

import torch

from ._activations import ActivationOffloader, no_offload
from ._optimizer_state import offload_optimizer_state
from ._weights import offload_module_weights

# ---- torchtune ---------------------------------------------------------------------------------


class OffloadActivations(ActivationOffloader):
    """torchtune's ``OffloadActivations`` through Tierd::

        from tier.torch import OffloadActivations   # was: from torchtune.training import ...
        with OffloadActivations():
            logits = model(tokens)
        loss_fn(logits, labels).backward()

    ``min_offload_size``: saved tensors smaller than this many bytes stay (torchtune's default,
    1024). ``use_streams``: reloads overlap backward, the next two started ahead (False: each
    reload when needed). ``use_pin_memory`` and ``max_fwd_stash_size`` are accepted (checked) and
    have nothing left to do: the pool is pinned, and each source stays alive until the daemon's
    copy read it.
    """

    def __init__(self, use_pin_memory=True, use_streams=True, max_fwd_stash_size=5,
                 min_offload_size=1024, client=None, module=None):
        if not isinstance(use_pin_memory, bool) or not isinstance(use_streams, bool):
            raise TypeError("use_pin_memory and use_streams are bools")
        if int(max_fwd_stash_size) < 1:
            raise ValueError("max_fwd_stash_size must be >= 1, got %r" % (max_fwd_stash_size,))
        if int(min_offload_size) < 0:
            raise ValueError("min_offload_size must be >= 0, got %r" % (min_offload_size,))
        super().__init__(min_bytes=int(min_offload_size), prefetch=2 if use_streams else 0,
                         client=client, module=module)
        self.use_pin_memory = use_pin_memory
        self.use_streams = use_streams
        self.max_fwd_stash_size = int(max_fwd_stash_size)


def NoOpManager():  # noqa: N802 - torchtune's name
    """torchtune's ``NoOpManager``: saved tensors inside stay where they are."""
    return no_offload()


class _HeadKeepingOffload(OffloadActivations):
    """OffloadActivations that leaves one module's saved tensors alone while active."""

    def __init__(self, head, **kwargs):
        super().__init__(**kwargs)
        self._head = head
        self._head_hooks = []
        self._head_noop = []

    def __enter__(self):
        result = super().__enter__()
        self._head_hooks = [self._head.register_forward_pre_hook(self._enter_head),
                            self._head.register_forward_hook(self._leave_head)]
        return result

    def __exit__(self, *exc):
        for hook in self._head_hooks:
            hook.remove()
        self._head_hooks = []
        return super().__exit__(*exc)

    def _enter_head(self, module, args):
        noop = NoOpManager()
        noop.__enter__()
        self._head_noop.append(noop)

    def _leave_head(self, module, args, output):
        self._head_noop.pop().__exit__(None, None, None)


def get_act_offloading_ctx_manager(model, enable_activation_offloading, client=None):
    """torchtune's ``get_act_offloading_ctx_manager``: an :class:`OffloadActivations` for
    ``model`` when enabled, else a context that does nothing. As torchtune's does, the activations
    of ``model.output`` (the head, whose saved tensors backward needs first) stay resident."""
    if not enable_activation_offloading:
        return contextlib.nullcontext()
    head = getattr(model, "output", None)
    if isinstance(head, torch.nn.Module):
        return _HeadKeepingOffload(head, client=client, module=model)
    return OffloadActivations(client=client, module=model)


# ---- torchtune's optimizer offload (torchao's CPUOffloadOptimizer) -------------------------------

def CPUOffloadOptimizer(params, optimizer_class=torch.optim.AdamW, *,  # noqa: N802 - torchao's
                        offload_gradients=False, group_bytes=None, prefetch=1, client=None,
                        **kwargs):
    """torchao's ``CPUOffloadOptimizer`` (what torchtune recipes name in their ``optimizer``
    config) through Tierd: ``optimizer_class(params, **kwargs)`` whose state lives in Tierd
    between steps (host memory, NVMe past the pool), streamed back group by group in ``step()``
    (tier.torch.offload_optimizer_state). A recipe switches by changing the component::

        optimizer:
          _component_: tier.torch.CPUOffloadOptimizer   # was torchao.prototype...
          optimizer_class: torch.optim.AdamW
          lr: 2e-5

    The update runs on the GPU (torchao's runs on the CPU), so it is the optimizer's own
    arithmetic: parameters are bit-identical to ``optimizer_class`` without offload. Returns
    the optimizer itself (its ``step``, ``state_dict`` and ``load_state_dict`` go through
    Tierd; ``optimizer._tier_state_offloader.remove()`` undoes it). ``offload_gradients=True``
    is refused: gradients stay on the GPU (Tierd does not move them).
    """
    if offload_gradients:
        raise ValueError("CPUOffloadOptimizer(offload_gradients=True): Tierd keeps the "
                         "optimizer state out of GPU memory, not the gradients; pass False")
    if isinstance(optimizer_class, str):
        module, _, name = optimizer_class.rpartition(".")
        optimizer_class = getattr(__import__(module or "torch.optim", fromlist=[name]), name)
    optimizer = optimizer_class(params, **kwargs)
    extra = {} if group_bytes is None else {"group_bytes": int(group_bytes)}
    offload_optimizer_state(optimizer, prefetch=prefetch, client=client, **extra)
    return optimizer


# ---- diffusers ---------------------------------------------------------------------------------

_OFFLOAD_TYPES = ("block_level", "leaf_level")


def _leaves(module):
    """Modules without children that hold parameters or buffers, in registration order."""
    return [m for m in module.modules()
            if not any(True for _ in m.children())
            and (any(True for _ in m.parameters(recurse=False))
                 or any(True for _ in m.buffers(recurse=False)))]


def _device_of(module):
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")


def apply_group_offloading(module, onload_device=None, offload_device=None,
                           offload_type="block_level", num_blocks_per_group=None,
                           non_blocking=False, use_stream=False, record_stream=False,
                           low_cpu_mem_usage=False, client=None):
    """diffusers' ``apply_group_offloading`` through Tierd: the weights live in Tierd (host
    memory, NVMe past the pool) and come back one group ahead of use, the current stream
    (whichever it is) waiting for them on the GPU only where the group runs::

        from tier.torch import apply_group_offloading   # was: from diffusers.hooks import ...
        apply_group_offloading(pipe.transformer, onload_device="cuda",
                               offload_type="block_level", num_blocks_per_group=2)
        with torch.no_grad():
            image = pipe(prompt).images[0]

    ``offload_type``: "block_level" (groups of ``num_blocks_per_group`` blocks, the module's
    largest ModuleList) or "leaf_level" (every module without children that has weights is a
    group; weights held directly by a module with children stay resident).
    ``onload_device``: where the module runs; it must be where its weights are now (Tierd keeps
    the offloaded copy itself, so there is no separate ``offload_device``: "cpu" or None).
    ``non_blocking``, ``use_stream``, ``record_stream`` and ``low_cpu_mem_usage`` are accepted:
    the next group is always onloaded one ahead, with the ordering done on the GPU.
    Returns the :class:`~tier.torch.WeightOffloader` (``.remove()`` undoes it).
    """
    if offload_type not in _OFFLOAD_TYPES:
        raise ValueError("offload_type must be one of %s, got %r" % (_OFFLOAD_TYPES, offload_type))
    if offload_device is not None and torch.device(offload_device).type != "cpu":
        raise ValueError("offload_device: Tierd keeps offloaded weights in host memory (or NVMe); "
                         "got %r" % (offload_device,))
    here = _device_of(module)
    if onload_device is not None and torch.device(onload_device) != here:
        want = torch.device(onload_device)
        if not (want.type == here.type and want.index is None):
            raise ValueError(
                "onload_device %s: the module's weights are on %s; move the module to where it "
                "runs first (module.to(%r)): Tierd then keeps them between uses" %
                (want, here, str(want)))
    if offload_type == "block_level":
        if num_blocks_per_group is None or int(num_blocks_per_group) < 1:
            raise ValueError("block_level offloading needs num_blocks_per_group >= 1")
        return offload_module_weights(module, group=int(num_blocks_per_group), client=client)
    return offload_module_weights(module, group=1, client=client, blocks=_leaves(module))
