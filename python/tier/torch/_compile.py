"""Activation offload for torch.compile'd models: the compiled graph holds a handle, not the
tensor.

Why saved-tensor hooks cannot do it under compile: AOTAutograd runs the whole compiled forward
as one graph and hands its saved tensors to autograd (``ctx.save_for_backward``) only when that
graph returns. The hooks (tier.torch.offload_activations) then see every saved tensor at once,
after the forward's activation peak: the bytes move, the peak stays (measured: 10.9 GB moved,
peak unchanged, 2.6x slower). In eager mode they see each tensor as it is saved, which is what
lowers the peak.

So Tierd goes where the compiler decides what to save: a partitioner (Inductor's
``custom_partitioner_fn``, or ``partition_fn`` of aot_autograd) that runs PyTorch's own
min-cut partitioner and then rewrites the two graphs it made:

* forward: after the last use of each saved activation X (large enough, produced in the graph,
  not a graph output or input), ``h = tier.offload_saved(X)``; the forward returns h instead of
  X. ``RELEASE_LAG`` offloads later, ``tier.release_saved(h, X)``: X's last use, after which
  Inductor may reuse its memory (it plans that at compile time), so the op makes the stream
  wait, on the GPU, until the daemon's copy has read X; by then the copy has had that much of
  the forward to run under. (At most ``max_inflight_bytes`` of copies wait for the host to
  learn they are done.)
* backward: before the first use, ``X = tier.reload_saved(h, ahead, ...)``; ``ahead`` are the
  next ``prefetch`` handles in the backward's order, whose reloads start then (one batch,
  allocated on the current stream: Client.start_reloads with prefetch) and are waited for, on
  the GPU, where they are used.

h is a one-element int64 CPU tensor naming an entry of this process's :class:`_Runtime` (the
tierd handle); the entry is freed when h is (autograd drops the graph after backward, or the
graph is never used). Inside a CUDA graph capture the op keeps X (a handle to the GPU tensor
itself; tier/_cuda_graphs.py), and the ops are tagged ``cudagraph_unsafe`` so Inductor does not
capture graphs that hold them (``mode="reduce-overhead"`` then runs them without CUDA graphs,
and says so once).

Two ways in:

* ``torch.compile(model, options=tier.torch.compile_options(min_bytes=...))``: this model's
  graphs offload whenever they run.
* ``with tier.torch.offload_activations(...)``: entering installs the partitioner for graphs
  compiled from then on (unless another one is set), and their ops follow the offloader active
  when they run (its client, min_bytes, stats); outside one they keep every tensor. Graphs
  compiled before are reported once, loudly, when their saved tensors reach the hooks.
"""

import hashlib
import itertools
import sys
import threading
import typing
import warnings
import weakref

import torch

from .. import _cuda_graphs
from ._default_client import DefaultClient
from ._counters import Counters
from ._inflight import InflightBound

__all__ = ["compile_options", "compile_backend", "TierPartitioner", "compile_stats"]

DEFAULT_MIN_BYTES = 1 << 20
DEFAULT_MAX_INFLIGHT_BYTES = 512 << 20
FOLLOW = 0  # policy id: follow the ActivationOffloader active at run time
AUTO_DEVICES = ("cuda",)  # what the partitioner offload_activations installs rewrites
RELEASE_LAG = 2  # offloads between an offload and the release of its source


class Followed:
    """What the ops of a graph compiled to follow the active offloader (FOLLOW) read from the
    owner of the saved-tensor hooks on top when they run: ``client``, ``min_bytes``,
    ``prefetch``, ``max_inflight_bytes`` and ``stats``. ActivationOffloader derives from it;
    defined here, so that this module needs nothing of the offloader's."""

    __slots__ = ()


class CompiledOffloadStats(Counters):
    """What the compiled graphs' ops did (process-wide; read any time)."""

    __slots__ = ("offloaded", "offloaded_bytes", "kept", "kept_bytes", "reloads", "prefetches",
                 "source_hits", "inflight_waits", "freed")


