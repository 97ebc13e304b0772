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
