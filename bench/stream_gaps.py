"""Why a GPU stream sat idle, from a profiler trace (torch.profiler's Chrome trace).

Between two consecutive operations of one stream the GPU idles for one of two reasons: the host
had not yet asked for the next one (its launch call ended after the previous operation ended:
the GPU waited for the host), or it had, and the stream still did not start it (something queued
before it held the stream: a wait on another stream or on memory, such as tierd's copy being
waited for at a release point, or the launch's own latency of a few microseconds). :func:`split`
divides every gap of the stream into those two parts, using the correlation between each GPU
operation and the host call that launched it, and lists the largest blocked gaps with the host's
stream-wait calls issued between the two launches (bench/plan_profile.py prints it). Those calls
name a wait issued on any stream (the trace does not say which: tierd's library makes its ticket
stream wait on the producer with cudaStreamWaitEvent, and the profiler records the driver's
cuStreamWaitValue64, the wait a release point or a reload puts on the compute stream, on some
drivers only): read them as a hint, the stall's length as the fact.
"""

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Host calls that make a stream wait (CUDA events, or memory: tierd's tickets and done words).
WAIT_CALLS = ("StreamWaitEvent", "WaitValue", "cuStreamBatchMemOp")
# A blocked gap longer than this is a stall; shorter ones are the launch's own latency.
STALL_US = 20.0


def _end(e):
    return e["ts"] + e.get("dur", 0)


def split(trace, stream=None, top=8):
    """The idle time of `stream` (default: the one with the most GPU time) in `trace` (a parsed
    Chrome trace), in microseconds: ``host_us`` (waiting for the host's launch), ``stall_us``
    (blocked gaps over STALL_US), ``latency_us`` (blocked gaps up to it), ``unknown_us`` (no
    launch found for the next operation), with ``span_us`` from the stream's first operation to
    its last, ``busy_us``, ``ops``, ``stalls`` (count), ``stalls_after_wait`` (those with a
    stream-wait call issued between the two launches) and ``largest``: the `top` stalls as
    (us, next operation's name, the wait calls between the launches)."""
    events = [e for e in trace.get("traceEvents", ()) if e.get("ph") == "X" and "ts" in e]
    launches = {}
    host_calls = []
    for e in events:
        if e.get("cat") in HOST_CATEGORIES:
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches[corr] = e
            host_calls.append(e)
    host_calls.sort(key=lambda e: e["ts"])
    streams = {}
    for e in events:
        if e.get("cat") in GPU_CATEGORIES:
            streams.setdefault((e.get("args") or {}).get("stream"), []).append(e)
    out = {"stream": None, "ops": 0, "span_us": 0.0, "busy_us": 0.0, "host_us": 0.0,
           "stall_us": 0.0, "latency_us": 0.0, "unknown_us": 0.0, "stalls": 0,
           "stalls_after_wait": 0, "largest": []}
    if not streams:
        return out
    if stream is None:
        stream = max(streams, key=lambda s: sum(e.get("dur", 0) for e in streams[s]))
    ops = sorted(streams.get(stream, ()), key=lambda e: e["ts"])
    if not ops:
        return out
    out["stream"] = stream
    out["ops"] = len(ops)
    out["span_us"] = _end(ops[-1]) - ops[0]["ts"]
    out["busy_us"] = sum(e.get("dur", 0) for e in ops)
    stalls = []
    prev_end = _end(ops[0])
    prev_launch = launches.get((ops[0].get("args") or {}).get("correlation"))
    for e in ops[1:]:
        gap = e["ts"] - prev_end
        launch = launches.get((e.get("args") or {}).get("correlation"))
        if gap > 0:
            if launch is None:
                out["unknown_us"] += gap
            else:
                host = min(gap, max(0.0, _end(launch) - prev_end))
                blocked = gap - host
                out["host_us"] += host
                if blocked > STALL_US:
                    out["stall_us"] += blocked
                    waits = _waits_between(host_calls, prev_launch, launch)
                    stalls.append((blocked, e.get("name", "?"), waits))
                else:
                    out["latency_us"] += blocked
        prev_end = max(prev_end, _end(e))
        if launch is not None:
            prev_launch = launch
    out["stalls"] = len(stalls)
    out["stalls_after_wait"] = sum(1 for s in stalls if s[2])
    stalls.sort(key=lambda s: -s[0])
    out["largest"] = [(round(us, 1), name[:60], waits) for us, name, waits in stalls[:top]]
    return out


def _waits_between(host_calls, first, second):
    """Names of the stream-wait calls the host issued after launch `first` and before launch
    `second` (host_calls sorted by start)."""
    if first is None or second is None:
        return []
    lo, hi = first["ts"], second["ts"]
    names = []
    for e in host_calls:  # (a profile step has a few thousand: a scan is fine)
        if e["ts"] <= lo:
            continue
        if e["ts"] >= hi:
            break
        name = e.get("name", "")
        if any(w in name for w in WAIT_CALLS) and name not in names:
            names.append(name)
    return names


def describe(name, s):
    """One paragraph of text for `split`'s result."""
    lines = ["== %s: stream %s, %d ops over %.2f ms, busy %.2f ms; idle: waiting for the host "
             "%.2f ms, stalled %.2f ms (%d gaps > %.0f us, %d after a stream-wait call), launch "
             "latency %.2f ms, unattributed %.2f ms" % (
                 name, s["stream"], s["ops"], s["span_us"] / 1e3, s["busy_us"] / 1e3,
                 s["host_us"] / 1e3, s["stall_us"] / 1e3, s["stalls"], STALL_US,
                 s["stalls_after_wait"], s["latency_us"] / 1e3, s["unknown_us"] / 1e3)]
    for us, op, waits in s["largest"]:
        lines.append("   stall %.1f us before %s%s" % (us, op, (" after " + ", ".join(waits))
                                                      if waits else ""))
    return "\n".join(lines)
