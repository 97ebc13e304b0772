#!/usr/bin/env python3
"""Checkpoint save and restore: tier.torch.checkpoint against torch.save, same state, same run.

    python3 bench/checkpoint_bench.py --params 1.2e9 --json out.json          # on the GPU machine
    python3 bench/checkpoint_bench.py --device cpu --params 5e7 --json out.json  # a smoke run

The state is a model's weights (--weight-dtype, bf16 by default) and AdamW's fp32 moments
(exp_avg, exp_avg_sq), as ``{"model": ..., "optim": ...}``, built from a stack of Linear layers of
about --params parameters after one optimizer step.

  torch.save disk     torch.save to --disk-dir, then fsync (the file is on the disk)
  torch.save shm      torch.save to /dev/shm (memory, no fsync): the fastest local copy
  tierd host          tier.torch.checkpoint.save, committed in tierd's memory (h.wait())
  tierd nvme          the same, then on NVMe (h.wait_durable(); tierd started with a spill_dir)

Columns: "blocks" is how long the training loop is held (the call's return, for tierd the
snapshot), "save" until the copy is whole (committed / written and fsynced), "restore" a load of
the state back onto --device (torch.load with map_location, tier.torch.checkpoint.load), and the
ratios against torch.save to disk of the same run. Then "step slowdown": the median time of a
training step of the model (forward, backward, AdamW) while an asynchronous tierd save is in
flight, against the median step time with no save, same run.

Starts its own tierd from --build-dir (pool sized to the state) unless --socket is given.
Prints a table and writes JSON (--json).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO_ROOT, "python"))

import torch  # noqa: E402

from _tierd import TierdProcess  # noqa: E402  (bench/_tierd.py)


def build_state(params, device, weight_dtype, width):
    layers = max(1, int(params // (width * width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False)
                                  for _ in range(layers)]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, width, device=device)
    model(x).float().square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    # The saved weights in the training dtype (bf16), the moments fp32 as AdamW keeps them.
    weights = {k: v.to(weight_dtype) for k, v in model.state_dict().items()}
    state = {"model": weights, "optim": opt.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(state))
    return model, opt, state, nbytes


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def torch_save_row(state, path, fsync, device):
    sync(device)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    saved = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = torch.load(path, map_location=device)
    sync(device)
    restored = time.perf_counter() - t0
    del loaded
    size = os.path.getsize(path)
    os.unlink(path)
    return {"blocks_s": saved, "save_s": saved, "restore_s": restored, "bytes": size}


def tierd_row(client, state, name, durable, device):
    ckpt = __import__("tier.torch", fromlist=["checkpoint"]).checkpoint
    sync(device)
    t0 = time.perf_counter()
    h = ckpt.save(state, name, keep=1, client=client)
    blocks = time.perf_counter() - t0
    h.wait()
    if durable:
        h.wait_durable()
    saved = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = ckpt.load(name, client=client)
    sync(device)
    restored = time.perf_counter() - t0
    del loaded
    ckpt.delete(name, client=client)
    return {"blocks_s": blocks, "save_s": saved, "restore_s": restored, "bytes": h.nbytes}


def step_times(model, opt, device, width, steps, during=None):
    x = torch.randn(8, width, device=device)
    times = []
    for i in range(steps):
        if during is not None and i == 1:
            during()
        sync(device)
        t0 = time.perf_counter()
        model(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    return times[1:]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=1.2e9)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--weight-dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--disk-dir", default=tempfile.gettempdir())
    p.add_argument("--spill-dir", default=None,
                   help="NVMe directory for tierd's spill files (default: a directory under "
                        "--disk-dir); 'none' skips the nvme row")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--build-dir", default=os.environ.get("TIER_BUILD_DIR",
                                                         os.path.join(REPO_ROOT, "build")))
    p.add_argument("--socket", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    weight_dtype = getattr(torch, args.weight_dtype)
    model, opt, state, nbytes = build_state(args.params, args.device, weight_dtype, args.width)
    params = sum(p.numel() for p in model.parameters())
    print("state: %.2f G parameters, %.2f GiB (%s weights + fp32 AdamW moments) on %s"
          % (params / 1e9, nbytes / 2**30, args.weight_dtype, args.device))

    spill_dir = None
    if args.spill_dir != "none":
        spill_dir = args.spill_dir or tempfile.mkdtemp(prefix="tierckpt-spill-",
                                                       dir=args.disk_dir)
    rows = {}
    rows["torch.save disk"] = torch_save_row(state, os.path.join(args.disk_dir, "ckpt.pt"), True,
                                             args.device)
    rows["torch.save shm"] = torch_save_row(state, "/dev/shm/tier-ckpt-bench.pt", False,
                                            args.device)
    daemon = None
    if args.socket is None:
        pool = int(nbytes * 1.25) + (256 << 20)
        extra = (("--spill_dir=" + spill_dir,
                  "--spill_bytes=%d" % (int(nbytes * 1.5) + (256 << 20))) if spill_dir else ())
        daemon = TierdProcess(args.build_dir, pool, extra)
        client = daemon.connect("checkpoint_bench")
    else:
        import tier
        client = tier.Client(socket=args.socket, name="checkpoint_bench")
    try:
        rows["tierd host"] = tierd_row(client, state, "bench/host", False, args.device)
        if spill_dir:
            rows["tierd nvme"] = tierd_row(client, state, "bench/nvme", True, args.device)
        ckpt = __import__("tier.torch", fromlist=["checkpoint"]).checkpoint
        base = step_times(model, opt, args.device, args.width, args.steps)
        handles = []
        during = step_times(model, opt, args.device, args.width, args.steps,
                            during=lambda: handles.append(ckpt.save(state, "bench/async",
                                                                    keep=1, client=client)))
        committed_after = None
        if handles:
            handles[0].wait()
            committed_after = handles[0].seconds_to_commit
            ckpt.delete("bench/async", client=client)
    finally:
        client.close()
        if daemon is not None:
            daemon.stop()
        if spill_dir and not args.spill_dir:
            shutil.rmtree(spill_dir, ignore_errors=True)

    disk = rows["torch.save disk"]
    print("\n%-18s %10s %10s %10s %12s %14s" % ("", "blocks s", "save s", "restore s",
                                               "save vs disk", "restore vs disk"))
    for name, r in rows.items():
        r["save_vs_disk"] = disk["save_s"] / r["save_s"]
        r["restore_vs_disk"] = disk["restore_s"] / r["restore_s"]
        print("%-18s %10.3f %10.3f %10.3f %11.2fx %13.2fx" % (
            name, r["blocks_s"], r["save_s"], r["restore_s"], r["save_vs_disk"],
            r["restore_vs_disk"]))
    base_ms = statistics.median(base) * 1e3
    during_ms = statistics.median(during) * 1e3
    print("\nstep: %.2f ms without a save, %.2f ms with an asynchronous tierd save in flight "
          "(%.1f%%; the save committed after %.2f s)"
          % (base_ms, during_ms, (during_ms / base_ms - 1) * 100, committed_after or 0))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": params, "state_bytes": nbytes, "device": args.device,
                       "weight_dtype": args.weight_dtype, "rows": rows,
                       "step_ms": base_ms, "step_ms_during_save": during_ms,
                       "save_committed_s": committed_after}, f, indent=2)


if __name__ == "__main__":
    main()
