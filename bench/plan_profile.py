#!/usr/bin/env python3
"""Where a planned step's time goes: one transformers Llama step under a plan of
tier.torch.plan_activations, profiled (torch.profiler, host and GPU) next to the same step without
a plan, so the difference per offloaded storage can be split into host work, GPU work and GPU
idle time (issue 24: planned steps that offload ran 4-50 ms over their prediction on H100 and
H200, plans that only recompute within 0.3%).

    python3 bench/plan_profile.py --build-dir .device --shape 3b --seq 4096 --goal rc-peak
    python3 bench/plan_profile.py --smoke            # tiny Llama on the CPU

Goals: ``rc-peak`` (full recompute's measured peak), ``overhead=F`` (max_overhead), ``mib=N``
(target_bytes); several, comma-separated, are planned in turn on one planner (as frontier_bench
runs its rows) and the last is profiled. ``budget=F`` (alone): no planner, the offload-only
budget (``offload_activations(max_overhead=F)``, frontier_bench's tierd-budget row). Prints, for
both steps: wall time, GPU busy time on every stream and on the compute stream, the CUDA runtime
and driver calls that can stall the host (synchronizations, allocator calls, stream waits) with
their count and host time, the host functions with the most self time, the planner's figures, and the planned step's host time by
section of the hook path and by libtierclient call (ms per step, calls per step, us per call);
writes JSON (and a gzipped Chrome trace per step with --trace; with --cprofile N, N more planned
steps under cProfile, the tier package's functions listed by their own time).
"""

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import frontier_bench as fb  # noqa: E402
import stream_gaps  # noqa: E402

MiB = 2**20
STALL_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
               "cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaHostRegister",
               "cudaStreamWaitEvent", "cuStreamWaitValue32", "cuStreamWaitValue64",
               "cuStreamWriteValue32", "cuStreamWriteValue64", "cudaEventRecord",
               "cudaEventQuery", "cudaMemcpyAsync", "cudaLaunchHostFunc", "cudaIpcGetMemHandle",
               "cuMemGetAddressRange", "cudaPointerGetAttributes")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="1b", choices=sorted(fb.SHAPES))
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--goal", default="rc-peak")
    p.add_argument("--settle-steps", type=int, default=24)
    p.add_argument("--build-dir", default=os.environ.get("TIER_BUILD_DIR", "build"))
    p.add_argument("--socket", default=None)
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--out-dir", default="/tmp/tier-plan-profile")
    p.add_argument("--trace", action="store_true", help="write gzipped Chrome traces")
    p.add_argument("--cprofile", type=int, default=0, metavar="STEPS",
                   help="also run STEPS planned steps under cProfile: the tier package's "
                        "functions by own time and by time with callees, per step")
    p.add_argument("--smoke", action="store_true", help="tiny Llama on the CPU")
    args = p.parse_args(argv)
    args.device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.shape, args.seq, args.min_bytes = "tiny", 128, 0
    return args


def _device_time(evt):
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(evt, name, None)
        if value is not None:
            return value
    return 0


def busy_ms(prof):
    """GPU busy time (union of kernel and copy intervals) over every stream and per stream."""
    spans = {}
    for e in prof.events():
        kind = str(getattr(e, "device_type", ""))
        if "CUDA" not in kind or e.time_range.elapsed_us() <= 0:
            continue
        stream = getattr(e, "device_resource_id", None)
        spans.setdefault(stream, []).append((e.time_range.start, e.time_range.end))

    def union(intervals):
        total, end = 0, None
        for a, b in sorted(intervals):
            if end is None or a > end:
                total += b - a
                end = b
            elif b > end:
                total += b - end
                end = b
        return total / 1e3
    every = union([s for v in spans.values() for s in v])
    per_stream = {str(k): union(v) for k, v in spans.items()}
    return every, per_stream


def summarize(prof, wall_ms):
    averages = prof.key_averages()
    calls = {}
    for e in averages:
        if any(e.key.startswith(name) for name in STALL_CALLS):
            calls[e.key] = {"count": e.count, "host_ms": e.self_cpu_time_total / 1e3}
    host = sorted(((e.self_cpu_time_total / 1e3, e.count, e.key) for e in averages),
                  reverse=True)[:20]
    device = sorted(((_device_time(e) / 1e3, e.count, e.key) for e in averages),
                    reverse=True)[:12]
    every, per_stream = busy_ms(prof)
    compute = max(per_stream.values()) if per_stream else 0.0
    return {"wall_ms": wall_ms, "gpu_busy_ms": every, "busiest_stream_ms": compute,
            "per_stream_ms": per_stream, "calls": calls,
            "host_top": [{"ms": ms, "count": n, "name": k} for ms, n, k in host],
            "device_top": [{"ms": ms, "count": n, "name": k} for ms, n, k in device]}


