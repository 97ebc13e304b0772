"""Restarting tierd under a training job (issue 30, item 2): steps lost and time without offload
per restart.

    python3 bench/restart_bench.py --build-dir .device [--restarts 20] [--device cuda|cpu]

A small GPT trains under tier.torch.offload_activations (a new context each step, as trainers
write it) while another thread restarts tierd `--restarts` times with SIGTERM (it drains: the
trainer takes back what it offloaded, then tierd exits and the next one starts on the same
socket; the client reconnects by itself). Counted: steps that raised (lost), steps that offloaded
nothing (tierd draining, gone or not yet reconnected), and per restart the wall time from the
SIGTERM to the first step that offloaded again. The final parameters are compared with the same
training without tierd (bit for bit). Prints a table and writes JSON.
"""

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO_ROOT, "python"))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "stress"))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tier  # noqa: E402
import tier.torch as tt  # noqa: E402
from _tierd import TierdProcess  # noqa: E402
from trainer import GPT  # noqa: E402  (tests/stress/trainer.py's model)

CFG = dict(vocab=4096, d_model=256, heads=4, layers=4, seq=256, batch=8)


def make(device):
    torch.manual_seed(0)
    model = GPT(**CFG).to(device)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def batches(device, steps):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, CFG["vocab"], (CFG["batch"], CFG["seq"]), generator=g).to(device)
            for _ in range(steps)]


def step(model, opt, idx, offload):
    with offload:
        loss = F.cross_entropy(model(idx).float().view(-1, CFG["vocab"]), idx.view(-1))
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default=os.path.join(REPO_ROOT, "build"))
    p.add_argument("--restarts", type=int, default=20)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--gap-s", type=float, default=1.0, help="mean seconds between restarts")
    p.add_argument("--json", default="restart_bench.json")
    p.add_argument("--handback-idle-ms", type=int, default=5000,
                   help="tierd's drain_handback_idle_ms (its default: 5000)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":  # a smoke run: a step of the GPU shape takes seconds here
        CFG.update(layers=2, seq=64, batch=4)
    if device.type == "cuda":
        torch.use_deterministic_algorithms(True, warn_only=True)
    steps_cap = 100000

    daemon = TierdProcess(args.build_dir, "4G",
                          extra=["--drain_handback_idle_ms=%d" % args.handback_idle_ms])
    client = daemon.connect("restart-bench", reconnect_interval_s=0.02)
    model, opt = make(device)
    data = batches(device, 64)
    restarts = []  # (sigterm wall time, exit s, up s)
    done = threading.Event()

    def restarter():
        rng = random.Random(7)
        for _ in range(args.restarts):
            time.sleep(rng.expovariate(1.0 / args.gap_s))
            t = time.monotonic()
            down, up = daemon.restart()
            restarts.append((t, down, up))
        done.set()

    steps = []  # (start, end, offloaded bytes, failed)
    thread = threading.Thread(target=restarter, daemon=True)
    thread.start()
    n = 0
    while not (done.is_set() and steps and steps[-1][2] > 0) and n < steps_cap:
        off = tt.offload_activations(min_bytes=64 << 10, client=client)
        t0 = time.monotonic()
        failed = False
        try:
            step(model, opt, data[n % len(data)], off)
        except tier.TierError as e:
            failed = True
            print("step %d failed: %s" % (n, e), flush=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        steps.append((t0, time.monotonic(), off.stats.offloaded_bytes, failed))
        n += 1
    thread.join()

    # The same steps without tierd, for the comparison.
    ref_model, ref_opt = make(device)
    for i in range(n):
        step(ref_model, ref_opt, data[i % len(data)], _Nothing())
    identical = all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))

    lost = sum(1 for s in steps if s[3])
    dark = sum(1 for s in steps if s[2] == 0 and not s[3])
    gaps = []
    for t, _, _ in restarts:
        later = [s for s in steps if s[0] >= t and s[2] > 0]
        if later:
            gaps.append(later[0][0] - t)
    result = dict(device=str(device), restarts=len(restarts), steps=n, steps_lost=lost,
                  steps_without_offload=dark, identical_to_no_tierd=identical,
                  drain_s_median=statistics.median(r[1] for r in restarts) if restarts else None,
                  start_s_median=statistics.median(r[2] for r in restarts) if restarts else None,
                  without_offload_s_median=statistics.median(gaps) if gaps else None,
                  without_offload_s_max=max(gaps) if gaps else None,
                  step_ms_median=statistics.median((s[1] - s[0]) * 1e3 for s in steps))
    client.close()
    daemon.stop()
    print("| restarts | steps | steps lost | steps without offload | SIGTERM to exit (median) "
          "| start (median) | time without offload per restart (median / max) | identical |")
    print("|---|---|---|---|---|---|---|---|")
    print("| %d | %d | %d | %d | %.2f s | %.2f s | %.2f / %.2f s | %s |" % (
        result["restarts"], n, lost, dark, result["drain_s_median"] or 0,
        result["start_s_median"] or 0, result["without_offload_s_median"] or 0,
        result["without_offload_s_max"] or 0, "yes" if identical else "NO"))
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    ok = lost == 0 and identical and len(restarts) == args.restarts
    print("restart_bench: %s" % ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
