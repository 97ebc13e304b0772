"""The `--compile` and `--fsdp N` rows of bench/torch_offload_bench.py and bench/optimizer_bench.py:
the bench's own model and data, trained without Tierd and with it, in the same run.

  compiled none / compiled tierd   torch.compile(model) (Inductor), without Tierd and with it:
                                   activations: tier.torch.compile_options() (the graph offloads
                                   inside, tier/torch/_compile.py); optimizer:
                                   offload_optimizer_state with the compiled model.
  fsdpN none / fsdpN tierd         FSDP2 (fully_shard per block, then the model) on N GPUs,
                                   NCCL, one process per rank: activations: offload_activations;
                                   optimizer: offload_optimizer_state (each rank's DTensor shards).

Columns: step ms (median after the warmup; the slowest rank for FSDP), activation peak MiB
(max_memory_allocated above the step's start; the largest rank's), D2H / H2D MiB per step (what
the offloader counted: compiled ops' offloaded bytes, or the offloader's stats), and whether every
step's loss equals the same-run baseline's bit for bit. CUDA only (skipped with a line on CPU,
or when N exceeds the GPUs)."""

import importlib
import os
import socket as _socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 2 ** 20


def _torch():
    import torch
    return torch


def _model_and_steps(kind, bench, args):
    """(model, optimizer or None, step(model, opt, i) -> loss tensor)"""
    torch = _torch()
    b = importlib.import_module(bench)
    if kind == "activations":
        model = b.make_model(args)
        idx, target = b.make_batch(args)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(model, opt, i, ctx):
            torch.manual_seed(1000 + i)
            with ctx:
                logits = model(idx)
                loss = torch.nn.functional.cross_entropy(logits.float().view(-1, args.vocab),
                                                         target.view(-1))
            return loss
        return model, opt, step
    model, opt = b.build(args)

    def step(model, opt, i, ctx):
        with ctx:
            return model(b.batch(args, i)).square().mean()
    return model, opt, step


def _train(model, opt, step, ctx, steps, warmup, after_step=None):
    torch = _torch()
    losses, times, peaks = [], [], []
    for i in range(warmup + steps):
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        loss = step(model, opt, i, ctx)
        loss.backward()
        opt.step()
        if after_step is not None:
            after_step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            peaks.append(torch.cuda.max_memory_allocated() - base)
        losses.append(loss.item())
    return {"losses": losses, "step_ms": statistics.median(times) * 1e3,
            "act_peak_mib": max(peaks) / MiB}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def compile_rows(kind, bench, args, socket):
    import tier
    import tier.torch as tt
    from tier.torch import _compile
    torch = _torch()
    rows = {}
    client = tier.Client(socket=socket, name="%s-compile" % bench)
    try:
        for name in ("compiled none", "compiled tierd"):
            torch._dynamo.reset()
            model, opt, step = _model_and_steps(kind, bench, args)
            off = None
            if name == "compiled none":
                compiled = torch.compile(model)
            elif kind == "activations":
                compiled = torch.compile(model, options=tt.compile_options(
                    min_bytes=args.min_bytes or (1 << 20), prefetch=args.prefetch,
                    client=client))
            else:
                compiled = torch.compile(model)
                off = tt.offload_optimizer_state(opt, group_bytes=int(args.group_mib * MiB),
                                                 prefetch=args.prefetch, client=client)
            before = _compile.compile_stats().offloaded_bytes
            r = _train(compiled, opt, step, _Null(), args.steps, max(args.warmup, 2),
                       client.synchronize if off is not None else None)
            total = args.steps + max(args.warmup, 2)
            if kind == "activations":
                moved = (_compile.compile_stats().offloaded_bytes - before) / total
                r["d2h_mib"] = r["h2d_mib"] = moved / MiB
            elif off is not None:
                r["d2h_mib"] = r["h2d_mib"] = off.stats.offloaded_bytes / max(off.stats.steps, 1) \
                    / MiB
                off.remove()
            else:
                r["d2h_mib"] = r["h2d_mib"] = 0.0
            rows[name] = r
            del model, opt, compiled
            torch.cuda.empty_cache()
    finally:
        client.close()
        torch._dynamo.reset()
    rows["compiled tierd"]["losses_equal"] = (rows["compiled tierd"]["losses"] ==
                                              rows["compiled none"]["losses"])
    return rows


# ---- FSDP2, one process per rank ------------------------------------------------------------

