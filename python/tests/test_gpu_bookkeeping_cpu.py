"""The GPU path's bookkeeping, on fakes (no GPU here; these are the rules it relies on).

The deferred GPU reload's ordering (tier/_reloads.py: DeferredBatch, DeferredReload): the
stream a result is taken on waits for its batch once (a wait per batch and stream), the batch's
jobs are noted in use at its first wait (the reload check after a daemon's death must see every
GPU reload a stream waited on), a tensor used on another stream than the allocating one is
record_stream'ed there, and a prefetch never taken still makes the allocating stream wait. And
the GPU-engine offload's completion: retain_on_failure keeps the source in the handle."""

import threading
import types

import torch

from tier import _reloads, _streams


class _Jobs:
    def __init__(self):
        self.waits = []
        self.noted = []

    def chunks(self, count):
        return [(0, count)]

    def stream_wait_reload(self, job_id, ptr):
        self.waits.append((job_id, ptr))

    def in_use(self, jobs):
        self.noted.extend(jobs)


class _Tensor:
    def __init__(self, device):
        self.device = device
        self.recorded = []

    def record_stream(self, stream):
        self.recorded.append(stream)


def _session():
    return types.SimpleNamespace(lock=threading.Lock(), c_session=object(), jobs=_Jobs())


def test_a_stream_waits_once_per_batch_and_its_jobs_are_noted_at_the_first_wait(monkeypatch):
    current = {"ptr": 0x100}
    monkeypatch.setattr(_streams, "_raw_stream", lambda index: current["ptr"])
    streams_made = []
    fake_cuda = types.SimpleNamespace(current_stream=lambda d: streams_made.append(d) or "S")
    monkeypatch.setattr(_reloads, "torch_module",
                        lambda: types.SimpleNamespace(cuda=fake_cuda))
    session = _session()
    jobs = [types.SimpleNamespace(id=i) for i in (11, 12, 13)]
    batch = _reloads.DeferredBatch(session, jobs, 0x100)
    device = torch.device("cuda", 0)
    tensors = [_Tensor(device) for _ in jobs]
    reloads = [_reloads.DeferredReload(batch, t) for t in tensors]

    assert reloads[0].result() is tensors[0]
    assert session.jobs.waits == [(13, 0x100)]  # the chunk's last job: its ticket covers all
    assert session.jobs.noted == jobs           # noted once, at the first wait
    assert tensors[0].recorded == []            # used on the allocating stream

    assert reloads[1].result() is tensors[1]
    assert session.jobs.waits == [(13, 0x100)]  # that stream waits already: no second wait

    current["ptr"] = 0x200                      # used on another stream
    assert reloads[2].result() is tensors[2]
    assert session.jobs.waits == [(13, 0x100), (13, 0x200)]
    assert session.jobs.noted == jobs           # not noted twice
    assert tensors[2].recorded == ["S"] and streams_made == [device]


def test_a_prefetch_never_taken_makes_the_allocating_stream_wait():
    session = _session()
    jobs = [types.SimpleNamespace(id=5), types.SimpleNamespace(id=6)]
    batch = _reloads.DeferredBatch(session, jobs, 0x300)
    reload = _reloads.DeferredReload(batch, _Tensor(torch.device("cuda", 0)))
    del reload
    assert session.jobs.waits == [(6, 0x300)]
    assert session.jobs.noted == jobs


def test_a_failed_gpu_offload_leaves_its_source_in_its_handle_and_a_done_one_lets_it_go():
    """The GPU-engine offload's job keeps (source, tensor, weak handle) and one shared callback
    (tier/_offloads.py): on failure the handle gets the source (retain_on_failure), on success
    nothing; either way the job drops what it kept once finished (JobTable._finish)."""
    from tier import _jobs, _offloads, errors

    class _Handle:
        fallback = None

    table = _jobs.JobTable(None)
    for status, kept in ((errors.RESOURCE_EXHAUSTED, True), (errors.OK, False)):
        handle, src, t = _Handle(), object(), object()
        keep, done = _offloads._cuda_keep(handle, src, t, retain_on_failure=True)
        job = _jobs.Job(1, "offload", keep, done)
        table._finish(job, status, "")
        assert (handle.fallback is src) == kept
        assert job.keep is None and job.on_done is None
    keep, done = _offloads._cuda_keep(_Handle(), object(), object(), retain_on_failure=False)
    assert done is None and len(keep) == 2


