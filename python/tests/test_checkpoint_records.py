"""tier.torch.checkpoint's records read back as untrusted bytes (issue 30, finding 10): a damaged or
forged index or commit record is refused with DataLoss (a TierError), never another exception,
never a large allocation, an endless loop or a deep recursion. No tierd needed: the record parsing
and checks alone (test_torch_checkpoint.py loads a forged record through a real tierd)."""
import io
import pickle
import random
import resource
import struct
import time

import pytest

torch = pytest.importorskip("torch")

import tier  # noqa: E402
import tier.torch as tt  # noqa: E402

ckpt = tt.checkpoint


def _rss_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _index(**changes):
    record = {"format": 1, "seq": 3, "last_version": 2, "pending": None,
              "versions": [{"version": 2, "token": "0a1b2c3d", "objects": 2}]}
    record.update(changes)
    return record


def _meta(**changes):
    record = {"format": 1, "version": 2, "sizes": [64],
              "tensors": [(0, 0, 16, "float32", (4,), "cpu", False),
                          (-1, 0, 0, "int64", (0, 3), "cpu", True)],
              "tree": {"w": ("__tier_tensor__", 0), "e": ("__tier_tensor__", 1),
                       "dtype": ("__tier_torch__", "torch.bfloat16"), "step": 7}}
    record.update(changes)
    return record


def _refused(data):
    """Loading `data` as a record raises DataLoss (and only that), quickly and without
    allocating what it claims."""
    before = _rss_kib()
    start = time.monotonic()
    with pytest.raises(tier.DataLoss):
        record = ckpt._loads(data, "the record")
        ckpt._check_index(record, "the record")
        ckpt._check_meta(record, "the record")
    assert time.monotonic() - start < 5
    assert _rss_kib() - before < 200 * 1024, "the loader allocated what the record claimed"


def test_valid_records_pass_the_checks():
    assert ckpt._check_index(ckpt._loads(ckpt._dumps(_index()), "i"), "i")["seq"] == 3
    assert ckpt._check_meta(ckpt._loads(ckpt._dumps(_meta()), "m"), "m")["version"] == 2


def test_a_short_record_claiming_gigabytes_allocates_nothing():
    # The finding: 70 bytes naming a 3 GiB bytearray; the same with bytes and str.
    proto = b"\x80\x05"
    for opcode, fmt in ((b"\x96", "<Q"),   # BYTEARRAY8
                        (b"\x8e", "<Q"),   # BINBYTES8
                        (b"\x8d", "<Q"),   # BINUNICODE8
                        (b"B", "<I"),      # BINBYTES
                        (b"\x8a", "<B")):  # LONG1 (small: a control)
        data = proto + opcode + struct.pack(fmt, min(3 << 30, (1 << (8 * struct.calcsize(fmt))) - 1)) \
            + b"x" * 40 + b"."
        _refused(data)


def test_a_memo_index_far_past_the_record_is_refused():
    data = b"\x80\x04" + b"N" + b"r" + struct.pack("<I", 1 << 31) + b"."  # LONG_BINPUT 2^31
    _refused(data)


def test_deep_nesting_is_dataloss_not_recursionerror():
    depth = 200000
    data = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."  # lists in lists
    _refused(data)


def test_shared_references_cannot_make_the_walk_exponential():
    node = []
    for _ in range(60):
        node = [node, node]  # 2^60 paths, 61 objects
    _refused(ckpt._dumps(node))


def test_a_container_that_holds_itself_is_refused():
    node = [1, 2]
    node.append({"k": node})
    _refused(ckpt._dumps(node))


def test_limits_count_a_shared_value_once_per_place():
    shared = list(range(1000))
    ok = [shared] * 4000           # 4M values as a walk sees them, 1001 objects: within
    assert ckpt._loads(ckpt._dumps(ok), "r")[3999][999] == 999
    _refused(ckpt._dumps([shared] * 4200))  # over 4M: refused, though small on disk
    deep = 0
    for _ in range(64):
        deep = [deep]
    ckpt._loads(ckpt._dumps(deep), "r")  # 64 deep: within
    _refused(ckpt._dumps([deep]))


