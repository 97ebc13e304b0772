"""The benchmarks' CPU smoke modes (bench/frontier_bench.py --smoke, bench/hook_overhead_bench.py
--device cpu): their logic end to end against a tierd of this build (host engine), in seconds."""

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
    from tier import _plan_activations as pa
    if not pa.selective_available():
        pytest.skip("selective checkpointing needs torch >= 2.4 (torch %s)" % torch.__version__)
    r = _run([os.path.join(BENCH, "frontier_bench.py"), "--smoke", "--out-dir", str(tmp_path),
              "--child-timeout", "300"])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    with open(tmp_path / "frontier.json") as f:
        out = json.load(f)
    (run,) = out["runs"]
    labels = [row["label"] for row in run["results"]]
    assert labels[:4] == ["none", "recompute", "selective", "tierd-budget"], labels
    planned = [row for row in run["results"] if row["label"].startswith("plan@")]
    assert planned and all("error" not in row for row in planned)
    assert all(row["modes"] and len(row["modes"]) == run["config"]["layers"] for row in planned)
    assert all(row["x_none"] > 0 for row in run["results"])
    assert (tmp_path / "frontier.png").stat().st_size > 0
    assert "tier.torch.plan_activations:" in r.stderr  # the planner's printed summary


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