def test_a_failure_only_callback_is_called_for_a_failed_job_alone():
    """Job.fail_only (the GPU offloads' retain callback): a job that succeeded drops what it
    kept without the call (reap's path for every such job), one that failed calls it."""
    from tier import _jobs, errors

    calls = []
    table = _jobs.JobTable(None)
    for status in (errors.OK, errors.RESOURCE_EXHAUSTED):
        job = _jobs.Job(1, "offload", object(), calls.append, fail_only=True)
        table._finish(job, status, "")
        assert job.keep is None and job.on_done is None
    assert [j.status for j in calls] == [errors.RESOURCE_EXHAUSTED]


class _FakeCudaTensor:
    """What _offload_batch_cuda reads of a contiguous CUDA tensor."""

    def __init__(self, ptr):
        self.ptr = ptr

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self.ptr


class _FakeHandle:
    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.object_id = None
        self.job = None
        self.direct = False
        self.kept = None


def _ranges_offloads(monkeypatch, answers, chunk):
    """An Offloads over a fake session whose tier_offload_ranges answers `answers` (ptr -> (object,
    job) or a status code) in chunks of `chunk` rows; returns (offloads, the calls made)."""
    import contextlib

    from tier import _offloads

    calls = []

    class _RangeJobs:
        def reap(self):
            pass

        def chunks(self, count):
            return [(lo, min(lo + chunk, count)) for lo in range(0, count, chunk)]

        def offload_ranges(self, rows, ptrs, keeps, dones, fail_only=False):
            calls.append((rows, ptrs, keeps, dones))
            return [answers[ptr] for ptr, _, _ in rows]

    offloads = _offloads.Offloads.__new__(_offloads.Offloads)
    offloads._session = types.SimpleNamespace(checked=contextlib.nullcontext(), jobs=_RangeJobs())
    offloads.device_direct = None
    offloads._warned_kept = set()
    fake_cuda = types.SimpleNamespace(current_stream=lambda device: "S")
    monkeypatch.setattr(_offloads, "torch_module", lambda: types.SimpleNamespace(cuda=fake_cuda))
    monkeypatch.setattr(_offloads, "stream_ptr", lambda stream: 0x99)
    monkeypatch.setattr(_offloads._lib, "last_error", lambda: "registration broke")
    return offloads, calls


