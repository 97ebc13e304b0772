#!/usr/bin/env python3
"""Ranks sharing one tierd (issue 26, point 1): DistributedDataParallel over NCCL, one process per
GPU, every rank offloading through the node's one tierd, against the same run without it.

    python3 tests/multigpu/ddp_tierd.py --build .device [--ranks N] [--steps 4] [--json FILE]
    python3 tests/multigpu/ddp_tierd.py --device cpu --ranks 2 --build build   # dry run (gloo)

Every rank runs, each from the same initial weights, with its own data (seeded by rank) and the
same dropout seeds:
  plain        DDP + AdamW, no tierd: the reference
  activations  the same, each forward under tier.torch.offload_activations (every rank its own
               session of the one tierd)
  optimizer    the same, AdamW's state kept in tierd between steps
               (tier.torch.offload_optimizer_state, several groups per step)
Checks, on every rank: each step's loss, the final parameters and the final optimizer state bit
for bit equal to plain's (SHA-256 of their bytes); the parameters equal across ranks (DDP keeps
them so); each tierd run moved its bytes through tierd (the offloaders' counts). Then tierd must
hold nothing once every rank closed its session. Prints a table, writes JSON; exit 0 only if every
check holds. With one GPU it runs one rank (the logic, not the sharing) and says so.
"""

import argparse
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import rank_launcher as rl  # noqa: E402  (sets the NCCL and cuBLAS environment first)
from rank_launcher import log, torch  # noqa: E402

CFG_CUDA = dict(vocab=8192, d_model=512, heads=8, layers=4, seq=512, batch=4)
CFG_CPU = dict(vocab=256, d_model=64, heads=4, layers=2, seq=64, batch=2)
RUNS = ("plain", "activations", "optimizer")


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def state_tensors(opt):
    """The optimizer's state tensors in parameter order (state_dict(): what a checkpoint sees)."""
    state = opt.state_dict()["state"]
    out = []
    for index in sorted(state):
        for key in sorted(state[index]):
            value = state[index][key]
            if torch.is_tensor(value):
                out.append(value)
    return out


