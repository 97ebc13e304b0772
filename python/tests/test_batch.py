"""Batched submission (tier_offload_batch / tier_reload_batch) from Python, against a real tierd
(host engine): the low-level calls over (buffer, offset, length) tuples, the tensor API
(Client.offload_batch / reload_batch), splitting above the ring size, a bad job failing alone,
the errors, and its use by tier.torch (weight groups, activation prefetch)."""

import ctypes
import gc

import numpy as np
import pytest
import torch
import torch.nn as nn

import tier
import tier.torch as tt
from tier import _lib, errors

from batch_counter import Installer

MiB = 1 << 20
KiB = 1 << 10


@pytest.fixture()
def counted():
    """counted(client, fail_call=None) -> the counter; the client's library is restored after."""
    install = Installer()
    yield install
    install.restore()


def _filled(client, nbytes, seed=0):
    buf = client.alloc_host_buffer(nbytes)
    data = buf.numpy()
    data[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return buf, data.copy()


# ---- low level --------------------------------------------------------------------------------

def test_offload_ranges_from_raw_pointers_round_trip(client, counted):
    """tier_offload_ranges through the ctypes layer (the GPU engine path's one call per batch;
    here raw pointers into a host buffer): each range's object and job come back and reload
    intact, a range the library leaves out reports its status, and the session reaps the jobs."""
    count = counted(client)
    buf, expected = _filled(client, MiB, seed=5)
    chunk = 64 * KiB
    session = client._session
    rows = [(buf.address + i * chunk, chunk, i + 1) for i in range(6)]
    rows.insert(3, (buf.address + MiB - 100, chunk, 0))  # runs past the buffer's end
    with session.checked:
        results = session.jobs.offload_ranges(rows, None, keeps=[("kept", i) for i in range(7)])
    assert count.sizes["tier_offload_ranges"] == [7]
    assert results[3] == errors.OUT_OF_RANGE
    done = [r for i, r in enumerate(results) if i != 3]
    assert all(type(r) is tuple for r in done) and len({obj for obj, _ in done}) == 6
    assert done[0][1].keep == ("kept", 0)
    with session.checked:
        for _, job in done:
            assert session.jobs.wait(job) == errors.OK
            assert job.keep is None  # released once the job finished
    buf.numpy()[:] = 0
    back = [(obj, buf, i * chunk, chunk) for i, (obj, _) in enumerate(done)]
    for job in client.reload_buffer_batch(back):
        client.wait(job)
    assert np.array_equal(buf.numpy()[:6 * chunk], expected[:6 * chunk])


def test_reload_ranges_into_raw_pointers_all_or_nothing(client, counted):
    """tier_reload_ranges through the ctypes layer (the GPU reload path's one call per batch):
    objects come back into raw pointers with their jobs tracked, free_after frees them, and a
    destination that cannot be registered raises with nothing submitted."""
    count = counted(client)
    buf, expected = _filled(client, MiB, seed=9)
    chunk = 64 * KiB
    session = client._session
    with session.checked:
        out = session.jobs.offload_ranges([(buf.address + i * chunk, chunk, 0) for i in range(4)],
                                          None)
        for _, job in out:
            assert session.jobs.wait(job) == errors.OK
    objects = [obj for obj, _ in out]
    buf.numpy()[:] = 0
    bad = [(objects[0], buf.address + 8 * chunk, chunk),
           (objects[1], buf.address + MiB - 100, chunk)]  # past the buffer's end
    with session.checked, pytest.raises(errors.OutOfRange):
        session.jobs.reload_ranges(bad, None, free_after=True)
    assert len(session.jobs) == 0  # nothing was submitted
    back = [(obj, buf.address + (8 + i) * chunk, chunk) for i, obj in enumerate(objects)]
    with session.checked:
        jobs = session.jobs.reload_ranges(back, None, free_after=True)
        for job in jobs:
            assert session.jobs.wait(job) == errors.OK
    assert count.sizes["tier_reload_ranges"] == [2, 4]
    got = buf.numpy()
    assert np.array_equal(got[8 * chunk:12 * chunk], expected[:4 * chunk])
    with session.checked:  # freed after the copy: a second reload finds no object
        again = session.jobs.reload_ranges(back[:1], None, free_after=False)
        assert session.jobs.wait(again[0]) == errors.NOT_FOUND


def test_buffer_batch_round_trip(client, counted):
    count = counted(client)
    buf, expected = _filled(client, MiB)
    chunk = 64 * KiB
    jobs = [(buf, i * chunk, chunk, 100 - i) if i % 2 else (buf.id, i * chunk, chunk)
            for i in range(8)]
    submitted = client.offload_buffer_batch(jobs)
    assert count.sizes["tier_offload_batch"] == [8]
    assert len(submitted) == 8 and len({obj for obj, _ in submitted}) == 8
    for _, job in submitted:
        client.wait(job)
    buf.numpy()[:] = 0
    # Back in reverse order, into the second half of the buffer shifted by one chunk.
    back = [(obj, buf, 8 * chunk + (7 - i) * chunk, chunk) for i, (obj, _) in enumerate(submitted)]
    for job in client.reload_buffer_batch(back):
        client.wait(job)
    assert count.sizes["tier_reload_batch"] == [8]
    got = buf.numpy()
    for i in range(8):
        dst = 8 * chunk + (7 - i) * chunk
        assert np.array_equal(got[dst:dst + chunk], expected[i * chunk:(i + 1) * chunk]), i
    # free_after: for every job, or for one job (the fifth element).
    objs = [obj for obj, _ in submitted]
    jobs = client.reload_buffer_batch([(objs[0], buf, 0, chunk),
                                       (objs[1], buf, chunk, chunk, True)])
    for job in jobs:
        client.wait(job)
    with pytest.raises(tier.NotFound):
        client.wait(client.reload_buffer(objs[1], buf, 0, chunk))  # freed after its reload
    client.wait(client.reload_buffer(objs[0], buf, 0, chunk))      # still there
    for job in client.reload_buffer_batch([(o, buf, 0, chunk) for o in objs if o != objs[1]],
                                          free_after=True):
        client.wait(job)
    for o in objs:
        with pytest.raises(tier.NotFound):
            client.wait(client.reload_buffer(o, buf, 0, chunk))


def test_a_bad_offload_fails_alone(client, daemon):
    buf, expected = _filled(client, 16 * KiB, seed=1)
    submitted = client.offload_buffer_batch([
        (buf, 0, 4096),
        (buf, 16 * KiB - 100, 200),   # crosses the buffer's end
        (buf, 4096, 4096),
        (424242, 0, 16),              # no such buffer
        (buf, 8192, 0),               # empty
        (buf, 8192, 8192),
    ])
    results = {}
    for i, (_, job) in enumerate(submitted):
        try:
            client.wait(job)
            results[i] = None
        except tier.TierError as e:
            results[i] = type(e)
    assert results == {0: None, 1: tier.OutOfRange, 2: None, 3: tier.NotFound,
                       4: tier.InvalidArgument, 5: None}
    buf.numpy()[:] = 0
    for i, (offset, length) in ((0, (0, 4096)), (2, (4096, 4096)), (5, (8192, 8192))):
        client.wait(client.reload_buffer(submitted[i][0], buf, offset, length))
    assert np.array_equal(buf.numpy(), expected)
    for i in (0, 2, 5):
        client.wait(client.free(submitted[i][0]))
    daemon.wait_host_used(0)


def test_a_bad_reload_fails_alone(client):
    buf, expected = _filled(client, 64 * KiB, seed=2)
    (a, ja), (b, jb) = client.offload_buffer_batch([(buf, 0, 8192), (buf, 8192, 8192)])
    client.wait(ja)
    client.wait(jb)
    buf.numpy()[:] = 0
    jobs = client.reload_buffer_batch([
        (a, buf, 0, 8192),
        (987654, buf, 16384, 8192),   # no such object
        (b, buf, 8192, 4096),         # not the object's length
        (b, buf, 8192, 8192),
    ])
    outcome = []
    for job in jobs:
        try:
            client.wait(job)
            outcome.append(None)
        except tier.TierError as e:
            outcome.append(e.code)
    assert outcome[0] is None and outcome[3] is None, outcome
    assert outcome[1] == tier.NOT_FOUND and outcome[2] not in (None, tier.OK), outcome
    assert np.array_equal(buf.numpy()[:16384], expected[:16384])
    client.wait(client.free(a))
    client.wait(client.free(b))


def test_poll_sees_each_job_of_a_batch(client):
    from conftest import wait_until
    buf, _ = _filled(client, 64 * KiB)
    submitted = client.offload_buffer_batch([(buf, i * 4096, 4096) for i in range(5)])
    seen = {}

    def all_seen():
        for c in client.poll():
            seen[c.job] = c
        return len(seen) == 5
    wait_until(all_seen, what="5 completions")
    for obj, job in submitted:
        assert seen[job].ok and seen[job].object == obj and seen[job].length == 4096
        client.wait(client.free(obj))


# ---- splitting --------------------------------------------------------------------------------

def test_batches_above_the_ring_size_are_split(daemon, counted):
    with tier.Client(socket=daemon.socket, ring_entries=16) as c:
        assert c.info().ring_entries == 16 and c.batch_limit == 16
        count = counted(c)
        buf, expected = _filled(c, 40 * 1024, seed=3)
        submitted = c.offload_buffer_batch([(buf, i * 1024, 1024, i) for i in range(40)])
        assert count.sizes["tier_offload_batch"] == [16, 16, 8]
        for _, job in submitted:
            c.wait(job)
        buf.numpy()[:] = 0
        for job in c.reload_buffer_batch([(obj, buf, i * 1024, 1024)
                                          for i, (obj, _) in enumerate(submitted)]):
            c.wait(job)
        assert count.sizes["tier_reload_batch"] == [16, 16, 8]
        assert np.array_equal(buf.numpy(), expected)
        # The tensor API: 200 tensors, 13 calls each way.
        ts = [torch.full((1000,), float(i)) for i in range(200)]
        hs = c.offload_batch(ts)
        assert count.sizes["tier_offload_batch"][3:] == [16] * 12 + [8]
        outs = c.reload_batch(hs, free=True)
        assert count.sizes["tier_reload_batch"][3:] == [16] * 12 + [8]
        for t, out in zip(ts, outs):
            assert torch.equal(out, t)
        assert all(h.freed for h in hs)


def test_staged_batches_are_bounded_by_the_staging_cache(daemon, counted):
    with tier.Client(socket=daemon.socket, staging_cache_bytes=MiB) as c:
        count = counted(c)
        ts = [torch.full((64 * KiB,), float(i)) for i in range(10)]  # 256 KiB each
        hs = c.offload_batch(ts)
        assert count.sizes["tier_offload_batch"] == [4, 4, 2]
        outs = c.reload_batch(hs)
        assert count.sizes["tier_reload_batch"] == [4, 4, 2]
        assert all(torch.equal(a, b) for a, b in zip(ts, outs))
        c.synchronize()
        assert c.staging_bytes <= 2 * MiB


def test_a_failed_later_batch_reports_what_was_submitted(daemon, counted):
    with tier.Client(socket=daemon.socket, ring_entries=8) as c:
        counted(c, fail_call=("tier_offload_batch", 2))
        buf, _ = _filled(c, 20 * 1024)
        with pytest.raises(tier.Internal) as info:
            c.offload_buffer_batch([(buf, i * 1024, 1024) for i in range(20)])
        first = info.value.submitted
        assert len(first) == 8  # the first batch is in flight; the second was refused whole
        for obj, job in first:
            c.wait(job)
            c.wait(c.free(obj))
        assert c.jobs_in_flight == 0


def test_a_failed_later_tensor_batch_leaves_nothing_behind(daemon, counted):
    with tier.Client(socket=daemon.socket, ring_entries=8) as c:
        counted(c, fail_call=("tier_offload_batch", 2))
        with pytest.raises(tier.Internal):
            c.offload_batch([torch.full((1000,), float(i)) for i in range(20)])
        gc.collect()       # the first batch's handles: dropped, so their objects are freed
        c.collect()
        c.synchronize()
        daemon.wait_host_used(0)
        assert c.jobs_in_flight == 0


# ---- the tensor API ---------------------------------------------------------------------------

def test_tensor_batch_round_trip(client, daemon, counted):
    count = counted(client)
    g = torch.Generator().manual_seed(4)
    base = torch.randn(64, 96, generator=g)
    ts = [torch.randn(333, 17, generator=g), torch.arange(1000, dtype=torch.int64),
          (torch.rand(7, 5, generator=g) > 0.5), base.t(), base[::3, 5:70:2],
          base.to(torch.bfloat16)[1::2, ::5], torch.empty(0, 5), torch.tensor(3.5),
          torch.randn(4, 1, 6, generator=g).expand(4, 5, 6)]
    hs = client.offload_batch(ts, next_use_hints=list(range(len(ts))))
    assert count.sizes["tier_offload_batch"] == [len(ts) - 1]  # the empty tensor is no job
    for h in hs:
        h.wait()
    outs = client.reload_batch(hs)
    assert count.sizes["tier_reload_batch"] == [len(ts) - 1]
    for t, out in zip(ts, outs):
        assert out.shape == t.shape and out.dtype == t.dtype and out.is_contiguous()
        assert torch.equal(out, t)
    # Reloaded as often as needed; then free=True drops every object.
    outs = client.reload_batch(hs, free=True)
    assert all(torch.equal(t, out) for t, out in zip(ts, outs))
    assert all(h.freed for h in hs if h.nbytes)  # (as reload(free=True): empty ones hold nothing)
    with pytest.raises(tier.FailedPrecondition):
        hs[0].reload()
    client.synchronize()
    daemon.wait_host_used(0)


def test_sources_may_change_after_offload_batch(client):
    ts = [torch.arange(100000, dtype=torch.int64) * i for i in range(3)]
    expected = [t.clone() for t in ts]
    hs = client.offload_batch(ts)
    for t in ts:
        t.zero_()  # CPU: staged at offload_batch(); each staging buffer belongs to its job
    assert all(torch.equal(a, b) for a, b in zip(client.reload_batch(hs), expected))


def test_dropped_batch_handles_free_their_objects(client, daemon):
    daemon.wait_host_used(0)
    hs = client.offload_batch([torch.randn(256, 1024) for _ in range(8)])  # 1 MiB each
    del hs  # in flight: the jobs keep their staging buffers, the objects are freed after them
    gc.collect()
    client.synchronize()
    daemon.wait_host_used(0)
    assert client.jobs_in_flight == 0


def test_batch_with_a_failing_offload(daemon):
    with tier.Client(socket=daemon.socket, quota_bytes=MiB) as c:
        small = [torch.arange(1000, dtype=torch.int32) + i for i in range(3)]
        big = torch.ones(2 * MiB, dtype=torch.uint8)
        hs = c.offload_batch([small[0], big, small[1], small[2]])
        with pytest.raises(tier.ResourceExhausted):
            hs[1].wait()
        for h in (hs[0], hs[2], hs[3]):
            h.wait()
        # The failed one is refused before anything is submitted; the others reload.
        with pytest.raises(tier.ResourceExhausted):
            c.reload_batch(hs)
        outs = c.reload_batch([hs[0], hs[2], hs[3]])
        assert all(torch.equal(a, b) for a, b in zip(outs, small))
        # retain_on_failure (tier.torch's form): the failed one comes back from its staging copy.
        hs = c.offload_batch([small[0], big], None, None, retain_on_failure=True)
        c.synchronize()
        assert hs[1].failed
        outs = c.reload_batch(hs)
        assert torch.equal(outs[0], small[0]) and torch.equal(outs[1], big)


def test_batch_errors(client, daemon, counted):
    count = counted(client)
    assert client.offload_buffer_batch([]) == [] and client.reload_buffer_batch([]) == []
    assert client.offload_batch([]) == [] and client.reload_batch([]) == []
    buf = client.alloc_host_buffer(4096)
    with pytest.raises(ValueError):
        client.offload_buffer_batch([(buf, 0)])
    with pytest.raises(ValueError):
        client.reload_buffer_batch([(buf, 0, 16)])
    # A tensor that cannot be offloaded: refused before anything is submitted.
    with pytest.raises(TypeError):
        client.offload_batch([torch.ones(10), "not a tensor"])
    with pytest.raises(TypeError):
        client.offload_batch([torch.ones(10), torch.ones(4, 4).to_sparse()])
    with pytest.raises(ValueError):
        client.offload_batch([torch.ones(10), torch.ones(10)], next_use_hints=[1])
    assert not count.sizes and client.jobs_in_flight == 0
    # A freed handle, a handle twice with free=True, a handle of another client: nothing starts.
    ts = [torch.full((100,), float(i)) for i in range(3)]
    hs = client.offload_batch(ts)
    hs[1].free()
    with pytest.raises(tier.FailedPrecondition):
        client.reload_batch(hs)
    with pytest.raises(ValueError):
        client.reload_batch([hs[0], hs[0]], free=True)
    with tier.Client(socket=daemon.socket) as other:
        with pytest.raises(ValueError):
            other.reload_batch([hs[0]])
    assert count.sizes["tier_reload_batch"] == []
    assert not hs[0].freed and not hs[2].freed
    assert [torch.equal(o, t) for o, t in zip(client.reload_batch([hs[0], hs[2]]),
                                              (ts[0], ts[2]))] == [True, True]
    client.synchronize()
    c = tier.Client(socket=daemon.socket)
    c.close()
    with pytest.raises(tier.FailedPrecondition):
        c.offload_buffer_batch([(1, 0, 16)])
    with pytest.raises(tier.FailedPrecondition):
        c.offload_batch([torch.ones(10)])


def test_the_library_refuses_bad_batches(daemon):
    """The C ABI's own checks, called directly: each refuses the whole batch, submitting
    nothing."""
    with tier.Client(socket=daemon.socket, ring_entries=16) as c:
        lib = _lib.load()
        buf = c.alloc_host_buffer(64 * KiB)
        options = _lib.new_struct(_lib.OffloadOptions)

        def offload(jobs, count=None):
            return lib.tier_offload_batch(c._session.c_session, jobs,
                                          len(jobs) if count is None else count,
                                          ctypes.byref(options))

        def batch(n):
            jobs = _lib.new_batch(n)
            for i, job in enumerate(jobs):
                job.buffer, job.offset, job.len = buf.id, (i % 16) * 1024, 1024
            return jobs
        assert offload(batch(17)) == errors.INVALID_ARGUMENT       # more than the ring holds
        assert "16" in _lib.last_error()
        assert offload(batch(1025)) == errors.INVALID_ARGUMENT     # more than TIER_MAX_BATCH_JOBS
        jobs = batch(2)
        jobs[1].struct_size = 8
        assert offload(jobs) == errors.INVALID_ARGUMENT            # strides disagree
        jobs = batch(2)
        for job in jobs:
            job.struct_size = 8
        assert offload(jobs) == errors.INVALID_ARGUMENT            # struct_size too small
        small = _lib.new_struct(_lib.OffloadOptions)
        small.struct_size = 4
        assert lib.tier_offload_batch(c._session.c_session, batch(2), 2,
                                      ctypes.byref(small)) == errors.INVALID_ARGUMENT
        assert (lib.tier_reload_batch(c._session.c_session, batch(17), 17, None)
                == errors.INVALID_ARGUMENT)
        assert c.info().jobs_in_flight == 0
        # Through the client the same 17 go as two calls.
        for _, job in c.offload_buffer_batch([(buf, (i % 16) * 1024, 1024) for i in range(17)]):
            c.wait(job)


# ---- tier.torch -------------------------------------------------------------------------------

class _Net(nn.Module):
    def __init__(self, d=64, layers=4):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
            for _ in range(layers))
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.out(x)


