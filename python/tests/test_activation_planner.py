"""The joint planner's arithmetic (tier/torch/_activation_planner.py) on made-up steps: no
daemon."""

import pytest

from tier.torch import _activation_planner as ap
from tier.torch._offload_planner import OFFLOAD, Link

MB = 1 << 20
GB = 1e9
LINK = Link(55 * GB, 55 * GB)


def _keep_sites(total=900 * MB, n=10, fwd=3e-3, bwd=6e-3):
    """n saved tensors over a block's forward; backward needs them in reverse."""
    return tuple(ap.TemplateSite(total // n, fwd * i / n, bwd * (n - 1 - i) / n, True)
                 for i in range(n))


def llama_like(n=16, keep_fwd=3e-3, keep_bwd=6e-3, extra=430 * MB, sel_fwd=3.1e-3,
               sel_bwd=6.6e-3, full_bwd=9e-3, input_bytes=32 * MB):
    """A 1B-like layer: 900 MB saved, 3 ms forward, 6 ms backward; selective keeps 430 MB of
    matmul outputs for 0.7 ms more; full recompute keeps its 32 MB input for 3 ms more."""
    inp = (ap.TemplateSite(input_bytes, 0.0, 0.0, True),)
    modes = {"keep": ap.ModeProfile(keep_fwd, keep_bwd, _keep_sites(fwd=keep_fwd, bwd=keep_bwd),
                                    0),
             "selective": ap.ModeProfile(sel_fwd, sel_bwd, inp, extra),
             "full": ap.ModeProfile(keep_fwd, full_bwd, inp, 0)}
    return ap.StepProfile(["L"] * n, {"L": modes}, pre_sites=[(16 * MB, 1e-4)],
                          post_sites=[64 * MB], pre_s=1e-3, post_s=5e-3, tail_s=1e-3)


def test_baseline_is_the_step_as_it_runs():
    prof = llama_like()
    jp = ap.choose(prof, LINK, max_overhead=0.0, offload=False, modes=("keep",))
    base = jp.baseline
    assert base.step_s == pytest.approx(1e-3 + 16 * 3e-3 + 5e-3 + 16 * 6e-3 + 1e-3)
    # Every block's 900 MB, the outside 80 MB.
    assert base.peak_bytes == 16 * 900 * MB // 10 * 10 + 80 * MB
    assert jp.best.modes == ["keep"] * 16 and jp.best.offloaded_bytes == 0


def test_within_no_overhead_only_what_the_link_hides_in_forward_is_offloaded():
    prof = llama_like()
    jp = ap.choose(prof, LINK, max_overhead=0.0, modes=("keep",))
    best = jp.best
    assert best.modes == ["keep"] * 16
    forward = 16 * 3e-3
    # The link bound: forward time x D2H rate (less the last tensors, which land too late).
    assert 0.7 * forward * LINK.d2h <= best.offloaded_bytes <= forward * LINK.d2h
    assert best.step_s <= jp.baseline.step_s * 1.005
    assert best.peak_bytes == jp.baseline.peak_bytes - best.offloaded_bytes
    # The earliest blocks' tensors, the longest-lived.
    assert min(s.index for s in best.chosen) == 1  # the first candidate after the pre site


def test_at_full_recomputes_peak_the_plan_is_faster_than_full_recompute():
    prof = llama_like()
    full = ap.evaluate(prof, ("full",) * 16, LINK, offload=False)
    jp = ap.choose(prof, LINK, target_bytes=full.peak_bytes)
    assert jp.met_target and jp.best.peak_bytes <= full.peak_bytes
    assert jp.best.step_s < full.step_s
    # Early blocks keep (and offload), late ones recompute.
    modes = jp.best.modes
    assert modes[0] == "keep" or jp.best.offloaded_bytes > 0
    assert modes[-1] != "keep"
    assert "full recompute" in jp.references and "selective everywhere" in jp.references


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.4, 0.55, 0.7, 0.85])
def test_never_worse_than_recompute_selective_or_offload_alone(fraction):
    prof = llama_like()
    base = ap.evaluate(prof, ("keep",) * 16, LINK, offload=False)
    target = int(fraction * base.peak_bytes)
    jp = ap.choose(prof, LINK, target_bytes=target)
    pure = [ap.evaluate(prof, (m,) * 16, LINK, offload=False) for m in ("full", "selective")]
    pure.append(ap.evaluate(prof, ("keep",) * 16, LINK))  # offload what hides
    meeting = [e for e in pure if e.peak_bytes <= target]
    if meeting:
        assert jp.met_target
        assert jp.best.step_s <= min(e.step_s for e in meeting) + 1e-12


