"""Activation offload: tensors saved for backward go to tierd in forward and come back in
backward (:func:`offload_activations`, :class:`ActivationOffloader`, :func:`no_offload`).
Stream ordering: tier/torch/__init__.py's docstring and tier/_reloads.py."""

import contextlib
import threading
import warnings
import weakref

import torch

from .. import _cuda_graphs
from .._streams import current_stream_ptr
from .. import _dtensor
from ._default_client import DefaultClient
from . import _compile
from . import _offload_planner as _planner
from ._counters import Counters
from ._module_selection import ModuleSelection
from ._backward_reloads import BackwardReloads
from ._offload_budget import OffloadBudget
from ._save_batches import SaveBatches
from ._save_shape import SaveShape
from ._saved import KeptSite, Saved, StorageIndex, StorageRecord, untyped_storage

DEFAULT_MIN_BYTES = 1 << 20
DEFAULT_MAX_INFLIGHT_BYTES = 512 << 20


def _identity(x):
    return x


@contextlib.contextmanager
def no_offload():
    """Inside this region saved tensors stay where they are (e.g. around an output head whose
    activations are needed first in backward). Identity hooks take precedence over any
    offloading hooks outside the region."""
    with torch.autograd.graph.saved_tensors_hooks(_identity, _identity):
        yield



# ---- activation offload -----------------------------------------------------------------------

class ActivationStats(Counters):
    """Counters of one ActivationOffloader (monotonic; read them any time).

    offloaded_storages / offloaded_bytes: what was sent to Tierd. stayed_on_gpu_storages /
    stayed_on_gpu_bytes: storages that could not be one job and stayed on the GPU (memory the
    library cannot register as one range: a tensor over physical pages of different sizes, or a
    tierd without expandable-segment registrations; a tensor inside one expandable segment, of any
    size, is one job and counts as offloaded); backward uses them in place. Every saved storage
    is one of the two, and backward gets each once: reloaded, prefetched, or (source_hits) taken
    from its source while the offload's copy was still in flight (the bytes never left the GPU):
    reloads + prefetches + source_hits == offloaded_storages + stayed_on_gpu_storages.
    released_storages / released_bytes: planned offloads (a budget) whose GPU memory went back to
    PyTorch in stream order during forward, at the plan's release points (see
    ActivationOffloader), instead of when the host saw their copies complete."""

    __slots__ = ("saved", "kept", "offloaded_tensors", "offloaded_storages", "offloaded_bytes",
                 "stayed_on_gpu_storages", "stayed_on_gpu_bytes",
                 "deduplicated", "reloads", "prefetches", "source_hits", "fallbacks",
                 "inflight_waits", "planned_prefetches", "released_storages", "released_bytes")


_Tensor = torch.Tensor
_empty = torch.empty
_uint8 = torch.uint8
_Parameter = torch.nn.Parameter
_strided = torch.strided
_KEEP, _STAMP, _OFFLOAD = _planner.KEEP, _planner.STAMP, _planner.OFFLOAD
_SCOPED = object()  # ActivationOffloader._hooks under a block-scoped plan: active, no hooks here
_CAPTURED = object()  # the context was entered during a CUDA graph capture: no hooks


