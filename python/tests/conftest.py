"""Fixtures: a real tierd (host engine) per test module, from the build in $TIER_BUILD_DIR.

The package under test is the one in this source tree (python/), and libtierclient.so the one of
the same build as the daemon (TIER_BUILD_DIR is exported for tier._lib to find it).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO_ROOT = os.path.dirname(PYTHON_DIR)
BUILD_DIR = os.path.abspath(os.environ.get("TIER_BUILD_DIR", os.path.join(REPO_ROOT, "build")))

os.environ["TIER_BUILD_DIR"] = BUILD_DIR
sys.path.insert(0, PYTHON_DIR)

TIERD = os.path.join(BUILD_DIR, "daemon", "tierd")
TIERCTL = os.path.join(BUILD_DIR, "tierctl", "tierctl")


def wait_until(predicate, timeout_s=20.0, interval_s=0.01, what="condition"):
    """Polls predicate until it returns a true value (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1f s waiting for %s" % (timeout_s, what))
        time.sleep(interval_s)


class Daemon:
    """One tierd process with its sockets and state in a private temporary directory."""

    def __init__(self, pool_bytes="256M", pool_lock="off", extra=()):
        if not os.access(TIERD, os.X_OK):
            pytest.skip("tierd not built at %s (set TIER_BUILD_DIR)" % TIERD)
        # Short path: a Unix socket path must fit in 108 bytes.
        self.dir = tempfile.mkdtemp(prefix="tierpy-")
        self.socket = os.path.join(self.dir, "tierd.sock")
        self.log_path = os.path.join(self.dir, "tierd.log")
        cmd = [TIERD, "--socket=" + self.socket,
               "--session_socket=" + os.path.join(self.dir, "s.sock"),
               "--state_dir=" + os.path.join(self.dir, "state"),
               "--pool_bytes=" + pool_bytes, "--pool_lock=" + pool_lock, "--log_level=warning"]
        cmd.extend(extra)
        self._cmd = cmd
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_until(self._ready, what="tierd to serve on " + self.socket)
        except BaseException:
            self.kill()
            raise

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("tierd exited with %s:\n%s" % (self.proc.returncode, self.log()))
        if not os.path.exists(self.socket):
            return False
        if os.access(TIERCTL, os.X_OK):
            r = subprocess.run([TIERCTL, "--socket", self.socket, "health"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return r.returncode == 0
        return True

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def start_again(self):
        """After the process exited (killed, or SIGTERM): a new tierd with the same settings, on
        the same socket; returns once it serves."""
        assert self.proc.poll() is not None, "tierd still runs"
        self.proc = subprocess.Popen(self._cmd, stdout=self._log, stderr=subprocess.STDOUT)
        wait_until(self._ready, what="the new tierd to serve on " + self.socket)

    def status(self):
        """`tierctl --json status`, parsed."""
        r = subprocess.run([TIERCTL, "--socket", self.socket, "--json", "status"],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout)

    def host_used_bytes(self):
        for tier in self.status()["tiers"]:
            if tier["name"] == "host":
                return tier["used_bytes"]
        raise AssertionError("no host tier in status")

    def wait_host_used(self, expected, timeout_s=20.0):
        wait_until(lambda: self.host_used_bytes() == expected, timeout_s,
                   what="host tier used bytes == %d (now %d)" % (expected, self.host_used_bytes()))

    def stop(self):
        """SIGTERM: drains and exits 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        rc = self.proc.returncode
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    rc = d.stop()
    assert rc == 0, "tierd exited with %s on SIGTERM" % rc


@pytest.fixture()
def client(daemon):
    import tier
    with tier.Client(socket=daemon.socket, name="pytest") as c:
        yield c


@pytest.fixture()
def make_daemon():
    """Extra daemons with their own settings (stopped at the end of the test)."""
    made = []

    def make(**kwargs):
        d = Daemon(**kwargs)
        made.append(d)
        return d
    yield make
    for d in made:
        d.kill()
