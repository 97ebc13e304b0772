"""The ctypes bindings: library lookup, struct layouts against the C compiler, error mapping."""

import ctypes
import os
import shutil
import subprocess
import tempfile
import time

import pytest

import tier
from tier import _lib, errors

from conftest import REPO_ROOT

STRUCTS = {
    "tier_session_options": _lib.SessionOptions,
    "tier_session_info": _lib.SessionInfo,
    "tier_offload_options": _lib.OffloadOptions,
    "tier_reload_options": _lib.ReloadOptions,
    "tier_completion": _lib.Completion,
    "tier_batch_job": _lib.BatchJob,
    "tier_offload_range": _lib.OffloadRange,
    "tier_reload_range": _lib.ReloadRange,
}


def test_library_found_and_versioned():
    path = tier.library_path()
    assert os.path.basename(path).startswith("libtierclient.so")
    assert tier.library_version() == "0.1.0"


def test_every_abi_function_is_bound():
    lib = _lib.load()
    with open(os.path.join(REPO_ROOT, "include", "tier", "tier.h")) as f:
        header = f.read()
    import re
    declared = set(re.findall(r"TIER_API\s+[^;(]*?\b(tier_\w+)\s*\(", header))
    assert declared, "no TIER_API declarations found"
    assert declared == set(_lib._SIGNATURES), declared ^ set(_lib._SIGNATURES)
    for name in declared:
        assert getattr(lib, name).argtypes is not None


def test_struct_layouts_match_the_c_compiler():
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to probe tier.h")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "tier/tier.h"',
             "int main(void) {"]
    for cname, cls in STRUCTS.items():
        lines.append('printf("%s size %%zu\\n", sizeof(%s));' % (cname, cname))
        for field, _ in cls._fields_:
            lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (cname, field, cname,
                                                                         field))
    lines.append('printf("tier_status size %zu\\n", sizeof(tier_status));')
    lines.append('printf("TIER_MAX_BATCH_JOBS %u\\n", TIER_MAX_BATCH_JOBS);')
    lines.append("return 0; }")
    d = tempfile.mkdtemp(prefix="tierabi-")
    try:
        src = os.path.join(d, "probe.c")
        exe = os.path.join(d, "probe")
        with open(src, "w") as f:
            f.write("\n".join(lines))
        subprocess.run([cc, "-std=c11", "-I", os.path.join(REPO_ROOT, "include"), src, "-o", exe],
                       check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)
    seen = dict(line.rsplit(" ", 1) for line in out.splitlines())
    for cname, cls in STRUCTS.items():
        assert int(seen["%s size" % cname]) == ctypes.sizeof(cls), cname
        for field, _ in cls._fields_:
            assert int(seen["%s.%s" % (cname, field)]) == getattr(cls, field).offset, (cname, field)
    assert int(seen["tier_status size"]) == ctypes.sizeof(_lib.c_status)
    assert int(seen["TIER_MAX_BATCH_JOBS"]) == _lib.TIER_MAX_BATCH_JOBS


def test_status_names_match_the_library():
    for code, name in errors.CODE_NAMES.items():
        assert _lib.status_name(code) == name


def test_errors_by_code():
    e = tier.error_from_code(tier.NOT_FOUND, "no object 7")
    assert isinstance(e, tier.NotFound) and isinstance(e, tier.TierError)
    assert e.code == 5 and e.code_name == "NOT_FOUND" and e.message == "no object 7"
    assert str(e) == "NOT_FOUND: no object 7"
    assert isinstance(tier.error_from_code(8), tier.ResourceExhausted)
    assert isinstance(tier.error_from_code(14), tier.Unavailable)
    assert isinstance(tier.error_from_code(3), tier.InvalidArgument)
    assert isinstance(tier.error_from_code(11), tier.OutOfRange)
    odd = tier.error_from_code(99, "?")
    assert type(odd) is tier.TierError and odd.code_name == "UNKNOWN"
    import pickle
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is tier.NotFound and again.code == 5 and again.message == "no object 7"


def test_explicit_library_path_wins(monkeypatch):
    monkeypatch.setenv("TIER_LIBRARY", "/nonexistent/libtierclient.so")
    assert _lib.candidate_paths() == ["/nonexistent/libtierclient.so"]


def test_no_daemon_is_unavailable(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(tier.Unavailable) as info:
        tier.Client(socket=str(tmp_path / "none.sock"), connect_timeout_ms=200, daemon_wait_ms=-1)
    assert info.value.code == tier.UNAVAILABLE
    assert time.monotonic() - t0 < 2.0  # one attempt: no waiting for a tierd


def test_no_daemon_is_unavailable_after_the_wait(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(tier.Unavailable, match="tried [0-9]+ times in"):
        tier.Client(socket=str(tmp_path / "none.sock"), daemon_wait_ms=600)
    assert 0.55 <= time.monotonic() - t0 < 5.0


def test_batch_arrays_pack_and_read_back_by_field():
    """pack_batch / unpack_batch (a batch's array built and read whole) agree with BatchJob's
    fields, and a field out of range is refused before any call."""
    jobs = _lib.pack_batch([(1, 2, 3, 4, 5, 6), (0, 7, 8, 9, 10, 11)])
    assert [(j.struct_size, j.flags, j.buffer, j.offset, j.len, j.next_use_hint, j.object, j.job)
            for j in jobs] == [(ctypes.sizeof(_lib.BatchJob), 1, 2, 3, 4, 5, 6, 0),
                               (ctypes.sizeof(_lib.BatchJob), 0, 7, 8, 9, 10, 11, 0)]
    jobs[0].job, jobs[1].job, jobs[1].object = 99, 100, 77
    assert _lib.unpack_batch(jobs) == [(99, 6, 4), (100, 77, 9)]
    with pytest.raises(errors.InvalidArgument):
        _lib.pack_batch([(0, -1, 0, 0, 0, 0)])