class _Policy:
    """Settings of graphs compiled with compile_options()."""

    __slots__ = ("min_bytes", "prefetch", "max_inflight_bytes", "_client")

    def __init__(self, min_bytes, prefetch, max_inflight_bytes, client):
        self.min_bytes = int(min_bytes)
        self.prefetch = int(prefetch)
        self.max_inflight_bytes = int(max_inflight_bytes)
        self._client = client

    client = DefaultClient()


class _Entry:
    """One saved activation of a compiled forward: in tierd (handle), or kept (tensor)."""

    __slots__ = ("handle", "tensor", "pending", "client", "stats")

    def __init__(self, handle=None, tensor=None, client=None, stats=None):
        self.handle = handle
        self.tensor = tensor
        self.pending = None  # a reload started (Client.start_reloads), not yet taken
        self.client = client
        self.stats = stats   # the ActivationOffloader's stats, when following one


class _Runtime:
    """The entries of every compiled graph of this process, by key (the value of h)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = {}
        self._keys = itertools.count(1)
        self._policies = {}
        self._inflight = InflightBound()  # offloads whose copies are not known complete
        self.stats = CompiledOffloadStats()
        self._warned = set()
        self.op_calls = 0           # offload ops run, ever
        self.op_calls_at_enter = 0  # ... when an ActivationOffloader was last entered

    def register_policy(self, policy):
        with self._lock:
            key = next(self._keys)
            self._policies[key] = policy
            return key

    def _follow(self):
        """The ActivationOffloader whose hooks are on top now, or None."""
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is None:
            return None
        # (The offloader's bound method, or a hook made for one of its steps, which names it.)
        owner = getattr(top[0], "__self__", None) or getattr(top[0], "offloader", None)
        return owner if isinstance(owner, Followed) else None

    def _settings(self, policy_id):
        """(client, min_bytes, prefetch, max_inflight_bytes, stats) or None (keep)."""
        if policy_id == FOLLOW:
            off = self._follow()
            if off is None:
                return None
            return (off.client, off.min_bytes, off.prefetch, off.max_inflight_bytes, off.stats)
        p = self._policies.get(policy_id)
        if p is None:
            return None
        return (p.client, p.min_bytes, p.prefetch, p.max_inflight_bytes, None)

    def _handle_tensor(self, entry):
        key = next(self._keys)
        with self._lock:
            self._entries[key] = entry
        h = torch.tensor([key], dtype=torch.int64)
        weakref.finalize(h, self._drop, key)
        return h

    def _drop(self, key):
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is not None and entry.handle is not None:
            self.stats.freed += 1
            entry.handle.free()

    def offload(self, x, policy_id):
        self.op_calls += 1
        nbytes = x.numel() * x.element_size()
        settings = self._settings(policy_id)
        if settings is None or nbytes < settings[1] or _cuda_graphs.capturing(x.device):
            if settings is not None and _cuda_graphs.capturing(x.device):
                self._warn_once("capture", "tier: a compiled graph's activation offload ran "
                                "%s; its saved tensors stay on the GPU" %
                                _cuda_graphs.UNSUPPORTED.split(": a tierd")[0])
            self.stats.kept += 1
            self.stats.kept_bytes += nbytes
            # A copy: the graph reuses x's memory after release_saved (Inductor plans that at
            # compile time, not knowing this run keeps it).
            return self._handle_tensor(_Entry(tensor=x.detach().clone()))
        client, _, _, max_inflight, off_stats = settings
        # CUDA: the daemon's copy waits for the current stream (which produced x); release_saved,
        # later in the graph, makes the stream wait for the copy before x's memory is reused.
        # A failed offload of a GPU tensor cannot fall back to x (it is reused by then): the
        # reload raises the offload's error. Host tensors are staged (copied) here: they can.
        handle = client.offload(x.detach(), None, 0,
                                retain_on_failure=x.device.type != "cuda")
        self.stats.offloaded += 1
        self.stats.offloaded_bytes += nbytes
        if off_stats is not None:
            off_stats.offloaded_tensors += 1
            off_stats.offloaded_storages += 1
            off_stats.offloaded_bytes += nbytes
        if handle.direct and handle.submitted:
            # Its source's memory returns once its copy is known complete (_inflight.py).
            self.stats.inflight_waits += self._inflight.add(handle, nbytes, max_inflight)
        return self._handle_tensor(_Entry(handle=handle, client=client, stats=off_stats))

    def release(self, h):
        """x's memory may be reused from here on in the graph's stream order: that stream
        waits, on the GPU, until the daemon's copy has read x (no host wait)."""
        entry = self._entry(h)
        handle = entry.handle
        if handle is None or not handle.direct or not handle.in_flight:
            return  # kept (a copy), staged (copied when offloaded), or done: nothing to wait for
        handle.stream_wait_offload(torch.cuda.current_stream(handle.device))

    def _entry(self, h):
        key = int(h.item())
        with self._lock:
            entry = self._entries.get(key)
        if entry is None:
            raise RuntimeError("tier: a compiled graph's saved activation %d is gone (its "
                               "handle was freed before backward)" % key)
        return entry

    def _start(self, entries, prefetch):
        todo = [e for e in entries if e.handle is not None and e.tensor is None
                and e.pending is None]
        if not todo:
            return
        client = todo[0].client
        # Allocated on the current stream (one batch); a prefetch's wait is put where it is
        # first used (reload: result()), so its copies run beside the backward queued between.
        started = client.start_reloads([e.handle for e in todo], prefetch=prefetch)
        for e, s in zip(todo, started):
            e.pending = s
            if prefetch:
                self.stats.prefetches += 1
                if e.stats is not None:
                    e.stats.prefetches += 1

    def reload(self, h, ahead, device, size, stride, dtype):
        entry = self._entry(h)
        if entry.tensor is not None:  # kept
            return _as(entry.tensor, size, stride)
        # (No taking the source of an offload still in flight, as the eager offloader does:
        # the graph reused its memory after release_saved.)
        self._start([entry], prefetch=False)
        others = [self._entry(a) for a in ahead]
        self._start([e for e in others if e.tensor is None], prefetch=True)
        started, entry.pending = entry.pending, None
        data = started.result()  # the current stream waits (GPU) for the copy before any use
        self.stats.reloads += 1
        if entry.stats is not None:
            entry.stats.reloads += 1
        return _as(data, size, stride)

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _contiguous(size):
    stride, acc = [], 1
    for s in reversed(list(size)):
        stride.append(acc)
        acc *= max(int(s), 1)
    return list(reversed(stride))


