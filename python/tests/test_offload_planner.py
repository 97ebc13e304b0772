"""The offload planner's arithmetic (tier/torch/_offload_planner.py), on made-up steps: no
daemon."""

import pytest

from tier.torch._offload_planner import (Link, Site, fill_link, plan, release_points,
                                 reload_triggers, simulate)

GB = 1e9


def test_one_copy_that_fits_under_compute_costs_nothing():
    # 1 GB produced at 0 s, needed again at 2.0 s; forward ends at 1 s; 10 GB/s: 0.1 s each way.
    sites = [Site(0, 1 * GB, 0.0, 2.0)]
    sim = simulate(sites, forward_end=1.0, link=Link(10 * GB, 10 * GB))
    assert sim.offload_done[0] == pytest.approx(0.1)
    assert sim.reload_start[0] == pytest.approx(1.9)  # just early enough
    assert sim.overhead == pytest.approx(0.0)


def test_a_reload_that_cannot_start_in_time_stalls_backward():
    # Needed right at the start of backward: the reload can only begin when backward begins.
    sites = [Site(0, 1 * GB, 0.9, 1.0)]
    sim = simulate(sites, forward_end=1.0, link=Link(10 * GB, 10 * GB))
    assert sim.overhead == pytest.approx(0.1)


def test_offload_still_running_delays_its_reload():
    # A slow D2H link: the offload lands at 0.5 + 2 = 2.5 s, after the use at 2 s.
    sites = [Site(0, 2 * GB, 0.5, 2.0)]
    sim = simulate(sites, forward_end=1.0, link=Link(1 * GB, 100 * GB))
    assert sim.offload_done[0] == pytest.approx(2.5)
    assert sim.overhead == pytest.approx(2.5 + 0.02 - 2.0)


def test_reloads_share_one_link_in_order_of_use():
    # Two 1 GB reloads needed at 1.5 and 1.6 s at 10 GB/s: the first must start by 1.3 s.
    sites = [Site(0, 1 * GB, 0.0, 1.6), Site(1, 1 * GB, 0.1, 1.5)]
    sim = simulate(sites, forward_end=1.0, link=Link(100 * GB, 10 * GB))
    assert sim.reload_end[1] <= 1.5 + 1e-9
    assert sim.reload_start[0] >= sim.reload_end[1] - 1e-9
    assert sim.overhead == pytest.approx(0.0)


