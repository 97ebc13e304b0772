#!/usr/bin/env python3
"""Weight offload for inference (tier.torch.offload_module_weights): the time of a forward whose
blocks' weights live in tierd between uses, against the same model resident, and the memory.

    python3 bench/weight_offload_bench.py --device cuda --json weights.json
    python3 bench/weight_offload_bench.py --device cuda --tier-python /tmp/old/python   # another tier

A stack of --blocks MLP blocks (d_model --dim, hidden 4x, --dtype) runs --steps forwards of a
--batch x --seq input under torch.no_grad(): first resident, then with
offload_module_weights(group=--group), where each group's weights come back one group ahead of
use. Reported: milliseconds per forward (median; CUDA: synchronized per forward), offload over
resident, the allocated peak and the reserved memory at the end, and the offloader's counters.
--tier-python imports tier from another python/ directory, to compare two versions of the
package on one device in one call. The script starts its own tierd from --build-dir.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--group", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--tier-python", default=os.path.join(os.path.dirname(HERE), "python"))
    p.add_argument("--build-dir", default=os.environ.get("TIER_BUILD_DIR",
                                                         os.path.join(os.path.dirname(HERE),
                                                                      "build")))
    p.add_argument("--pool-bytes", default="8G")
    p.add_argument("--json")
    return p.parse_args()


def timed(model, x, steps, warmup, cuda):
    import torch
    times = []
    with torch.no_grad():
        for i in range(warmup + steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(x)
            if cuda:
                torch.cuda.synchronize()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    args = parse()
    sys.path.insert(0, os.path.abspath(args.tier_python))
    sys.path.insert(0, HERE)
    import torch
    import tier
    import tier.torch as tt
    from _tierd import TierdProcess

    cuda = args.device == "cuda"
    dtype = getattr(torch, args.dtype) if cuda else torch.float32
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(
        torch.nn.LayerNorm(args.dim), torch.nn.Linear(args.dim, 4 * args.dim), torch.nn.GELU(),
        torch.nn.Linear(4 * args.dim, args.dim)) for _ in range(args.blocks)])
    model = model.to(device=args.device, dtype=dtype).eval()
    x = torch.randn(args.batch, args.seq, args.dim, device=args.device, dtype=dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    daemon = TierdProcess(args.build_dir, args.pool_bytes)
    client = daemon.connect("weight-offload-bench")
    try:
        with torch.no_grad():
            want = model(x)
        resident_ms = timed(model, x, args.steps, args.warmup, cuda)
        w = tt.offload_module_weights(model, group=args.group, client=client)
        client.synchronize()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        offload_ms = timed(model, x, args.steps, args.warmup, cuda)
        with torch.no_grad():
            same = bool(torch.equal(model(x), want))
        peak = torch.cuda.max_memory_allocated() if cuda else None
        reserved = torch.cuda.memory_reserved() if cuda else None
        stats = w.stats.as_dict()
        w.remove()
    finally:
        client.close()
        daemon.stop()
    out = {"tier": os.path.dirname(tier.__file__), "device": args.device,
           "gpu": torch.cuda.get_device_name() if cuda else None, "blocks": args.blocks,
           "group": args.group, "weight_bytes": weight_bytes, "resident_ms": resident_ms,
           "offload_ms": offload_ms, "ratio": offload_ms / resident_ms, "identical": same,
           "peak_allocated_bytes": peak, "reserved_bytes": reserved, "stats": stats}
    print("tier from %s" % out["tier"])
    print("%d blocks, %.0f MiB of weights, group %d on %s: resident %.2f ms, offloaded %.2f ms "
          "per forward (%.2fx); outputs identical: %s" % (
              args.blocks, weight_bytes / 2**20, args.group, out["gpu"] or "cpu", resident_ms,
              offload_ms, out["ratio"], same))
    if cuda:
        print("peak allocated %.0f MiB, reserved %.0f MiB" % (peak / 2**20, reserved / 2**20))
    print("counters: %s" % stats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
