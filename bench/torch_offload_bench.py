#!/usr/bin/env python3
"""Activation offload three ways, same model and batch: step time and peak memory.

    python3 bench/torch_offload_bench.py --json out.json

  none       no offload: the baseline.
  inprocess  an in-process offloader written in this file the way torchtune's OffloadActivations
             works (use_streams): D2H into pinned host tensors on a side stream with events; a GPU
             tensor is dropped once `max_fwd_stash` newer ones were offloaded, after the compute
             stream waited for its copy's event; in backward, H2D on the side stream `prefetch`
             ahead, the compute stream waits for the events (record_stream for allocator lifetime).
  tierd      tier.torch.offload_activations: the copies are done by tierd's GPU engine.

Step time is forward + backward + optimizer step (median of --steps after --warmup); peak memory
is torch.cuda.max_memory_allocated, absolute and above the step's starting point (activations).
Prints a table and writes JSON (--json). Starts a tierd from --build-dir unless --socket is
given. --device cpu is a smoke run of this script's logic (modes none and tierd, no memory).
"""

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO_ROOT, "python"))  # the package of this checkout

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from _tierd import TierdProcess  # noqa: E402  (bench/_tierd.py)
import torch.nn.functional as F  # noqa: E402


# ---- the model (the GPU test's GPT: pre-norm blocks, attention written out) -------------------

class Block(nn.Module):
    def __init__(self, d_model, heads, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, h, d // h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = self.drop(att.masked_fill(mask[:s, :s], float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1),
                             persistent=False)
        self.head_region = contextlib.nullcontext  # set per mode: the head is never offloaded

    def forward(self, idx):
        s = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(s, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask)
        with self.head_region():
            return self.head(self.ln_f(x))


# ---- the in-process offloader (torchtune's OffloadActivations, use_streams=True) -------------

def _identity(x):
    return x