class ActivationOffloader(_compile.Followed):
    """Offloads tensors saved for backward to Tierd; see :func:`offload_activations`.

    Two ways to decide, one mechanism. Without a budget every candidate is offloaded, and a CUDA
    source's memory is released when the host sees its copy complete (at most
    ``max_inflight_bytes`` wait so; past that the host waits for the oldest). With a budget (or
    another policy with its interface, tier/torch/_offload_budget.py) each step follows a
    :class:`~tier.torch._offload_planner.StepPlan`, read in O(1) per saved tensor: keep it as it is,
    keep it wrapped (its first use starts planned reloads or ends the timed step), or offload
    it. A planned offload's source goes back to PyTorch's allocator in stream order: at the
    plan's release point (a later saved tensor, once its copy should be done) and at the latest
    at the end of forward (the barrier, after the step's last candidate), the current stream
    waits on the GPU for the copy (tier_stream_wait_offload) and the job stops holding the
    source, so the memory is free for what forward allocates next and off the activation peak
    that ``torch.cuda.max_memory_allocated`` measures; the host never waits. (Released only
    once the host sees its copy complete, a source would still be allocated when forward ends:
    the host runs ahead of the GPU.) The price of a stream-ordered release: such an offload that
    fails (pool or quota full) has no source left to fall back to, and backward raises with the
    cause."""

    def __init__(self, min_bytes=DEFAULT_MIN_BYTES, prefetch=2, client=None, module=None,
                 max_inflight_bytes=DEFAULT_MAX_INFLIGHT_BYTES, modules=None,
                 max_overhead=None, target_bytes=None, link=None, policy=None):
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        self._budget = policy
        if max_overhead is not None or target_bytes is not None:
            if policy is not None:
                raise ValueError("give a budget (max_overhead / target_bytes) or a policy")
            self._budget = OffloadBudget(lambda: self.client, max_overhead=max_overhead,
                                         target_bytes=target_bytes, link=link)
        self._selection = ModuleSelection(module, modules) if modules is not None else None
        self.min_bytes = int(min_bytes)
        self.prefetch = int(prefetch)
        self.max_inflight_bytes = int(max_inflight_bytes)
        self._client = client
        self._module = module
        self._skip = frozenset()
        self._skip_params = None
        self._lock = threading.RLock()
        self._by_storage = StorageIndex()  # (device, data_ptr) -> weakref to its StorageRecord
        self._next_index = 0
        self._hooks = None
        # The step under a policy: its plan (None: it calibrates), the candidates seen so far,
        # the records of its offloaded sites, and those whose sources are still held.
        self._plan = None
        self._site = 0
        self._step_open = False
        self._site_records = {}  # site -> weakref to its StorageRecord
        self._held = []          # weakrefs to planned records not yet released, in offload order
        self._saves = SaveShape()  # a planned step's pack hook, indexed by save (_save_shape.py)
        self.stats = ActivationStats()
        # Forward's side (tier/torch/_save_batches.py: packed storages sent as batches) and
        # backward's (tier/torch/_backward_reloads.py: each storage back once, prefetched).
        self._batches = SaveBatches(self, bounded=self._budget is None)
        self._reloads = BackwardReloads(self, self._batches)
        self._defer_cpu = False  # tests: the deferral's bookkeeping on the host engine
        self._warned_down = False
        self._serving = True  # tierd serves (checked as each context begins)
        self._capture = _cuda_graphs.CaptureGuard()

    BATCH_TENSORS = 16
    BATCH_BYTES = 32 << 20

    client = DefaultClient()

    def __enter__(self):
        if self._hooks is not None:
            raise RuntimeError("this ActivationOffloader is already active")
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            # A CUDA graph capture (whole-step capture, reduce-overhead): no hook at all, so
            # nothing of Tierd runs inside it, in forward or in backward; the captured step keeps
            # its saved tensors on the GPU, as it would without Tierd.
            self._capture.warn_once()
            self._hooks = _CAPTURED
            return self
        # Opens the session now, not inside the first hook; a tierd that went away is replaced
        # by the next one here when it is up. While none serves (gone, or draining before a
        # restart) this context offloads nothing: every saved tensor stays where it is.
        self._serving = self.client.ensure_connected()
        if not self._serving and not self._warned_down:
            self._warned_down = True
            warnings.warn("tier: tierd is restarting or gone: saved activations stay on the GPU "
                          "until it serves again", RuntimeWarning, stacklevel=2)
        if self._budget is not None:
            if self._step_open:
                self._budget.end_step(self._site)  # the step before: its backward has run
            self._plan = self._budget.begin_step()
            self._step_open = True
            self._site = 0
            self._site_records = {}
            self._held = []
        scoped = self._plan is not None and self._plan.regions is not None
        if self._module is not None and (self._plan is None or self._skip_params is None):
            # Parameters and buffers stay resident anyway: offloading them would save nothing.
            # (A DTensor's storage is its local shard's: FSDP2, tensor parallel.) A step that
            # follows a plan (a budget's, or a block-scoped one) keeps the set of the calibration
            # the plan was made from: the plan numbers candidates as that calibration counted
            # them, and the walk over the module's tensors took 2.3 ms at every step of the 1B
            # Llama's budget (H200), on the step's path while the GPU waited.
            self._skip_params = frozenset(
                (t.device, untyped_storage(t).data_ptr())
                for t in (_dtensor.split(t)[0] for t in list(self._module.parameters()) +
                          list(self._module.buffers())))
        self._skip = self._skip_params or frozenset()
        if self._selection is not None:
            self._selection.install()
        _compile.on_offloader_enter(self)  # graphs compiled from now on offload inside
        if scoped:
            # Block-scoped: no hooks here; the policy opens them around the blocks the plan
            # names (region_enter / region_exit).
            self._hooks = _SCOPED
        else:
            pack = self._pack if self._budget is None else self._saves.hook(self, self._plan)
            self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, self._unpack)
            self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        hooks, self._hooks = self._hooks, None
        if hooks is _CAPTURED:
            return False
        if hooks is not _SCOPED:
            hooks.__exit__(*exc)
            if self._budget is not None:
                self._site = self._saves.end_step(self._site)  # (what end_step will read)
        with self._lock:
            self._batches.flush()
            if self._held:
                self._release_held(None)  # a step that never reached its barrier
        if self._selection is not None:
            self._selection.remove()
        return False

    # -- block-scoped plans: what a block-scoped policy (tier/torch/_plan_activations.py) drives:
    # region_enter / region_exit around each block with candidates, release_sites where a block
    # begins, barrier at the end of forward --

    def region_enter(self, first_site):
        """Opens the saved-tensor hooks for one block of a block-scoped plan, whose candidates
        are numbered from `first_site`. Returns the token for region_exit."""
        self._site = first_site
        # Made per region, not kept: an offloader holding hooks bound to itself would live on
        # in a reference cycle (its records and tierd objects with it) until a collection.
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        return hooks

    def region_exit(self, token, *exc):
        """Closes the block's hooks (its deferred offloads go now: their copies start by the
        block's end); returns the index after its last candidate."""
        token.__exit__(*(exc or (None, None, None)))
        if self._batches.deferred:
            with self._lock:
                self._batches.flush()
        return self._site

    def barrier(self, device):
        """The end of a block-scoped plan's forward: every planned offload still held goes back
        in stream order (the current stream waits on the GPU for copies still running)."""
        with self._lock:
            if self._held:
                self._release_held(device)

    # -- pack (forward) --

    @property
    def settling(self):
        """Whether a budget's plan may still change by itself (tier/torch/_offload_budget.py)."""
        return bool(getattr(self._budget, "settling", False))

    @property
    def budget(self):
        """With max_overhead or target_bytes: what the policy chose and how it went
        (:class:`~tier.torch._offload_budget.BudgetStats`); else None."""
        return self._budget.stats if self._budget is not None else None

    @property
    def plan(self):
        """The budget's current plan (:class:`~tier.torch._offload_planner.Plan`), or None."""
        return self._budget.plan if self._budget is not None else None

    def _pack(self, tensor):
        stats = self.stats
        stats.saved += 1
        if not _should_offload(self, tensor):
            stats.kept += 1
            return tensor
        # Inside a CUDA graph capture nothing is offloaded, released or stamped
        # (tier/_cuda_graphs.py). Asking costs CUDA calls, so only a save that would do one of
        # those asks: a save the plan keeps as it is returns before.
        budget = self._budget
        if budget is None:
            if self._capture.keep(tensor):
                stats.kept += 1
                return tensor
            _compile.note_hooked_save()  # from a torch.compile graph Tierd did not rewrite? (once)
            return self._offload_saved(tensor, None)
        plan = self._plan
        site = self._site
        if plan is not None and site < plan.count and plan.plain[site]:
            self._site = site + 1
            stats.kept += 1
            return tensor
        self._site = site + 1  # (counted under a capture too: the step's sites stay aligned)
        if self._capture.keep(tensor):
            stats.kept += 1
            return tensor
        _compile.note_hooked_save()
        if plan is None:
            # Calibration: every candidate kept and stamped (production now, first use later).
            storage = untyped_storage(tensor)
            budget.candidate(site, storage.nbytes(), tensor.device,
                             (tensor.device, storage.data_ptr()))
            stats.kept += 1
            return KeptSite(tensor, site)
        if site == 0:
            budget.step_started(tensor.device)
        if site >= plan.count:
            stats.kept += 1  # more candidates than planned: the policy calibrates again
            return tensor
        due = plan.releases.get(site)
        if due is not None:
            self.release_sites(due, tensor.device)
        action = plan.actions[site]
        if action == _OFFLOAD:
            out = self._offload_saved(tensor, site)
            if site + 1 >= plan.count or plan.actions[site + 1] != _OFFLOAD:
                with self._lock:  # its copy starts now (no next offload to batch it with)
                    self._batches.after_planned(plan.actions, site)
        else:
            stats.kept += 1
            out = tensor if action == _KEEP else KeptSite(tensor, site)
        if site == plan.barrier:
            # The end of forward: every planned offload still held goes back now, the current
            # stream waiting for the copies still running (the plan predicted how long).
            with self._lock:
                self._release_held(tensor.device)
        return out

    def _offload_saved(self, tensor, site):
        storage = untyped_storage(tensor)
        nbytes = storage.nbytes()
        key = (tensor.device, storage.data_ptr())
        with self._lock:
            ref = self._by_storage.get(key)
            record = ref() if ref is not None else None
            if record is not None and not record.same_storage(nbytes, tensor._version):
                record = None
            if record is None:
                # The whole storage, once, however many saved views share it. CUDA: the daemon's
                # copy waits for the current stream (which produced it); the job keeps the flat
                # bytes (so the storage) alive until the copy completed, or until a plan's
                # release point hands it back.
                record = StorageRecord(None, self._next_index, tensor.device, nbytes, storage,
                                       tensor._version)
                self._next_index += 1
                if self._budget is None:  # the order count-based prefetch walks (a plan: triggers)
                    self._reloads.note(record)
                if not tensor.is_cuda and not self._defer_cpu:
                    # CPU: the storage's bytes are staged now (as saved), the job goes with the
                    # next batch.
                    self._batches.add_staged(record, storage)
                elif tensor.storage_offset() == 0 and tensor.nbytes == nbytes and \
                        tensor.is_contiguous():
                    # The tensor is its whole storage (most activations): it is the source
                    # itself, detached (no graph held by a job), and comes back in its own
                    # shape, so its unpack needs no view (record.whole). No flat tensor made.
                    record.whole = True
                    self._batches.add(record, tensor.detach(), tensor)
                else:
                    self._batches.add(record, _empty(0, dtype=_uint8, device=tensor.device).set_(
                        storage), tensor)
                by_storage = self._by_storage
                by_storage[key] = weakref.ref(record)  # (StorageIndex.remember, inline)
                if len(by_storage) >= by_storage.compact_at:
                    by_storage.compact()
                if site is not None:
                    self._held.append(weakref.ref(record))
                whole = record.whole
            else:
                self.stats.deduplicated += 1
                whole = False  # (another view of the storage, maybe: rebuilt as a view)
            self.stats.offloaded_tensors += 1
            if site is not None:
                self._site_records[site] = weakref.ref(record)
        return Saved(record, tensor, site, whole)

    def release_sites(self, sites, device):
        """The planned offloads of `sites` whose sources are still held go back in stream
        order (the current stream of `device` waits on the GPU for their copies)."""
        records = []
        for site in sites:
            ref = self._site_records.get(site)
            record = ref() if ref is not None else None
            if record is not None and not record.released:
                records.append(record)
        if records:
            with self._lock:
                self._release(records, device)

    def _release_held(self, device):
        """Releases every planned offload of this step still held (the barrier). Called with
        self._lock held."""
        held, self._held = self._held, []
        records = []
        for ref in held:  # (a loop: a generator would resume once per record)
            r = ref()
            if r is not None and not r.released:
                records.append(r)
        if records:
            self._release(records, device if device is not None else records[-1].device)

    def _release(self, records, device):
        """Planned offloads' sources back to the allocator in stream order: the current stream
        of `device` waits (GPU) for their copies, then their jobs drop the sources. CPU sources
        were staged when saved: nothing is held (nor flushed). Called with self._lock held."""
        if device.type != "cuda":
            for r in records:
                r.released = True
            return
        for r in records:  # (a loop, not any(): this runs at most saves of a plan)
            if r.handle is None:
                self._batches.flush()  # still deferred: submitted first, so there is a copy to
                break                  # wait for
        handles = [r.handle for r in records if r.handle is not None and r.device == device]
        released = 0
        if handles:
            # (The current stream as a raw pointer: no stream object at every release point.)
            released = self.client.release_sources(handles, current_stream_ptr(device), device)
        for r in records:
            r.released = True
        if released:
            self.stats.released_storages += released
            released_bytes = 0
            for h in handles:  # (a loop: a generator would resume once per handle)
                if h.released:
                    released_bytes += h.nbytes
            self.stats.released_bytes += released_bytes

    # -- unpack (backward) --

    def _unpack(self, saved):
        cls = type(saved)
        if cls is KeptSite:
            self._on_use(saved.site, saved.tensor.device)
            return saved.tensor
        if cls is not Saved:
            return saved
        record = saved.record
        site = saved.site
        planned = site is not None
        if planned:
            plan = self._plan
            if plan is None or site == plan.timing_site or site in plan.triggers:
                self._on_use(site, record.device)  # (else nothing to do there: no call)
        if not self._reloads.check_queued:
            self._reloads.check_at_end_of_backward()
        with self._lock:
            if self._batches.deferred:
                self._batches.flush()  # backward began: whatever forward saved goes out now
            if self._held:
                self._release_held(record.device)  # a forward that ended before its barrier
            # The one needed now is submitted first, then the ones ahead: those the plan starts
            # at this point of backward (just early enough: _on_use), or else the next
            # `prefetch` in reverse order of offload (the order backward needs them); then we
            # take this one.
            if record.tensor is None and record.pending is None:
                self._reloads.start([record], prefetch=False)
            if not planned:
                self._reloads.prefetch_before(record, self.prefetch)
            flat = record.tensor
            if flat is None:  # the reload's result, taken once
                pending, record.pending = record.pending, None
                flat = record.tensor = pending.result()
        if saved.whole:
            return flat  # the saved tensor's own shape, dtype and strides (record.whole)
        # (view_of, inline)
        return _empty(0, dtype=saved.dtype, device=flat.device).set_(
            untyped_storage(flat), saved.offset, saved.size, saved.stride)

    def _on_use(self, site, device):
        """Backward uses a wrapped site: the calibration's stamp, the timed step's end, or the
        reloads the plan starts here."""
        plan = self._plan
        if plan is None:
            self._budget.used(site, device)
            return
        if site == plan.timing_site:
            self._budget.used(site, device)
        due = plan.triggers.get(site)
        if due:
            ahead = []
            for other_site in due:
                ref = self._site_records.get(other_site)
                other = ref() if ref is not None else None
                if other is not None and other.tensor is None and other.pending is None:
                    ahead.append(other)  # (start skips a record given twice)
            if ahead:
                with self._lock:
                    self._reloads.start(ahead, prefetch=True)  # as one batch
                self.stats.planned_prefetches += len(ahead)


