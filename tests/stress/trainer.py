"""One trainer process of the GPU stress test (scripts/gpu-stress).

Runs a random mix of tasks against one tierd until its time is up, each checked against the same
computation without Tierd in this process (bit-identical results expected):

  act       a training step of a small GPT under tier.torch.offload_activations (random min_bytes,
            prefetch on or off), on the current stream or a side stream; loss and every gradient
            compared with the step run without offload
  custom    custom autograd functions whose backward sleeps on the GPU, under activation offload
  weights   a no-grad forward with tier.torch.offload_module_weights (random group)
  multi     a tensor written by two fresh streams, offloaded naming both, dropped, its memory
            reused, reloaded on a random stream
  churn     tensors allocated and freed, and torch.cuda.empty_cache(): allocations go back to the
            driver and come again (registration and unregistration churn)

Progress goes to --status (one JSON object per line: begin/end of each task), which the stress
driver's watchdog reads; SIGUSR1 dumps every Python thread's stack to stderr. Exit status 0 when
every task matched, 1 on a mismatch (details in --status), anything else on a crash.

--tasks multi,act draws only the named tasks (a search for one task's failure). --scenario issue10 runs the fixed reproduction of issue 10 instead of the random mix: the GPT step
under offload_activations(min_bytes=64 KiB) with the default prefetch, --steps times.
"""

import argparse
import contextlib
import faulthandler
import json
import math
import os
import random
import signal
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tier  # noqa: E402
import tier.torch as tt  # noqa: E402

CFG = dict(vocab=4096, d_model=256, heads=4, layers=4, seq=256, batch=4)


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
    def __init__(self, vocab, d_model, heads, layers, seq, **_):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1),
                             persistent=False)
        # Where the head runs: tier.torch.no_offload keeps its activations (the first backward
        # needs) on the GPU under activation offload (tests/multigpu); nothing by default.
        self.head_region = contextlib.nullcontext

    def forward(self, idx):
        s = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(s, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask)
        with self.head_region():
            return self.head(self.ln_f(x))


