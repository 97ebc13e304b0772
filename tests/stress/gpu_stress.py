"""The many-trainers stress test of issue 10: N trainer processes against one tierd.

Each run starts one tierd (delay injection on in some runs), N trainers (tests/stress/trainer.py;
half of them with PyTorch's expandable segments; dealt over the GPUs of --gpus by rank, every
GPU's trainers sharing the one tierd), and, now and then, SIGKILLs one trainer in the
middle of a task and starts a new one in its place. A watchdog reads every trainer's progress:
a task that runs longer than --watchdog-s is a hang, and then every thread's stack (Python stacks
through SIGUSR1, native ones through cuda-gdb where it exists, kernel wait channels always) and
tierd's own view (tierctl --json status and clients) are written to the output folder before the
run fails. At the end of a run every trainer must have exited 0 (no mismatch), tierd must still
be up and, once the last session ended, hold no session, object, pool byte, buffer or mapping;
then SIGTERM must stop it with exit 0.

Daemon chaos (--daemon-kill-every-s S): every S seconds on average tierd itself is SIGKILLed or
stopped with SIGTERM (it drains: the trainers take back what they offloaded first) at a random
point of the random workload, and the next tierd starts on the same socket; the trainers' clients
reconnect by themselves. A task running when tierd died must end within 10 s, done and matching
or with a clear error (tier.Unavailable / tier.DataLoss: counted as aborted, never as a pass);
wrong data or a hang fails the run. A `multi` task whose offload tierd refused (host pool full,
said by reload() or by the reload check that runs before its data is judged) is counted as
refused: a clear error, not a pass.

Prints a table (runs, tasks, processes killed, tierd deaths, aborted tasks, hangs, mismatches)
and writes it as JSON. Exit status 0 only if no run hung, crashed, mismatched or leaked, and no
task took more than 10 s to end after a death of tierd.
"""

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "trainer.py")


def now():
    return time.monotonic()


class Trainer:
    def __init__(self, run, rank, seed, expandable, scenario):
        self.run = run
        self.rank = rank
        self.seed = seed
        self.expandable = expandable
        self.status_path = os.path.join(run.dir, "trainer-%d-%d.jsonl" % (rank, seed))
        self.log_path = os.path.join(run.dir, "trainer-%d-%d.log" % (rank, seed))
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if expandable:
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        # A trainer started in place of a killed one runs only until the run's end.
        minutes = max(0.2, (run.deadline - now()) / 60)
        # --gpus: trainers dealt over the GPUs by rank, as one node's ranks are.
        self.gpu = run.args.gpu_list[rank % len(run.args.gpu_list)]
        cmd = [sys.executable, TRAINER, "--socket", run.socket, "--rank", str(rank),
               "--seed", str(seed), "--minutes", "%.2f" % minutes,
               "--status", self.status_path, "--device", str(self.gpu)]
        if scenario:
            cmd += ["--scenario", scenario, "--steps", str(run.args.steps)]
        if run.args.tasks:
            cmd += ["--tasks", run.args.tasks]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self.started = now()
        self.killed = False

    def events(self):
        try:
            with open(self.status_path) as f:
                for line in f:
                    try:
                        yield json.loads(line)
                    except ValueError:
                        continue
        except OSError:
            return

    def progress(self):
        """(tasks ended, wall time the current task began or None, mismatches reported)."""
        begun = None
        ended = 0
        mismatches = 0
        try:
            with open(self.status_path) as f:
                for line in f:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if e["event"] == "begin":
                        begun = e["t"]
                    elif e["event"] == "end":
                        begun = None
                        ended += 1
                    elif e["event"] == "mismatch":
                        mismatches += 1
        except OSError:
            pass
        return ended, begun, mismatches


