#!/usr/bin/env python3
"""Checkpoint save and restore: tier.torch.checkpoint against torch.save, same state, same run.

    python3 bench/checkpoint_bench.py --params 1.2e9 --json out.json          # on the GPU machine
    python3 bench/checkpoint_bench.py --device cpu --params 5e7 --json out.json  # a smoke run

The state is a model's weights (--weight-dtype, bf16 by default) and AdamW's fp32 moments
(exp_avg, exp_avg_sq), as ``{"model": ..., "optim": ...}``, built from a stack of Linear layers of
about --params parameters after one optimizer step.

  torch.save disk     torch.save to --disk-dir, then fsync (the file is on the disk)
  torch.save shm      torch.save to /dev/shm (memory, no fsync): the fastest local copy
  tierd host          tier.torch.checkpoint.save into a tierd without NVMe, committed in its
                      memory (h.wait())
  tierd nvme commit   the same into a tierd with a spill_dir (write-through journal): committed
                      in host memory (h.wait()) while the journal writes
  tierd nvme          ... and on NVMe (h.wait_durable())

The link and the disk are measured in the same run: pinned cudaMemcpy of --link-bytes each way
(torch copies between a GPU tensor and a pinned host tensor) and an O_DIRECT write and read of
--disk-bytes in the spill directory (dd). Each tierd row says its GB/s and its fraction of the
bound (the link for save and restore, the disk for "nvme"), and where a save's time went
(tier.torch.checkpoint's SaveHandle.phases: snapshot in save(), copies until the data landed,
record until committed, cleanup after).

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


def tierd_rows(client, state, name, durable, device, prefix):
    """The row of a save committed in host memory (and with durable, the row of the same save
    on NVMe), restored once."""
    ckpt = __import__("tier.torch", fromlist=["checkpoint"]).checkpoint
    sync(device)
    t0 = time.perf_counter()
    h = ckpt.save(state, name, keep=1, client=client)
    blocks = time.perf_counter() - t0
    h.wait()
    committed = time.perf_counter() - t0
    durable_s = None
    if durable:
        h.wait_durable()
        durable_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = ckpt.load(name, client=client)
    sync(device)
    restored = time.perf_counter() - t0
    del loaded
    h._cleaned.wait()
    phases = dict(h.phases)
    ckpt.delete(name, client=client)
    rows = {prefix + (" commit" if durable else ""): {
        "blocks_s": blocks, "save_s": committed, "restore_s": restored, "bytes": h.nbytes,
        "phases": phases}}
    if durable:
        rows[prefix] = {"blocks_s": blocks, "save_s": durable_s, "restore_s": restored,
                        "bytes": h.nbytes, "phases": phases}
    return rows


def measure_link(device, nbytes):
    """(d2h, h2d) GB/s of pinned copies of nbytes, best of 3."""
    if not device.startswith("cuda"):
        return None, None
    g = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out = []
    for src, dst in ((g, h), (h, g)):
        best = None
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        out.append(nbytes / best / 1e9)
    del g, h
    return tuple(out)


def measure_disk(directory, nbytes):
    """(write, read) GB/s of dd with O_DIRECT, 8 MiB blocks, in `directory`."""
    import subprocess
    path = os.path.join(directory, "tier-bench-dd")
    count = max(1, nbytes // (8 << 20))
    out = []
    try:
        for args in (["if=/dev/zero", "of=" + path, "oflag=direct", "conv=fsync"],
                     ["if=" + path, "of=/dev/null", "iflag=direct"]):
            t0 = time.perf_counter()
            r = subprocess.run(["dd", "bs=8M", "count=%d" % count] + args,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            dt = time.perf_counter() - t0
            out.append(count * (8 << 20) / dt / 1e9 if r.returncode == 0 else None)
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return tuple(out)


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
    p.add_argument("--skip-torch-save", action="store_true",
                   help="leave out the torch.save rows (slow; ratios are then against the "
                        "tierd host row)")
    p.add_argument("--link-bytes", type=float, default=1 << 30)
    p.add_argument("--disk-bytes", type=float, default=2 << 30)
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
    link = measure_link(args.device, int(args.link_bytes))
    disk = measure_disk(spill_dir, int(args.disk_bytes)) if spill_dir else (None, None)
    if not args.skip_torch_save:
        rows["torch.save disk"] = torch_save_row(state, os.path.join(args.disk_dir, "ckpt.pt"),
                                                 True, args.device)
        rows["torch.save shm"] = torch_save_row(state, "/dev/shm/tier-ckpt-bench.pt", False,
                                                args.device)
    daemons = []
    if args.socket is None:
        pool = int(nbytes * 1.25) + (256 << 20)
        # The whole state is one uid's persistent objects: the node's default quotas (1/16 and
        # 1/4 of what tierd holds) are lifted to the pool, as an operator keeping checkpoints
        # in tierd would set them.
        quota = ("--persistent_quota_bytes_per_uid=%d" % pool,
                 "--persistent_max_bytes=%d" % pool)
        # Host memory only (no journal), then a second tierd with the NVMe tier.
        daemons.append(TierdProcess(args.build_dir, pool, ("--pool_lock=best-effort",) + quota))
        client = daemons[0].connect("checkpoint_bench")
    else:
        import tier
        client = tier.Client(socket=args.socket, name="checkpoint_bench")
    try:
        rows.update(tierd_rows(client, state, "bench/host", False, args.device, "tierd host"))
        if spill_dir and args.socket is None:
            client.close()
            daemons[0].stop()
            daemons.pop()
            extra = ("--pool_lock=best-effort", "--spill_dir=" + spill_dir,
                     "--spill_bytes=%d" % (int(nbytes * 1.5) + (256 << 20))) + quota
            daemons.append(TierdProcess(args.build_dir, pool, extra))
            client = daemons[0].connect("checkpoint_bench")
            rows.update(tierd_rows(client, state, "bench/nvme", True, args.device,
                                   "tierd nvme"))
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
        for daemon in daemons:
            daemon.stop()
        if spill_dir and not args.spill_dir:
            shutil.rmtree(spill_dir, ignore_errors=True)

    if link[0] is not None:
        print("\nlink (pinned copies, %.0f MiB): D2H %.1f GB/s, H2D %.1f GB/s"
              % (args.link_bytes / 2**20, link[0], link[1]))
    if disk[0] is not None:
        print("disk (dd O_DIRECT, %s): write %.2f GB/s, read %.2f GB/s"
              % (spill_dir, disk[0], disk[1] or 0))
    ref_row = rows.get("torch.save disk") or rows["tierd host"]
    print("\n%-18s %9s %9s %10s %8s %9s %8s %8s %8s" % (
        "", "blocks s", "save s", "restore s", "save x", "restore x", "save GB/s",
        "rest GB/s", "of bound"))
    for name, r in rows.items():
        r["save_vs_disk"] = ref_row["save_s"] / r["save_s"]
        r["restore_vs_disk"] = ref_row["restore_s"] / r["restore_s"]
        r["save_gbps"] = r["bytes"] / r["save_s"] / 1e9
        r["restore_gbps"] = r["bytes"] / r["restore_s"] / 1e9
        bound = None
        if name.startswith("tierd") and name.endswith("nvme") and disk[0]:
            bound = r["save_gbps"] / disk[0]
        elif name.startswith("tierd") and link[0]:
            bound = r["save_gbps"] / link[0]
        r["save_of_bound"] = bound
        print("%-18s %9.3f %9.3f %10.3f %7.2fx %8.2fx %9.2f %8.2f %8s" % (
            name, r["blocks_s"], r["save_s"], r["restore_s"], r["save_vs_disk"],
            r["restore_vs_disk"], r["save_gbps"], r["restore_gbps"],
            "-" if bound is None else "%.2f" % bound))
        if "phases" in r:
            print("%-18s phases: %s" % ("", ", ".join("%s %.3f s" % kv
                                                      for kv in sorted(r["phases"].items()))))
    base_ms = statistics.median(base) * 1e3
    during_ms = statistics.median(during) * 1e3
    print("\nstep: %.2f ms without a save, %.2f ms with an asynchronous tierd save in flight "
          "(%.1f%%; the save committed after %.2f s)"
          % (base_ms, during_ms, (during_ms / base_ms - 1) * 100, committed_after or 0))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": params, "state_bytes": nbytes, "device": args.device,
                       "link_gbps": link, "disk_gbps": disk,
                       "weight_dtype": args.weight_dtype, "rows": rows,
                       "step_ms": base_ms, "step_ms_during_save": during_ms,
                       "save_committed_s": committed_after}, f, indent=2)


if __name__ == "__main__":
    main()
