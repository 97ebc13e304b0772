"""What the multi-GPU runs share (issue 26): one process per GPU started with torch.multiprocessing
(spawn), a watchdog over them, the node's one tierd, and the model the ranks train.

    results = launch(worker, ranks, args, timeout_s)   # worker(rank, ranks, args) -> dict

Each rank runs worker(rank, ranks, args) and hands back a picklable dict. The parent waits for
every rank's result; a rank that exits without one, or a run that outlasts timeout_s, is a
failure: every rank's Python stacks are dumped first (SIGUSR1, faulthandler) and, when a tierd
socket is known, `tierctl clients` (what tierd's lanes wait for), then the ranks are killed.
--device cpu runs the same logic on CPU processes (gloo, tierd's host engine): a dry run for a
machine without a GPU.
"""

import faulthandler
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO_ROOT, "python"))  # the package of this checkout

# NVLink multicast stays off on the shared GPU machines (it can take the host's GPUs out of
# service); deterministic cuBLAS for bit-identical runs. Both before CUDA starts in any rank.
for _key, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1"), ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")):
    os.environ.setdefault(_key, _value)

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def log(*parts):
    print(*parts, flush=True)


def gpu_count():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---- tierd --------------------------------------------------------------------------------------

class Tierd:
    """The node's one tierd, from a build tree or bundle (its sockets in a temporary folder), or
    one already running (socket=...)."""

    def __init__(self, build_dir, pool_bytes="8G", socket_path=None, extra=()):
        self.build_dir = build_dir
        self.tierctl = os.path.join(build_dir, "tierctl", "tierctl") if build_dir else None
        self.proc = None
        self.dir = None
        if socket_path:
            self.socket = socket_path
            return
        tierd = os.path.join(build_dir, "daemon", "tierd")
        if not os.access(tierd, os.X_OK):
            raise SystemExit("no tierd at %s (pass --build with a build tree or bundle)" % tierd)
        self.dir = tempfile.mkdtemp(prefix="tiermulti-")
        self.socket = os.path.join(self.dir, "tierd.sock")
        self.log_path = os.path.join(self.dir, "tierd.log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [tierd, "--socket=" + self.socket,
             "--session_socket=" + os.path.join(self.dir, "s.sock"),
             "--state_dir=" + os.path.join(self.dir, "state"), "--pool_bytes=" + pool_bytes,
             "--pool_lock=best-effort", "--log_level=warning", *extra],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("tierd did not start (exit %s):\n%s" % (self.proc.poll(),
                                                                         self.log_tail()))
            time.sleep(0.1)

    def healthy(self):
        if not os.path.exists(self.socket):
            return False
        if not self.tierctl or not os.access(self.tierctl, os.X_OK):
            return True
        return subprocess.run([self.tierctl, "--socket", self.socket, "health"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0

    def tierctl_output(self, *cmd):
        if not self.tierctl or not os.access(self.tierctl, os.X_OK):
            return "(no tierctl beside tierd)"
        r = subprocess.run([self.tierctl, "--socket", self.socket] + list(cmd),
                           capture_output=True, text=True, timeout=30)
        return r.stdout if r.returncode == 0 else "tierctl %s: exit %d: %s" % (
            " ".join(cmd), r.returncode, r.stderr)

    def status(self):
        return json.loads(self.tierctl_output("--json", "status"))

    def log_tail(self, n=4000):
        try:
            with open(self.log_path) as f:
                return f.read()[-n:]
        except (OSError, AttributeError):
            return ""

    def stop(self):
        """SIGTERM (tierd drains and exits 0); the exit status, None for a tierd not ours."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


# ---- the model ----------------------------------------------------------------------------------

# The stress test's GPT (tests/stress/trainer.py), with its head_region: each rank sets it to
# tier.torch.no_offload (or the in-process offloader's keep) under activation offload.
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "stress"))
from trainer import GPT  # noqa: E402,F401  (ddp_tierd and rank_overhead use rl.GPT)


def batches(cfg, steps, seed, device):
    """`steps` (input, target) pairs from a generator seeded with `seed` (each rank its own)."""
    g = torch.Generator().manual_seed(seed)
    shape = (cfg["batch"], cfg["seq"])
    return [(torch.randint(0, cfg["vocab"], shape, generator=g).to(device),
             torch.randint(0, cfg["vocab"], shape, generator=g).to(device))
            for _ in range(steps)]


def loss_of(model, idx, target):
    logits = model(idx)
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), target.view(-1))


# ---- the launcher -------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, ranks, worker, args, results, port, timeout_s):
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent's watchdog asks
    # A second net: a rank that outlives the run's deadline dumps its stacks and exits.
    faulthandler.dump_traceback_later(timeout_s + 30, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank))
    try:
        out = worker(rank, ranks, args)
        results.put((rank, "ok", out))
    except BaseException as e:  # noqa: B902 - everything goes back to the parent
        import traceback
        results.put((rank, "error", "%s\n%s" % (e, traceback.format_exc())))
        raise SystemExit(1)


def launch(worker, ranks, args, timeout_s, tierd=None):
    """Runs worker(rank, ranks, args) in `ranks` spawned processes; returns the list of their
    results (rank order). Raises RuntimeError, after dumping stacks, on a failure or a hang."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, ranks, worker, args, results, port, timeout_s),
                         name="rank%d" % r)
             for r in range(ranks)]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + timeout_s
    failure = None
    while len(got) < ranks and failure is None:
        try:
            rank, state, out = results.get(timeout=0.5)
            if state != "ok":
                failure = "rank %d failed: %s" % (rank, out)
            got[rank] = out
            continue
        except Exception:  # queue.Empty
            pass
        dead = [p for i, p in enumerate(procs) if i not in got and p.exitcode not in (None, 0)]
        if dead:
            failure = "%s exited with %s before reporting" % (dead[0].name, dead[0].exitcode)
        elif time.monotonic() > deadline:
            failure = "the run outlasted %.0f s (a hang?)" % timeout_s
    if failure is not None:
        log("== FAILURE: %s" % failure)
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGUSR1)  # Python stacks to the rank's stderr
        if tierd is not None:
            log("== tierctl clients (what tierd's lanes wait for)\n%s" %
                tierd.tierctl_output("clients"))
        time.sleep(2)
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        raise RuntimeError(failure)
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    return [got[r] for r in range(ranks)]


def setup_rank(rank, ranks, device, backend_wanted=True):
    """The rank's device (cuda:rank, or cpu) and, when backend_wanted, its process group."""
    import torch.distributed as dist
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
    else:
        dev = torch.device("cpu")
    if backend_wanted:
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank,
                                world_size=ranks)
    return dev
