"""tier.torch.checkpoint against a real tierd (host engine): a model's and optimizer's state saved
into tierd and loaded back bit-identical; a trainer killed with SIGKILL right after a save resumes
from the saved step with the state it would have had; with an NVMe tier the state survives a
SIGKILL of tierd, and without one a clear error says it was not durable; damaged records are
refused and never loaded; the objects of a save cut short are not left behind."""
import collections
import os
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import tier  # noqa: E402
import tier.torch as tt  # noqa: E402
from conftest import BUILD_DIR, PYTHON_DIR, wait_until  # noqa: E402

ckpt = tt.checkpoint


def _model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def _train(model, opt, steps, start=0):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(8, 16, generator=g)
        y = torch.randn(8, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _assert_same(a, b, path="state"):
    assert type(a) is type(b), "%s: %s vs %s" % (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device, path
        assert a.requires_grad == b.requires_grad, path
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a, b), path
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), path
        for k in a:
            _assert_same(a[k], b[k], "%s[%r]" % (path, k))
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, "%s[%d]" % (path, i))
    else:
        assert a == b, "%s: %r vs %r" % (path, a, b)


def test_save_and_load_bit_identical_and_training_continues_the_same(client):
    model, opt = _model_and_optimizer()
    _train(model, opt, 3)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 3,
             "extras": {"bf16": torch.arange(7, dtype=torch.bfloat16), "mask": torch.ones(5) > 0,
                        "empty": torch.empty(0, 3), "scalar": torch.tensor(2.5),
                        "strided": torch.arange(12.0).reshape(3, 4).t(), "dtype": torch.float16,
                        "names": ("a", "b"), "none": None}}
    h = ckpt.save(state, "t/roundtrip", client=client)
    assert h.wait(timeout=30) is h and h.done()
    assert h.version == 1 and ckpt.versions("t/roundtrip", client=client) == [1]
    loaded = ckpt.load("t/roundtrip", client=client)
    expected = dict(state, extras=dict(state["extras"], strided=state["extras"]["strided"]
                                       .contiguous()))
    _assert_same(expected, loaded)

    # A fresh trainer that loads it continues exactly as the original does.
    model2, opt2 = _model_and_optimizer(seed=99)
    model2.load_state_dict(loaded["model"])
    opt2.load_state_dict(loaded["optim"])
    _train(model, opt, 2, start=3)
    _train(model2, opt2, 2, start=3)
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(p, q)
    assert ckpt.delete("t/roundtrip", client=client) == 1
    with pytest.raises(tier.NotFound):
        ckpt.load("t/roundtrip", client=client)


def test_the_snapshot_is_taken_when_save_returns(client):
    w = torch.arange(1 << 16, dtype=torch.float32)
    h = ckpt.save({"w": w}, "t/snapshot", client=client)
    w.add_(1)  # the next step updates in place at once; the save must not see it
    h.wait(timeout=30)
    assert torch.equal(ckpt.load("t/snapshot", client=client)["w"],
                       torch.arange(1 << 16, dtype=torch.float32))
    ckpt.delete("t/snapshot", client=client)


def test_keeps_the_newest_versions_and_frees_the_rest(daemon, client):
    base = daemon.host_used_bytes()
    handles = []
    for step in range(1, 6):
        handles.append(ckpt.save({"w": torch.full((1 << 16,), float(step)), "step": step},
                                 "t/keep", keep=2, client=client, chunk_bytes=64 << 10))
    for h in handles:
        h.wait(timeout=30)
    assert [h.version for h in handles] == [1, 2, 3, 4, 5]
    assert ckpt.versions("t/keep", client=client) == [5, 4]
    assert ckpt.load("t/keep", client=client)["step"] == 5
    assert ckpt.load("t/keep", version=4, client=client)["step"] == 4
    with pytest.raises(tier.NotFound):
        ckpt.load("t/keep", version=3, client=client)
    # Two versions of 256 KiB (in 64 KiB chunks), their records and an index slot or two.
    used = daemon.host_used_bytes() - base
    assert 2 * (256 << 10) <= used < 2 * (256 << 10) + (256 << 10), used
    assert ckpt.delete("t/keep", client=client) == 2
    daemon.wait_host_used(base)


