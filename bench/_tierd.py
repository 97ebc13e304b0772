"""A private tierd for a benchmark: started from a build directory with its sockets and state in a
temporary directory, connected to once it serves, stopped with SIGTERM."""

import os
import shutil
import signal
import subprocess
import tempfile
import time


class TierdProcess:
    def __init__(self, build_dir, pool_bytes, extra=()):
        self.tierd = os.path.join(build_dir, "daemon", "tierd")
        if not os.access(self.tierd, os.X_OK):
            raise SystemExit("no tierd at %s: build it, or pass --build-dir / --socket" %
                             self.tierd)
        self.dir = tempfile.mkdtemp(prefix="tierbench-")
        self.socket = os.path.join(self.dir, "tierd.sock")
        self.log = open(os.path.join(self.dir, "tierd.log"), "w")
        self.cmd = [self.tierd, "--socket=" + self.socket,
                    "--session_socket=" + os.path.join(self.dir, "s.sock"),
                    "--state_dir=" + os.path.join(self.dir, "state"),
                    "--pool_bytes=%s" % pool_bytes, "--log_level=warning", *extra]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def restart(self, sig=signal.SIGTERM, timeout_s=120):
        """Stops tierd with `sig` (SIGTERM: it drains) and starts the next one on the same socket.
        Returns (seconds until the old one exited, seconds until the new one served)."""
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        self.proc.wait(timeout=timeout_s)
        t1 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        import tier
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise SystemExit("tierd exited (%s); log in %s" % (self.proc.returncode, self.dir))
            try:
                tier.Client(socket=self.socket, name="restart-probe", reconnect=False).close()
                break
            except tier.TierError:
                if time.monotonic() > deadline:
                    raise SystemExit("tierd did not come back; log in %s" % self.dir)
                time.sleep(0.02)
        return t1 - t0, time.monotonic() - t1

    def connect(self, name, timeout_s=120, **client_options):
        import tier
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise SystemExit("tierd exited (%s); log in %s" % (self.proc.returncode, self.dir))
            if os.path.exists(self.socket):
                try:
                    return tier.Client(socket=self.socket, name=name, **client_options)
                except tier.TierError:
                    pass
            if time.monotonic() > deadline:
                raise SystemExit("tierd did not come up; log in %s" % self.dir)
            time.sleep(0.05)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