def _as(t, size, stride):
    """t (contiguous data of the saved tensor) as a tensor of the saved size and stride."""
    if list(t.size()) == list(size) and list(t.stride()) == list(stride):
        return t
    if list(stride) == _contiguous(size):
        return t.view(size)
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t.view(size))
    return out


_RUNTIME = _Runtime()


def compile_stats():
    """The compiled graphs' offload counters (:class:`CompiledOffloadStats`)."""
    return _RUNTIME.stats


# ---- the ops the graphs call ---------------------------------------------------------------

HAVE_OPS = hasattr(torch.library, "custom_op")  # torch >= 2.4


def _register_ops():
    tags = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()

    @torch.library.custom_op("tier::offload_saved", mutates_args=(), tags=tags)
    def offload_saved(x: torch.Tensor, policy: int) -> torch.Tensor:
        return _RUNTIME.offload(x, policy)

    @offload_saved.register_fake
    def _(x, policy):
        return torch.empty(1, dtype=torch.int64, device="cpu")

    @torch.library.custom_op("tier::release_saved", mutates_args=(), tags=tags)
    def release_saved(h: torch.Tensor, x: torch.Tensor) -> None:
        _RUNTIME.release(h)

    @release_saved.register_fake
    def _(h, x):
        return None

    @torch.library.custom_op("tier::reload_saved", mutates_args=(), tags=tags)
    def reload_saved(h: torch.Tensor, ahead: typing.List[torch.Tensor], device: torch.device,
                     size: typing.List[int], stride: typing.List[int],
                     dtype: torch.dtype) -> torch.Tensor:
        return _RUNTIME.reload(h, ahead, device, size, stride, dtype)

    @reload_saved.register_fake
    def _(h, ahead, device, size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    try:  # side effects: never removed as dead code
        from torch.fx.node import has_side_effect
        for op in (torch.ops.tier.offload_saved, torch.ops.tier.release_saved,
                   torch.ops.tier.reload_saved):
            has_side_effect(op.default)
    except ImportError:  # pragma: no cover - older torch: the graph's outputs keep them alive
        pass


if HAVE_OPS:
    _register_ops()


def _need_ops():
    if not HAVE_OPS:
        raise RuntimeError("tier: activation offload inside torch.compile graphs needs "
                           "torch.library.custom_op (torch >= 2.4); this is torch %s"
                           % torch.__version__)


# ---- the graph rewrite -------------------------------------------------------------------------

def _is_view(node):
    target = getattr(node, "target", None)
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    return any(a.alias_info is not None and not a.alias_info.is_write
               for a in schema.returns)


def _effective_users(node):
    out = []
    for user in node.users:
        if user.op == "output":
            continue
        out.append(user)
        if _is_view(user):
            out.extend(_effective_users(user))
    return out


def _nbytes(val):
    return int(val.numel()) * val.element_size()


def rewrite(fw, bw, num_fwd_outputs, policy_id, min_bytes, prefetch, devices=("cuda",)):
    """Inserts the ops into a partitioned (fw, bw) pair; returns how many tensors it offloads.
    Forward outputs [num_fwd_outputs:] are what backward gets, in order, as its first inputs:
    each offloaded one is replaced at its position by its handle, in both graphs."""
    fw_g, bw_g = fw.graph, bw.graph
    out_node = fw_g.find_nodes(op="output")[0]
    outs = list(out_node.args[0])
    user_outs = set(outs[:num_fwd_outputs])
    order = {n: i for i, n in enumerate(fw_g.nodes)}
    bw_inputs = {n.name: n for n in bw_g.find_nodes(op="placeholder")}
    chosen = []
    for pos in range(num_fwd_outputs, len(outs)):
        node = outs[pos]
        val = node.meta.get("val") if hasattr(node, "meta") else None
        if not isinstance(val, torch.Tensor) or node.op != "call_function":
            continue  # symints, and graph inputs (parameters, user inputs): alive anyway
        if node in user_outs or val.device.type not in devices or val.layout != torch.strided:
            continue
        if _is_view(node) or node.name not in bw_inputs:
            continue  # a view keeps its base alive; offloading it would free nothing
        if not all(isinstance(v, int) for v in list(val.size()) + list(val.stride())):
            continue  # dynamic shapes: not rewritten (the ops take static sizes)
        if _nbytes(val) < min_bytes:
            continue
        if not val.is_contiguous():
            continue
        chosen.append((pos, node))
    if not chosen:
        return 0
    fake_h = torch.empty(1, dtype=torch.int64, device="cpu")
    bw_order = {n: i for i, n in enumerate(bw_g.nodes)}
    reloads = []
    offloads = []  # (offload node, saved node)
    for pos, node in chosen:
        users = _effective_users(node)
        after = max(users, key=lambda n: order[n]) if users else node
        with fw_g.inserting_after(after):
            h = fw_g.call_function(torch.ops.tier.offload_saved.default, (node, policy_id))
        h.meta["val"] = fake_h
        outs[pos] = h
        offloads.append((h, node))
        old = bw_inputs[node.name]
        with bw_g.inserting_before(old):
            ph = bw_g.placeholder(h.name)
        ph.meta["val"] = fake_h
        val = node.meta["val"]
        first = min(old.users, key=lambda n: bw_order[n]) if old.users else None
        reloads.append((first, ph, old, val))
    out_node.args = (tuple(outs),) + tuple(out_node.args[1:])
    # x is the release's input, so the graph keeps x's memory until then; the release comes
    # RELEASE_LAG offloads later (the copy had that much of the forward to run), and makes the
    # stream wait for the copy before anything reuses x's memory.
    order = {n: i for i, n in enumerate(fw_g.nodes)}
    offloads.sort(key=lambda o: order[o[0]])
    for i, (h, node) in enumerate(offloads):
        later = i + RELEASE_LAG
        if later < len(offloads):
            anchor_ctx = fw_g.inserting_after(offloads[later][0])
        else:
            anchor_ctx = fw_g.inserting_before(out_node)
        with anchor_ctx:
            fw_g.call_function(torch.ops.tier.release_saved.default, (h, node))
    # Reloads in the backward's order of first use; each names the next `prefetch` handles.
    reloads.sort(key=lambda r: bw_order[r[0]] if r[0] is not None else len(bw_order))
    for i, (first, ph, old, val) in enumerate(reloads):
        ahead = [r[1] for r in reloads[i + 1:i + 1 + prefetch]]
        anchor = first if first is not None else bw_g.find_nodes(op="output")[0]
        with bw_g.inserting_before(anchor):
            x = bw_g.call_function(torch.ops.tier.reload_saved.default,
                                   (ph, ahead, val.device, list(val.size()),
                                    list(val.stride()), val.dtype))
        x.meta["val"] = val
        old.replace_all_uses_with(x)
        bw_g.erase_node(old)
    fw_g.lint()
    bw_g.lint()
    fw.recompile()
    bw.recompile()
    return len(chosen)


def _base_partition(gm, joint_inputs, **kwargs):
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    kwargs.setdefault("compiler", "inductor")
    return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)


