"""The learning half of ``offload_activations(max_overhead=..., target_bytes=...)``: it watches one
step with nothing offloaded (the calibration step), measures the link, asks the planner
(tier/_offload_planner.py) which saved tensors hide under compute, and from the next step on
answers, for each saved tensor in forward order, whether to offload it. It re-plans when a step
takes longer than the plan predicted.

A site is a saved tensor's position among the step's candidates (tensors the offloader could
offload: big enough, not parameters); a model whose forward saves the same tensors in the same
order every step (the usual case) has the same sites every step. When the count changes, it
calibrates again.

Times: CUDA tensors are timed with CUDA events on the current stream (the host runs ahead of the
GPU), CPU tensors with the host clock.
"""

import time

import torch

from . import _offload_planner as planner
from ._counters import Counters

PROBE_BYTES = 64 << 20
PROBE_ROUNDS = 2


class _Clock:
    """Seconds since the step began, on the GPU's timeline for CUDA tensors."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._cuda_start = {}   # device -> event recorded at its first stamp
        self._stamps = []       # (key, device or None, event or host time)

    def stamp(self, key, device):
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(device))
            if device not in self._cuda_start:
                self._cuda_start[device] = (event, time.perf_counter() - self._t0)
            self._stamps.append((key, device, event))
        else:
            self._stamps.append((key, None, time.perf_counter() - self._t0))

    def resolve(self):
        """{key: seconds}; waits for the CUDA events."""
        out = {}
        for key, device, value in self._stamps:
            if device is None:
                out[key] = value
            else:
                start, host_offset = self._cuda_start[device]
                value.synchronize()
                out[key] = host_offset + start.elapsed_time(value) / 1e3
        return out


class _StepTimer:
    """The length of a step that follows the plan, at the cost of two CUDA events per device (the
    first stamp and the latest first use, recorded again and again) and read without waiting:
    per-site events and a host wait for them at every step cost a 24 ms step a third of its time
    on the H100, which the policy then took for link time."""

    def __init__(self):
        self._t0 = time.perf_counter()
        self._start = {}   # device -> (event, host seconds at the first stamp)
        self._last = {}    # device -> event of the latest use
        self._host_last = None

    def stamp(self, key, device):
        if device.type != "cuda":
            if key[0] == "u":
                self._host_last = time.perf_counter() - self._t0
            return
        stream = torch.cuda.current_stream(device)
        if device not in self._start:
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream)
            self._start[device] = (event, time.perf_counter() - self._t0)
        if key[0] == "u":
            event = self._last.get(device)
            if event is None:
                event = self._last[device] = torch.cuda.Event(enable_timing=True)
            event.record(stream)

    def ready(self):
        return all(event.query() for event in self._last.values())

    def step_s(self):
        """Seconds from the step's start to its last first use; None if nothing was used."""
        times = [self._host_last] if self._host_last is not None else []
        for device, last in self._last.items():
            start, host_offset = self._start[device]
            times.append(host_offset + start.elapsed_time(last) / 1e3)
        return max(times) if times else None


class BudgetStats(Counters):
    """What the policy chose and how it went (``off.budget``)."""

    __slots__ = ("calibrations", "plans", "sites", "chosen_sites", "planned_bytes",
                 "predicted_overhead", "measured_overhead", "calibration_step_s", "last_step_s",
                 "link_d2h", "link_h2d", "met_target")

    def __repr__(self):
        return ("BudgetStats(%d of %d sites, %d bytes, predicted overhead %.1f%%, measured %.1f%%, "
                "step %.1f ms (calibration %.1f ms), link %.2f/%.2f GB/s)" % (
                    self.chosen_sites, self.sites, self.planned_bytes,
                    100 * self.predicted_overhead, 100 * self.measured_overhead,
                    1e3 * self.last_step_s, 1e3 * self.calibration_step_s,
                    self.link_d2h / 1e9, self.link_h2d / 1e9))