def _step(n=8, size=GB // 4):
    # Forward 0..1 s produces n tensors evenly; backward 1..2 s needs them in reverse.
    return [Site(i, size, i / n, 2.0 - i / n - 0.5 / n) for i in range(n)]


def test_budget_picks_what_hides_and_leaves_the_rest():
    sites = _step()
    # 1 GB/s each way: all 2 GB would take 2 s each way, twice the step's compute.
    link = Link(1 * GB, 1 * GB)
    everything = simulate(sites, 1.0, link).overhead
    assert everything > 0.05 * 2.0
    p = plan(sites, forward_end=1.0, step_seconds=2.0, link=link, max_overhead=0.05)
    assert p.predicted_overhead <= 0.05 * 2.0 + 1e-12
    assert 0 < len(p.indices) < len(sites)
    # The longest-lived (produced first, needed last) go first.
    assert 0 in p.indices
    assert p.offloaded_bytes + p.kept_bytes == sum(s.nbytes for s in sites)


def test_zero_budget_offloads_only_what_is_free():
    sites = _step()
    p = plan(sites, 1.0, 2.0, Link(2.5 * GB, 2.5 * GB), max_overhead=0.0)
    assert simulate([s for s in sites if s.index in p.indices], 1.0,
                    Link(2.5 * GB, 2.5 * GB)).overhead == pytest.approx(0.0)
    assert len(p.indices) > 0


def test_target_alone_offloads_until_it_fits():
    sites = _step(n=8, size=100)
    p = plan(sites, 1.0, 2.0, Link(1e12, 1e12), target_bytes=450)
    assert p.kept_bytes <= 450 and p.met_target
    assert p.offloaded_bytes == 400  # four tensors of 100: no more than needed


def test_budget_wins_over_target_and_says_so():
    sites = _step()
    p = plan(sites, 1.0, 2.0, Link(0.5 * GB, 0.5 * GB), max_overhead=0.01, target_bytes=0)
    assert not p.met_target
    assert p.predicted_overhead <= 0.01 * 2.0 + 1e-12


def test_bad_arguments():
    with pytest.raises(ValueError):
        plan([], 1.0, 2.0, Link(1, 1))
    with pytest.raises(ValueError):
        plan([], 1.0, 2.0, Link(1, 1), max_overhead=-1)
    with pytest.raises(ValueError):
        Link(0, 1)


def test_reloads_start_at_the_last_use_before_their_planned_start():
    # Uses in backward at 1.1 (site 3), 1.3 (2), 1.6 (1), 1.9 (0); 1 GB at 10 GB/s: 0.1 s each.
    sites = [Site(0, 1 * GB, 0.0, 1.9), Site(1, 1 * GB, 0.2, 1.6), Site(2, 1 * GB, 0.4, 1.3),
             Site(3, 1 * GB, 0.6, 1.1)]
    link = Link(100 * GB, 10 * GB)
    chosen = [sites[0], sites[1]]
    sim = simulate(chosen, 1.0, link)
    assert sim.reload_start[0] == pytest.approx(1.8) and sim.reload_start[1] == pytest.approx(1.5)
    # 1.8 s: after site 1's use (1.6); 1.5 s: after site 2's (1.3), a site kept on the GPU.
    assert reload_triggers(sites, chosen, sim) == {1: [0], 2: [1]}


def test_a_reload_due_before_backward_starts_at_its_first_use():
    # Needed at 1.05 s, 1 GB at 10 GB/s: planned from 0.95 s, before backward's first use.
    sites = [Site(0, 1 * GB, 0.0, 1.05), Site(1, 1 * GB, 0.5, 1.02)]
    link = Link(100 * GB, 10 * GB)
    chosen = [sites[0]]
    sim = simulate(chosen, 0.9, link)
    assert sim.reload_start[0] < 1.02
    assert reload_triggers(sites, chosen, sim) == {1: [0]}
    # A site needed first of all reloads at its own use: no trigger.
    assert reload_triggers(sites, [sites[1]], simulate([sites[1]], 0.9, link)) == {}


def test_plan_carries_the_triggers():
    sites = _step()
    p = plan(sites, forward_end=1.0, step_seconds=2.0, link=Link(100 * GB, 100 * GB),
             max_overhead=0.05)
    assert p.indices == frozenset(range(8))
    planned = sorted(i for due in p.triggers.values() for i in due)
    # Every offloaded site but the first needed reloads ahead of its use, at a use of a site
    # needed before it.
    assert planned == list(range(7))
    needed = {s.index: s.needed for s in sites}
    for trigger, due in p.triggers.items():
        assert all(needed[trigger] < needed[i] for i in due)


def test_barrier_stalls_for_offloads_still_running_at_the_end_of_forward():
    # 1 GB produced at 0.9 s at 10 GB/s lands at 1.0 s; forward ends at 0.95 s: 0.05 s stall.
    sites = [Site(0, 1 * GB, 0.9, 1.5)]
    link = Link(10 * GB, 10 * GB)
    assert simulate(sites, 0.95, link).overhead == pytest.approx(0.0)
    sim = simulate(sites, 0.95, link, barrier=True)
    assert sim.barrier_stall == pytest.approx(0.05)
    assert sim.overhead == pytest.approx(0.05)  # the reload itself hides (0.1 s before 1.5 s)


def test_barrier_moves_backward_by_the_stall():
    # A reload that just fits without the stall is late by the stall with it, and no more.
    sites = [Site(0, 1 * GB, 0.9, 1.2)]
    link = Link(10 * GB, 10 * GB)
    sim = simulate(sites, 1.0, link, barrier=True)
    assert sim.barrier_stall == pytest.approx(0.0)
    sim = simulate([Site(0, 1 * GB, 0.95, 1.2)], 1.0, link, barrier=True)
    assert sim.barrier_stall == pytest.approx(0.05)
    assert sim.overhead == pytest.approx(0.05)


def test_budget_with_a_barrier_offloads_only_what_lands_in_forward():
    # Eight 0.25 GB tensors over a 1 s forward at 1 GB/s: only those that land by the end of
    # forward hide (each takes 0.25 s); without the barrier later ones would seem free too.
    sites = _step()
    link = Link(1 * GB, 100 * GB)
    with_barrier = plan(sites, 0.875, 2.0, link, max_overhead=0.0, barrier=True)
    without = plan(sites, 0.875, 2.0, link, max_overhead=0.0)
    assert with_barrier.offloaded_bytes <= 0.875 * GB
    assert with_barrier.offloaded_bytes < without.offloaded_bytes
    done = simulate([s for s in sites if s.index in with_barrier.indices], 0.875, link).offload_done
    assert max(done.values()) <= 0.875 + 1e-9


def test_release_points_hand_sources_back_once_their_copies_are_done():
    # Sites produced every 0.1 s; 1 GB at 20 GB/s takes 0.05 s: site 0's copy is done by 0.05 s
    # (+ margin), so it goes back when site 1 is saved; the last one at the barrier.
    sites = [Site(i, 1 * GB, 0.1 * i, 2.0 - 0.1 * i) for i in range(4)]
    link = Link(20 * GB, 20 * GB)
    sim = simulate(sites, 0.3, link, barrier=True)
    points, barrier = release_points(sites, sites, sim, link)
    assert points == {1: [0], 2: [1], 3: [2]}
    assert barrier == [3]
    # A slow link: site 0's copy (0.5 s) is done only after site 3 is saved: the barrier.
    slow = Link(2 * GB, 2 * GB)
    points, barrier = release_points(sites[:1], sites[:1], simulate(sites[:1], 0.3, slow), slow)
    assert points == {} and barrier == [0]


def test_fill_link_keeps_the_link_busy_from_the_start_and_stops_at_the_deadline():
    sites = _step(n=8, size=GB // 4)  # produced 0, 0.125, ... 0.875 s; 0.25 s each at 1 GB/s
    chosen = fill_link(sites, 1.0, Link(1 * GB, 1 * GB))
    assert [s.index for s in chosen] == [0, 1, 2, 3]  # 4 x 0.25 s from 0 s: done at 1.0 s
    assert fill_link(sites, 1.0, Link(1e12, 1e12)) == sorted(sites, key=lambda s: s.produced)


def test_reloads_due_close_together_start_as_one_batch():
    # Four small reloads whose planned starts lie within a millisecond: one trigger, one batch.
    sites = [Site(i, 1000, 0.1 * i, 2.0 - 0.0002 * i) for i in range(4)]
    link = Link(1e12, 1e12)
    sim = simulate(sites, 1.0, link)
    # Unbatched: each starts at the use just before its own (the link is that fast).
    assert reload_triggers(sites, sites, sim) == {3: [2], 2: [1], 1: [0]}
    batched = reload_triggers(sites, sites, sim, window_s=1e-3, batch_bytes=1 << 20)
    assert batched == {3: [3, 2, 1, 0]}  # the first one used, and the rest with it
    # Bounded by bytes: two per batch.
    assert reload_triggers(sites, sites, sim, window_s=1e-3, batch_bytes=2000) == {
        3: [3, 2], 2: [1, 0]}


def test_release_points_close_together_are_one_point_at_the_latest():
    # Sites produced every 0.2 ms, each copy done 0.1 ms after its save: each would have a point
    # of its own at the next save. Within the 1 ms group, they share one, at the group's last
    # (never earlier than a copy allows), so the host flushes and waits once per group.
    us = 1e-6
    sites = [Site(i, 1 << 20, 200 * us * i, 1.0) for i in range(12)]
    link = Link(20 * GB, 20 * GB)
    sim = simulate(sites, 12 * 200 * us, link, barrier=True)
    ungrouped, _ = release_points(sites, sites, sim, link, group_s=0.0)
    assert len(ungrouped) == 11
    points, barrier = release_points(sites, sites, sim, link)
    assert len(points) < len(ungrouped) / 3
    released = sorted(i for group in points.values() for i in group)
    assert released + barrier == list(range(12))  # each site once
    when = {s.index: s.produced for s in sites}
    for point, group in points.items():
        for i in group:
            assert when[point] >= sim.offload_done[i]       # never before its copy is done
            ready = min(p for p, g in ungrouped.items() if i in g)
            assert when[point] - when[ready] <= 1e-3 + 1e-12  # at most the group's span later