class _Partitioner:
    """PyTorch's min-cut partitioner, then :func:`rewrite`. Usable as Inductor's
    ``custom_partitioner_fn`` (through :func:`TierPartitioner`, which makes it an Inductor
    CustomPartitionerFn) and as aot_autograd's ``partition_fn``."""

    def __init__(self, policy_id=FOLLOW, min_bytes=DEFAULT_MIN_BYTES, prefetch=2,
                 devices=("cuda",)):
        self.policy_id = int(policy_id)
        self.min_bytes = int(min_bytes)
        self.prefetch = int(prefetch)
        self.devices = tuple(devices)
        self.offloaded = 0  # tensors given ops, over every graph partitioned
        _partitioners.add(self)

    def __call__(self, gm, joint_inputs, **kwargs):
        fw, bw = _base_partition(gm, joint_inputs, **kwargs)
        num_fwd_outputs = kwargs.get("num_fwd_outputs")
        if num_fwd_outputs is None:
            return fw, bw
        self.offloaded += rewrite(fw, bw, num_fwd_outputs, self.policy_id, self.min_bytes,
                                  self.prefetch, self.devices)
        return fw, bw

    def uuid(self):
        h = hashlib.sha256()
        with open(__file__, "rb") as f:
            h.update(f.read())
        h.update(repr((self.policy_id, self.min_bytes, self.prefetch, self.devices)).encode())
        return h.hexdigest()