def profiled_step(model, opt, ids, mode, cuda, path=None):
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        fb.train_step(model, opt, ids, mode, cuda)
        wall = (time.perf_counter() - t0) * 1e3
    if path:
        raw = path + ".json"
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as f, gzip.open(path + ".json.gz", "wb") as g:
            shutil.copyfileobj(f, g)
        os.remove(raw)
    return summarize(prof, wall)


def gaps_of_step(model, opt, ids, mode, path):
    """One step profiled for the GPU only (no host op records: the host runs at its own pace),
    and the compute stream's idle time split into waiting for the host and stalls
    (bench/stream_gaps.py)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fb.train_step(model, opt, ids, mode, True)
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.remove(path)
    return stream_gaps.split(trace)


PHASES = ("entered", "forward", "backward", "exited", "optimizer", "synced")


def phases_of_steps(model, opt, ids, mode, steps=3):
    """Where a step's wall time goes, phase by phase (entering the mode's context, forward,
    backward with its end-of-backward callbacks, leaving the context, the optimizer, the final
    synchronization): host ms, and GPU ms between the same points (CUDA events recorded as the
    host passes them), medians over `steps` steps. A phase whose host time exceeds its GPU time
    held the GPU up; the synchronization's host time is how far the GPU ran behind."""
    rows = []
    for _ in range(steps):
        marks = []

        def mark(name):
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            marks.append((name, time.perf_counter(), e))
        opt.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        mark("start")
        ctx = mode.context()
        ctx.__enter__()
        mark("entered")
        loss = model(input_ids=ids, labels=ids).loss
        mark("forward")
        loss.backward()
        mark("backward")
        ctx.__exit__(None, None, None)
        mark("exited")
        opt.step()
        mark("optimizer")
        torch.cuda.synchronize()
        mark("synced")
        rows.append({name: (1e3 * (t - marks[i][1]), marks[i][2].elapsed_time(e))
                     for i, (name, t, e) in enumerate(marks[1:])})
    return {name: {"host_ms": statistics.median(r[name][0] for r in rows),
                   "gpu_ms": statistics.median(r[name][1] for r in rows)} for name in PHASES}


def print_phases(name, phases):
    fb.log("== %s, phases (host ms / GPU ms): " % name + ", ".join(
        "%s %.2f/%.2f" % (p, phases[p]["host_ms"], phases[p]["gpu_ms"]) for p in PHASES))


def print_summary(name, s):
    fb.log("== %s: wall %.1f ms, GPU busy %.1f ms (busiest stream %.1f ms)" % (
        name, s["wall_ms"], s["gpu_busy_ms"], s["busiest_stream_ms"]))
    fb.log("   streams: " + ", ".join("%s %.1f" % kv for kv in sorted(s["per_stream_ms"].items())))
    fb.log("   calls that can stall (count, host ms): " + ", ".join(
        "%s %d/%.2f" % (k, v["count"], v["host_ms"]) for k, v in sorted(s["calls"].items())))
    fb.log("   host self time, top: " + "; ".join(
        "%s x%d %.2f" % (r["name"][:48], r["count"], r["ms"]) for r in s["host_top"][:14]))
    fb.log("   GPU time, top: " + "; ".join(
        "%s x%d %.2f" % (r["name"][:40], r["count"], r["ms"]) for r in s["device_top"][:8]))


SECTION_STEPS = 4
CPROFILE_ROWS = 30


