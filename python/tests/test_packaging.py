"""Installs: `pip install ./python` (offline, build isolation on) and `cmake --install` both give
a package that finds its bundled libtierclient.so with no path set."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import BUILD_DIR, PYTHON_DIR

PROBE = """
import sys, tier
path = tier.library_path()
assert path.startswith(sys.argv[1]), (path, sys.argv[1])
with tier.Client(socket=sys.argv[2]) as c:
    b = c.alloc_host_buffer(4096)
    b.view()[:3] = b"abc"
    o, j = c.offload_buffer(b, 0, 4096)
    c.wait(j)
    b.view()[:3] = b"xyz"
    c.wait(c.reload_buffer(o, b, 0, 4096))
    assert bytes(b.view()[:3]) == b"abc"
print("ok", path)
"""


def _clean_env():
    env = dict(os.environ)
    for key in ("TIER_LIBRARY", "TIER_BUILD_DIR", "PYTHONPATH"):
        env.pop(key, None)
    return env


def _probe(site_dir, package_root, daemon, tmp_path):
    env = _clean_env()
    env["PYTHONPATH"] = site_dir
    r = subprocess.run([sys.executable, "-c", PROBE, package_root, daemon.socket], env=env,
                       cwd=str(tmp_path), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok")


def test_pip_install_offline_bundles_the_library(daemon, tmp_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"],
                      capture_output=True).returncode != 0:
        pytest.skip("pip is not installed for %s" % sys.executable)
    lib = os.path.join(BUILD_DIR, "client", "libtierclient.so")
    if not os.path.exists(lib):
        pytest.skip("no libtierclient.so in %s" % BUILD_DIR)
    # Build from a copy, so nothing (build/, *.egg-info) is written into the source tree.
    src = tmp_path / "src"
    shutil.copytree(PYTHON_DIR, str(src), ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__", "libtierclient.so*"))
    site_dir = str(tmp_path / "site")
    env = _clean_env()
    env["TIER_BUILD_DIR"] = BUILD_DIR
    env["PIP_NO_INDEX"] = "1"  # offline: nothing may be fetched, build isolation stays on
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                        "--target", site_dir, str(src)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.isfile(os.path.join(site_dir, "tier", "_lib", "libtierclient.so"))
    assert os.path.isfile(os.path.join(site_dir, "tier", "torch", "__init__.py"))
    _probe(site_dir, os.path.join(site_dir, "tier", "_lib"), daemon, tmp_path)


def test_cmake_install_component(daemon, tmp_path):
    if not os.path.exists(os.path.join(BUILD_DIR, "python", "cmake_install.cmake")):
        pytest.skip("this build does not include python/ (add_subdirectory(python))")
    prefix = str(tmp_path / "prefix")
    r = subprocess.run(["cmake", "--install", BUILD_DIR, "--component", "python", "--prefix",
                        prefix], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    found = [root for root, dirs, files in os.walk(prefix) if os.path.basename(root) == "tier"
             and "client.py" in files]
    assert len(found) == 1, found
    libs = os.listdir(os.path.join(found[0], "_lib"))
    assert any(name.startswith("libtierclient.so") for name in libs), libs
    _probe(os.path.dirname(found[0]), os.path.join(found[0], "_lib"), daemon, tmp_path)
