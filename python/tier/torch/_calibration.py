"""The joint planner's calibration: what one calibration step saw (:class:`Calibration`), and
the :class:`~tier.torch._activation_planner.StepProfile` built from the steps of a round
(:func:`build_profile`). See tier/torch/_plan_activations.py for how the steps run."""

import collections
import statistics
import time

import torch

from . import _activation_planner as ap
from . import _offload_budget as ob

# Steps of a round that time its modes without hooks. Each block counts the least of its times
# over them: a host slowed for one step (another process, a collection, a first use) once made a
# round's blocks twice their time on an H200 (full recompute's forward 4.56 ms, 2.0-2.2 in every
# other run), and every plan made from it predicted its steps 20-40% too slow.
TIMING_STEPS = 2


class Calibration:
    """One calibration step: the modes it runs, and what it saw. ``kind``: "sites" (the
    saved-tensor hooks see the whole step: every candidate is stamped, the allocator measured)
    or "timing" (the same modes without any hooks: the blocks' times as they run)."""

    def __init__(self, modes, device_hint, kind):
        self.modes = list(modes)
        self.kind = kind
        self.clock = ob.Clock()
        self.host = {}           # ("fs" | "fe" | "bs" | "be", block) -> host seconds
        self.windows = []        # per candidate: block index, "pre" or "post"
        self.sizes = []          # per candidate: storage bytes
        self.keys = []           # per candidate: storage key
        self.window = "pre"      # where candidates now land
        self.sac_bytes = collections.defaultdict(int)
        self.mem_before = {}
        self.mem_extra = {}
        self.peak = None
        self.base = None
        self.device = device_hint
        self.times = {}
        # CUDA, per segment of the step (the allocator's peak statistics reset at each block's
        # backward start): bytes above `base`.
        self.running = 0          # the step's peak so far
        self.forward_peak = None  # from the step's start to the last block's backward start
        self.alloc_bs = {}        # block -> allocated at its backward start
        self.seg_peak = {}        # block -> the peak during its backward

    def span(self, b, start, end, host=False):
        """Seconds from stamp (start, b) to (end, b); None where either is missing."""
        t = self.host if host else self.times
        if (start, b) in t and (end, b) in t:
            return t[(end, b)] - t[(start, b)]
        return None

    def first_view(self, site):
        """Whether candidate `site` is the first view of its storage (the one that counts)."""
        return self.keys.index(self.keys[site]) == site

    def resolve(self, count):
        """After a sites step: when each candidate was produced and first used; False where
        nothing was learned (no backward ran, or the candidates do not match)."""
        times = self.times
        self.produced = {k[1]: v for k, v in times.items() if k[0] == "p"}
        used = {}
        for k, v in times.items():
            if k[0] == "u" and k[1] not in used:
                used[k[1]] = v
        self.used = used
        # (A step with no candidate at all, every saved tensor under min_bytes, still teaches
        # the blocks' times once its backward ran: its plan keeps everything.)
        ran_backward = any(k[0] == "be" for k in times)
        if len(self.sizes) != count or not (used or (count == 0 and ran_backward)):
            return False
        if self.peak is None and self.device is not None and self.device.type == "cuda" and \
                self.base is not None:
            self.peak = max(self.running, torch.cuda.max_memory_allocated(self.device) - self.base)
        return True

    def start_peak(self, device):
        # The allocator's statistics are the host's own accounting: no synchronization (one
        # here would cost the step its host lead and slow the block measured next).
        if device.type == "cuda":
            self.base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        self.device = device

    def grad_stamp(self, key, device, last_block):
        """A block's boundary reached in backward (`key`: ("bs" | "be", block)), when its
        gradient arrives: the clock's stamp, and on CUDA the segment's peak."""
        self.host[key] = time.perf_counter()
        self.clock.stamp(key, device)
        if device.type != "cuda" or self.base is None or self.kind != "sites":
            return
        kind, b = key
        # A block's backward starts where the one after it ends (the same gradient; its
        # "bs" hook was registered first, so it runs first): close that segment, open this one.
        if kind == "bs":
            peak = torch.cuda.max_memory_allocated(device) - self.base
            if b == last_block:
                self.forward_peak = peak
            else:
                self.seg_peak[b + 1] = peak
            self.running = max(self.running, peak)
            self.alloc_bs[b] = torch.cuda.memory_allocated(device) - self.base
            torch.cuda.reset_peak_memory_stats(device)
        elif b == 0:
            peak = torch.cuda.max_memory_allocated(device) - self.base
            self.seg_peak[0] = peak
            self.running = max(self.running, peak)
            self.peak = self.running


