"""ctypes bindings of the C ABI (include/tier/tier.h) and the search for libtierclient.so.

Every struct below mirrors tier.h field by field, in the same order and with the same C types, so
ctypes lays it out exactly as the C compiler does (tests/test_abi.py checks each offset against a
compiled probe). Option structs begin with ``struct_size``: we always set it to *our* sizeof, never
through the library's ``*_options_init`` (a newer library's init would write its own, larger size,
and then read fields past the end of our struct).

Where the library is found, first match wins:
  1. ``$TIER_LIBRARY`` (a path to the .so);
  2. next to this package, ``tier/_lib/libtierclient.so*`` (the CMake install and ``pip install``
     put it there);
  3. ``$TIER_BUILD_DIR/client/libtierclient.so`` (a build tree named explicitly; the tests use it);
  4. running from a source checkout: ``build*/client/libtierclient.so`` in a parent directory of the
     package (``build`` first, then other ``build*`` trees, newest first);
  5. the system: ``ctypes.util.find_library("tierclient")``, then the usual lib directories.
"""

import ctypes
import ctypes.util
import glob
import itertools
import os
import struct
import sys
import threading

from . import errors

c_status = ctypes.c_int  # tier_status is a C enum: int-sized
c_buffer_id = ctypes.c_uint64
c_object_id = ctypes.c_uint64
c_job_id = ctypes.c_uint64

TIER_SESSION_DAEMON_GONE = 1
TIER_SESSION_DAEMON_DRAINING = 2
TIER_RELOAD_FREE_AFTER = 1
TIER_RELOAD_DEFER_WAIT = 2
TIER_MAX_BATCH_JOBS = 1024  # jobs per tier_offload_batch / tier_reload_batch (and <= ring_entries)
TIER_OBJECT_READY = 1
TIER_OBJECT_DURABLE = 2
TIER_OBJECT_JOURNALED = 4


class SessionOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("socket_path", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
        ("quota_bytes", ctypes.c_uint64),
        ("ring_entries", ctypes.c_uint32),
        ("connect_timeout_ms", ctypes.c_int32),
        ("daemon_wait_ms", ctypes.c_int32),
    ]


class SessionInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("session_id", ctypes.c_uint64),
        ("quota_bytes", ctypes.c_uint64),
        ("ring_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("jobs_in_flight", ctypes.c_uint64),
        ("engine", ctypes.c_char * 16),
        ("device_registrations", ctypes.c_uint64),
        ("device_extensions", ctypes.c_uint64),
        ("device_exports", ctypes.c_uint64),
    ]


class OffloadOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("num_producer_streams", ctypes.c_uint32),
        ("producer_streams", ctypes.POINTER(ctypes.c_void_p)),
        ("next_use_hint", ctypes.c_uint64),
    ]


class ReloadOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("consumer_stream", ctypes.c_void_p),
    ]


class BatchJob(ctypes.Structure):
    """tier_batch_job: one job of tier_offload_batch / tier_reload_batch. Every element of an
    array passed to them carries our struct_size (the library walks the array with jobs[0]'s as
    the stride); new_batch() builds such arrays."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),        # reloads: TIER_RELOAD_* of this job
        ("buffer", c_buffer_id),
        ("offset", ctypes.c_uint64),
        ("len", ctypes.c_uint64),
        ("next_use_hint", ctypes.c_uint64),  # offloads
        ("object", c_object_id),           # offloads: set to the new object; reloads: the source
        ("job", c_job_id),                 # set to the job's id
    ]


class OffloadRange(ctypes.Structure):
    """tier_offload_range: one range of tier_offload_ranges (raw memory registered and offloaded
    in one call). pack_ranges() builds arrays of them, unpack_ranges() reads them back."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("status", ctypes.c_int32),        # set: TIER_OK or why the range was not offloaded
        ("ptr", ctypes.c_void_p),
        ("len", ctypes.c_uint64),
        ("next_use_hint", ctypes.c_uint64),
        ("object", c_object_id),           # set
        ("job", c_job_id),                 # set
    ]


class ReloadRange(ctypes.Structure):
    """tier_reload_range: one range of tier_reload_ranges (a reload into raw memory, registered
    and submitted in one call; all or nothing)."""
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("status", ctypes.c_int32),        # set
        ("ptr", ctypes.c_void_p),          # the destination
        ("len", ctypes.c_uint64),
        ("object", c_object_id),
        ("flags", ctypes.c_uint32),        # TIER_RELOAD_* of this range
        ("reserved", ctypes.c_uint32),
        ("job", c_job_id),                 # set
    ]