class Run:
    def __init__(self, args, index, delay):
        self.args = args
        self.index = index
        self.delay = delay
        self.dir = os.path.join(args.out, "run%02d" % index)
        os.makedirs(self.dir, exist_ok=True)
        self.tmp = tempfile.mkdtemp(prefix="tierstress-")
        self.socket = os.path.join(self.tmp, "tierd.sock")
        self.tierd_log = os.path.join(self.dir, "tierd.log")
        cmd = [args.tierd, "--socket=" + self.socket,
               "--session_socket=" + os.path.join(self.tmp, "s.sock"),
               "--state_dir=" + os.path.join(self.tmp, "state"), "--pool_bytes=" + args.pool,
               "--pool_lock=best-effort", "--log_level=info"]
        if delay:
            cmd.append("--copy_delay_us=%d" % args.delay_us)
        self._tierd_cmd = cmd
        self._tierd_log = open(self.tierd_log, "w")
        self.start_tierd()
        self.trainers = []
        self.finished = []
        self.result = dict(run=index, delay=delay, tasks=0, killed=0, hangs=0, mismatches=0,
                           crashes=0, leaks=[], tierd_exit=None, daemon_kills=0,
                           daemon_terms=0, aborted=0, refused=0, worst_after_death_s=0.0)
        self.deaths = []  # when tierd was killed or told to stop (chaos)

    def start_tierd(self):
        self.tierd = subprocess.Popen(self._tierd_cmd, stdout=self._tierd_log,
                                      stderr=subprocess.STDOUT)
        deadline = now() + 60
        while not self.tierctl("health", quiet=True):
            if self.tierd.poll() is not None or now() > deadline:
                raise RuntimeError("tierd did not start; see %s" % self.tierd_log)
            time.sleep(0.1)

    def daemon_chaos(self):
        """Kills (SIGKILL) or restarts (SIGTERM: it drains, handing back first) tierd, and starts
        the next one on the same socket at once; the trainers reconnect by themselves."""
        term = random.random() < 0.5
        self.deaths.append(time.time())
        self.tierd.send_signal(signal.SIGTERM if term else signal.SIGKILL)
        try:
            self.tierd.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.dump("tierd did not stop within 60 s of SIGTERM (chaos)")
            self.tierd.kill()
            self.tierd.wait()
        self.result["daemon_terms" if term else "daemon_kills"] += 1
        print("run %d: tierd %s (exit %s), restarting" % (
            self.index, "stopped with SIGTERM" if term else "SIGKILLed", self.tierd.returncode),
            flush=True)
        self.start_tierd()

    def tierctl(self, *cmd, quiet=False):
        r = subprocess.run([self.args.tierctl, "--socket", self.socket] + list(cmd),
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None if quiet else ("exit %d: %s" % (r.returncode, r.stderr))
        return r.stdout

    def start_trainer(self, rank):
        seed = random.randrange(1 << 30)
        expandable = rank % 2 == 1
        t = Trainer(self, rank, seed, expandable, self.args.scenario)
        self.trainers.append(t)
        return t

    # ---- diagnosis of a hang ----

    def dump(self, why):
        path = os.path.join(self.dir, "hang.txt")
        with open(path, "a") as out:
            out.write("=== HANG: %s\n" % why)
            for cmd in (["--json", "status"], ["--json", "clients"]):
                out.write("--- tierctl %s\n%s\n" % (" ".join(cmd), self.tierctl(*cmd)))
            procs = [("tierd", self.tierd.pid)] + [
                ("trainer %d (GPU %d, seed %d%s)" % (t.rank, t.gpu, t.seed,
                                                     ", expandable" if t.expandable else ""),
                 t.proc.pid)
                for t in self.trainers if t.proc.poll() is None]
            for name, pid in procs:
                out.write("--- %s pid %d: kernel view of each thread\n" % (name, pid))
                for task in sorted(glob.glob("/proc/%d/task/*" % pid)):
                    try:
                        comm = open(task + "/comm").read().strip()
                        wchan = open(task + "/wchan").read().strip()
                        syscall = open(task + "/syscall").read().split()[0]
                    except OSError:
                        continue
                    out.write("  tid %s %-16s wchan=%-24s syscall=%s\n" % (
                        os.path.basename(task), comm, wchan, syscall))
            out.flush()
            for t in self.trainers:
                if t.proc.poll() is None:
                    os.kill(t.proc.pid, signal.SIGUSR1)  # Python stacks into the trainer's log
            gdb = shutil.which("cuda-gdb") or next(iter(glob.glob("/usr/local/cuda*/bin/cuda-gdb")),
                                                   None)
            if gdb:
                for name, pid in procs[:1 + self.args.native_stacks]:
                    out.write("--- %s pid %d: native stacks (cuda-gdb)\n" % (name, pid))
                    out.flush()
                    try:
                        r = subprocess.run([gdb, "-batch", "-nx", "-p", str(pid), "-ex",
                                            "set pagination off", "-ex", "thread apply all bt 40"],
                                           capture_output=True, text=True, timeout=120)
                        out.write(r.stdout[-60000:])
                    except subprocess.TimeoutExpired:
                        out.write("(cuda-gdb timed out)\n")
            time.sleep(2)
            for t in self.trainers:
                out.write("--- trainer %d log tail\n" % t.rank)
                try:
                    out.write(open(t.log_path).read()[-20000:])
                except OSError:
                    pass
            out.write("--- tierd log tail\n")
            out.write(open(self.tierd_log).read()[-20000:])

    # ---- the run ----

    def execute(self):
        args = self.args
        self.deadline = now() + args.run_minutes * 60
        for rank in range(args.procs):
            self.start_trainer(rank)
        end = now() + args.run_minutes * 60 + args.grace_s
        next_kill = now() + random.expovariate(1.0 / args.kill_every_s) if args.kill_every_s else None
        next_chaos = (now() + random.expovariate(1.0 / args.daemon_kill_every_s)
                      if args.daemon_kill_every_s else None)
        hung = False
        while True:
            live = [t for t in self.trainers if t.proc.poll() is None]
            for t in list(self.trainers):
                rc = t.proc.poll()
                if rc is None or t in self.finished:
                    continue
                self.finished.append(t)
                ended, _, mismatches = t.progress()
                self.result["tasks"] += ended
                self.result["mismatches"] += mismatches
                self.result["aborted"] += sum(1 for e in t.events() if e["event"] == "aborted")
                self.result["refused"] += sum(1 for e in t.events() if e["event"] == "refused")
                if t.killed:
                    continue
                if rc != 0:
                    if mismatches == 0:
                        self.result["crashes"] += 1
                    print("run %d: trainer %d exited %d (see %s)" % (self.index, t.rank, rc,
                                                                    t.log_path), flush=True)
            if not live:
                break
            if self.tierd.poll() is not None:
                self.result["tierd_exit"] = self.tierd.returncode
                self.dump("tierd exited with %s" % self.tierd.returncode)
                break
            if next_chaos is not None and now() >= next_chaos and now() < self.deadline - 30:
                self.daemon_chaos()
                next_chaos = now() + random.expovariate(1.0 / args.daemon_kill_every_s)
            for t in live:
                _, begun, _ = t.progress()
                if begun is not None and time.time() - begun > args.watchdog_s:
                    self.result["hangs"] += 1
                    hung = True
                    self.dump("trainer %d: a task has run for %.0f s" % (t.rank,
                                                                        time.time() - begun))
                    break
                if begun is None and now() - t.started > args.watchdog_s + 60 and \
                        t.progress()[0] == 0:
                    self.result["hangs"] += 1
                    hung = True
                    self.dump("trainer %d: no task began within %.0f s of its start" % (
                        t.rank, now() - t.started))
                    break
            if hung:
                break
            if now() > end + args.watchdog_s:
                self.result["hangs"] += 1
                hung = True
                self.dump("the run outlasted its time")
                break
            if next_kill is not None and now() >= next_kill and now() < self.deadline - 20:
                busy = [t for t in live if t.progress()[1] is not None]
                if busy:
                    victim = random.choice(busy)
                    victim.killed = True
                    victim.proc.kill()
                    victim.proc.wait()
                    self.result["killed"] += 1
                    self.start_trainer(victim.rank)
                next_kill = now() + random.expovariate(1.0 / args.kill_every_s)
            time.sleep(0.5)
        for t in self.trainers:
            if t.proc.poll() is None:
                t.proc.kill()
                t.proc.wait()
        self.result["worst_after_death_s"] = round(self.worst_after_death(), 1)
        if not hung and self.tierd.poll() is None:
            self.check_empty()
        self.stop_tierd()
        for t in self.trainers:
            t._log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return self.result

    def worst_after_death(self):
        """The longest a task that was running when tierd died took to end (done or a clear
        error) after the death: the issue's bound is 10 s."""
        worst = 0.0
        for death in self.deaths:
            for t in self.trainers:
                begun = None
                for e in t.events():
                    if e["event"] == "begin":
                        begun = e["t"]
                    elif e["event"] == "end" and begun is not None:
                        if begun <= death <= e["t"]:
                            worst = max(worst, e["t"] - death)
                        begun = None
        return worst

    def check_empty(self):
        deadline = now() + 30
        while True:
            status = self.tierctl("--json", "status")
            try:
                s = json.loads(status)
            except (TypeError, ValueError):
                self.result["leaks"].append("tierctl status failed: %s" % status)
                return
            leaks = []
            if s.get("sessions", 0):
                leaks.append("%s sessions" % s["sessions"])
            for tier_ in s.get("tiers", []):
                if tier_.get("used_bytes", 0):
                    leaks.append("%s: %d bytes used" % (tier_["name"], tier_["used_bytes"]))
                if tier_.get("objects", 0):
                    leaks.append("%s: %d objects" % (tier_["name"], tier_["objects"]))
            for key in ("buffers", "gpu_lanes", "pending_releases", "jobs_in_flight"):
                if s.get(key, 0):
                    leaks.append("%d %s" % (s[key], key))
            if not leaks:
                return
            if now() > deadline:
                self.result["leaks"] = leaks
                with open(os.path.join(self.dir, "leak.json"), "w") as f:
                    f.write(status)
                return
            time.sleep(0.5)

    def stop_tierd(self):
        if self.tierd.poll() is None:
            self.tierd.send_signal(signal.SIGTERM)
            try:
                self.tierd.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.dump("tierd did not stop within 60 s of SIGTERM")
                self.tierd.kill()
                self.tierd.wait()
        self.result["tierd_exit"] = self.tierd.returncode
        self._tierd_log.close()


def gpu_list(spec):
    """--gpus: "all" (every GPU torch sees here) or a list of GPU indices ("0", "0,2")."""
    if spec != "all":
        return [int(g) for g in spec.split(",") if g.strip() != ""]
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                       capture_output=True, text=True)
    count = int(r.stdout.strip() or 0) if r.returncode == 0 else 0
    if count == 0:
        raise SystemExit("gpu-stress: --gpus all: no GPU found (torch.cuda.device_count() is 0)")
    return list(range(count))


