"""Reserved GPU memory and tierd's registration work per training step under activation offload
(issue 28): which stream's allocator segments grow, step by step, with and without Tierd.

    python3 bench/reserved_memory_probe.py --build-dir .device [--steps 20] [--json FILE]
        [--python-dir DIR]    # another copy of the package (python/), for an A/B of two versions

The model is bench/torch_offload_bench.py's model a (GPT, 8 blocks, d1024, seq 1024, batch 4,
fp32, SGD), an `offload_activations(min_bytes=1 MiB, module=model)` context entered every step.
Each (allocator, variant) runs in a child process (PYTORCH_CUDA_ALLOC_CONF must be set before CUDA
starts). Variants:

  none        no offload
  tierd       offload through tierd, reloads prefetched on the client's reload stream
  noprefetch  prefetch=0: every reload allocated on the consuming stream

Per step it prints reserved and allocated MiB, the allocator's segments per stream (from
torch.cuda.memory_snapshot()), and tierd's registration counters (registrations, extensions,
exports), and the step time. Flat from step 3 is the target.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

VARIANTS = ("none", "tierd", "noprefetch")
ALLOC_CONF = {"default": None, "expandable": "expandable_segments:True"}
MiB = 2**20


def segments_by_stream(torch):
    out = {}
    for seg in torch.cuda.memory_snapshot():
        key = "%x" % seg.get("stream", 0)
        out[key] = out.get(key, 0) + seg["total_size"]
    return {k: v // MiB for k, v in sorted(out.items())}


def child(args):
    sys.path.insert(0, args.python_dir)
    import time
    import torch
    import torch.nn.functional as F
    import tier
    import tier.torch as tt
    from torch_offload_bench import GPT, PRESETS
    from _tierd import TierdProcess

    torch.manual_seed(0)
    p = PRESETS["a"]
    model = GPT(vocab=8192, d_model=p["d_model"], heads=p["heads"], layers=p["layers"],
                seq=p["seq"], dropout=0.0).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    client = None
    daemon = None
    if args.variant != "none":
        daemon = TierdProcess(args.build_dir, "16G")
        client = daemon.connect("probe")
    rows = []
    for step in range(args.steps):
        start = time.perf_counter()
        idx = torch.randint(0, 8192, (p["batch"], p["seq"]), device="cuda")
        if client is None:
            ctx = torch.enable_grad()
        else:
            ctx = tt.offload_activations(min_bytes=MiB, client=client, module=model,
                                         prefetch=0 if args.variant == "noprefetch" else 2)
        with ctx:
            loss = F.cross_entropy(model(idx).float().view(-1, 8192), idx.view(-1))
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - start) * 1e3
        info = client.info() if client is not None else None
        row = {"step": step + 1, "ms": round(ms, 2),
               "reserved_mib": torch.cuda.memory_reserved() // MiB,
               "allocated_mib": torch.cuda.memory_allocated() // MiB,
               "segments_mib_by_stream": segments_by_stream(torch),
               "registrations": None if info is None else [info.device_registrations,
                                                           info.device_extensions,
                                                           info.device_exports]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if client is not None:
        client.close()
        daemon.stop()
    print("RESULT " + json.dumps(rows), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(REPO_ROOT, "build"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--allocators", default="default,expandable")
    ap.add_argument("--json", default="reserved_memory_probe.json")
    ap.add_argument("--python-dir", default=os.path.join(REPO_ROOT, "python"))
    ap.add_argument("--label", default="")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--variant", default="tierd")
    args = ap.parse_args()
    if args.child:
        return child(args)
    results = {}
    for allocator in args.allocators.split(","):
        for variant in args.variants.split(","):
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if ALLOC_CONF[allocator]:
                env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[allocator]
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--variant", variant,
                   "--steps", str(args.steps), "--build-dir", args.build_dir,
                   "--python-dir", args.python_dir]
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            rows = None
            for line in r.stdout.splitlines():
                if line.startswith("RESULT "):
                    rows = json.loads(line[7:])
            if rows is None:
                print("%s/%s failed:\n%s\n%s" % (allocator, variant, r.stdout[-3000:],
                                                 r.stderr[-3000:]))
                continue
            key = "%s/%s%s" % (allocator, variant, args.label)
            results[key] = rows
            later = sorted(r["ms"] for r in rows[2:]) or [0]
            print("\n== %s allocator, %s%s: median step from step 3 %.1f ms" % (
                allocator, variant, args.label, later[len(later) // 2]))
            print("%4s %8s %9s %9s  %-34s %s" % ("step", "ms", "reserved", "allocated",
                                                 "segments by stream", "registrations"))
            for row in rows:
                print("%4d %8.1f %9d %9d  %-34s %s" % (row["step"], row["ms"], row["reserved_mib"],
                                                       row["allocated_mib"],
                                                       row["segments_mib_by_stream"],
                                                       row["registrations"]))
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print("wrote", args.json)


if __name__ == "__main__":
    sys.exit(main())