def _should_offload(off, t):
    """ActivationOffloader's test of a saved tensor (a function: the class stays small)."""
    if not off._serving:
        return False
    if type(t) is not _Tensor:
        return False  # nn.Parameter, and tensor subclasses we cannot rebuild
    if off._selection is not None and not off._selection.active():
        return False  # saved outside the selected modules
    if t.numel() * t.element_size() < off.min_bytes:  # (not nbytes: sparse has none)
        return False
    if t.layout != _strided or t.is_quantized or not (t.is_cuda or t.is_cpu):
        return False
    # Parameters and buffers (and their views: weight.t(), saved by linear; a view is judged
    # by its base, and views made in no-grad mode, inside a custom Function's forward, look
    # like leaves) are leaves: they stay resident anyway. Activations that require grad are
    # not, and skip the lookups below.
    base = t._base
    if base is None:
        base = t
    if not base.is_leaf:
        return True
    if base.requires_grad or isinstance(base, _Parameter):
        return False
    if off._skip and (t.device, untyped_storage(t).data_ptr()) in off._skip:
        return False  # a registered parameter or buffer of `module`
    return True


def offload_activations(min_bytes=DEFAULT_MIN_BYTES, prefetch=2, client=None, module=None,
                        max_inflight_bytes=DEFAULT_MAX_INFLIGHT_BYTES, modules=None,
                        max_overhead=None, target_bytes=None, link=None):
    """A context manager that offloads tensors saved for backward to Tierd.

    Saved tensors of at least ``min_bytes`` are offloaded (parameters and their views are not; with
    ``module`` given, none of its parameters or buffers either); a storage is offloaded once
    however many saved views share it, and the views are rebuilt over it. In backward each is
    reloaded when needed, with the next ``prefetch`` ones (reverse order of offload) started ahead.
    Use :func:`no_offload` for regions to leave alone. ``modules``: offload only what the listed
    modules save in their forward: module classes (every instance in ``module``), module
    instances, or name patterns over ``module``'s qualified names (``"layers.*.mlp"``; see
    tier/torch/_module_selection.py for Megatron's module names).

    A budget instead of "everything": ``max_overhead=0.05`` (the step may grow by at most 5%)
    and/or ``target_bytes`` (saved-tensor memory to keep at the end of forward). Create the
    offloader once and enter it every step (``with off:``): the first step offloads nothing and
    is timed, the link is measured (or given: ``link=(d2h, h2d)`` bytes/s), and from the next step
    on only the saved tensors whose copies hide under compute are offloaded (largest and
    longest-lived first; tier/torch/_offload_planner.py). ``off.budget`` says what it chose, the
    predicted and the measured overhead; a step slower than planned makes it plan again with
    less. Returns the :class:`ActivationOffloader`
    (``.stats`` counts what happened). ``client``: a tier.Client (default: tier.default_client()).

    CUDA: the daemon copies each storage after the current stream's work that produced it; its
    GPU memory is released when the copy is known to be done, and at most ``max_inflight_bytes``
    may wait so (beyond, the host waits for the oldest copy). An offload that fails (pool or
    quota full) keeps its tensor where it is (``stats.fallbacks``) instead of failing backward.

    Double backward (create_graph=True) through offloaded tensors is not supported: reloaded
    tensors carry no autograd history.
    """
    return ActivationOffloader(min_bytes=min_bytes, prefetch=prefetch, client=client,
                               module=module, max_inflight_bytes=max_inflight_bytes,
                               modules=modules, max_overhead=max_overhead,
                               target_bytes=target_bytes, link=link)