class Completion(ctypes.Structure):
    _fields_ = [
        ("job", c_job_id),
        ("object", c_object_id),
        ("len", ctypes.c_uint64),
        ("status", c_status),
        ("reserved", ctypes.c_uint32),
    ]


class ObjectInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("len", ctypes.c_uint64),
    ]


def new_struct(cls):
    """A zeroed option/info struct with struct_size set to our own layout's size."""
    s = cls()
    s.struct_size = ctypes.sizeof(cls)
    return s


# tier_batch_job as bytes (native order, no padding: BatchJob's layout, checked below): a
# batch's array packed from rows and read back whole, without a ctypes attribute per field.
_BATCH_JOB = struct.Struct("=IIQQQQQQ")
_chain = itertools.chain
assert _BATCH_JOB.size == ctypes.sizeof(BatchJob) and BatchJob.job.offset == 48


class _ArrayPacker:
    """Packs rows into a ctypes array of `cls` whose element is `element` (a struct.Struct of
    cls's layout) in one struct.pack (no ctypes attribute set per field); the pack format of each
    array length seen is kept (at most 64)."""

    def __init__(self, cls, element, what):
        self._cls = cls
        self._fields = element.format.lstrip("=")
        self._what = what
        self._layouts = {}  # element count -> struct.Struct of that many elements

    def __call__(self, values, n):
        layout = self._layouts.get(n)
        if layout is None:
            if len(self._layouts) >= 64:
                self._layouts.clear()
            layout = self._layouts[n] = struct.Struct("=" + self._fields * n)
        try:
            data = layout.pack(*_chain.from_iterable(values))
        except struct.error as e:  # a negative or too large field
            raise errors.InvalidArgument(errors.INVALID_ARGUMENT, "%s: %s" % (self._what, e))
        return (self._cls * n).from_buffer_copy(data)


_pack_batch_jobs = _ArrayPacker(BatchJob, _BATCH_JOB, "a batch job's field")


def pack_batch(rows):
    """A tier_batch_job array from rows of (flags, buffer, offset, len, next_use_hint, object):
    struct_size set in each, the job ids 0. (One pack for the whole array: no call per job.)"""
    size = _BATCH_JOB.size
    return _pack_batch_jobs([(size, flags, buffer, offset, length, hint, obj, 0)
                             for flags, buffer, offset, length, hint, obj in rows], len(rows))


def unpack_batch(jobs):
    """(job id, object, len) of each element of a tier_batch_job array, read back whole."""
    return [(job, obj, length) for _, _, _, _, length, _, obj, job
            in _BATCH_JOB.iter_unpack(bytes(jobs))]


# tier_offload_range as bytes, as _BATCH_JOB for tier_batch_job.
_RANGE = struct.Struct("=IiQQQQQ")
assert _RANGE.size == ctypes.sizeof(OffloadRange) and OffloadRange.job.offset == 40
_pack_ranges = _ArrayPacker(OffloadRange, _RANGE, "an offload range's field")


def pack_ranges(rows):
    """A tier_offload_range array from rows of (ptr, len, next_use_hint), struct_size set."""
    size = _RANGE.size
    return _pack_ranges([(size, 0, ptr, length, hint, 0, 0) for ptr, length, hint in rows],
                        len(rows))


def unpack_ranges(ranges):
    """(status, object, job, len) of each element of a tier_offload_range array, read whole."""
    return [(status, obj, job, length) for _, status, _, length, _, obj, job
            in _RANGE.iter_unpack(bytes(ranges))]


# tier_reload_range as bytes.
_RELOAD_RANGE = struct.Struct("=IiQQQIIQ")
assert _RELOAD_RANGE.size == ctypes.sizeof(ReloadRange) and ReloadRange.job.offset == 40
_pack_reload_ranges = _ArrayPacker(ReloadRange, _RELOAD_RANGE, "a reload range's field")


def pack_reload_ranges(rows):
    """A tier_reload_range array from rows of (object, ptr, len, flags), struct_size set."""
    size = _RELOAD_RANGE.size
    return _pack_reload_ranges([(size, 0, ptr, length, obj, flags, 0, 0)
                                for obj, ptr, length, flags in rows], len(rows))