def test_bad_arguments_are_refused_clearly(client):
    with pytest.raises(tier.InvalidArgument, match="no spaces"):
        ckpt.save({}, "has space", client=client)
    with pytest.raises(tier.InvalidArgument, match="at most"):
        ckpt.save({}, "x" * 200, client=client)
    with pytest.raises(tier.InvalidArgument, match="keep"):
        ckpt.save({}, "t/k", keep=0, client=client)
    with pytest.raises(tier.InvalidArgument, match="cannot store a object"):
        ckpt.save({"o": object()}, "t/obj", client=client)
    # A tuple that reads as a reference would come back as a tensor, dtype or device: refused.
    for reserved in (("__tier_tensor__", 0), ("__tier_torch__", "cpu")):
        with pytest.raises(tier.InvalidArgument, match="is reserved"):
            ckpt.save({"t": [reserved]}, "t/reserved", client=client)
    with pytest.raises(tier.InvalidArgument, match="named tuples"):
        ckpt.save({"n": collections.namedtuple("Point", "x y")(1, 2)}, "t/named", client=client)
    with pytest.raises(tier.NotFound):
        ckpt.load("t/never-saved", client=client)


def test_a_record_that_names_code_is_refused(client):
    """The record is read with builtins only: a forged one cannot run code on load."""
    h = ckpt.save({"w": torch.ones(4)}, "t/forged", client=client)
    h.wait(timeout=30)
    meta = [n for n in h._objects if n.endswith("/meta")][0]
    client.delete_object(meta)

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch /tmp/tier-checkpoint-pwned",))
    data = pickle.dumps({"format": 1, "tree": Evil()})
    buf = client.alloc_host_buffer(len(data))
    buf.view()[:] = data
    client.wait(client.offload_persistent(meta, buf, 0, len(data))[1])
    with pytest.raises(tier.DataLoss, match="posix.system|os.system"):
        ckpt.load("t/forged", client=client)
    assert not os.path.exists("/tmp/tier-checkpoint-pwned")

    # A record whose fields lie (issue 30): a tensor of a trillion elements in 16 bytes, and a
    # version entry naming a billion objects, are refused before anything is allocated or looped.
    client.delete_object(meta)
    data = pickle.dumps({"format": 1, "version": 1, "sizes": [16],
                         "tensors": [(0, 0, 16, "float32", (10 ** 12,), "cpu", False)],
                         "tree": {"w": ("__tier_tensor__", 0)}})
    buf = client.alloc_host_buffer(len(data))
    buf.view()[:] = data
    client.wait(client.offload_persistent(meta, buf, 0, len(data))[1])
    with pytest.raises(tier.DataLoss, match="shape"):
        ckpt.load("t/forged", client=client)
    ckpt.delete("t/forged", client=client)


def test_host_only_tierd_says_a_save_will_not_be_durable(client):
    h = ckpt.save({"w": torch.ones(4)}, "t/hostonly", client=client)
    with pytest.raises(tier.FailedPrecondition, match="host memory only"):
        h.wait_durable(timeout=10)
    ckpt.delete("t/hostonly", client=client)


# ---- a trainer killed with SIGKILL --------------------------------------------------------------

TRAINER = textwrap.dedent("""
    import hashlib, os, signal, sys
    import torch
    import tier, tier.torch
    mode, total = sys.argv[1], int(sys.argv[2])
    ckpt = tier.torch.checkpoint
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = 0
    if mode == "resume":
        state = ckpt.load("trainer/ckpt")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = state["step"]
        print("resumed", start, flush=True)
    for step in range(start, total):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        done = step + 1
        if mode.startswith("kill") and done in (3, 5):
            h = ckpt.save({"model": model.state_dict(), "optim": opt.state_dict(),
                           "step": done}, "trainer/ckpt", keep=2)
            if done == 3 or mode == "kill-after-commit":
                h.wait()
                if done == 5:
                    print("saved", done, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            else:  # killed while the save of step 5 may still be in flight
                print("saving", done, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    digest = hashlib.sha256()
    for t in list(model.state_dict().values()) + [
            v for s in opt.state_dict()["state"].values() for v in s.values()]:
        digest.update(t.detach().numpy().tobytes())
    print("final", digest.hexdigest(), flush=True)
""")


def _run_trainer(daemon, tmp_path, mode, total=8):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, TIER_BUILD_DIR=BUILD_DIR,
               TIER_SOCKET=daemon.socket, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, str(script), mode, str(total)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return r.returncode, r.stdout.split("\n"), r.stderr


@pytest.mark.parametrize("mode", ["kill-after-commit", "kill-in-flight"])
def test_trainer_killed_after_a_save_resumes_bit_identical(make_daemon, tmp_path, mode):
    d = make_daemon()
    rc, out, err = _run_trainer(d, tmp_path, "straight")
    assert rc == 0, err
    expected = [line for line in out if line.startswith("final")]

    rc, out, err = _run_trainer(d, tmp_path, mode)
    assert rc == -signal.SIGKILL, (rc, out, err)
    rc, out, err = _run_trainer(d, tmp_path, "resume")
    assert rc == 0, err
    resumed = [line for line in out if line.startswith("resumed")]
    if mode == "kill-after-commit":
        assert resumed == ["resumed 5"]
    else:  # step 5's save committed or not: either way a whole version, never a torn one
        assert resumed in (["resumed 3"], ["resumed 5"]), out
    assert [line for line in out if line.startswith("final")] == expected

    # Nothing left behind by the save cut short: deleting the checkpoint frees every byte.
    with tier.Client(socket=d.socket, name="cleanup") as c:
        assert ckpt.delete("trainer/ckpt", client=c) >= 1
    d.wait_host_used(0)


