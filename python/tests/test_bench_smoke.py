"""The benchmarks' CPU smoke modes (bench/frontier_bench.py --smoke, bench/plan_profile.py --smoke,
bench/hook_overhead_bench.py and bench/weight_offload_bench.py --device cpu): their logic end to end against a tierd of this
build (host engine), in seconds."""

import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD_DIR, REPO_ROOT, TIERD

BENCH = os.path.join(REPO_ROOT, "bench")


def _run(args, timeout=600):
    if not os.access(TIERD, os.X_OK):
        pytest.skip("tierd not built at %s (set TIER_BUILD_DIR)" % TIERD)
    env = dict(os.environ, TIER_BUILD_DIR=BUILD_DIR, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable] + args, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_frontier_bench_smoke(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("matplotlib")
    torch = pytest.importorskip("torch")
    from tier.torch import _plan_activations as pa
    if not pa.selective_available():
        pytest.skip("selective checkpointing needs torch >= 2.4 (torch %s)" % torch.__version__)
    r = _run([os.path.join(BENCH, "frontier_bench.py"), "--smoke", "--out-dir", str(tmp_path),
              "--child-timeout", "300"])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    with open(tmp_path / "frontier.json") as f:
        out = json.load(f)
    (run,) = out["runs"]
    labels = [row["label"] for row in run["results"]]
    assert labels[:5] == ["none", "recompute", "selective", "light", "tierd-budget"], labels
    planned = [row for row in run["results"] if row["label"].startswith("plan@")]
    assert planned and all("error" not in row for row in planned)
    assert all(row["modes"] and len(row["modes"]) == run["config"]["layers"] for row in planned)
    assert all(row["x_none"] > 0 for row in run["results"])
    assert all(row["step_ms_mean"] >= row["step_ms_min"] for row in run["results"])
    # Every row also ran free (steps back to back, one synchronization): its loop ms.
    assert all(row["loop_ms"] > 0 for row in run["results"]), run["results"]
    assert "loop ms" in r.stdout
    assert labels[-1] == "none-last", labels  # the baseline again, after every other row
    assert (tmp_path / "frontier.png").stat().st_size > 0
    assert "tier.torch.plan_activations:" in r.stderr  # the planner's printed summary


def test_plan_profile_smoke(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    r = _run([os.path.join(BENCH, "plan_profile.py"), "--smoke", "--goal", "overhead=0.05",
              "--cprofile", "1", "--out-dir", str(tmp_path)], timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    with open(tmp_path / "plan_profile.json") as f:
        out = json.load(f)
    for step in ("none", "plan"):
        assert out[step]["wall_ms"] > 0 and out[step]["host_top"], out[step]
    assert out["plan_step_ms"] > 0 and out["none_step_ms"] > 0
    assert len(out["planner"]["modes"]) == 6 and out["planner"]["stats"]["plans"] == 1
    assert "== plan: wall" in r.stdout
    # The sections pass: the hook path's and the library's host time per step, by call.
    assert out["sections"]["steps"] > 0 and out["sections"]["rows"], out["sections"]
    assert all(row["calls_per_step"] > 0 and row["us_per_call"] >= 0
               for row in out["sections"]["rows"])
    assert any(row["name"].startswith("C tier_") for row in out["sections"]["rows"])
    assert "host time by section" in r.stdout
    # --cprofile: the tier package's functions of a planned step, the planner's among them.
    cp = out["cprofile"]
    assert cp["steps"] == 1 and os.path.getsize(cp["pstats"]) > 0
    assert all(row["function"].startswith("tier/") for row in cp["rows"]), cp["rows"][:5]
    assert any("_plan_activations.py" in row["function"] for row in cp["rows"])
    assert all(row["with_callees_ms_per_step"] >= row["own_ms_per_step"] - 1e-6 >= -1e-6
               for row in cp["rows"])
    assert "== cProfile of 1 planned steps" in r.stdout


def test_plan_profile_smoke_of_the_offload_only_budget(tmp_path):
    pytest.importorskip("transformers")
    r = _run([os.path.join(BENCH, "plan_profile.py"), "--smoke", "--goal", "budget=0.05",
              "--out-dir", str(tmp_path)], timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    with open(tmp_path / "plan_profile.json") as f:
        out = json.load(f)
    # No planner: the budget's own figures, and its offloads' host time by section.
    assert out["planner"]["budget"] is not None and "modes" not in out["planner"]
    assert out["planner"]["tier_stats"]["saved"] > 0
    assert out["sections"]["rows"] and "budget:" in r.stdout


def test_hook_overhead_bench_cpu(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "hooks.json"
    r = _run([os.path.join(BENCH, "hook_overhead_bench.py"), "--device", "cpu", "--ops", "64",
              "--steps", "3", "--warmup", "3", "--json", str(out)], timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = {row["mode"]: row for row in json.load(open(out))["rows"]}
    assert set(rows) == {"none", "identity", "kept", "planned", "half", "offload-all"}
    assert rows["planned"]["offloaded_storages"] > 0
    assert rows["kept"]["offloaded_storages"] == 0


def test_weight_offload_bench_cpu(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "weights.json"
    r = _run([os.path.join(BENCH, "weight_offload_bench.py"), "--device", "cpu", "--blocks", "4",
              "--dim", "64", "--seq", "8", "--steps", "2", "--warmup", "1", "--pool-bytes", "256M",
              "--json", str(out)], timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    row = json.load(open(out))
    assert row["identical"] and row["resident_ms"] > 0 and row["offload_ms"] > 0
    assert row["stats"]["onloads"] > 0 and row["stats"]["prefetches"] > 0, row["stats"]


class _HostEvent:
    """torch.cuda.Event's timing interface on the host clock (the probe's logic on CPU)."""

    def record(self):
        import time
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 1e3 * (other.t - self.t)


def test_frontier_probe_and_report_on_cpu(capsys):
    """frontier_bench's CUDA-only parts (the per-block timeline, the bounds, the checks and the
    report) on a tiny Llama with host-clock events: every mode's blocks are seen in forward and
    backward, a recompute in backward is not counted twice."""
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    import sys
    sys.path.insert(0, BENCH)
    import frontier_bench as fb
    cfg = dict(fb.SHAPES["tiny"], seq=32, vocab=128, attn="eager")
    model = fb.make_model(cfg, "cpu")
    ids = fb.make_batch(cfg, "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    n = cfg["layers"]
    rows = []
    for name in ("none", "recompute", "selective", "light"):
        mode = fb.make_mode(name, model, None, None, {})
        timeline = fb.Timeline(fb.layers_of(model), event=_HostEvent)
        timeline.install()
        try:
            probes = [fb.train_step(model, opt, ids, mode, False, timeline)["probe"]
                      for _ in range(2)]
        finally:
            timeline.remove()
            mode.remove()
        p = fb.summarize_timeline(probes, n)
        assert all(v is not None and v >= 0 for v in p["fwd_ms"] + p["bwd_ms"]), (name, p)
        assert p["head_ms"] is not None and p["tail_ms"] is not None
        rows.append({"mode": name, "label": name, "step_ms": 100.0 + 10 * len(rows),
                     "act_peak_mib": 1000.0 - 200 * len(rows), "d2h_mib": 0, "h2d_mib": 0,
                     "probe": p})
    rows.append(dict(rows[0], label="plan@rc-peak", mode="plan", step_ms=118.0,
                     act_peak_mib=420.0, modes=["keep"] + ["full"] * (n - 1),
                     goal={"target_bytes": 400 << 20}, predicted={"peak_bytes": 410 << 20},
                     profile={"modes": {"keep": {"block_mib": 100.0}, "full": {"block_mib": 5.0}}}))
    run = {"shape": "tiny", "seq": 4096, "config": dict(cfg, layers=n), "device": "cpu",
           "torch": torch.__version__, "tierd_engine": "host", "none_fwd_s": 0.03,
           "none_bwd_s": 0.06, "link_pinned": {"d2h": 5e9, "h2d": 5e9, "source": "pinned"},
           "results": rows, "notes": []}
    fb.analyze(run, None)
    fb.report(run)
    out = capsys.readouterr().out
    assert "where the time goes" in out and "plan@rc-peak" in out
    b = run["frontier_bound"]
    assert b["x_at_recompute_peak"] >= 1.0 and b["source"] == "the planner's calibration"
    rc_check = next(c for c in run["checks"] if "recompute's peak" in c["target"])
    assert rc_check["bound"] and rc_check["at_bound"] is not None
    assert any("within its target" in c["target"] for c in run["checks"])
