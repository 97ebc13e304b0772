"""A tierd that dies or is restarted under a running trainer (issue 30, item 2), on the host
engine: the client reconnects by itself, what it had offloaded to the dead tierd is reported lost
(never read from the new one), and a drain-and-restart during training costs no step."""

import os
import signal
import threading
import time

import pytest

import tier
from conftest import Daemon, wait_until

torch = pytest.importorskip("torch")
import tier.torch as tt  # noqa: E402


def test_client_reconnects_and_objects_of_the_dead_tierd_are_lost():
    d = Daemon()
    try:
        with tier.Client(socket=d.socket, name="restart", reconnect_interval_s=0.05) as c:
            x = torch.arange(1 << 16, dtype=torch.float32)
            old = c.offload(x)
            old.wait()
            assert torch.equal(old.reload(), x)
            d.proc.kill()
            d.proc.wait()
            wait_until(lambda: not c.ensure_connected(), what="the client to see tierd gone")
            with pytest.raises(tier.Unavailable):
                c.offload(x)
            d.start_again()
            with pytest.warns(RuntimeWarning, match="went away and is back"):
                wait_until(c.ensure_connected, what="the client to reconnect")
            assert c.generation == 1
            # Lost, never read from the new tierd (whose object ids start again at 1).
            new = c.offload(x * 2)
            new.wait()
            with pytest.raises(tier.DataLoss, match="tierd that went away"):
                old.reload()
            old.free()  # frees nothing in the new tierd
            assert torch.equal(new.reload(), x * 2)
    finally:
        d.kill()


class _Net(torch.nn.Module):
    def __init__(self, on_middle=None):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(256, 512)
        self.b = torch.nn.Linear(512, 512)
        self.c = torch.nn.Linear(512, 10)
        self.on_middle = on_middle

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.on_middle is not None:
            self.on_middle()
        return self.c(torch.relu(self.b(h)))


def _train(steps, client=None, on_step=None):
    net = _Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        x = torch.randn(64, 256, generator=g)
        y = torch.randint(0, 10, (64,), generator=g)
        net.on_middle = (lambda: on_step(step)) if on_step is not None else None
        if client is None:
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
        else:
            with tt.offload_activations(min_bytes=4096, client=client):
                loss = torch.nn.functional.cross_entropy(net(x), y)
                loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in net.parameters()]


def test_a_client_started_while_tierd_restarts_waits_for_it():
    """A trainer started (or restarted by its launcher) while tierd is down for a restart opens
    its session once the new tierd serves, instead of failing at start-up; with no wait it fails
    at once with a clear error."""
    d = Daemon()
    try:
        d.proc.kill()
        d.proc.wait()
        t0 = time.monotonic()
        with pytest.raises(tier.Unavailable, match="not reachable"):
            tier.Client(socket=d.socket, daemon_wait_ms=-1)
        assert time.monotonic() - t0 < 2.0
        starter = threading.Timer(0.8, d.start_again)
        starter.start()
        try:
            t0 = time.monotonic()
            with tier.Client(socket=d.socket, name="late", daemon_wait_ms=60000) as c:
                waited = time.monotonic() - t0
                x = torch.arange(1 << 12, dtype=torch.float32)
                h = c.offload(x)
                h.wait()
                assert torch.equal(h.reload(), x)
            assert waited >= 0.7, waited
        finally:
            starter.join()
    finally:
        d.kill()


def test_training_goes_on_across_a_drain_and_restart():
    """SIGTERM in the middle of a step's forward, after activations were offloaded: the draining
    tierd lets the step's backward take them back, exits once they are, and the next tierd takes
    over at a later step. Every step completes, and the result is the same as without tierd."""
    want_losses, want_params = _train(8)
    d = Daemon(extra=["--drain_handback_idle_ms=30000"])
    restarted = threading.Event()
    try:
        with tier.Client(socket=d.socket, name="drain", reconnect_interval_s=0.05) as c:
            def on_step(step):
                if step != 3:
                    return
                d.proc.send_signal(signal.SIGTERM)
                # The rest of this forward sees the drain: its offloads are refused (kept here).
                wait_until(lambda: c.info() is not None and
                           c._session.flags() & tier._lib.TIER_SESSION_DAEMON_DRAINING,
                           what="the drain to reach the client")

                def restart():
                    d.proc.wait(timeout=60)  # exits once this step's backward gave back
                    d.start_again()
                    restarted.set()
                threading.Thread(target=restart, daemon=True).start()

            def on_step_after(step):
                on_step(step)
                if step == 5:  # the next tierd is up, and the client back, before the last steps
                    assert restarted.wait(60)
                    wait_until(c.ensure_connected, what="the client to reconnect")

            with pytest.warns(RuntimeWarning):
                losses, params = _train(8, c, on_step_after)
            assert restarted.is_set()
            assert c.generation == 1, "the client did not reconnect to the new tierd"
            assert losses == want_losses
            for p, q in zip(params, want_params):
                assert torch.equal(p, q)
        assert d.stop() == 0
    finally:
        d.kill()