def test_offload_ranges_results_reach_their_handles_and_a_range_left_out_stays_on_the_gpu(
        monkeypatch):
    """_offload_batch_cuda goes through tier_offload_ranges (one call per chunk registers and
    submits): each range's (object, job) lands in its handle with the source kept by its job; a
    range the library left out (OUT_OF_RANGE: two physical allocations; another status: its
    registration failed) stays on the GPU with its producers, warned once per cause."""
    import warnings

    from tier import errors

    answers = {0x10: (7, "job7"), 0x20: errors.OUT_OF_RANGE, 0x30: errors.INTERNAL,
               0x40: (8, "job8"), 0x50: errors.OUT_OF_RANGE}
    offloads, calls = _ranges_offloads(monkeypatch, answers, chunk=2)
    handles = [_FakeHandle(100 * (i + 1)) for i in range(5)]
    tensors = [_FakeCudaTensor(ptr) for ptr in sorted(answers)]
    items = [(h, t, i + 1) for i, (h, t) in enumerate(zip(handles, tensors))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback = offloads._offload_batch_cuda("cuda:0", items, None, retain_on_failure=True)
    assert fallback == []
    # Three calls of at most two ranges, each naming (ptr, bytes, hint) and the producer stream.
    assert [rows for rows, _, _, _ in calls] == [
        [(0x10, 100, 1), (0x20, 200, 2)], [(0x30, 300, 3), (0x40, 400, 4)], [(0x50, 500, 5)]]
    assert all(ptrs == [0x99] for _, ptrs, _, _ in calls)
    keep = calls[0][2][0]
    assert keep[0] is tensors[0] and keep[1] is tensors[0] and keep[2]() is handles[0]
    assert calls[0][3][0] is not None  # the shared retain-on-failure callback
    assert (handles[0].object_id, handles[0].job, handles[0].direct) == (7, "job7", True)
    assert (handles[3].object_id, handles[3].job) == (8, "job8")
    for left_out in (1, 2, 4):
        assert handles[left_out].job is None and handles[left_out].direct
        assert handles[left_out].kept == (tensors[left_out], ["S"])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2  # once per cause, not once per range
    assert any("expandable segment" in m for m in messages)
    assert any("INTERNAL" in m and "registration broke" in m for m in messages)
    assert offloads.device_direct is True


class _SizedCudaTensor(_FakeCudaTensor):
    """What offload_contiguous reads besides: shape, dtype, nbytes."""

    def __init__(self, ptr, nbytes):
        super().__init__(ptr)
        self.nbytes = nbytes
        self.shape = (nbytes,)
        self.dtype = "uint8"


def test_offload_contiguous_sends_the_callers_tensors_as_ranges_written_by_its_stream(
        monkeypatch):
    """tier.torch's lane (Offloads.offload_contiguous): a handle per tensor in order, the
    non-empty ones as one tier_offload_ranges naming the producer stream given (a raw
    cudaStream_t); without the GPU engine, the general offload_batch with that stream."""
    from tier import _offloads, _streams

    offloads, calls = _ranges_offloads(monkeypatch, {0x10: (7, "job7"), 0x20: (8, "job8")},
                                       chunk=4)
    monkeypatch.setattr(_offloads, "stream_ptr", _streams.stream_ptr)
    monkeypatch.setattr(_offloads, "Handle",
                        lambda client, session, pool, shape, dtype, device, nbytes:
                        _FakeHandle(nbytes))
    offloads._client = types.SimpleNamespace(_staging=None)
    offloads._session.engine = "gpu"
    tensors = [_SizedCudaTensor(0x10, 64), _SizedCudaTensor(0x30, 0),
               _SizedCudaTensor(0x20, 128)]
    handles = offloads.offload_contiguous("cuda:0", 0x77, tensors, True)
    assert [h.nbytes for h in handles] == [64, 0, 128]
    assert [(rows, ptrs) for rows, ptrs, _, _ in calls] == [
        ([(0x10, 64, 0), (0x20, 128, 0)], [0x77])]
    assert (handles[0].object_id, handles[0].job) == (7, "job7")
    assert (handles[2].object_id, handles[2].job) == (8, "job8")
    assert handles[1].job is None
    assert offloads.device_direct is True

    general = []
    offloads.device_direct = False
    offloads.offload_batch = lambda *args: general.append(args) or ["h"]
    assert offloads.offload_contiguous("cuda:0", 0x77, tensors[:1], True) == ["h"]
    assert general == [(tensors[:1], [0x77], None, True)]


def test_offload_ranges_without_gpu_support_stage_every_tensor(monkeypatch):
    """A library without GPU support answers UNIMPLEMENTED for every range: nothing was
    submitted, every tensor goes back to be staged, and CUDA tensors are staged from then on."""
    import warnings

    from tier import errors

    answers = {0x10: errors.UNIMPLEMENTED, 0x20: errors.UNIMPLEMENTED}
    offloads, _ = _ranges_offloads(monkeypatch, answers, chunk=8)
    handles = [_FakeHandle(64), _FakeHandle(64)]
    tensors = [_FakeCudaTensor(0x10), _FakeCudaTensor(0x20)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fallback = offloads._offload_batch_cuda(
            "cuda:0", [(h, t, 0) for h, t in zip(handles, tensors)], ["P"],
            retain_on_failure=False)
    assert fallback == [(handles[0], tensors[0], 0, ["P"]), (handles[1], tensors[1], 0, ["P"])]
    assert offloads.device_direct is False
    assert all(h.job is None and h.kept is None for h in handles)
