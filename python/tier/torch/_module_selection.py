"""Which modules' saved tensors to offload (tier.torch.offload_activations(modules=...)): the way
Megatron users list modules to offload, and torchtune users wrap parts of a model.

A selection is a list of module classes (every instance under the root), module instances, or
strings: shell-style patterns over the qualified names of the root's modules (``"layers.*.mlp"``,
``"*.input_layernorm"``). While one of the selected modules runs its forward, saved tensors are
offloaded; elsewhere they stay.

Megatron's names for what to offload map onto modules as follows (HF-style Llama/Mixtral names;
for another model, print ``[n for n, _ in model.named_modules()]`` and pick the same parts):

| Megatron ``offload_modules`` | what it is | a selection |
|---|---|---|
| ``attn_norm`` | the norm before attention | ``"*.input_layernorm"`` |
| ``core_attn`` | attention itself (QK^T, softmax, PV) | ``"*.self_attn"`` (or its core module) |
| ``mlp_norm`` | the norm before the MLP / MoE | ``"*.post_attention_layernorm"`` |
| ``expert_fc1`` | the experts' first projection | ``"*.experts.*.w1"`` / ``"*.mlp.up_proj"`` |
| ``moe_act`` | the experts' activation function | ``"*.experts.*.act_fn"`` |
"""

import fnmatch
import threading

import torch


class ModuleSelection:
    def __init__(self, root, spec):
        if isinstance(spec, (str, type, torch.nn.Module)):
            spec = [spec]
        self._modules = []
        seen = set()

        def take(m):
            if id(m) not in seen:
                seen.add(id(m))
                self._modules.append(m)

        for item in spec:
            if isinstance(item, torch.nn.Module):
                take(item)
            elif isinstance(item, type) and issubclass(item, torch.nn.Module):
                if root is None:
                    raise ValueError("selecting modules by class needs module=<the model>")
                found = [m for m in root.modules() if isinstance(m, item)]
                if not found:
                    raise ValueError("modules=: no %s in the model" % item.__name__)
                for m in found:
                    take(m)
            elif isinstance(item, str):
                if root is None:
                    raise ValueError("selecting modules by name needs module=<the model>")
                found = [m for name, m in root.named_modules() if name and
                         fnmatch.fnmatchcase(name, item)]
                if not found:
                    raise ValueError("modules=: %r matches no module name in the model" % item)
                for m in found:
                    take(m)
            else:
                raise TypeError("modules= takes module classes, modules and name patterns, "
                                "not %s" % type(item).__name__)
        self._local = threading.local()
        self._hooks = []

    @property
    def modules(self):
        return list(self._modules)

    def active(self):
        """Whether a selected module's forward runs on this thread now."""
        return getattr(self._local, "depth", 0) > 0

    def install(self):
        self._local = threading.local()
        for m in self._modules:
            self._hooks.append(m.register_forward_pre_hook(self._enter))
            self._hooks.append(m.register_forward_hook(self._leave))

    def remove(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _enter(self, module, args):
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def _leave(self, module, args, output):
        self._local.depth = max(0, getattr(self._local, "depth", 0) - 1)