_inductor_class = None


def TierPartitioner(*args, **kwargs):  # noqa: N802 - it makes instances of a class
    """A partitioner Inductor takes as ``custom_partitioner_fn`` (its class derives from
    Inductor's CustomPartitionerFn, imported here on first use: importing Inductor costs about a
    second); arguments as :class:`_Partitioner`."""
    global _inductor_class, InductorPartitioner
    if _inductor_class is None:
        from torch._inductor.custom_graph_pass import CustomPartitionerFn
        # A module-level name, so that Inductor's cache can pickle the config that holds one.
        _inductor_class = InductorPartitioner = type(
            "InductorPartitioner", (_Partitioner, CustomPartitionerFn), {"__module__": __name__})
    return _inductor_class(*args, **kwargs)


InductorPartitioner = None  # made by TierPartitioner()


def compile_options(min_bytes=DEFAULT_MIN_BYTES, prefetch=2,
                    max_inflight_bytes=DEFAULT_MAX_INFLIGHT_BYTES, client=None,
                    devices=("cuda",)):
    """Options for ``torch.compile(model, options=...)`` (Inductor) that make the compiled
    graphs offload their saved activations of at least ``min_bytes`` through Tierd whenever they
    run, each as soon as the forward is done with it; see the module docstring. ``devices``:
    the device types whose activations go (CPU too for tests)."""
    _need_ops()
    policy = _RUNTIME.register_policy(_Policy(min_bytes, prefetch, max_inflight_bytes, client))
    return {"custom_partitioner_fn": TierPartitioner(policy, min_bytes, prefetch, devices)}


