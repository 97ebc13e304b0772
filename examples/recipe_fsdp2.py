#!/usr/bin/env python3
"""A torchtitan / torchtune-style FSDP2 recipe with Tierd: the optimizer built through
tier.torch.CPUOffloadOptimizer (torchao's name, as a recipe config names it), activations
offloaded with tier.torch.OffloadActivations (torchtune's), and checkpoints through
tier.torch.Checkpointer (every save into tierd, every other one also into a DCP directory).
Trains with and without Tierd; losses and parameters must be identical on every rank, and a
checkpoint saved mid-run must restore the model bit for bit.

    torchrun --nproc_per_node 2 examples/recipe_fsdp2.py            # GPUs (NCCL)
    torchrun --nproc_per_node 2 examples/recipe_fsdp2.py --device cpu   # gloo
"""
import argparse
import contextlib
import os
import sys
import tempfile

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import tier.torch as tt  # noqa: E402
from mlp_block import Block  # noqa: E402


class Model(nn.Module):
    def __init__(self, d, layers):
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.output = nn.Linear(d, d)  # the head: torchtune keeps its activations resident

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.output(x)


def train(device, d, layers, steps, use_tier, ckpt_dir):
    torch.manual_seed(0)
    model = Model(d, layers).to(device)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    if use_tier:
        opt = tt.CPUOffloadOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
        act = tt.get_act_offloading_ctx_manager(model, True)
        ckpt = tt.Checkpointer("recipe-example", dcp_dir=ckpt_dir, dcp_every=2, keep=2)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        act = contextlib.nullcontext()
        ckpt = None
    rank = dist.get_rank()
    losses, saved = [], None
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(8, 256, d, generator=g).to(device)
        opt.zero_grad()
        with act:
            out = model(x)
        loss = nn.functional.mse_loss(out, x)
        loss.backward()
        opt.step()
        losses.append(loss.detach().float().item())
        if ckpt is not None and step % 2 == 1:
            msd, osd = get_state_dict(model, opt)
            ckpt.save({"model": msd, "optim": osd}, step)
            saved = (step, {k: v.full_tensor().cpu() for k, v in msd.items()})
    restored = None
    if ckpt is not None:
        step, want = saved
        with torch.no_grad():
            for p in model.parameters():
                p.to_local().zero_()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        got_step = ckpt.load(state)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        msd, _ = get_state_dict(model, opt)
        restored = got_step == step and all(
            torch.equal(v.full_tensor().cpu(), want[k]) for k, v in msd.items())
        ckpt.delete()
        opt._tier_state_offloader.remove()
    params = {n: p.full_tensor().cpu() for n, p in model.named_parameters()}
    return losses, params, restored


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--d", type=int, default=None)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    cuda = args.device == "cuda"
    rank = int(os.environ.get("RANK", "0"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    d = args.d or (1024 if cuda else 64)
    ckpt_dir = tempfile.mkdtemp(prefix="tier-recipe-") if rank == 0 else None
    box = [ckpt_dir]
    dist.broadcast_object_list(box, src=0)
    ref_losses, ref_params, _ = train(device, d, args.layers, args.steps, False, box[0])
    losses, params, restored = train(device, d, args.layers, args.steps, True, box[0])
    same = losses == ref_losses and all(torch.equal(ref_params[k], params[k]) for k in params)
    print("rank %d: losses %s; with Tierd %s; checkpoint restored bit for bit: %s; %s"
          % (rank, ref_losses, "identical" if same else "MISMATCH %s" % losses, restored,
             "ok" if same and restored else "FAILED"), flush=True)
    ok = torch.tensor([1 if same and restored else 0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    dist.destroy_process_group()
    if rank == 0:
        print("recipe_fsdp2: %s" % ("identical" if ok.item() else "MISMATCH"))
    sys.exit(0 if ok.item() else 1)


if __name__ == "__main__":
    main()