def test_the_least_memory_within_an_overhead_budget():
    prof = llama_like()
    jp = ap.choose(prof, LINK, max_overhead=0.05)
    assert jp.within_budget and jp.best.step_s <= 1.05 * jp.baseline.step_s + 1e-12
    # More than offload can do alone within the same budget.
    alone = ap.choose(prof, LINK, max_overhead=0.05, modes=("keep",))
    assert jp.best.peak_bytes < alone.best.peak_bytes


def test_a_target_out_of_reach_gives_the_least_memory_and_says_so():
    prof = llama_like()
    jp = ap.choose(prof, LINK, target_bytes=1)
    assert not jp.met_target
    assert any("no plan reaches" in n for n in jp.notes)
    full = ap.evaluate(prof, ("full",) * 16, LINK, offload=False)
    assert jp.best.peak_bytes <= full.peak_bytes
    assert "NOT met" in jp.summary()


def test_the_budget_wins_over_the_target_and_says_so():
    prof = llama_like()
    jp = ap.choose(prof, LINK, target_bytes=1, max_overhead=0.02)
    assert jp.within_budget and not jp.met_target
    assert any("out of reach within the overhead budget" in n for n in jp.notes)


def test_without_recompute_the_offload_only_plan_may_stall_to_meet_a_target():
    prof = llama_like()
    base = ap.evaluate(prof, ("keep",) * 16, LINK, offload=False)
    jp = ap.choose(prof, LINK, target_bytes=base.peak_bytes // 2, modes=("keep",))
    assert jp.met_target and jp.best.how == "offload-only plan"
    assert jp.best.step_s > base.step_s  # it waits for the link


def test_the_step_plan_matches_the_layout():
    prof = llama_like()
    full = ap.evaluate(prof, ("full",) * 16, LINK, offload=False)
    jp = ap.choose(prof, LINK, target_bytes=full.peak_bytes * 2)
    sp = jp.step_plan
    lay = ap.Layout(prof, jp.best.modes)
    assert sp.count == lay.count
    offloaded = set(sp.offloaded)
    assert offloaded and offloaded == {s.index for s in jp.best.chosen}
    assert all(sp.actions[i] == OFFLOAD for i in offloaded)
    # Block-scoped: each block's candidates from its own first index; hooks only in the blocks
    # with an offload or a reload trigger; sources released at a later block's start or at the
    # barrier (the end of the last block's forward); the step timed at the blocks.
    regions = sp.regions
    assert regions.first == tuple(lay.starts) and regions.count == tuple(lay.counts)
    need_hooks = {lay.block_of(i) for i in offloaded | set(sp.triggers)}
    assert {b for b, h in enumerate(regions.hooked) if h} == need_hooks
    assert regions.barrier
    for b, due in enumerate(regions.releases):
        assert all(i in offloaded and lay.block_of(i) < b for i in due)
    assert sp.barrier == -1 and sp.timing_site == -1 and sp.releases == {}


def test_nothing_offloaded_means_no_hooks_at_all():
    prof = llama_like()
    jp = ap.choose(prof, LINK, max_overhead=0.0, offload=False)
    assert not any(jp.step_plan.regions.hooked) and not jp.step_plan.regions.barrier


def test_reloads_started_before_a_blocks_backward_count_at_its_peak():
    """Offloaded bytes come back before their block's backward: where the link needs longer
    than the blocks in between take, the reloads start during the backward of later blocks and
    their memory is allocated there, on top of what those blocks hold. (The first device run
    measured 2868 MiB where the model, without this, said 1585.)"""
    prof = llama_like(n=4)
    modes = ("keep", "full", "full", "full")
    lay = ap.Layout(prof, modes)
    block0 = [s for s in lay.sites if lay.block_of(s.index) == 0]
    slow_back = Link(55 * GB, 20 * GB)  # 900 MB back in 45 ms: longer than blocks 1..3's 27 ms
    e = ap.evaluate(prof, modes, slow_back, chosen=block0)
    assert e.offloaded_bytes == 900 * MB and max(e.early) > 0
    without = lay.peak([e.offloaded_bytes, 0, 0, 0], prof.peak_offset)
    assert e.peak_bytes == lay.peak([e.offloaded_bytes, 0, 0, 0], prof.peak_offset, e.early)
    assert e.peak_bytes > without
    # Reloads that fit in block 0's own backward come back there: nothing early.
    fast = ap.evaluate(prof, modes, Link(55 * GB, 1e15), chosen=block0)
    assert max(fast.early) == 0 and fast.peak_bytes == without


def test_at_a_tight_target_the_plan_holds_it_with_its_reloads():
    prof = llama_like()
    full = ap.evaluate(prof, ("full",) * 16, LINK, offload=False)
    for target in (full.peak_bytes, int(full.peak_bytes * 1.5)):
        jp = ap.choose(prof, LINK, target_bytes=target)
        e = jp.best
        assert jp.met_target and e.peak_bytes <= target
        # The model's peak includes the early reloads it plans.
        n = len(e.modes)
        by_block = [0] * n
        for s in e.chosen:
            by_block[e.layout.block_of(s.index)] += s.nbytes
        assert e.peak_bytes == e.layout.peak(by_block, prof.peak_offset, e.early)


def test_views_follow_their_storage():
    # A block saving one storage three times (q, k, v views): 100 MB once, all offloaded or none.
    sites = (ap.TemplateSite(100 * MB, 0.0, 1e-3, True), ap.TemplateSite(0, 1e-4, 1e-3, True),
             ap.TemplateSite(0, 2e-4, 1e-3, True))
    prof = ap.StepProfile(["B"] * 2, {"B": {"keep": ap.ModeProfile(1e-2, 2e-2, sites, 0)}})
    jp = ap.choose(prof, LINK, max_overhead=0.0)
    assert jp.baseline.peak_bytes == 200 * MB
    sp = jp.step_plan
    first_block = {i for i in sp.offloaded if i < 3}
    assert first_block in (set(), {0, 1, 2})


def test_storages_saved_outside_the_block_are_not_offloaded():
    sites = (ap.TemplateSite(100 * MB, 0.0, 1e-3, False), ap.TemplateSite(50 * MB, 1e-4, 1e-3, True))
    prof = ap.StepProfile(["B"], {"B": {"keep": ap.ModeProfile(1e-2, 2e-2, sites, 0)}})
    jp = ap.choose(prof, LINK, max_overhead=0.0)
    assert 0 not in jp.step_plan.offloaded


def test_only_measured_modes_are_used():
    prof = llama_like()
    del prof.modes["L"]["selective"]
    assert prof.allowed(ap.MODES) == ["keep", "full"]
    jp = ap.choose(prof, LINK, target_bytes=1)
    assert "selective" not in jp.best.modes


@pytest.mark.parametrize("kwargs", [dict(), dict(max_overhead=-1), dict(target_bytes=-5)])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        ap.choose(llama_like(), LINK, **kwargs)


def test_a_28_block_search_is_quick():
    import time
    prof = llama_like(n=28)
    t0 = time.perf_counter()
    ap.choose(prof, LINK, target_bytes=2 << 30)
    assert time.perf_counter() - t0 < 20


def test_the_measured_segments_model_the_peak_where_the_allocator_was_measured():
    """CUDA calibrations measure the allocator per segment: the end of forward, and each block's
    backward. The model then moves those figures by what the blocks keep instead of adding an
    offset to the saved bytes."""
    prof = llama_like(n=4)
    calib = ["keep", "selective", "full", "full"]
    kept = ap.Layout(prof, calib, peak_model=False).block_bytes  # 900, 462, 32, 32 MB
    outside = 80 * MB
    prof.calib_modes = calib
    prof.forward_peak = outside + sum(kept) + 300 * MB   # with the head's logits and the loss
    prof.misc = [40 * MB] * 4     # allocated at each backward start besides the saved bytes
    # A block's backward holds its whole activations again plus 200 MB of gradients.
    prof.work = {"L": {m: 1100 * MB for m in ap.MODES}}
    assert prof.measured()

    def backward_peaks(k):
        return [40 * MB + sum(k[:b]) + 1100 * MB for b in range(4)]

    e = ap.evaluate(prof, calib, LINK, offload=False)
    assert e.peak_bytes == max([prof.forward_peak] + backward_peaks(kept))
    # All full: the end of forward falls by what keep and selective kept beyond their inputs;
    # the last block's backward then tops it.
    full = ap.evaluate(prof, ("full",) * 4, LINK, offload=False)
    k_full = [32 * MB] * 4
    assert full.peak_bytes == max([prof.forward_peak - sum(kept) + sum(k_full)] +
                                  backward_peaks(k_full))
    # Offloading from block 0 lowers the later blocks' backward peaks by what it took.
    some = ap.evaluate(prof, ("keep", "full", "full", "full"), LINK,
                       chosen=[s for s in ap.Layout(prof, ["keep"] + ["full"] * 3).sites
                               if s.index < 3])
    assert some.offloaded_bytes > 0
    k_some = [900 * MB - some.offloaded_bytes] + [32 * MB] * 3
    assert some.peak_bytes == max([prof.forward_peak - sum(kept) + sum(k_some)] +
                                  backward_peaks(k_some))


def test_candidates_between_blocks_are_numbered_after_their_block_and_never_offloaded():
    prof = llama_like(n=3)
    prof.gaps = [[8 * MB, 8 * MB], [8 * MB, 8 * MB], []]  # after the last block: the head's
    lay = ap.Layout(prof, ("keep",) * 3)
    per_block = len(prof.modes["L"]["keep"].sites)
    assert lay.starts == [1, 1 + per_block + 2, 1 + 2 * per_block + 4]
    assert lay.counts == [per_block] * 3
    assert lay.block_bytes[0] == lay.block_bytes[2] + 16 * MB
    gap_indices = set(range(1 + per_block, 1 + per_block + 2))
    assert not gap_indices & {s.index for s in lay.sites}
    jp = ap.choose(prof, LINK, max_overhead=0.0)
    assert not gap_indices & set(jp.step_plan.offloaded)


def _with_host(prof, host_fwd, cost_s):
    """prof with a host that issues a keep block in `host_fwd` s (its GPU: 3 ms) and spends
    `cost_s` per offloaded storage (measured, as a planned step would)."""
    prof.host = {"L": {m: (p.fwd_s, p.bwd_s, host_fwd, 1e-3) for m, p in prof.modes["L"].items()}}
    prof.offload_host_s = cost_s
    return prof


def test_the_hosts_cost_per_offload_is_unseen_until_measured():
    plain = ap.evaluate(llama_like(), ("keep",) * 16, LINK)
    measured_zero = ap.evaluate(_with_host(llama_like(), 1.5e-3, 0.0), ("keep",) * 16, LINK)
    assert plain.host_s == measured_zero.host_s == 0.0
    assert [s.index for s in plain.chosen] == [s.index for s in measured_zero.chosen]


def test_offloads_the_host_cannot_issue_in_time_count_and_are_trimmed():
    # Blocks of 10 tensors of 90 MB: the GPU takes 3 ms, the host 1.5 ms, and 300 us per
    # offloaded storage (an H100 host's per-storage cost, before release grouping): 5 offloads
    # a block use the host's lead up; the link would take about 1.8 per block.
    prof = _with_host(llama_like(), 1.5e-3, 300e-6)
    lay = ap.Layout(prof, ("keep",) * 16)
    chosen = [s for s in lay.sites if lay.block_of(s.index) < 2]  # 20 offloads in 2 blocks
    bunched = ap.evaluate(prof, ("keep",) * 16, LINK, chosen=chosen)
    # Host: 2 x (1.5 + 10 x 0.3) = 9 ms for the first two blocks against the GPU's 6 ms: the GPU
    # waits 3 ms, and a wait is never won back (the host's later lead only keeps the GPU fed).
    assert bunched.host_s == pytest.approx(3e-3, rel=1e-6)
    nothing = ap.evaluate(prof, ("keep",) * 16, LINK, chosen=[])
    assert bunched.step_s == pytest.approx(nothing.step_s + bunched.overhead_s + 3e-3)
    # The planner's own choice keeps the host's extra within the tolerance, where the same
    # choice without the host's cost would have taken more.
    tol = 0.005 * nothing.step_s
    filled = ap.evaluate(prof, ("keep",) * 16, LINK, tolerance_s=tol)
    assert 0 < filled.host_s <= tol
    unmeasured = ap.evaluate(llama_like(), ("keep",) * 16, LINK, tolerance_s=tol)
    assert 0 < len(filled.chosen) < len(unmeasured.chosen)
    # No block offloads more than its host lead and the tolerance pay for: 5 of 0.3 ms in a
    # lead of 1.5 ms, plus at most the tolerance's 2.
    assert max(ap.offloads_by_block(filled.layout, filled.chosen)) <= 5 + int(tol / 300e-6)


def test_a_host_bound_block_runs_at_the_hosts_pace():
    prof = _with_host(llama_like(n=2), 4e-3, 0.0)  # the host slower than the GPU's 3 ms
    ends = ap._forward_pipeline(prof, ("keep", "keep"), [0, 0])
    assert ends == pytest.approx([4e-3, 8e-3])
    prof.offload_host_s = 1e-3
    assert ap.host_extra_s(prof, ("keep", "keep"), [2, 0]) == pytest.approx(2e-3)


def test_the_host_probe_takes_the_median_blocks_cost_per_offload():
    from tier.torch._host_probe import HostProbe

    prof = _with_host(llama_like(n=4), 1.5e-3, 0.0)
    lay = ap.Layout(prof, ("keep",) * 4)
    # Two offloads in each of blocks 0-2, none in block 3.
    chosen = [s for s in lay.sites if lay.block_of(s.index) < 3 and
              s.index - lay.starts[lay.block_of(s.index)] < 2]
    e = ap.evaluate(prof, ("keep",) * 4, LINK, chosen=chosen)
    probe = HostProbe(4)
    # Host forward per block: 1.5 ms calibrated, plus 0.2, 0.3 and (held up) 9 ms; block 3: +0.1.
    for b, extra in enumerate((0.2e-3, 0.3e-3, 9e-3, 0.1e-3)):
        probe._marks[b] = [10.0 * b, 10.0 * b + 1.5e-3 + extra]
    cost = probe.cost_s(e, prof, prof.blocks)
    assert cost == pytest.approx(0.3e-3 / 2)  # the median block's 0.15 ms an offload, not 1.58
    assert [b[1] for b in probe.blocks] == [2, 2, 2, 0]
    assert probe.blocks[3][2] == pytest.approx(0.1e-3)  # a hooked block without offloads shows too
    empty = HostProbe(4)
    assert empty.cost_s(e, prof, prof.blocks) is None  # nothing clocked


def test_the_host_probe_says_where_a_blocks_host_time_went():
    from tier.torch._host_probe import HostProbe

    class Offloader:
        def __init__(self):
            self.calls = []

        def region_exit(self, token):
            self.calls.append(("exit", token))
            return 7

        def release_sites(self, due, device):
            self.calls.append(("release", due))

    prof = _with_host(llama_like(n=2), 1.5e-3, 0.0)
    e = ap.evaluate(prof, ("keep",) * 2, LINK, chosen=[])
    probe = HostProbe(2)
    off = Offloader()
    timed = probe.timing(off)
    probe.begins(0)
    timed.release_sites([1], None)
    probe.begins(1)
    assert timed.region_exit("t") == 7  # calls pass through, results come back
    timed.region_exit("u")
    probe.ends(1)
    assert off.calls == [("release", [1]), ("exit", "t"), ("exit", "u")]
    probe.cost_s(e, prof, prof.blocks)
    assert set(probe.blocks[0][3]) == {"release_sites"}
    assert set(probe.blocks[1][3]) == {"region_exit"}
    assert all(v >= 0 for b in probe.blocks for v in b[3].values())


def test_the_host_probe_places_a_blocks_time_on_both_timelines():
    # Besides the host forward it prices offloads by, the probe step clocks each block's host
    # backward and its forward and backward on the step's clock (CUDA events on a GPU; here the
    # host's), each beyond calibration: where a price shows on the device and not on the host,
    # it is a stall, not host work.
    import time
    import torch
    from tier.torch._host_probe import HostProbe

    prof = _with_host(llama_like(n=2), 1.5e-3, 0.0)
    gpu_f, gpu_b, _, host_b = prof.host["L"]["keep"]
    e = ap.evaluate(prof, ("keep",) * 2, LINK, chosen=[])
    cpu = torch.device("cpu")
    probe = HostProbe(2)
    t0 = time.perf_counter()
    x = torch.ones(8, requires_grad=True)
    probe.begins(0, x, cpu)
    y = x * 2
    probe.ends(0, y, cpu)
    probe.begins(1, y, cpu)
    z = y.sin()
    probe.ends(1, z, cpu)
    z.sum().backward()
    wall = time.perf_counter() - t0
    probe.cost_s(e, prof, prof.blocks)
    first, second = probe.blocks[0][4], probe.blocks[1][4]
    assert set(first) == {"host_bwd", "gpu_fwd", "gpu_bwd"}
    # Each is the block's own span less its calibrated figure: a span inside the test's wall.
    assert 0 <= first["gpu_fwd"] + gpu_f <= wall
    assert 0 <= first["gpu_bwd"] + gpu_b <= wall
    assert 0 <= first["host_bwd"] + host_b <= wall
    assert second["gpu_fwd"] is not None
    # Block 1's backward began (its "bs": the gradient of z) and ended (y's gradient) here too.
    assert second["gpu_bwd"] is not None
    forward_only = HostProbe(1)
    x = torch.ones(8, requires_grad=True)
    forward_only.begins(0, x, cpu)
    forward_only.ends(0, x * 2, cpu)
    forward_only.cost_s(ap.evaluate(llama_like(n=1), ("keep",), LINK, chosen=[]),
                        _with_host(llama_like(n=1), 1.5e-3, 0.0), ("L",))
    assert forward_only.blocks[0][4]["gpu_bwd"] is None  # no backward ran: not a figure
    assert forward_only.blocks[0][4]["host_bwd"] is None


def test_a_price_per_offload_learned_from_the_clock_makes_offloads_pay_their_way():
    # With offloads free, at full recompute's peak the plan mixes offload into recompute; once
    # the planned steps showed each offload costs the step 3 ms beyond the model (more than a
    # block's recompute frees per offload), the same goal is met without them, and every
    # prediction carries the price.
    prof = llama_like()
    full = ap.evaluate(prof, ("full",) * 16, LINK, offload=False)
    free = ap.choose(prof, LINK, target_bytes=full.peak_bytes).best
    assert free.chosen
    prof.offload_step_s = 3e-3
    priced = ap.choose(prof, LINK, target_bytes=full.peak_bytes).best
    assert priced.peak_bytes <= full.peak_bytes
    assert len(priced.chosen) < len(free.chosen)
    assert priced.step_s <= full.step_s + 1e-12
    again = ap.evaluate(prof, free.modes, LINK, chosen=free.chosen)
    assert again.step_s == pytest.approx(free.step_s + 3e-3 * len(free.chosen))


def test_a_28_block_search_with_a_price_per_offload_is_quick():
    import time
    prof = llama_like(n=28)
    prof.offload_step_s = 2e-4
    t0 = time.perf_counter()
    ap.choose(prof, LINK, target_bytes=2 << 30)
    assert time.perf_counter() - t0 < 20
