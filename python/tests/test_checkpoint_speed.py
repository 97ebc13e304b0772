"""tier.torch.checkpoint's commit path (issue 29): nothing is deleted between a save and its
commit. A delete waits for tierd's NVMe journal (the write-through of what was just saved), so
a commit that deleted first ran at the disk's speed: 11 GiB "committed in host memory" took
13 s. The older index slots and versions go after the commit."""

import threading

import torch

import tier.torch as tt


def test_nothing_is_deleted_before_the_commit(client, daemon):
    ckpt = tt.checkpoint
    handles = []
    deletes = []
    real_delete = client.delete_object

    def delete_object(name, uid=None):
        # Which saves were committed when this delete was asked for.
        deletes.append((name, threading.current_thread().name, [h.done() for h in handles]))
        return real_delete(name, uid)
    client.delete_object = delete_object
    try:
        state = {"w": torch.arange(1 << 16, dtype=torch.float32), "step": 0}
        for step in range(4):
            state["step"] = step
            h = ckpt.save(state, "speed/ckpt", keep=2, client=client)
            handles.append(h)
            h.wait()
        for h in handles:
            h._cleaned.wait(30)
    finally:
        client.delete_object = real_delete
    assert deletes, "saves past keep delete versions"
    for name, thread, committed in deletes:
        assert all(committed), "%s deleted before the save in flight committed" % name
    # Whole and loadable: the newest version, and keep=2 versions kept.
    assert ckpt.versions("speed/ckpt", client=client) == [4, 3]
    assert ckpt.load("speed/ckpt", client=client)["step"] == 3
    assert all(set(h.phases) >= {"snapshot", "copies", "record", "cleanup"} for h in handles)
    ckpt.delete("speed/ckpt", client=client)
    daemon.wait_host_used(0)