def train(run, rank, dev, client, args, cfg):
    """One run on this rank: {losses, params, state, moved}."""
    import tier.torch as tt
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    model = rl.GPT(**cfg).to(dev)
    ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    moved = 0
    state_off = None
    if run == "optimizer":
        # Several groups per step, so the step streams state through tierd group by group.
        state_bytes = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
        state_off = tt.offload_optimizer_state(opt, group_bytes=max(1 << 16, state_bytes // 6),
                                               prefetch=1, client=client)
    act = None
    if run == "activations":
        model.head_region = tt.no_offload
        act = tt.offload_activations(min_bytes=args.min_bytes, prefetch=2, client=client,
                                     module=model)
    losses = []
    for step, (idx, target) in enumerate(rl.batches(cfg, args.steps, 1000 + rank, dev)):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(100 + step * 1000 + rank)  # dropout: the same masks in every run
        if act is not None:
            with act:
                loss = rl.loss_of(ddp, idx, target)
        else:
            loss = rl.loss_of(ddp, idx, target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    client.synchronize()
    if act is not None:
        moved = act.stats.offloaded_bytes
        if act.stats.fallbacks:
            raise AssertionError("rank %d: %d activations stayed on the GPU (offload refused)" %
                                 (rank, act.stats.fallbacks))
    state = digest(state_tensors(opt))
    if state_off is not None:
        moved = state_off.stats.offloaded_bytes
        state_off.remove()
    params = digest(model.parameters())
    del ddp, model, opt
    return dict(losses=losses, params=params, state=state, moved=moved)


def rank_worker(rank, ranks, args):
    import torch.distributed as dist
    import tier
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = rl.setup_rank(rank, ranks, args.device)
    cfg = CFG_CUDA if args.device == "cuda" else CFG_CPU
    out = {"rank": rank, "device": str(dev)}
    with tier.Client(socket=args.socket, name="ddp-rank%d" % rank) as client:
        out["engine"] = client.engine
        for run in RUNS:
            t0 = time.perf_counter()
            out[run] = train(run, rank, dev, client, args, cfg)
            out[run]["seconds"] = round(time.perf_counter() - t0, 2)
            dist.barrier()
    # DDP keeps every rank's parameters equal: compare each run's digest across ranks here.
    gathered = [None] * ranks
    dist.all_gather_object(gathered, {run: out[run]["params"] for run in RUNS})
    out["params_all_ranks"] = gathered
    dist.destroy_process_group()
    return out


def check(results, ranks):
    """(table rows, failures)."""
    failures = []
    rows = []
    for r in results:
        ref = r["plain"]
        for run in RUNS:
            got = r[run]
            same_losses = got["losses"] == ref["losses"]
            same_params = got["params"] == ref["params"]
            same_state = got["state"] == ref["state"]
            across = all(g[run] == got["params"] for g in r["params_all_ranks"])
            moved_ok = run == "plain" or got["moved"] > 0
            rows.append((r["rank"], run, got["losses"][-1], got["moved"] / 2**20, same_losses,
                         same_params, same_state, across, got["seconds"]))
            for ok, what in ((same_losses, "losses differ from plain's"),
                             (same_params, "parameters differ from plain's"),
                             (same_state, "optimizer state differs from plain's"),
                             (across, "parameters differ across ranks"),
                             (moved_ok, "nothing went through tierd")):
                if not ok:
                    failures.append("rank %d, %s: %s" % (r["rank"], run, what))
        if r["device"].startswith("cuda") and r["engine"] != "cuda":
            failures.append("rank %d: tierd runs the %s engine, not cuda" % (r["rank"],
                                                                         r["engine"]))
    return rows, failures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.environ.get("TIER_BUILD_DIR", ""),
                   help="build tree or bundle with daemon/tierd (and tierctl/tierctl)")
    p.add_argument("--socket", default="", help="a running tierd instead of a private one")
    p.add_argument("--ranks", type=int, default=0, help="processes (default: every GPU)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json", default="")
    args = p.parse_args()
    if args.device == "cuda":
        gpus = rl.gpu_count()
        if gpus == 0:
            log("ddp_tierd: no GPU: skipped")
            return 77
        ranks = min(args.ranks or gpus, gpus)
        if ranks < 2:
            log("ddp_tierd: %d GPU: one rank only, so this checks the logic, not ranks sharing "
                "tierd (that needs 2 GPUs or more)" % gpus)
    else:
        ranks = args.ranks or 2
        args.min_bytes = min(args.min_bytes, 4096)
    tierd = rl.Tierd(args.build, pool_bytes="%dG" % (2 + 2 * ranks) if args.device == "cuda"
                     else "1G", socket_path=args.socket or None)
    args.socket = tierd.socket
    failures = []
    results = []
    t0 = time.monotonic()
    try:
        results = rl.launch(rank_worker, ranks, args, args.timeout, tierd=tierd)
        rows, failures = check(results, ranks)
        log("\n== ranks sharing one tierd: %d rank%s (DDP, %s), %d steps each, AdamW" % (
            ranks, "s" if ranks > 1 else "", "NCCL" if args.device == "cuda" else "gloo",
            args.steps))
        log("%4s %-12s %12s %10s %7s %7s %7s %11s %6s" % (
            "rank", "run", "last loss", "MiB tierd", "losses", "params", "state", "all ranks",
            "s"))
        for rank, run, loss, mib, sl, sp, ss, across, sec in rows:
            log("%4d %-12s %12.6f %10.0f %7s %7s %7s %11s %6.1f" % (
                rank, run, loss, mib, "same" if sl else "DIFF", "same" if sp else "DIFF",
                "same" if ss else "DIFF", "same" if across else "DIFF", sec))
        log("(losses / params / state: bit for bit against the plain run of the same rank; all "
            "ranks: the parameters equal on every rank; MiB tierd: what the offloader sent)")
        if tierd.proc is not None:
            # Every session closed: tierd holds nothing.
            deadline = time.monotonic() + 30
            while True:
                s = tierd.status()
                held = [t for t in s.get("tiers", []) if t.get("used_bytes") or t.get("objects")]
                if not s.get("sessions") and not held:
                    break
                if time.monotonic() > deadline:
                    failures.append("tierd still holds sessions or objects: %s" % json.dumps(s))
                    break
                time.sleep(0.2)
            log(tierd.tierctl_output("pools"))
    except RuntimeError as e:
        failures.append(str(e))
    finally:
        rc = tierd.stop()
        if rc not in (None, 0):
            failures.append("tierd exited %s on SIGTERM" % rc)
    verdict = "PASS" if not failures else "FAIL"
    if ranks < 2 and not failures:
        verdict = "PASS (one rank: logic only)"
    log("TARGET every rank's losses and parameters identical with and without tierd: %s (%.0f s)"
        % (verdict, time.monotonic() - t0))
    for f in failures:
        log("  " + f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(ranks=ranks, steps=args.steps, results=results, failures=failures),
                      f, indent=1)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