def unpack_reload_ranges(ranges):
    """(status, job, object, len) of each element of a tier_reload_range array, read whole."""
    return [(status, job, obj, length) for _, status, _, length, obj, _, _, job
            in _RELOAD_RANGE.iter_unpack(bytes(ranges))]


def new_batch(count):
    """A zeroed array of `count` tier_batch_job, each with struct_size set to our layout's size."""
    jobs = (BatchJob * count)()
    size = ctypes.sizeof(BatchJob)
    for job in jobs:
        job.struct_size = size
    return jobs


_P = ctypes.POINTER
_SIGNATURES = {
    # name: (restype, argtypes)
    "tier_status_name": (ctypes.c_char_p, [c_status]),
    "tier_last_error": (ctypes.c_char_p, []),
    "tier_version": (ctypes.c_char_p, []),
    "tier_session_options_init": (None, [_P(SessionOptions)]),
    "tier_session_open": (c_status, [_P(SessionOptions), _P(ctypes.c_void_p)]),
    "tier_session_close": (None, [ctypes.c_void_p]),
    "tier_session_get_info": (c_status, [ctypes.c_void_p, _P(SessionInfo)]),
    "tier_session_flags": (ctypes.c_uint32, [ctypes.c_void_p]),
    "tier_stream_wait_reload": (c_status, [ctypes.c_void_p, c_job_id, ctypes.c_void_p]),
    "tier_link_rate": (c_status, [ctypes.c_void_p, ctypes.c_int, _P(ctypes.c_double),
                                  _P(ctypes.c_double)]),
    "tier_buffer_alloc_host": (c_status, [ctypes.c_void_p, ctypes.c_uint64, _P(ctypes.c_void_p),
                                          _P(c_buffer_id)]),
    "tier_buffer_register_fd": (c_status, [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64,
                                           _P(c_buffer_id)]),
    "tier_buffer_register_device": (c_status, [ctypes.c_void_p, ctypes.c_void_p, _P(c_buffer_id),
                                               _P(ctypes.c_uint64)]),
    "tier_buffer_register_device_range": (c_status, [ctypes.c_void_p, ctypes.c_void_p,
                                                      ctypes.c_uint64, _P(c_buffer_id),
                                                      _P(ctypes.c_uint64)]),
    "tier_buffer_register_device_ranges": (c_status, [
        ctypes.c_void_p, ctypes.c_size_t, _P(ctypes.c_void_p), _P(ctypes.c_uint64),
        _P(c_buffer_id), _P(ctypes.c_uint64), _P(c_status)]),
    "tier_buffer_unregister": (c_status, [ctypes.c_void_p, c_buffer_id]),
    "tier_offload_options_init": (None, [_P(OffloadOptions)]),
    "tier_reload_options_init": (None, [_P(ReloadOptions)]),
    "tier_offload": (c_status, [ctypes.c_void_p, c_buffer_id, ctypes.c_uint64, ctypes.c_uint64,
                                _P(OffloadOptions), _P(c_object_id), _P(c_job_id)]),
    "tier_reload": (c_status, [ctypes.c_void_p, c_object_id, c_buffer_id, ctypes.c_uint64,
                               ctypes.c_uint64, _P(ReloadOptions), _P(c_job_id)]),
    "tier_offload_batch": (c_status, [ctypes.c_void_p, _P(BatchJob), ctypes.c_size_t,
                                      _P(OffloadOptions)]),
    "tier_reload_batch": (c_status, [ctypes.c_void_p, _P(BatchJob), ctypes.c_size_t,
                                     _P(ReloadOptions)]),
    "tier_offload_ranges": (c_status, [ctypes.c_void_p, _P(OffloadRange), ctypes.c_size_t,
                                       _P(OffloadOptions)]),
    "tier_reload_ranges": (c_status, [ctypes.c_void_p, _P(ReloadRange), ctypes.c_size_t,
                                      _P(ReloadOptions)]),
    "tier_free": (c_status, [ctypes.c_void_p, c_object_id, _P(c_job_id)]),
    "tier_offload_persistent": (c_status, [ctypes.c_void_p, ctypes.c_char_p, c_buffer_id,
                                           ctypes.c_uint64, ctypes.c_uint64, _P(OffloadOptions),
                                           _P(c_object_id), _P(c_job_id)]),
    "tier_object_open": (c_status, [ctypes.c_void_p, ctypes.c_char_p, _P(c_object_id),
                                    _P(ctypes.c_uint64)]),
    "tier_object_delete": (c_status, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]),
    "tier_object_stat": (c_status, [ctypes.c_void_p, ctypes.c_char_p, _P(ObjectInfo)]),
    "tier_object_release": (c_status, [ctypes.c_void_p, c_object_id]),
    "tier_stream_wait_offload": (c_status, [ctypes.c_void_p, c_job_id, ctypes.c_void_p]),
    "tier_job_wait": (c_status, [ctypes.c_void_p, c_job_id, ctypes.c_int64]),
    "tier_poll": (c_status, [ctypes.c_void_p, _P(Completion), ctypes.c_size_t,
                             _P(ctypes.c_size_t)]),
}