class OffloadBudget:
    def __init__(self, client_fn, max_overhead=None, target_bytes=None, link=None):
        if max_overhead is None and target_bytes is None:
            raise ValueError("a budget needs max_overhead or target_bytes")
        if max_overhead is not None and not 0 <= max_overhead <= 10:
            raise ValueError("max_overhead is a fraction of the step (0.05 = 5%%), got %r"
                             % (max_overhead,))
        if target_bytes is not None and target_bytes < 0:
            raise ValueError("target_bytes must be >= 0")
        self._client_fn = client_fn
        self.max_overhead = max_overhead
        self.target_bytes = target_bytes
        self._link = planner.Link(*link) if link is not None else None
        self._plan = None
        self._base_step = None
        self._clock = None
        self._sizes = []          # this step's candidates' sizes, in order
        self._devices = []
        self._open = False
        self._timers = []         # plan-following steps not read yet (their GPU work may run)
        self.stats = BudgetStats()

    @property
    def plan(self):
        return self._plan

    def begin_step(self):
        if self._open:
            self.end_step()
        # Per-site stamps only while calibrating; a step that follows the plan is only timed.
        self._clock = _Clock() if self._plan is None else _StepTimer()
        self._sizes = []
        self._devices = []
        self._open = True

    def candidate(self, nbytes, device):
        """A saved tensor the offloader could offload; returns (site, offload it?)."""
        site = len(self._sizes)
        self._sizes.append(nbytes)
        self._devices.append(device)
        self._clock.stamp(("p", site), device)
        if self._plan is None:
            return site, False
        return site, site in self._plan.indices

    def following_plan(self):
        """Whether this step offloads by the plan (the sites match the calibration's)."""
        return self._plan is not None and len(self._sizes) == len(self._plan_sizes)

    def reloads_due(self, site):
        """The sites whose reload the plan starts when backward first uses `site` (this step
        follows the plan: the same sites as the calibration); () otherwise."""
        if self._plan is None or len(self._sizes) != len(self._plan_sizes):
            return ()
        return self._plan.triggers.get(site, ())

    def used(self, site, device):
        """Backward needs the saved tensor of `site` now (first use counts)."""
        if self._open and self._clock is not None:
            self._clock.stamp(("u", site), device)

    def end_step(self):
        if not self._open:
            return
        self._open = False
        if isinstance(self._clock, _StepTimer):
            if len(self._sizes) != len(self._plan_sizes):
                # Other sites than the calibration's: calibrate again (next step, by stamps).
                self._plan = None
                self._timers.clear()
                return
            self._timers.append(self._clock)
            self._read_timers()
            return
        times = self._clock.resolve()
        produced = {k[1]: v for k, v in times.items() if k[0] == "p"}
        needed = {}
        for k, v in times.items():
            if k[0] == "u" and k[1] not in needed:
                needed[k[1]] = v
        if not produced or not needed:
            return  # no backward ran (inference, or no candidates): nothing to learn
        step = max(needed.values())
        # Calibration: nothing was offloaded in this step (or the sites changed).
        self.stats.calibrations += 1
        self._base_step = step
        self.stats.calibration_step_s = step
        self.stats.last_step_s = step
        self._sites = [planner.Site(i, self._sizes[i], produced[i], needed[i])
                       for i in range(len(self._sizes)) if i in needed]
        self._forward_end = max(produced.values())
        self._plan_sizes = list(self._sizes)
        if self._link is None:
            self._link = self._measure_link()
        self._replan()

    def _read_timers(self):
        """Takes the measured length of every timed step whose GPU work has finished, in order."""
        while self._timers and self._timers[0].ready():
            step = self._timers.pop(0).step_s()
            if step is None or self._plan is None:
                continue
            self.stats.last_step_s = step
            self.stats.measured_overhead = max(0.0, step / self._base_step - 1.0)
            if self.max_overhead is not None and self._plan.offloaded_bytes > 0 and \
                    self.stats.measured_overhead > max(2 * self.max_overhead,
                                                       self.max_overhead + 0.02):
                # Slower than predicted: the link is slower than measured (other processes
                # share it): take the evidence and plan again with less. (Only when the plan
                # moves bytes: a step slower with nothing offloaded says nothing of the link.)
                self._link = planner.Link(self._link.d2h / 2, self._link.h2d / 2)
                self._replan()
                self._timers.clear()  # steps timed under the old plan

    def _replan(self):
        self._plan = planner.plan(self._sites, self._forward_end, self._base_step, self._link,
                                  max_overhead=self.max_overhead, target_bytes=self.target_bytes)
        self.stats.plans += 1
        self.stats.sites = len(self._sites)
        self.stats.chosen_sites = len(self._plan.indices)
        self.stats.planned_bytes = self._plan.offloaded_bytes
        self.stats.predicted_overhead = (self._plan.predicted_overhead / self._base_step
                                         if self._base_step else 0.0)
        self.stats.link_d2h = self._link.d2h
        self.stats.link_h2d = self._link.h2d
        self.stats.met_target = int(self._plan.met_target)

    def _measure_link(self):
        """Offloads and reloads of PROBE_BYTES on the candidates' device: one untimed round first
        (the probe's registration with tierd and the lane's start would otherwise be timed as
        transfer: a 16 MiB probe measured 2-18 GB/s on a 55 GB/s link), then the best of
        PROBE_ROUNDS timed rounds in each direction."""
        device = self._devices[0] if self._devices else torch.device("cpu")
        client = self._client_fn()
        probe = torch.empty(PROBE_BYTES, dtype=torch.uint8, device=device)

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        best_d2h = best_h2d = float("inf")
        for round_ in range(1 + PROBE_ROUNDS):
            sync()
            t0 = time.perf_counter()
            handle = client.offload(probe)
            client.synchronize()
            t1 = time.perf_counter()
            back = handle.reload()
            sync()
            t2 = time.perf_counter()
            del back
            handle.free()
            if round_ > 0:
                best_d2h, best_h2d = min(best_d2h, t1 - t0), min(best_h2d, t2 - t1)
        return planner.Link(PROBE_BYTES / max(best_d2h, 1e-6), PROBE_BYTES / max(best_h2d, 1e-6))
