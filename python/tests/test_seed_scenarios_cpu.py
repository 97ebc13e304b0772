"""The seed pattern that needs no GPU, in CI: a source overwritten or freed right after its
offload was submitted, while the daemon's copy is still delayed (seeds 000 and 003: sources
reused before the D2H copy read them). GPU versions of all five seeds:
python/tests/gpu/test_seed_scenarios.py."""

import gc

import torch

import tier


def test_source_overwritten_and_freed_right_after_offload(make_daemon):
    d = make_daemon(extra=("--copy_delay_us=3000",))
    with tier.Client(socket=d.socket, name="seed-cpu") as c:
        g = torch.Generator().manual_seed(0)
        want, handles = [], []
        for i in range(16):
            t = torch.randn(64, 1024, generator=g)
            want.append(t.clone())
            handles.append(c.offload(t))
            t.fill_(float("nan"))  # overwritten at once: the copy must have its own bytes
            del t
        gc.collect()
        junk = [torch.full((64, 1024), 7.0) for _ in range(16)]  # memory handed out again
        for h, w in zip(reversed(handles), reversed(want)):
            assert torch.equal(h.reload(), w)
        del junk