LIBRARY_NAME = "libtierclient.so"


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def _newest_first(paths):
    def mtime(p):
        try:
            return os.path.getmtime(p)
        except OSError:
            return 0.0
    return sorted(paths, key=mtime, reverse=True)


def _in_package():
    # Prefer the unversioned name, then the soname, then a fully versioned file.
    found = sorted(glob.glob(os.path.join(_package_dir(), "_lib", LIBRARY_NAME + "*")), key=len)
    return [p for p in found if os.path.isfile(p)]


def _in_build_trees():
    """build*/client/libtierclient.so in the parents of the package (a source checkout)."""
    out = []
    d = os.path.dirname(_package_dir())
    for _ in range(4):  # python/tier -> python -> repo root, and a little beyond
        exact = os.path.join(d, "build", "client", LIBRARY_NAME)
        others = [p for p in glob.glob(os.path.join(d, "build*", "client", LIBRARY_NAME))
                  if p != exact]
        if os.path.isfile(exact):
            out.append(exact)
        out.extend(_newest_first(others))
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return out


def candidate_paths():
    """Where load() looks, in order (for diagnostics)."""
    paths = []
    env = os.environ.get("TIER_LIBRARY")
    if env:
        return [env]  # explicit: nothing else is tried
    paths.extend(_in_package())
    build_dir = os.environ.get("TIER_BUILD_DIR")
    if build_dir:
        paths.append(os.path.join(build_dir, "client", LIBRARY_NAME))
        # A bundle copied without symlinks holds only the versioned file (libtierclient.so.0...).
        paths.extend(sorted(glob.glob(os.path.join(build_dir, "client", LIBRARY_NAME + ".*"))))
    paths.extend(_in_build_trees())
    system = ctypes.util.find_library("tierclient")
    if system:
        paths.append(system)
    for d in ("/usr/local/lib", "/usr/local/lib64", "/usr/lib", "/usr/lib64",
              os.path.join(sys.prefix, "lib")):
        paths.append(os.path.join(d, LIBRARY_NAME))
    return paths


_lock = threading.Lock()
_lib = None
_lib_path = None


def _bind(lib):
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def load():
    """The bound library (loaded once per process). Raises OSError naming every place tried."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidate_paths():
            # A bare soname from find_library ("libtierclient.so.0") is loadable without a file.
            if os.sep in path and not os.path.exists(path):
                tried.append(path + " (absent)")
                continue
            try:
                lib = ctypes.CDLL(path)  # CDLL: the GIL is released during every call
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
                continue
            _lib = _bind(lib)
            _lib_path = getattr(lib, "_name", path)
            return _lib
        raise OSError("libtierclient.so not found; set TIER_LIBRARY to its path. Tried: " +
                      "; ".join(tried))


def library_path():
    """The path of the loaded libtierclient.so (loading it if needed)."""
    load()
    return _lib_path


def version():
    return load().tier_version().decode()


def status_name(code):
    return load().tier_status_name(code).decode()


def last_error():
    return load().tier_last_error().decode(errors="replace")


def check(status, what=None):
    """Raises the TierError for a failed call, with tier_last_error()'s message (read at once: it is
    per thread, and nothing else ran on this thread since the call)."""
    if status == errors.OK:
        return
    message = last_error()
    if what:
        message = "%s: %s" % (what, message) if message else what
    raise errors.error_from_code(status, message)