def cprofiled(model, opt, ids, mode, cuda, steps, path):
    """`steps` planned steps under cProfile (deterministic: every Python call, so slower than the
    timed steps; read the shares, not the microseconds). Returns the tier package's functions
    (own time and time with callees, ms per step; calls per step), most own time first, and
    writes the whole profile to `path` (pstats)."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        fb.train_step(model, opt, ids, mode, cuda)
    prof.disable()
    prof.dump_stats(path)
    stats = pstats.Stats(prof).stats
    rows = []
    for (filename, line, name), (_, calls, own, cumulative, _) in stats.items():
        where = filename.replace(os.sep, "/")
        if "/tier/" not in where:
            continue
        rows.append({"function": "%s:%d %s" % (where[where.rindex("/tier/") + 1:], line, name),
                     "own_ms_per_step": 1e3 * own / steps,
                     "with_callees_ms_per_step": 1e3 * cumulative / steps,
                     "calls_per_step": calls / steps})
    rows.sort(key=lambda r: -r["own_ms_per_step"])
    return {"steps": steps, "pstats": path, "rows": rows}


def print_cprofiled(cp):
    fb.log("== cProfile of %d planned steps (%s): the tier package's functions, ms per step own / "
           "with callees, calls per step" % (cp["steps"], cp["pstats"]))
    for r in cp["rows"][:CPROFILE_ROWS]:
        fb.log("   %-58s %7.2f %8.2f %7.1f" % (r["function"][:58], r["own_ms_per_step"],
                                              r["with_callees_ms_per_step"], r["calls_per_step"]))


def sections_of(model, opt, ids, mode, cuda, offloader, steps):
    """Host time per planned step in the hook path's sections and in each library call
    (bench/hook_overhead_bench.Sections: timers around each, so a little slower than the timed
    steps), with the calls per step: where an offload's host price goes."""
    import hook_overhead_bench as hob
    stats = offloader.stats
    before = stats.offloaded_storages
    with hob.Sections() as sec:
        for _ in range(steps):
            fb.train_step(model, opt, ids, mode, cuda)
    return {"steps": steps,
            "offloaded_storages_per_step": (stats.offloaded_storages - before) / steps,
            "rows": [{"name": name, "ms_per_step": sec.ns[name] / 1e6 / steps,
                      "calls_per_step": sec.calls[name] / steps,
                      "us_per_call": sec.ns[name] / 1e3 / sec.calls[name]}
                     for name in sec.names() if sec.calls.get(name)]}


def print_sections(sections):
    fb.log("== plan's host time by section (%d steps with timers; %.1f storages offloaded a "
           "step): ms per step, calls per step, us per call" % (
               sections["steps"], sections["offloaded_storages_per_step"]))
    for r in sections["rows"]:
        fb.log("   %-34s %7.2f %7.1f %8.1f" % (r["name"], r["ms_per_step"], r["calls_per_step"],
                                              r["us_per_call"]))


def goal_of(text, rc_peak):
    if text == "rc-peak":
        return dict(target_bytes=int(rc_peak))
    key, _, value = text.partition("=")
    if key == "overhead":
        return dict(max_overhead=float(value))
    if key == "mib":
        return dict(target_bytes=int(float(value) * MiB))
    if key == "budget":
        return dict(budget=float(value))
    raise SystemExit("--goal: rc-peak, overhead=F, mib=N or budget=F")


def settled_plan(model, opt, ids, session, args, goals, cuda, tt):
    """The planner after its goals in turn (comma-separated, as frontier_bench runs its rows on
    one planner: the first calibrates, each later one re-plans), settled on the last."""
    planner = tt.plan_activations(model, client=session.client, min_bytes=args.min_bytes,
                                  verbose=True, **goals[0])
    for goal in goals:
        mode = fb.Planned(planner, session, goal, "plan")
        steps = settle(model, opt, ids, mode, args, cuda)
    if planner.plan is None:
        raise SystemExit("no plan after %d steps: %r" % (steps, planner.stats))
    return mode, steps


def settled_budget(model, opt, ids, session, args, max_overhead, cuda):
    """The offload-only budget (frontier_bench's tierd-budget), settled."""
    mode = fb.TierdBudget("tierd-budget", model, session, args, max_overhead=max_overhead)
    return mode, settle(model, opt, ids, mode, args, cuda)


def settle(model, opt, ids, mode, args, cuda):
    """Steps of `mode` (a planner's goal or the budget) until it settles: at least 6, at most
    6 + --settle-steps. Returns how many ran."""
    steps = 0
    while steps < 6 or (mode.settling() and steps < 6 + args.settle_steps):
        fb.train_step(model, opt, ids, mode, cuda)
        steps += 1
    return steps


def planner_figures(planner, offloader, steps):
    """What the planner (or, with planner None, the budget) chose."""
    if planner is None:
        budget = offloader.budget
        stats = offloader.stats.as_dict()
        return {"steps_to_settle": steps, "tier_stats": stats,
                "budget": budget.as_dict() if budget is not None else None,
                "summary": "budget: %d storages, %.0f MiB offloaded in all" % (
                    stats["offloaded_storages"], stats["offloaded_bytes"] / MiB)}
    best = planner.plan.best
    return {"steps_to_settle": steps, "stats": planner.stats.as_dict(),
            "modes": best.modes, "offloads": len(best.chosen),
            "offloaded_mib": best.offloaded_bytes / MiB,
            "predicted_step_ms": 1e3 * best.step_s,
            "baseline_step_ms": 1e3 * planner.plan.baseline.step_s,
            "offload_step_us": 1e6 * planner.profile.offload_step_s,
            "offload_host_us": 1e6 * planner.profile.offload_host_s,
            "summary": planner.summary()}


