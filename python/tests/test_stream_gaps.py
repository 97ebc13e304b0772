"""bench/stream_gaps.py: a stream's idle time split into waiting for the host and stalls, on
traces built by hand (the profiler's Chrome trace format)."""

import os
import sys

from conftest import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))

import stream_gaps  # noqa: E402


def _kernel(ts, dur, corr, stream=7, name="k"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": corr}}


def _call(ts, dur, name, corr=None):
    e = {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "args": {}}
    if corr is not None:
        e["args"]["correlation"] = corr
    return e


def test_a_gap_the_host_caused_and_a_stall_after_a_stream_wait_are_told_apart():
    trace = {"traceEvents": [
        # Kernel 1 runs 0-100; kernel 2 is launched at 150-155 (the host was late: 55 us of
        # the 60 us gap are the host's, 5 us launch latency); kernel 3 is launched early
        # (170-175), after a stream wait the host issued at 160, and starts at 400 although
        # kernel 2 ended at 200: a 200 us stall.
        _call(0, 5, "cudaLaunchKernel", 1),
        _kernel(10, 90, 1),
        _call(150, 5, "cudaLaunchKernel", 2),
        _kernel(160, 40, 2),
        _call(160, 3, "cuStreamWaitValue32_v2"),
        _call(170, 5, "cudaLaunchKernel", 3),
        _kernel(400, 50, 3, name="gemm"),
        # Another stream's kernels do not count (less GPU time than stream 7).
        _call(180, 5, "cudaLaunchKernel", 4),
        _kernel(200, 10, 4, stream=9),
    ]}
    s = stream_gaps.split(trace)
    assert s["stream"] == 7 and s["ops"] == 3
    assert s["span_us"] == 440 and s["busy_us"] == 180
    assert s["host_us"] == 55            # 100 -> 155, the launch of kernel 2 ended at 155
    assert s["latency_us"] == 5          # 155 -> 160
    assert s["stall_us"] == 200          # 200 -> 400, launched at 175
    assert s["stalls"] == 1 and s["stalls_after_wait"] == 1
    assert s["largest"] == [(200.0, "gemm", ["cuStreamWaitValue32_v2"])]
    assert "stalled 0.20 ms" in stream_gaps.describe("x", s)


def test_no_launch_found_is_unattributed_and_no_gpu_work_is_an_empty_split():
    trace = {"traceEvents": [_kernel(0, 10, 1), _kernel(30, 10, 2)]}
    s = stream_gaps.split(trace)
    assert s["unknown_us"] == 20 and s["host_us"] == 0 and s["stall_us"] == 0
    empty = stream_gaps.split({"traceEvents": [_call(0, 1, "cudaFree")]})
    assert empty["ops"] == 0 and empty["stream"] is None