def compile_backend(min_bytes=DEFAULT_MIN_BYTES, prefetch=2,
                    max_inflight_bytes=DEFAULT_MAX_INFLIGHT_BYTES, client=None,
                    devices=("cuda",)):
    """A ``torch.compile`` backend without Inductor (aot_autograd, graphs run as FX code) with
    the same rewrite: for backends other than Inductor, and for CPU tests
    (``devices=("cpu",)``). Returns (backend, partitioner)."""
    _need_ops()
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func
    policy = _RUNTIME.register_policy(_Policy(min_bytes, prefetch, max_inflight_bytes, client))
    part = _Partitioner(policy, min_bytes, prefetch, devices)

    def nop(gm, example_inputs):
        return make_boxed_func(gm.forward)
    return aot_autograd(fw_compiler=nop, bw_compiler=nop, partition_fn=part), part


# ---- offload_activations and compiled graphs -----------------------------------------------------

_installed = None


def on_offloader_enter(offloader):
    """ActivationOffloader.__enter__: graphs compiled from now on get the ops (following the
    offloader active when they run), unless the user set a partitioner of their own."""
    global _installed
    _RUNTIME.op_calls_at_enter = _RUNTIME.op_calls
    if _installed is not None or "torch._dynamo" not in sys.modules:
        return  # (no torch.compile in this process yet: nothing to install for)
    try:
        import torch._inductor.config as inductor_config
    except ImportError:  # pragma: no cover
        return
    if getattr(inductor_config, "custom_partitioner_fn", "absent") is not None:
        return  # theirs (or a torch without the setting)
    if not HAVE_OPS or not hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks"):
        return  # cannot tell the active offloader at run time: compile_options() only
    _installed = TierPartitioner(FOLLOW, min(DEFAULT_MIN_BYTES, offloader.min_bytes),
                                 offloader.prefetch, AUTO_DEVICES)
    inductor_config.custom_partitioner_fn = _installed


_partitioners = weakref.WeakSet()  # every partitioner made (they count what they rewrote)


def uninstall():
    """Removes the partitioner offload_activations installed (tests; or to compile without)."""
    global _installed
    if _installed is None:
        return
    import torch._inductor.config as inductor_config
    if inductor_config.custom_partitioner_fn is _installed:
        inductor_config.custom_partitioner_fn = None
    _installed = None


def note_hooked_save():
    """ActivationOffloader._pack, for a tensor it is about to offload: if it comes from a
    compiled graph that Tierd did not rewrite (compiled before offload_activations was entered,
    or with a partitioner of the user's own), say so once: offloading it after the whole graph
    ran does not lower that graph's peak. (It is still offloaded: with a graph per block, as
    torchtitan compiles, that lowers the peak between blocks.)"""
    if "hooks" in _RUNTIME._warned or _RUNTIME.op_calls != _RUNTIME.op_calls_at_enter:
        return  # (a rewritten graph ran in this context: its ops ran before its saves came)
    if "torch._dynamo" not in _MODULES:
        return  # nothing was compiled in this process (torch.compile loads dynamo)
    # Whether the saved tensor being packed now comes from an AOTAutograd compiled function (its
    # forward ran as one graph, so the hooks see its tensors only after it returned). (Inline:
    # this runs for every offloaded save.)
    frame = sys._getframe(2)
    for _ in range(6):
        if frame is None:
            return
        name = frame.f_code.co_filename
        if "_aot_autograd" in name or "_functorch" in name:
            warn_compiled_saves_once()
            return
        frame = frame.f_back


_MODULES = sys.modules


def warn_compiled_saves_once():
    _RUNTIME._warn_once("hooks", (
        "tier: offload_activations sees the saved tensors of a torch.compile graph only after "
        "its whole forward ran, so offloading them moves bytes without lowering the activation "
        "peak of that graph. Compile inside `with offload_activations(...)` (the first call "
        "compiles: Tierd then offloads inside the graph) or pass "
        "options=tier.torch.compile_options() to torch.compile"))