@pytest.mark.parametrize("changes", [
    {"versions": [{"version": 2, "token": "0a1b2c3d", "objects": 10 ** 9}]},  # 1e9 deletes
    {"versions": [{"version": 2, "token": "../../x", "objects": 1}]},
    {"versions": [{"version": "2", "token": "0a1b2c3d", "objects": 1}]},
    {"versions": [{"version": True, "token": "0a1b2c3d", "objects": 1}]},
    {"versions": "not a list"},
    {"versions": [None]},
    {"pending": {"version": 1}},
    {"seq": -1},
    {"seq": 2 ** 80},
    {"last_version": "x"},
])
def test_index_fields_are_type_checked(changes):
    with pytest.raises(tier.DataLoss):
        ckpt._check_index(ckpt._loads(ckpt._dumps(_index(**changes)), "i"), "i")


@pytest.mark.parametrize("changes", [
    {"sizes": "64"},
    {"sizes": [-1]},
    {"sizes": [64], "tensors": [(0, 0, 16, "float32", (10 ** 12,), "cpu", False)]},
    {"sizes": [64], "tensors": [(-1, 0, 0, "float32", (10 ** 12,), "cpu", False)]},  # no bytes
    {"sizes": [64], "tensors": [(0, 60, 16, "float32", (4,), "cpu", False)]},  # past its object
    {"sizes": [64], "tensors": [(1, 0, 16, "float32", (4,), "cpu", False)]},  # no object 1
    {"sizes": [64], "tensors": [(0, 0, 16, "load", (4,), "cpu", False)]},  # torch.load: no dtype
    {"sizes": [64], "tensors": [(0, 0, 16, "float32", (4,), "tpu:x", False)]},
    {"sizes": [64], "tensors": [(0, 0, 16, "float32", (4,), "cpu", 1)]},
    {"sizes": [64], "tensors": [[0, 0, 16, "float32", (4,), "cpu", False]]},
    {"sizes": [64], "tensors": [(0, 0, 16, "float32", [4], "cpu", False)]},
    {"tree": ("__tier_tensor__", 5)},
    {"tree": ("__tier_torch__", "torch.load")},
    {"tree": {"x": ("__tier_torch__", 7)}},
])
def test_meta_fields_are_type_checked(changes):
    with pytest.raises(tier.DataLoss):
        ckpt._check_meta(ckpt._loads(ckpt._dumps(_meta(**changes)), "m"), "m")


def test_only_what_a_record_holds_is_unpickled():
    for value in (bytearray(b"abc"), {1, 2}, frozenset([1]), range(3), slice(1, 2)):
        with pytest.raises(tier.DataLoss):
            ckpt._loads(pickle.dumps({"v": value}, protocol=4), "r")


def test_every_mutation_of_a_record_is_dataloss_or_a_valid_record():
    """Random byte flips, cuts and insertions in a real index and commit record: each either still
    reads as a record that passes the checks, or raises DataLoss; nothing else escapes."""
    rng = random.Random(30)
    for record, check in ((_index(), ckpt._check_index), (_meta(), ckpt._check_meta)):
        good = ckpt._dumps(record)
        for _ in range(3000):
            data = bytearray(good)
            for _ in range(rng.randint(1, 4)):
                kind = rng.randrange(3)
                at = rng.randrange(len(data))
                if kind == 0:
                    data[at] = rng.randrange(256)
                elif kind == 1:
                    del data[at:at + rng.randint(1, 8)]
                else:
                    data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            try:
                check(ckpt._loads(bytes(data), "r"), "r")
            except tier.DataLoss:
                pass


def test_deleting_a_version_stops_at_a_long_run_of_missing_objects():
    asked = []

    class Client:
        def delete_object(self, name):
            asked.append(name)
            raise tier.NotFound(tier.NotFound.code, name)

    ckpt._delete_version(Client(), "t/x", {"version": 1, "token": "0a1b2c3d", "objects": 10 ** 9})
    assert len(asked) < 2000