def signature(block):
    """Blocks of one signature (class and parameter shapes) are calibrated as one kind."""
    return (type(block).__qualname__,
            tuple(tuple(p.shape) for p in block.parameters()))


def rest_mode(allowed):
    """The mode of the blocks a calibration step does not measure: the least memory."""
    return "full" if "full" in allowed else ("selective" if "selective" in allowed else "keep")


def calibration_modes(signatures, allowed, measured):
    """Per signature: its blocks take the modes not yet measured, one each, in the middle of its
    blocks (away from the step's start, where the host has no lead on the GPU yet, and its end);
    the rest run in full recompute (the least memory), else selective, else keep."""
    modes = [rest_mode(allowed)] * len(signatures)
    by_sig = collections.OrderedDict()
    for b, sig in enumerate(signatures):
        by_sig.setdefault(sig, []).append(b)
    for sig, positions in by_sig.items():
        need = [m for m in allowed if (sig, m) not in measured]
        at = max(0, (len(positions) - len(need)) // 2)
        for b, mode in zip(positions[at:], need):
            modes[b] = mode
    return modes


def _least_span(steps, b, start, end, host=False):
    """The least of block b's span from `start` to `end` over calibration `steps`; None where
    no step saw both stamps."""
    spans = [s for s in (c.span(b, start, end, host) for c in steps) if s is not None]
    return min(spans) if spans else None


def _block_times(b, sites, timings):
    """(forward, backward, host forward, host backward) seconds of block b: the least over the
    timing steps (no hooks), else the sites step's."""
    for steps in (timings or (), [sites]):
        fwd = _least_span(steps, b, "fs", "fe")
        if fwd is not None:
            return (fwd, _least_span(steps, b, "bs", "be"),
                    _least_span(steps, b, "fs", "fe", host=True),
                    _least_span(steps, b, "bs", "be", host=True))
    return None, None, None, None


def build_profile(signatures, measured, last, last_timings):
    """The StepProfile from the calibration steps (times in seconds from the sites step's
    first saved tensor; the blocks' own times from the timing steps). `measured`: (signature,
    mode) -> [(block, sites step, its timing steps)]; `last`: the last round's sites step,
    `last_timings` its timing steps (None: none)."""
    modes = collections.defaultdict(dict)
    host = collections.defaultdict(dict)
    for (sig, mode), seen in measured.items():
        fwd, bwd, hfwd, hbwd = [], [], [], []
        for b, s, t in seen:
            f, w, hf, hw = _block_times(b, s, t)
            if f is not None:
                fwd.append(f)
                if hf is not None:
                    hfwd.append(hf)
            if w is not None:
                bwd.append(w)
                if hw is not None:
                    hbwd.append(hw)
        b0, s0, t0 = seen[0]
        gpu_f = _median(fwd)
        gpu_b = _median(bwd) if bwd else gpu_f * (2 if mode == "keep" else 3)
        host_f, host_b = _median(hfwd), _median(hbwd)
        host[sig][mode] = (gpu_f, gpu_b, host_f, host_b)
        # A block whose host work takes longer than its GPU work runs at the host's pace.
        modes[sig][mode] = ap.ModeProfile(
            max(gpu_f, host_f), max(gpu_b, host_b),
            _template(b0, s0, t0), _extra(b0, s0, mode))
    c = last
    t = c.times
    n = len(signatures)
    # (Without a candidate: from the first block's forward to the last backward boundary.)
    first = min(c.produced.values()) if c.produced else t.get(("fs", 0), 0.0)
    pre_sites = []
    post_sites = []
    end = max(c.used.values()) if c.used else \
        max((v for k, v in t.items() if k[0] == "be"), default=first)
    block0_end = t.get(("be", 0), end)
    gaps = [[] for _ in range(n)]
    for site, window in enumerate(c.windows):
        if window == "pre":
            pre_sites.append((c.sizes[site] if c.first_view(site) else 0,
                              c.used.get(site, end) - block0_end))
        elif window == "post":
            post_sites.append(c.sizes[site] if c.first_view(site) else 0)
        elif isinstance(window, tuple):
            gaps[window[1]].append(c.sizes[site] if c.first_view(site) else 0)
    pre_s = t.get(("fs", 0), first) - first if n else 0.0
    post_s = _least_span(last_timings or [c], n - 1, "fe", "bs") if n else None
    if post_s is None:
        post_s = 0.0
    tail_s = end - block0_end if n else end - first
    profile = ap.StepProfile(signatures, dict(modes), pre_sites, post_sites,
                             max(0.0, pre_s), max(0.0, post_s), max(0.0, tail_s),
                             gaps=gaps)
    profile.host = {sig: dict(v) for sig, v in host.items()}
    if c.peak is not None:
        lay = ap.Layout(profile, c.modes, peak_model=False)
        profile.peak_offset = c.peak - lay.peak([0] * n, 0)
    _measure_segments(signatures, measured, profile, c)
    return profile


def _measure_segments(signatures, measured, profile, last):
    """The per-segment peak model's figures (StepProfile.measured), where the calibration
    steps measured every block's backward on CUDA."""
    n = len(signatures)
    if last.forward_peak is None or len(last.alloc_bs) != n:
        return

    def kept(c):
        # What each block keeps at the end of forward in calibration c, by the model.
        return ap.Layout(profile, c.modes, peak_model=False).block_bytes

    last_kept = kept(last)
    misc, below = [], 0
    for b in range(n):
        below += last_kept[b]
        misc.append(last.alloc_bs[b] - below)
    work = collections.defaultdict(dict)
    for (sig, mode), seen in measured.items():
        for b, c, _ in seen:
            if b in c.seg_peak and b in c.alloc_bs:
                w = c.seg_peak[b] - c.alloc_bs[b] + kept(c)[b]
                work[sig][mode] = max(work[sig].get(mode, 0), w)
    profile.calib_modes = list(last.modes)
    profile.forward_peak = last.forward_peak
    profile.misc = misc
    profile.work = dict(work)


def _template(b, c, timings):
    """Block b's candidates in sites calibration c, as TemplateSites; when they were saved
    and needed is scaled to the block's times in the timing steps (without the hooks)."""
    t = c.times
    fs = t.get(("fs", b), 0.0)
    bs = t.get(("bs", b))
    f_scale = b_scale = 1.0
    if timings:
        f0, w0 = c.span(b, "fs", "fe"), c.span(b, "bs", "be")
        f1, w1 = _least_span(timings, b, "fs", "fe"), _least_span(timings, b, "bs", "be")
        if f0 and f1:
            f_scale = f1 / f0
        if w0 and w1:
            b_scale = w1 / w0
    out = []
    windows_of = collections.defaultdict(set)
    for site, key in enumerate(c.keys):
        windows_of[key].add(c.windows[site])
    for site, window in enumerate(c.windows):
        if window != b:
            continue
        key = c.keys[site]
        first = c.first_view(site)
        produced = (c.produced.get(site, fs) - fs) * f_scale
        needed = (c.used[site] - bs) * b_scale if (bs is not None and site in c.used) \
            else 0.0
        out.append(ap.TemplateSite(c.sizes[site] if first else 0, max(0.0, produced),
                                   max(0.0, needed), first and windows_of[key] == {b}))
    return tuple(out)


def _extra(b, c, mode):
    """What block b keeps outside the hooks in `mode` (selective checkpointing's saved outputs;
    light's MLP matmul output)."""
    if mode not in ("selective", "light"):
        return 0
    if b in c.sac_bytes:
        return c.sac_bytes[b]
    return c.mem_extra.get(b, 0)


def _median(values):
    return statistics.median(values) if values else 0.0
