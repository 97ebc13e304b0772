"""FSDP2 (torch.distributed.fsdp.fully_shard) with and without Tierd, one process per rank.

`run_world(world, socket, device, scenarios)` spawns `world` ranks (gloo on CPU, NCCL on CUDA),
each of which trains the same small model from the same seed once per scenario:

  plain       FSDP2 alone (the reference)
  optimizer   tier.torch.offload_optimizer_state on the sharded optimizer (DTensor state)
  activations tier.torch.offload_activations around each forward
  both        the two together
  dcp         plain training, a sharded checkpoint written to tierd through
              torch.distributed.checkpoint (tier.torch.dcp), the model and optimizer scrambled,
              the checkpoint loaded back, training goes on

and returns, per rank and scenario, the losses and the full (unsharded) parameters at the end,
for the caller to compare bit for bit. A watchdog dumps every stack and fails a rank that hangs.
"""

import faulthandler
import os
import socket as _socket
import sys
import tempfile
import traceback

import torch
import torch.multiprocessing as mp
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 3
WATCHDOG_S = 240


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d=32, blocks=3):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(blocks))
        self.out = nn.Linear(d, 4)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def free_port():
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(device, rank):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    d = 256 if device.type == "cuda" else 32
    model = Net(d=d).to(device)
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, opt


def _batch(step, rank, device):
    g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own data
    return (torch.randn(16, 8, generator=g).to(device), torch.randn(16, 4, generator=g).to(device))


def _full_params(model):
    return {n: p.full_tensor().detach().cpu().clone() for n, p in model.named_parameters()}


def _train(model, opt, steps, rank, device, act=None, start=0):
    losses = []
    for step in range(start, start + steps):
        x, y = _batch(step, rank, device)
        opt.zero_grad()
        if act is not None:
            with act:
                loss = nn.functional.mse_loss(model(x), y)
        else:
            loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu().item())
    return losses


def _scenario(name, device, rank, client):
    import tier.torch as tt
    model, opt = _build(device, rank)
    act = None
    off = None
    if name in ("optimizer", "both"):
        # Small groups: several groups per step, each of several DTensor shards.
        off = tt.offload_optimizer_state(opt, group_bytes=16 << 10, prefetch=1, min_bytes=64,
                                         client=client)
    if name in ("activations", "both"):
        act = tt.offload_activations(min_bytes=1024, client=client, module=model)
    losses = _train(model, opt, STEPS, rank, device, act)
    extra = {}
    if off is not None:
        extra["offloaded"] = off.stats.offloads
        # state_dict() sees DTensors again, of the right shape
        sd = opt.state_dict()
        shapes = [tuple(v.shape) for st in sd["state"].values() for k, v in st.items()
                  if k == "exp_avg"]
        extra["state_shapes"] = shapes
        off.remove()
    if act is not None:
        extra["act_offloaded"] = act.stats.offloaded_storages
    params = _full_params(model)
    if name == "plain":  # on, uninterrupted: what the dcp scenario must match after its restore
        extra["losses2"] = losses + _train(model, opt, STEPS, rank, device, start=STEPS)
        extra["params2"] = _full_params(model)
    if name == "dcp":
        extra.update(_dcp_round_trip(model, opt, rank, device, client))
        extra["losses2"] = losses + _train(model, opt, STEPS, rank, device, start=STEPS)
        extra["params2"] = _full_params(model)
    return {"losses": losses, "params": params, **extra}


def _dcp_round_trip(model, opt, rank, device, client):
    """Save the sharded model and optimizer state to tierd through DCP, scramble both, load."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    import tier.torch as tt
    msd, osd = get_state_dict(model, opt)
    name = "fsdp-test/w%d" % dist.get_world_size()
    dcp.save({"model": msd, "optim": osd}, storage_writer=tt.dcp.TierWriter(name, client=client))
    before = _full_params(model)
    with torch.no_grad():  # scramble: the load must bring every byte back
        for p in model.parameters():
            p.to_local().add_(1.0)
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    (v.to_local() if hasattr(v, "to_local") else v).mul_(3.0)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=tt.dcp.TierReader(name, client=client))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    after = _full_params(model)
    same = all(torch.equal(before[k], after[k]) for k in before)
    dist.barrier()
    if rank == 0:
        tt.dcp.delete(name, client=client)
    return {"dcp_restored_params": same}


def _rank_main(rank, world, port, socket, device_type, scenarios, out_dir):
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    sys.path.insert(0, os.path.dirname(HERE))
    result_path = os.path.join(out_dir, "rank%d.pt" % rank)
    try:
        import torch.distributed as dist
        import tier
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        if device_type == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
            backend = "nccl"
        else:
            device = torch.device("cpu")
            backend = "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world)
        results = {}
        with tier.Client(socket=socket, name="fsdp-rank%d" % rank) as client:
            for name in scenarios:
                results[name] = _scenario(name, device, rank, client)
                dist.barrier()
        dist.destroy_process_group()
        torch.save(results, result_path)
    except BaseException:
        with open(result_path + ".err", "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        faulthandler.cancel_dump_traceback_later()


def run_world(world, socket, device_type, scenarios):
    """{rank: {scenario: result}} of `world` ranks; raises with the ranks' tracebacks if any
    rank failed."""
    out_dir = tempfile.mkdtemp(prefix="tier-fsdp-")
    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main,
                         args=(r, world, port, socket, device_type, scenarios, out_dir))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(WATCHDOG_S + 60)
    errors = []
    results = {}
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            p.join()
        path = os.path.join(out_dir, "rank%d.pt" % r)
        if os.path.exists(path + ".err"):
            with open(path + ".err") as f:
                errors.append("rank %d:\n%s" % (r, f.read()))
        elif p.exitcode != 0 or not os.path.exists(path):
            errors.append("rank %d exited with %s (watchdog: stacks above)" % (r, p.exitcode))
        else:
            results[r] = torch.load(path)
    if errors:
        raise AssertionError("FSDP2 ranks failed:\n" + "\n".join(errors))
    return results


def check_identical(results, scenarios):
    """Every scenario's losses and final parameters equal the plain run's, bit for bit, on
    every rank; returns a short summary."""
    lines = []
    for rank, by_name in sorted(results.items()):
        plain = by_name["plain"]
        for name in scenarios:
            if name == "plain":
                continue
            got = by_name[name]
            keys = ("losses", "params") + (("losses2", "params2") if name == "dcp" else ())
            for key in keys:
                if key.startswith("losses"):
                    assert got[key] == plain[key], (rank, name, key, got[key], plain[key])
                else:
                    for k, v in plain[key].items():
                        assert torch.equal(v, got[key][k]), (rank, name, key, k)
            if name == "dcp":
                assert got["dcp_restored_params"], (rank, "the DCP load changed parameters")
            lines.append("rank %d %s: %d losses and the parameters identical%s" % (
                rank, name, len(got.get("losses2", got["losses"])),
                "".join(", %s=%s" % (k, got[k]) for k in sorted(got)
                        if k not in ("losses", "params", "losses2", "params2",
                                     "state_shapes"))))
    return lines