def _rank(rank, world, port, kind, bench, arg_dict, socket, out):
    import argparse
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    torch = _torch()
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    import tier
    import tier.torch as tt
    args = argparse.Namespace(**arg_dict)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    args.device = "cuda"
    dist.init_process_group("nccl", rank=rank, world_size=world)
    results = {}
    with tier.Client(socket=socket, name="%s-fsdp%d" % (bench, rank)) as client:
        for name in ("none", "tierd"):
            model, opt, step = _model_and_steps(kind, bench, args)
            blocks = getattr(model, "blocks", None) or getattr(model, "layers", None) or []
            for blk in blocks:
                fully_shard(blk)
            fully_shard(model)
            # The optimizer over the sharded parameters (fully_shard replaced them).
            opt = type(opt)(model.parameters(), **{k: v for k, v in opt.defaults.items()
                                                   if k in ("lr", "weight_decay", "momentum")})
            ctx, off = _Null(), None
            if name == "tierd" and kind == "activations":
                ctx = tt.offload_activations(min_bytes=args.min_bytes or (1 << 20),
                                             prefetch=args.prefetch, client=client,
                                             module=model)
            elif name == "tierd":
                off = tt.offload_optimizer_state(opt, group_bytes=int(args.group_mib * MiB),
                                                 prefetch=args.prefetch, client=client)
            r = _train(model, opt, step, ctx, args.steps, max(args.warmup, 2),
                       client.synchronize if off is not None else None)
            stats = getattr(ctx, "stats", None) or (off.stats if off is not None else None)
            total = args.steps + max(args.warmup, 2)
            r["d2h_mib"] = (stats.offloaded_bytes / total / MiB) if stats is not None else 0.0
            r["h2d_mib"] = r["d2h_mib"]
            if off is not None:
                off.remove()
            results[name] = r
            del model, opt
            torch.cuda.empty_cache()
            dist.barrier()
    dist.destroy_process_group()
    torch.save(results, os.path.join(out, "rank%d.pt" % rank))


def fsdp_rows(kind, bench, args, socket, world):
    torch = _torch()
    import torch.multiprocessing as mp
    with _socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mkdtemp(prefix="tier-fsdp-bench-")
    arg_dict = {k: v for k, v in vars(args).items() if not callable(v)}
    mp.start_processes(_rank, args=(world, port, kind, bench, arg_dict, socket, out),
                       nprocs=world, start_method="spawn")
    per_rank = [torch.load(os.path.join(out, "rank%d.pt" % r)) for r in range(world)]
    rows = {}
    for name in ("none", "tierd"):
        rs = [p[name] for p in per_rank]
        rows["fsdp%d %s" % (world, name)] = {
            "step_ms": max(r["step_ms"] for r in rs),
            "act_peak_mib": max(r["act_peak_mib"] for r in rs),
            "d2h_mib": sum(r["d2h_mib"] for r in rs), "h2d_mib": sum(r["h2d_mib"] for r in rs),
            "losses": [r["losses"] for r in rs]}
    rows["fsdp%d tierd" % world]["losses_equal"] = (rows["fsdp%d tierd" % world]["losses"] ==
                                                   rows["fsdp%d none" % world]["losses"])
    return rows


def run(kind, bench, args, socket, compile_=False, fsdp=0):
    """The rows asked for, printed as a table; returns them (for the JSON)."""
    torch = _torch()
    if args.device != "cuda" or not torch.cuda.is_available():
        print("framework rows (--compile, --fsdp): CUDA only, skipped")
        return {}
    rows = {}
    if compile_:
        rows.update(compile_rows(kind, bench, args, socket))
    if fsdp:
        if torch.cuda.device_count() < fsdp:
            print("--fsdp %d: skipped, this machine has %d GPUs" % (fsdp,
                                                                  torch.cuda.device_count()))
        else:
            rows.update(fsdp_rows(kind, bench, args, socket, fsdp))
    if rows:
        print("\n%-16s %9s %8s %13s %9s %9s %s" % ("", "step ms", "vs none", "act peak MiB",
                                                   "D2H MiB", "H2D MiB", "losses = none"))
        for name, r in rows.items():
            base = rows.get(name.rsplit(" ", 1)[0] + " none")
            vs = r["step_ms"] / base["step_ms"] if base else 1.0
            print("%-16s %9.1f %7.2fx %13.0f %9.0f %9.0f %s" % (
                name, r["step_ms"], vs, r["act_peak_mib"], r["d2h_mib"], r["h2d_mib"],
                {True: "yes", False: "NO"}.get(r.get("losses_equal"), "-")))
    return rows