def _write_totals(args, results, start):
    """The runs' totals, written with every run's record to OUT/stress.json; returns them."""
    total = dict(runs=len(results), tasks=sum(r["tasks"] for r in results),
                 killed=sum(r["killed"] for r in results), hangs=sum(r["hangs"] for r in results),
                 mismatches=sum(r["mismatches"] for r in results),
                 crashes=sum(r["crashes"] for r in results),
                 leaks=sum(1 for r in results if r["leaks"]),
                 bad_tierd_exits=sum(1 for r in results if r["tierd_exit"] != 0),
                 daemon_kills=sum(r["daemon_kills"] for r in results),
                 daemon_terms=sum(r["daemon_terms"] for r in results),
                 aborted=sum(r["aborted"] for r in results),
                 refused=sum(r["refused"] for r in results),
                 worst_after_death_s=max([r["worst_after_death_s"] for r in results] or [0]),
                 minutes=round((now() - start) / 60, 1))
    with open(os.path.join(args.out, "stress.json"), "w") as f:
        json.dump(dict(total=total, runs=results), f, indent=1)
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="total time of all runs")
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--gpus", default="0",
                   help="GPUs the trainers are dealt over by rank: all, or a list (0,1)")
    p.add_argument("--run-minutes", type=float, default=2.0, help="length of one run")
    p.add_argument("--runs", type=int, default=0, help="number of runs (0: as --minutes allow)")
    p.add_argument("--delay-fraction", type=float, default=0.5,
                   help="share of runs with delay injection")
    p.add_argument("--delay-us", type=int, default=1000)
    p.add_argument("--kill-every-s", type=float, default=30.0,
                   help="mean seconds between SIGKILLs of a trainer (0: never)")
    p.add_argument("--daemon-kill-every-s", type=float, default=0.0,
                   help="daemon chaos: mean seconds between tierd SIGKILLs or SIGTERM restarts "
                        "(0: never)")
    p.add_argument("--watchdog-s", type=float, default=60.0)
    p.add_argument("--grace-s", type=float, default=60.0)
    p.add_argument("--pool", default="4G")
    p.add_argument("--scenario", default="", help="issue10: the fixed reproduction")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tasks", default="",
                   help="trainers draw only these tasks (comma-separated: act,custom,weights,multi,"
                        "churn); default: the whole mix")
    p.add_argument("--native-stacks", type=int, default=1,
                   help="trainers whose native stacks cuda-gdb dumps on a hang (tierd always)")
    p.add_argument("--build", required=True, help="build tree or device bundle")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    args.tierd = os.path.join(args.build, "daemon", "tierd")
    args.tierctl = os.path.join(args.build, "tierctl", "tierctl")
    os.environ["TIER_BUILD_DIR"] = args.build
    args.gpu_list = gpu_list(args.gpus)
    print("gpu-stress: %d trainers dealt over GPU%s %s, one tierd" % (
        args.procs, "s" if len(args.gpu_list) > 1 else "", ",".join(map(str, args.gpu_list))),
        flush=True)
    os.makedirs(args.out, exist_ok=True)
    random.seed(args.seed)
    results = []
    start = now()
    index = 0
    while True:
        if args.runs and index >= args.runs:
            break
        if not args.runs and now() - start + args.run_minutes * 60 > args.minutes * 60 + 1:
            break
        delay = random.random() < args.delay_fraction
        print("run %d: %d trainers, delay injection %s" % (index, args.procs,
                                                           "on" if delay else "off"), flush=True)
        t0 = now()
        r = Run(args, index, delay).execute()
        r["seconds"] = round(now() - t0, 1)
        results.append(r)
        print("run %d: %s" % (index, json.dumps(r)), flush=True)
        # The totals so far, after every run: a call cut short by its own limit still leaves
        # the counts of the runs that finished (stress.json).
        _write_totals(args, results, start)
        index += 1
    total = _write_totals(args, results, start)
    print()
    print("| runs | minutes | processes | tasks | killed | tierd SIGKILL / SIGTERM | aborted by "
          "the death | refused (pool full) | worst s to a task's end after a death | hangs | "
          "mismatches | crashes | leaks | tierd exit != 0 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("| %(runs)d | %(minutes).1f | %(procs)d | %(tasks)d | %(killed)d | %(daemon_kills)d / "
          "%(daemon_terms)d | %(aborted)d | %(refused)d | %(worst_after_death_s).1f | %(hangs)d | "
          "%(mismatches)d | %(crashes)d | %(leaks)d | %(bad_tierd_exits)d |" % dict(
              total, procs=args.procs))
    # A clear error is allowed when tierd dies under a task, within 10 s (issue 30, item 1).
    bad = total["hangs"] or total["mismatches"] or total["crashes"] or total["leaks"] or \
        total["bad_tierd_exits"] or total["worst_after_death_s"] > 10
    print("gpu-stress: %s" % ("FAILED" if bad else "passed"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
