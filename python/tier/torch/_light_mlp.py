"""light recompute's gated-MLP tail, down_proj(act_fn(gate) * up), as one autograd Function that
saves only gate and up (tier/torch/_plan_activations.BlockModes).

Run as usual, autograd saves gate (for act_fn), act_fn(gate) and up (for the product) and the
product (for down_proj's weight gradient): four tensors of tokens x intermediate a block. Here
backward runs act_fn(gate) * up again (two elementwise kernels) and takes both gradients of the
matmul from it, with the very ops autograd's own formulas for a linear layer use (the input's
gradient ``grad @ weight``, the weight's ``grad^T @ input``, on the flattened tokens), and the
elementwise part's gradients through autograd itself: loss and gradients are bit-identical to the
block run as it is. Against ``torch.utils.checkpoint`` with a selective policy that keeps the
matmul's output (what light did before), it keeps nothing beyond gate and up, and costs the host
one Function call instead of a checkpoint frame and a dispatch mode per op (about 0.6 ms of
host a block on an H200's host, where the 3B Llama's block forward takes 2 ms of GPU).

Only for what it can reproduce exactly: a plain ``nn.Linear`` without bias and without hooks,
plain tensors, outside autocast; :func:`mlp_tail` returns None otherwise and the caller uses the
checkpoint."""

import torch

_Tensor = torch.Tensor
_Linear = torch.nn.Linear
_linear = torch.nn.functional.linear


def _hooked(module):
    from torch.nn.modules import module as m
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or
                getattr(module, "_backward_pre_hooks", None) or
                m._global_forward_hooks or m._global_forward_pre_hooks or
                m._global_backward_hooks or getattr(m, "_global_backward_pre_hooks", None))


def _autocast():
    is_enabled = torch.is_autocast_enabled
    try:
        if is_enabled("cuda") or is_enabled("cpu"):
            return True
    except TypeError:  # (older torch: no device argument)
        return is_enabled() or torch.is_autocast_cpu_enabled()
    return False


def mlp_tail(act, down, gate, up):
    """down(act(gate) * up), saving only gate and up; None where that cannot be exact (the
    caller runs it otherwise)."""
    weight = getattr(down, "weight", None)
    if (type(down) is not _Linear or down.bias is not None or type(gate) is not _Tensor or
            type(up) is not _Tensor or type(weight) not in (_Tensor, torch.nn.Parameter) or
            gate.dim() < 2 or _hooked(down) or _autocast()):
        return None
    return _MlpTail.apply(gate, up, weight, act)


class _MlpTail(torch.autograd.Function):

    @staticmethod
    def forward(ctx, gate, up, weight, act):
        with torch.no_grad():
            out = _linear(act(gate) * up, weight)
        ctx.act = act
        ctx.save_for_backward(gate, up, weight)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        gate, up, weight = ctx.saved_tensors
        need_gate, need_up, need_weight = ctx.needs_input_grad[:3]
        with torch.enable_grad():
            g = gate.detach().requires_grad_(need_gate)
            u = up.detach().requires_grad_(need_up)
            h = ctx.act(g) * u
        grad2 = grad.reshape(-1, grad.shape[-1])
        d_weight = None
        if need_weight:
            # (As autograd's mm backward gives it for weight.t(), transposed back: grad^T @ h.)
            d_weight = grad2.t().mm(h.detach().reshape(-1, h.shape[-1]))
        d_gate = d_up = None
        inputs = [t for t, need in ((g, need_gate), (u, need_up)) if need]
        if inputs:
            d_h = grad2.mm(weight).view(h.shape)
            grads = list(torch.autograd.grad(h, inputs, d_h))
            d_gate = grads.pop(0) if need_gate else None
            d_up = grads.pop(0) if need_up else None
        return d_gate, d_up, d_weight, None