class InProcessOffloader:
    """Saved tensors to pinned host memory and back, on a side stream, inside this process."""

    def __init__(self, min_bytes, prefetch=2, max_fwd_stash=5, skip_storages=()):
        self.min_bytes = min_bytes
        self.prefetch = prefetch
        self.max_fwd_stash = max_fwd_stash
        self.skip = set(skip_storages)
        self.next_id = 0
        self.host = {}       # id -> pinned CPU copy
        self.fwd_stash = {}  # id -> (GPU tensor, event of its D2H): kept until the copy is waited
        self.bwd = {}        # id -> (GPU tensor, event of its H2D): prefetched
        self.offloaded_bytes = 0
        self.s0 = self.s1 = None
        self._hooks = None

    def __enter__(self):
        self.s0 = torch.cuda.current_stream()
        self.s1 = torch.cuda.Stream()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False

    def _offloadable(self, t):
        if type(t) is not torch.Tensor or not t.is_cuda or t.layout != torch.strided:
            return False
        if t.numel() * t.element_size() < self.min_bytes:
            return False
        base = t._base if t._base is not None else t
        if isinstance(base, nn.Parameter) or (base.is_leaf and base.requires_grad):
            return False
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        return storage.data_ptr() not in self.skip

    def pack(self, t):
        if not self._offloadable(t):
            return t
        tid = self.next_id
        self.next_id += 1
        self.s1.wait_stream(self.s0)  # the copy reads what the compute stream wrote
        with torch.cuda.stream(self.s1):
            cpu = torch.empty(t.size(), dtype=t.dtype, pin_memory=True)
            cpu.copy_(t, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.s1)
        self.offloaded_bytes += t.numel() * t.element_size()
        self.host[tid] = cpu
        self.fwd_stash[tid] = (t, event)
        # Drop GPU tensors whose copies are old enough: the compute stream waits for each copy
        # first, so its later work (which may reuse the memory) is ordered after the copy.
        for old in [k for k in self.fwd_stash if k <= tid - self.max_fwd_stash]:
            _, old_event = self.fwd_stash.pop(old)
            self.s0.wait_event(old_event)
        return tid

    def unpack(self, tid):
        if not isinstance(tid, int):
            return tid
        if tid in self.fwd_stash:  # never dropped: still on the GPU
            out = self.fwd_stash.pop(tid)[0]
        elif tid in self.bwd:
            out, event = self.bwd.pop(tid)
            self.s0.wait_event(event)
            out.record_stream(self.s0)
        else:
            out = self.host[tid].to("cuda", non_blocking=True)
        self.host.pop(tid, None)
        for j in range(tid - 1, max(tid - 1 - self.prefetch, -1), -1):
            if j in self.host and j not in self.bwd and j not in self.fwd_stash:
                with torch.cuda.stream(self.s1):
                    gpu = self.host[j].to("cuda", non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(self.s1)
                self.bwd[j] = (gpu, event)
        return out


# ---- runs -------------------------------------------------------------------------------------

def make_model(args):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    return GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(args.device,
                                                                               dtype)


def make_batch(args):
    g = torch.Generator().manual_seed(1)
    shape = (args.batch, args.seq)
    return (torch.randint(0, args.vocab, shape, generator=g).to(args.device),
            torch.randint(0, args.vocab, shape, generator=g).to(args.device))


def storages_of(model):
    out = set()
    for t in list(model.parameters()) + list(model.buffers()):
        s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        out.add(s.data_ptr())
    return out


def run_mode(mode, args, client):
    import tier.torch as tt
    cuda = args.device == "cuda"
    model = make_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    idx, target = make_batch(args)
    if mode == "none":
        def factory():
            return contextlib.nullcontext()
    elif mode == "inprocess":
        skip = storages_of(model)

        def factory():
            return InProcessOffloader(args.min_bytes, args.prefetch, args.max_fwd_stash, skip)
        model.head_region = lambda: torch.autograd.graph.saved_tensors_hooks(_identity, _identity)
    elif mode == "tierd":
        def factory():
            return tt.offload_activations(min_bytes=args.min_bytes, prefetch=args.prefetch,
                                          client=client, module=model,
                                          max_inflight_bytes=args.max_inflight_mib << 20)
        model.head_region = tt.no_offload
    else:
        raise ValueError(mode)
    times, act_peaks, abs_peaks, losses = [], [], [], []
    offloaded = 0
    stats = None
    for step in range(args.warmup + args.steps):
        torch.manual_seed(1000 + step)
        if cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with factory() as off:
            logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), target.view(-1))
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        losses.append(loss.item())
        if step >= args.warmup:
            times.append(t1 - t0)
            if cuda:
                act_peaks.append(torch.cuda.max_memory_allocated() - base)
                abs_peaks.append(torch.cuda.max_memory_allocated())
            if off is not None:
                if mode == "tierd":
                    offloaded = off.stats.offloaded_bytes
                    stats = off.stats.as_dict()
                else:
                    offloaded = off.offloaded_bytes
        del logits, loss, off
    model = opt = None  # freed before the next mode runs
    if cuda:
        torch.cuda.empty_cache()
    return {
        "mode": mode,
        "step_ms_median": statistics.median(times) * 1e3,
        "step_ms_min": min(times) * 1e3,
        "step_ms_mean": statistics.mean(times) * 1e3,
        "peak_activation_mib": max(act_peaks) / 2**20 if act_peaks else None,
        "peak_allocated_mib": max(abs_peaks) / 2**20 if abs_peaks else None,
        "offloaded_mib_per_step": offloaded / 2**20,
        "losses": losses,
        "tier_stats": stats,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--modes", default="none,inprocess,tierd")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--max-fwd-stash", type=int, default=5, help="inprocess: GPU tensors kept")
    p.add_argument("--max-inflight-mib", type=int, default=512, help="tierd: see offload_activations")
    p.add_argument("--socket", help="an already running tierd (else one is started)")
    p.add_argument("--build-dir", default=os.environ.get("TIER_BUILD_DIR",
                                                         os.path.join(REPO_ROOT, "build")))
    p.add_argument("--pool-bytes", default="16G")
    args = p.parse_args()

    modes = [m for m in args.modes.split(",") if m]
    notes = []
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available (use --device cpu for a smoke run)")
    if args.device == "cpu" and "inprocess" in modes:
        modes.remove("inprocess")
        notes.append("inprocess needs CUDA streams: skipped on cpu")
    os.environ.setdefault("TIER_BUILD_DIR", args.build_dir)

    daemon = None
    client = None
    if "tierd" in modes:
        import tier
        if args.socket:
            client = tier.Client(socket=args.socket, name="torch_offload_bench")
        else:
            daemon = TierdProcess(args.build_dir, args.pool_bytes)
            client = daemon.connect("torch_offload_bench")
        notes.append("tierd engine: %s" % client.engine)
        if args.device == "cuda" and client.engine != "cuda":
            notes.append("WARNING: tierd has no GPU engine; tierd mode stages through host memory")
    try:
        results = [run_mode(mode, args, client) for mode in modes]
    finally:
        if client is not None:
            client.close()
        if daemon is not None:
            daemon.stop()

    base = next((r for r in results if r["mode"] == "none"), None)
    ref_losses = base["losses"] if base else None
    for r in results:
        r["vs_none"] = r["step_ms_median"] / base["step_ms_median"] if base else None
        r["losses_equal_to_none"] = (r["losses"] == ref_losses) if ref_losses else None

    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print("activation offload, %s, torch %s: %d layers, d_model %d, seq %d, batch %d, %s" % (
        device_name, torch.__version__, args.layers, args.d_model, args.seq, args.batch,
        "bf16" if args.device == "cuda" else "fp32"))
    header = ("mode", "step ms", "vs none", "act peak MiB", "peak MiB", "offloaded MiB",
              "losses = none")
    rows = [header]
    for r in results:
        fmt = lambda v, f="%.1f": "-" if v is None else f % v  # noqa: E731
        rows.append((r["mode"], fmt(r["step_ms_median"]), fmt(r["vs_none"], "%.3f"),
                     fmt(r["peak_activation_mib"], "%.0f"), fmt(r["peak_allocated_mib"], "%.0f"),
                     fmt(r["offloaded_mib_per_step"], "%.0f"), str(r["losses_equal_to_none"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.rjust(w) if i else cell.ljust(w)
                        for i, (cell, w) in enumerate(zip(row, widths))))
    for n in notes:
        print("note:", n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "torch_offload_bench", "device": device_name,
                       "torch": torch.__version__, "python": sys.version.split()[0],
                       "config": vars(args), "results": results, "notes": notes}, f, indent=2)
        print("wrote", args.json)


if __name__ == "__main__":
    main()
