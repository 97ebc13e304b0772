"""Named, persistent objects through tier.Client (host engine): they outlive the session that
offloaded them, a later session of the same uid reloads them bit-identical and deletes them, and
the per-uid quota answers with a clear error."""
import numpy as np
import pytest

import tier

KiB = 1024


def test_persistent_object_outlives_its_session(daemon):
    rng = np.random.default_rng(17)
    expected = rng.integers(0, 256, 256 * KiB, dtype=np.uint8)
    with tier.Client(socket=daemon.socket, name="writer") as writer:
        buf = writer.alloc_host_buffer(expected.size)
        buf.numpy()[:] = expected
        _, job = writer.offload_persistent("py/ckpt/w0", buf, 0, expected.size)
        writer.wait(job)
        with pytest.raises(tier.AlreadyExists):
            writer.offload_persistent("py/ckpt/w0", buf, 0, expected.size)
    with tier.Client(socket=daemon.socket, name="reader") as reader:
        obj, length = reader.open_object("py/ckpt/w0")
        assert length == expected.size
        buf = reader.alloc_host_buffer(length)
        reader.wait(reader.reload_buffer(obj, buf, 0, length))
        assert np.array_equal(buf.numpy(), expected)
        reader.delete_object("py/ckpt/w0")
        with pytest.raises(tier.NotFound):
            reader.open_object("py/ckpt/w0")
        with pytest.raises(tier.NotFound):
            reader.delete_object("py/ckpt/w0")


def test_persistent_quota_per_uid(make_daemon):
    d = make_daemon(extra=("--persistent_quota_bytes_per_uid=64K",))
    with tier.Client(socket=d.socket, name="quota") as c:
        buf = c.alloc_host_buffer(128 * KiB)
        with pytest.raises(tier.ResourceExhausted, match="persistent_quota_bytes_per_uid"):
            c.offload_persistent("too-big", buf, 0, 128 * KiB)
        _, job = c.offload_persistent("fits", buf, 0, 64 * KiB)
        c.wait(job)