def test_weight_groups_go_as_batches(client, counted):
    torch.manual_seed(0)
    ref = _Net().eval()
    m = _Net().eval()
    m.load_state_dict(ref.state_dict())
    x = torch.randn(8, 64)
    with torch.no_grad():
        want = ref(x)
    count = counted(client)
    w = tt.offload_module_weights(m, group=2, client=client)
    per_group = 2 * 6  # two blocks of LayerNorm + 2 Linear: 6 tensors each
    assert count.sizes["tier_offload_batch"] == [per_group, per_group]
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(m(x), want)
    # Each pass: the first group onloaded, the second prefetched: one batch each.
    assert count.sizes["tier_reload_batch"] == [per_group] * 4
    assert w.stats.onloads == 4 and w.stats.prefetches == 2, w.stats
    # In-place changes while resident are offloaded again, as one batch per group.
    w.remove()
    w = tt.offload_module_weights(m, group=4, client=client)
    with torch.no_grad():
        m(x)
    w._onload(0)
    with torch.no_grad():
        for p in m.layers[0].parameters():
            p.mul_(1.0)  # bumps the version: Tierd's copy counts as stale
        before = len(count.sizes["tier_offload_batch"])
        w._release(0)  # (under no_grad: with grad enabled the weights would stay resident)
    assert count.sizes["tier_offload_batch"][before:] == [6]
    assert w.stats.reoffloads == 6
    with torch.no_grad():
        assert torch.equal(m(x), want)
    w.remove()