# ---- tierd killed and restarted -----------------------------------------------------------------

def _nvme_daemon(make_daemon, spill_dir):
    return make_daemon(extra=("--spill_dir=" + str(spill_dir), "--spill_bytes=64M"))


def test_survives_a_sigkill_of_tierd_with_nvme(make_daemon, tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    d = _nvme_daemon(make_daemon, spill)
    model, opt = _model_and_optimizer()
    _train(model, opt, 2)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 2}
    with tier.Client(socket=d.socket, name="saver") as c:
        h = ckpt.save(state, "t/nvme", client=c, chunk_bytes=8 << 10)
        h.wait_durable(timeout=30)
        assert h.durable()
    d.kill()
    d2 = _nvme_daemon(make_daemon, spill)
    with tier.Client(socket=d2.socket, name="loader") as c:
        _assert_same(state, ckpt.load("t/nvme", client=c))


def test_a_save_not_durable_when_tierd_died_is_a_clear_error(make_daemon, tmp_path):
    d = make_daemon()  # no NVMe tier: host memory only
    with tier.Client(socket=d.socket, name="saver") as c:
        ckpt.save({"w": torch.ones(8)}, "t/lost", client=c).wait(timeout=30)
    d.kill()
    d2 = make_daemon()
    with tier.Client(socket=d2.socket, name="loader") as c:
        with pytest.raises(tier.NotFound, match="not in tierd"):
            ckpt.load("t/lost", client=c)


def test_a_damaged_record_on_nvme_is_never_loaded(make_daemon, tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    d = _nvme_daemon(make_daemon, spill)
    with tier.Client(socket=d.socket, name="saver") as c:
        ckpt.save({"w": torch.full((4096,), 1.0), "step": 1}, "t/damaged",
                  client=c).wait_durable(timeout=30)
        h2 = ckpt.save({"w": torch.full((4096,), 2.0), "step": 2}, "t/damaged", client=c)
        h2.wait_durable(timeout=30)
        chunk = [n for n in h2._objects if n.endswith("/0")][0]
    d.kill()
    # Flip one byte of version 2's data in the journal on disk (a record's name is followed by
    # its bytes).
    journals = sorted((spill / "persistent").glob("journal-*[0-9]"))
    assert len(journals) == 1, journals
    raw = bytearray(journals[0].read_bytes())
    at = raw.find(chunk.encode())
    assert at > 0 and raw.find(chunk.encode(), at + 1) == -1
    raw[at + len(chunk) + 100] ^= 0xFF
    journals[0].write_bytes(bytes(raw))

    d2 = _nvme_daemon(make_daemon, spill)
    wait_until(lambda: "DATA_LOSS" in d2.log() or "checksum" in d2.log(), timeout_s=10,
               what="tierd to report the damaged record")
    with tier.Client(socket=d2.socket, name="loader") as c:
        # Version 2 lost an object: the load falls back to version 1, whole.
        state = ckpt.load("t/damaged", client=c)
        assert state["step"] == 1 and torch.equal(state["w"], torch.full((4096,), 1.0))
        with pytest.raises(tier.NotFound, match="lost objects"):
            ckpt.load("t/damaged", version=2, client=c)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_another_uid_cannot_load_it(make_daemon, tmp_path):
    d = make_daemon(extra=("--socket_mode=0666",))
    os.chmod(d.dir, 0o755)
    with tier.Client(socket=d.socket, name="owner") as c:
        ckpt.save({"secret": torch.arange(16)}, "t/private", client=c).wait(timeout=30)
    script = tmp_path / "peer.py"
    # The imports come first, as root: the interpreter itself may live where the other uid
    # cannot read (a pyenv under a 0700 /root). The session is opened by the load, as that uid.
    script.write_text(textwrap.dedent("""
        import os, sys
        import tier, tier.torch
        os.setgid(65534); os.setuid(65534)
        try:
            tier.torch.checkpoint.load("t/private")
            print("loaded")
        except tier.NotFound:
            print("NOT_FOUND")
    """))
    os.chmod(tmp_path, 0o755)
    os.chmod(script, 0o644)
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, TIER_BUILD_DIR=BUILD_DIR,
               TIER_SOCKET=d.socket, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.stdout.strip() == "NOT_FOUND", (r.stdout, r.stderr)