class SleepyScale(torch.autograd.Function):
    """y = x * 2; backward sleeps on the GPU before it computes (a slow consumer)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        torch.cuda._sleep(2_000_000)
        return g * 2 + x * 0


class Runner:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.status = open(args.status, "a", buffering=1)
        # Reconnects by itself when tierd is killed or restarted (gpu-stress --daemon-kill-every-s).
        self.client = tier.Client(socket=args.socket, name="stress-%d" % args.rank,
                                  reconnect_interval_s=0.2)
        self.tasks = 0
        self.mismatches = 0
        self.aborted = 0
        self.refused = 0

    def log(self, **kv):
        kv["t"] = time.time()
        kv["pid"] = os.getpid()
        self.status.write(json.dumps(kv) + "\n")

    def fail(self, task, what):
        self.mismatches += 1
        self.log(event="mismatch", task=task, what=what)

    def refuse(self, task, *errors):
        """tierd refused the task's offload (host pool or quota full) and said so: a clear error,
        counted apart from a death's aborts."""
        self.refused += 1
        self.log(event="refused", task=task,
                 what="; ".join("%s: %s" % (type(e).__name__, e) for e in errors))

    # ---- tasks ----

    def _gpt_step(self, offload, stream, seed, dtype):
        torch.manual_seed(seed)
        model = GPT(**CFG).to(device="cuda", dtype=dtype)
        g = torch.Generator().manual_seed(seed + 1)
        shape = (CFG["batch"], CFG["seq"])
        idx = torch.randint(0, CFG["vocab"], shape, generator=g).cuda()
        target = torch.randint(0, CFG["vocab"], shape, generator=g).cuda()
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            torch.manual_seed(seed + 2)
            ctx = offload(model) if offload is not None else _null()
            with ctx:
                logits = model(idx)
                loss = F.cross_entropy(logits.float().view(-1, CFG["vocab"]), target.view(-1))
            loss.backward()
            out = [loss.detach().clone()] + [p.grad.detach().clone() for p in model.parameters()]
        stream.synchronize()
        return out

    def task_mlp(self):
        torch.manual_seed(self.rng.randrange(1 << 30))
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.Tanh()).cuda()
        x = torch.randn(32, 64, device="cuda")

        def run(offload):
            model.zero_grad(set_to_none=True)
            with (tt.offload_activations(min_bytes=0, client=self.client) if offload
                  else _null()):
                y = model(x).square().sum()
            y.backward()
            return [y.detach()] + [p.grad.detach().clone() for p in model.parameters()]
        want, got = run(False), run(True)
        if not all(torch.equal(a, b) for a, b in zip(want, got)):
            self.fail("mlp", "tiny MLP with min_bytes=0 differs")

    def task_act_side(self):
        self.task_act(side=True)

    def task_act(self, side=None):
        seed = self.rng.randrange(1 << 30)
        if side is None:
            side = self.rng.random() < 0.4 if not self.args.scenario else False
        stream = torch.cuda.Stream() if side else torch.cuda.current_stream()
        min_bytes = self.rng.choice([0, 64 << 10, 1 << 20]) if not self.args.scenario else 64 << 10
        prefetch = self.rng.choice([0, 1, 2, 4]) if not self.args.scenario else 2
        dtype = torch.bfloat16 if (not self.args.scenario and self.rng.random() < 0.3) \
            else torch.float32
        want = self._gpt_step(None, stream, seed, dtype)
        got = self._gpt_step(lambda m: tt.offload_activations(
            min_bytes=min_bytes, prefetch=prefetch, client=self.client, module=m),
            stream, seed, dtype)
        for i, (a, b) in enumerate(zip(want, got)):
            if not torch.equal(a, b):
                self.fail("act", "tensor %d differs (min_bytes=%d prefetch=%d side=%s)" % (
                    i, min_bytes, prefetch, side))
                return

    def task_custom(self):
        torch.manual_seed(self.rng.randrange(1 << 30))
        x0 = torch.randn(1024, 1024, device="cuda", requires_grad=True)
        w = torch.randn(1024, 1024, device="cuda")

        def run(offload):
            x = x0.detach().clone().requires_grad_(True)
            with (tt.offload_activations(min_bytes=0, client=self.client) if offload
                  else _null()):
                y = SleepyScale.apply(x @ w)
                z = SleepyScale.apply(torch.relu(y))
            z.sum().backward()
            return [z.detach(), x.grad.detach()]
        want, got = run(False), run(True)
        if not all(torch.equal(a, b) for a, b in zip(want, got)):
            self.fail("custom", "custom autograd results differ")

    def task_weights(self):
        seed = self.rng.randrange(1 << 30)
        torch.manual_seed(seed)
        model = GPT(**CFG).cuda().eval()
        idx = torch.randint(0, CFG["vocab"], (2, CFG["seq"]), device="cuda")
        with torch.no_grad():
            want = model(idx)
        w = tt.offload_module_weights(model, group=self.rng.choice([1, 2]), client=self.client)
        try:
            with torch.no_grad():
                for _ in range(2):
                    if not torch.equal(model(idx), want):
                        self.fail("weights", "weight-offloaded forward differs")
                        return
        finally:
            w.remove()

    def task_multi64(self):
        self.task_multi(64 << 20)

    def task_multi(self, nbytes=None):
        n = (nbytes or self.rng.choice([1 << 20, 8 << 20, 64 << 20])) // 4
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        base = torch.arange(n, device="cuda", dtype=torch.float32)
        torch.cuda.synchronize()
        t = torch.empty(n, device="cuda")
        half = n // 2
        sleep = self.rng.choice([0, 1_000_000, 20_000_000])
        with torch.cuda.stream(s1):
            torch.cuda._sleep(sleep)
            t[:half].copy_(base[:half] * 3)
        with torch.cuda.stream(s2):
            t[half:].copy_(base[half:] * 3)
        h = self.client.offload(t, streams=[s1, s2])
        del t
        junk = [torch.full((n,), -1.0, device="cuda") for _ in range(2)]
        side = self.rng.random() < 0.5
        consumer = torch.cuda.Stream() if side else None
        # As a training step does at its backward's end: the reload's own answer is read before
        # its data is judged. A GPU reload that tierd failed (say of an object whose offload it
        # refused for a full pool) has a destination the copy never filled; reload_check says so.
        check = self.client.reload_check()
        try:
            out = h.reload(stream=consumer)
        except tier.ResourceExhausted as e:
            if h.job is None or h.job.status != tier.errors.RESOURCE_EXHAUSTED:
                raise  # not the offload's refusal (a destination tierd could not register)
            self.refuse("multi", e)
            return
        with torch.cuda.stream(consumer or torch.cuda.current_stream()):
            ok = torch.equal(out, base * 3)
        del junk
        try:
            check()
        except tier.Unavailable as e:
            h.wait_offload()
            if not ok and h.job.status == tier.errors.RESOURCE_EXHAUSTED:
                self.refuse("multi", e, h.job.error())
                return
            raise
        if not ok:
            h.wait_offload()
            self.fail("multi", "offload after two producer streams differs (%d floats; s1 slept "
                      "%d cycles; consumer %s): %s" % (
                          n, sleep, "a side stream" if side else "the current stream",
                          _describe_difference(out, base * 3, lambda: h.reload())) +
                      "; offload job %s" % tier.errors.code_name(h.job.status))

    def task_churn(self):
        keep = [torch.empty(self.rng.choice([1, 3, 17, 65]) << 20, dtype=torch.uint8,
                            device="cuda") for _ in range(self.rng.randrange(1, 6))]
        del keep
        torch.cuda.empty_cache()

    def run(self):
        deadline = time.time() + self.args.minutes * 60
        names = ["act", "custom", "weights", "multi", "churn"]
        weights = [5, 1, 1, 2, 1]
        if self.args.tasks:
            chosen = self.args.tasks.split(",")
            weights = [w for name, w in zip(names, weights) if name in chosen]
            names = [name for name in names if name in chosen]
        n = 0
        sequence = {"issue10": ["act"] * self.args.steps,
                    "issue10b": ["mlp", "custom", "act", "act_side", "multi64"]}.get(
                        self.args.scenario)
        while True:
            if self.args.scenario:
                if n >= len(sequence):
                    break
                name = sequence[n]
            else:
                if time.time() >= deadline:
                    break
                name = self.rng.choices(names, weights)[0]
            self.log(event="begin", task=name, n=n)
            try:
                getattr(self, "task_" + name)()
            except Exception as e:  # noqa: BLE001
                # tierd went away under the task (a daemon kill): a clear error is the allowed
                # outcome, wrong data never is (the task compares before it returns).
                if not _daemon_gone_error(e):
                    raise
                self.aborted += 1
                self.log(event="aborted", task=name, n=n, what="%s: %s" % (type(e).__name__, e))
                torch.cuda.synchronize()
            self.log(event="end", task=name, n=n)
            n += 1
        self.client.synchronize()
        self.log(event="done", tasks=n, mismatches=self.mismatches, aborted=self.aborted,
                 refused=self.refused)
        self.client.close()
        return 0 if self.mismatches == 0 else 1