def _tiny_gpt_steps(client, prefetch, steps=2):
    from test_torch_activations import _batches, _fresh_model, _train_steps
    batches = _batches(steps)
    ref_losses, ref_grads, _ = _train_steps(_fresh_model(), batches, steps=steps)
    losses, grads, stats = _train_steps(
        _fresh_model(), batches,
        lambda: tt.offload_activations(min_bytes=16 * 1024, prefetch=prefetch, client=client),
        steps=steps)
    for a, b in zip(ref_losses, losses):
        assert torch.equal(a, b)
    for a, b in zip(ref_grads, grads):
        assert torch.equal(a, b)
    return stats


def test_activation_prefetch_goes_as_batches(client, daemon, counted):
    count = counted(client)
    stats = _tiny_gpt_steps(client, prefetch=4)
    sizes = count.sizes["tier_reload_batch"]
    # The first unpack of backward starts `prefetch` reloads at once: one batch of them.
    assert sizes and max(sizes) >= 2, sizes
    assert sum(sizes) <= sum(s.prefetches for s in stats), (sizes, stats)
    for s in stats:
        assert (s.reloads + s.prefetches + s.source_hits
                == s.offloaded_storages + s.stayed_on_gpu_storages), s
    del stats
    gc.collect()
    client.synchronize()
    daemon.wait_host_used(0)


