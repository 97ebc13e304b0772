"""PyTorch integration: activation offload and module weight offload through Tierd.

Activation offload::

    with tier.torch.offload_activations(min_bytes=1 << 20, prefetch=2) as off:
        loss = model(x).sum()               # saved activations >= min_bytes go to Tierd
        with tier.torch.no_offload():       # opt-out region (e.g. the output head)
            ...
    loss.backward()                         # reloaded in reverse order, `prefetch` ahead
    print(off.stats)

Module weight offload (inference, or frozen weights under no_grad)::

    w = tier.torch.offload_module_weights(model, group=2)   # blocks' weights live in Tierd
    with torch.no_grad():
        y = model(x)        # each group is onloaded one group ahead, as one batch
    w.remove()              # everything resident again, hooks gone

Optimizer state offload (ZeRO-Offload style: Adam's moments live in Tierd between steps)::

    off = tier.torch.offload_optimizer_state(optimizer, group_bytes=64 << 20, prefetch=1)
    optimizer.step()        # group by group: state back, update, state out; next group prefetched

Checkpoints kept in tierd (they outlive the trainer; with NVMe, tierd too)::

    h = tier.torch.checkpoint.save({"model": model.state_dict(),
                                    "optim": optimizer.state_dict(), "step": step}, "run7/rank0")
    ...                      # training goes on; h.wait() committed, h.wait_durable() on NVMe
    state = tier.torch.checkpoint.load("run7/rank0")   # after a restart

Stream ordering (CUDA), stated once here and at each use:

* Offload: the daemon's copy waits on the GPU for the current stream (the producer of the saved
  tensor / weight); the job record keeps the source alive until the copy completed.
* Reload for immediate use: destination allocated on the current (consumer) stream, which waits on
  the GPU for the copy before tier_reload returns.
* Prefetch: destination allocated on the consumer stream at the prefetch point, so
  it comes from the same allocator pool as everything else of that stream; the copy waits for the
  stream to reach that point, and the stream waits for the copy only at the tensor's first use
  (TIER_RELOAD_DEFER_WAIT and ``tier_stream_wait_reload``; one wait per batch). A prefetch never
  used still has its wait put on the stream before its memory is let go.
  Weights, optimizer state and compiled graphs prefetch the same way
  (:meth:`tier.Client.start_reloads` with ``prefetch=True``): no offloader has a side stream or
  an event of its own. Where the first use is on another stream than the allocating one,
  ``record_stream`` only tells the caching allocator so; the wait is the ordering.
"""


# This package only re-exports; each part lives in a module of its own:
#   _activations.py        offload_activations, ActivationOffloader, no_offload
#   _weights.py            offload_module_weights, WeightOffloader
#   _optimizer_state.py    offload_optimizer_state, OptimizerStateOffloader
#   _plan_activations.py   plan_activations, ActivationPlanner (keep / offload / recompute)
#   _offload_budget.py, _offload_planner.py, _activation_planner.py: the planners' policy
#   _compile.py            torch.compile: compile_options, compile_backend, compile_stats
#   _checkpoint.py         tier.torch.checkpoint; _dcp.py tier.torch.dcp; _checkpointer.py
#   _dropin.py             torchtune's, torchao's and diffusers' names over the above
from . import _checkpoint as checkpoint  # noqa: F401  (tier.torch.checkpoint.save/load)
from ._activations import (DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MIN_BYTES,  # noqa: F401
                           ActivationOffloader, ActivationStats, no_offload, offload_activations)
from ._compile import compile_backend, compile_options, compile_stats  # noqa: F401
from ._counters import Counters  # noqa: F401
from ._dropin import (CPUOffloadOptimizer, NoOpManager, OffloadActivations,  # noqa: F401
                      apply_group_offloading, get_act_offloading_ctx_manager)
from ._module_selection import ModuleSelection  # noqa: F401
from ._offload_budget import OffloadBudget  # noqa: F401
from ._optimizer_state import (DEFAULT_GROUP_BYTES, DEFAULT_STATE_MIN_BYTES,  # noqa: F401
                               OptimizerStateOffloader, OptimizerStateStats,
                               offload_optimizer_state)
from ._plan_activations import ActivationPlanner, plan_activations  # noqa: F401
from ._weights import WeightOffloader, WeightStats, offload_module_weights  # noqa: F401

__all__ = ["checkpoint", "offload_activations", "no_offload", "offload_module_weights",
           "ActivationOffloader", "WeightOffloader", "DEFAULT_MIN_BYTES",
           "DEFAULT_MAX_INFLIGHT_BYTES", "offload_optimizer_state", "OptimizerStateOffloader",
           "DEFAULT_GROUP_BYTES", "DEFAULT_STATE_MIN_BYTES", "OffloadActivations", "NoOpManager",
           "get_act_offloading_ctx_manager", "apply_group_offloading", "plan_activations",
           "ActivationPlanner", "CPUOffloadOptimizer", "compile_options", "compile_backend",
           "compile_stats"]


def __getattr__(name):
    # tier.torch.dcp (_dcp.py) on first use: it imports torch.distributed.checkpoint.
    # tier.torch.Checkpointer (_checkpointer.py) likewise.
    if name == "dcp":
        from . import _dcp
        return _dcp
    if name == "Checkpointer":
        from ._checkpointer import Checkpointer
        return Checkpointer
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