def main(argv=None):
    args = parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available (--smoke runs on the CPU)")
    os.makedirs(args.out_dir, exist_ok=True)
    import torch_offload_bench as tob
    import tier.torch as tt
    from _tierd import TierdProcess
    os.environ.setdefault("TIER_BUILD_DIR", args.build_dir)
    daemon = None
    if args.socket is None:
        daemon = TierdProcess(args.build_dir, "48G" if cuda else "1G")
        daemon.connect("plan_profile").close()
        args.socket = daemon.socket
    try:
        return _run(args, cuda, tob, tt)
    finally:
        if daemon is not None:
            daemon.stop()


def _run(args, cuda, tob, tt):
    session = tob.TierdSession(args.socket, args.build_dir)
    cfg = dict(fb.SHAPES[args.shape], seq=args.seq, vocab=32000 if cuda else 256, attn="sdpa")
    model = fb.make_model(cfg, args.device)
    ids = fb.make_batch(cfg, args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    out = {"shape": args.shape, "seq": args.seq, "goal": args.goal,
           "device": torch.cuda.get_device_name() if cuda else "cpu"}
    try:
        none = fb.Mode()
        for _ in range(3):
            fb.train_step(model, opt, ids, none, cuda)
        none_steps = [fb.train_step(model, opt, ids, none, cuda)["step_s"] for _ in range(3)]
        trace = os.path.join(args.out_dir, "none") if args.trace else None
        out["none"] = profiled_step(model, opt, ids, none, cuda, trace)
        rc = fb.Recompute(model)
        rc_peak = max(fb.train_step(model, opt, ids, rc, cuda)["act_peak"] or 0
                      for _ in range(3)) if cuda else 1 << 20
        rc.remove()
        goals = [goal_of(g, rc_peak) for g in args.goal.split(",")]
        if "budget" in goals[-1]:
            mode, steps = settled_budget(model, opt, ids, session, args, goals[-1]["budget"],
                                         cuda)
            offloader, planner = mode.off, None
        else:
            mode, steps = settled_plan(model, opt, ids, session, args, goals, cuda, tt)
            planner = mode.planner
            offloader = planner.offloader
        planned = [fb.train_step(model, opt, ids, mode, cuda)["step_s"] for _ in range(3)]
        trace = os.path.join(args.out_dir, "plan") if args.trace else None
        out["plan"] = profiled_step(model, opt, ids, mode, cuda, trace)
        if cuda:
            out["none_phases"] = phases_of_steps(model, opt, ids, none)
            out["plan_phases"] = phases_of_steps(model, opt, ids, mode)
            out["none_gaps"] = gaps_of_step(model, opt, ids, none,
                                            os.path.join(args.out_dir, "gaps-none.json"))
            out["plan_gaps"] = gaps_of_step(model, opt, ids, mode,
                                            os.path.join(args.out_dir, "gaps-plan.json"))
        out["sections"] = sections_of(model, opt, ids, mode, cuda, offloader, SECTION_STEPS)
        if args.cprofile > 0:
            out["cprofile"] = cprofiled(model, opt, ids, mode, cuda, args.cprofile,
                                        os.path.join(args.out_dir, "plan.pstats"))
        out["planner"] = planner_figures(planner, offloader, steps)
        if planner is not None:
            planner.remove()
    finally:
        session.close()
    out["none_step_ms"] = 1e3 * statistics.median(none_steps)
    out["plan_step_ms"] = 1e3 * statistics.median(planned)
    fb.log("%s seq %d, %s, goal %s: none %.1f ms, plan %.1f ms (%.3fx); settled after %d steps"
           % (args.shape, args.seq, out["device"], args.goal, out["none_step_ms"],
              out["plan_step_ms"], out["plan_step_ms"] / out["none_step_ms"], steps))
    fb.log(out["planner"]["summary"])
    if "offload_step_us" in out["planner"]:
        fb.log("offloads %d (%.0f MiB), price per offload %.0f us of step, host %.0f us" % (
            out["planner"]["offloads"], out["planner"]["offloaded_mib"],
            out["planner"]["offload_step_us"], out["planner"]["offload_host_us"]))
    print_summary("none", out["none"])
    print_summary("plan", out["plan"])
    for step in ("none", "plan"):
        if step + "_phases" in out:
            print_phases(step, out[step + "_phases"])
        if step + "_gaps" in out:
            fb.log(stream_gaps.describe(step + ", compute stream", out[step + "_gaps"]))
    print_sections(out["sections"])
    if "cprofile" in out:
        print_cprofiled(out["cprofile"])
    path = os.path.join(args.out_dir, "plan_profile.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    fb.log("wrote %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