def test_activation_prefetch_of_one_is_not_batched(client, counted):
    count = counted(client)
    _tiny_gpt_steps(client, prefetch=1, steps=1)
    assert count.sizes["tier_reload_batch"] == []  # one at a time: plain tier_reload


def test_device_ranges_register_in_one_call_as_one_by_one(client):
    """tier_buffer_register_device_ranges: per range the status tier_buffer_register_device_range
    gives (here, tierd's host engine: every range refused with the single call's error), and
    Session.register_device raises that error."""
    lib = _lib.load()
    session = client._session
    ptrs = [0x7f0000001000, 0x7f0000100000, 0x7f0000200000]
    n = len(ptrs)
    ids = (_lib.c_buffer_id * n)(*[7] * n)
    offsets = (ctypes.c_uint64 * n)(*[7] * n)
    statuses = (_lib.c_status * n)()
    assert lib.tier_buffer_register_device_ranges(
        session.c_session, n, (ctypes.c_void_p * n)(*ptrs), (ctypes.c_uint64 * n)(*[4096] * n),
        ids, offsets, statuses) == errors.OK
    one = lib.tier_buffer_register_device_range(session.c_session, ptrs[0], 4096,
                                                ctypes.byref(_lib.c_buffer_id()),
                                                ctypes.byref(ctypes.c_uint64()))
    assert one != errors.OK
    assert list(statuses) == [one] * n and list(ids) == [0] * n and list(offsets) == [0] * n
    assert lib.tier_buffer_register_device_ranges(session.c_session, 2, None, None, None, None,
                                                  None) == errors.INVALID_ARGUMENT
    assert lib.tier_buffer_register_device_ranges(None, 0, None, None, None, None,
                                                  None) == errors.INVALID_ARGUMENT
    assert lib.tier_buffer_register_device_ranges(session.c_session, 0, None, None, None, None,
                                                  None) == errors.OK

    with pytest.raises(errors.TierError) as raised:
        session.register_device(ptrs[0], 4096)
    assert raised.value.code == one