def _describe_difference(got, want, reload_again):
    """Where `got` differs from `want`, for a mismatch's report: which half (the first is the slow
    producer's), how many wrong floats are -1 (the memory reused after the source was dropped), 0,
    or else; the first wrong ones; and whether a second reload of the object, made after the GPU
    is idle, is right (then the pool held the right bytes and the first reload read too early)."""
    torch.cuda.synchronize()
    wrong = (got != want).nonzero().flatten()
    half = got.numel() // 2
    values = got[wrong]
    first = [(int(i), float(got[i]), float(want[i])) for i in wrong[:4].tolist()]
    try:
        again = reload_again()
        torch.cuda.synchronize()
        second = "right" if torch.equal(again, want) else "wrong in %d floats" % int(
            (again != want).sum())
    except Exception as e:  # noqa: BLE001
        second = "failed (%s: %s)" % (type(e).__name__, e)
    return ("%d wrong (%d in the first half, %d in the second; %d are -1, %d are 0); first "
            "(index, got, want): %s; a second reload after synchronize: %s" % (
                wrong.numel(), int((wrong < half).sum()), int((wrong >= half).sum()),
                int((values == -1).sum()), int((values == 0).sum()), first, second))


def _daemon_gone_error(e):
    """Whether `e` is the clear error a task gets when tierd died or restarted under it."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (tier.Unavailable, tier.DataLoss)):
            return True
        if isinstance(e, tier.TierError) and "went away" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--scenario", default="")
    p.add_argument("--tasks", default="", help="the random mix of only these tasks (comma-separated)")
    p.add_argument("--status", required=True)
    p.add_argument("--device", type=int, default=0, help="this trainer's GPU (every 'cuda' is it)")
    args = p.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.cuda.set_device(args.device)  # before anything touches CUDA: its context only
    torch.cuda.init()
    sys.exit(Runner(args).run())


if __name__ == "__main__":
    main()
