"""The wheel: `pip wheel ./python` builds one that carries libtierclient.so; it installs into a
fresh venv, where `import tier; tier.Client()` works against a running tierd with no path set; and
the versions agree: the package's, its library's and the daemon's (a client and a daemon of
different protocol versions are refused at open, naming both: tests/integration/version_test.cc).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import tier

from conftest import BUILD_DIR, PYTHON_DIR, TIERCTL

PROBE = """
import os, sys, tier
venv = sys.argv[1]
assert tier.__file__.startswith(venv), tier.__file__
assert tier.library_path().startswith(venv), tier.library_path()
with tier.Client(socket=sys.argv[2]) as c:
    b = c.alloc_host_buffer(1 << 16)
    b.view()[:5] = b"wheel"
    o, j = c.offload_buffer(b, 0, 1 << 16)
    c.wait(j)
    b.view()[:5] = b"xxxxx"
    c.wait(c.reload_buffer(o, b, 0, 1 << 16))
    assert bytes(b.view()[:5]) == b"wheel"
print(tier.__version__, tier.library_version())
"""


def _clean_env():
    env = dict(os.environ)
    for key in ("TIER_LIBRARY", "TIER_BUILD_DIR", "PYTHONPATH", "TIER_SOCKET"):
        env.pop(key, None)
    return env


def _pyproject_version():
    with open(os.path.join(PYTHON_DIR, "pyproject.toml")) as f:
        return re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


def _daemon_version(daemon):
    r = subprocess.run([TIERCTL, "--socket", daemon.socket, "--json", "version"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["version"]


def test_versions_agree(daemon):
    if not os.access(TIERCTL, os.X_OK):
        pytest.skip("no tierctl in %s" % BUILD_DIR)
    assert tier.__version__ == _daemon_version(daemon)
    assert tier.__version__ == tier.library_version()
    assert tier.__version__ == _pyproject_version()


def test_wheel_installs_into_a_fresh_venv_and_talks_to_tierd(daemon, tmp_path):
    if subprocess.run([sys.executable, "-m", "pip", "--version"],
                      capture_output=True).returncode != 0:
        pytest.skip("pip is not installed for %s" % sys.executable)
    if not os.path.exists(os.path.join(BUILD_DIR, "client", "libtierclient.so")):
        pytest.skip("no libtierclient.so in %s" % BUILD_DIR)
    # `pip wheel ./python`, from a copy so that nothing is written into the source tree, offline.
    src = tmp_path / "python"
    shutil.copytree(PYTHON_DIR, str(src), ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__", "libtierclient.so*"))
    dist = tmp_path / "dist"
    env = _clean_env()
    env["TIER_BUILD_DIR"] = BUILD_DIR
    env["PIP_NO_INDEX"] = "1"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                        "-w", str(dist), str(src)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    # A platform wheel (it carries a native library), named for this package and version.
    assert re.match(r"tierd_client-%s-py3-none-linux_\w+\.whl$" % re.escape(tier.__version__),
                    wheels[0].name), wheels[0].name
    names = zipfile.ZipFile(str(wheels[0])).namelist()
    assert "tier/_lib/libtierclient.so" in names, names
    assert "tier/__init__.py" in names
    assert "tier/torch/__init__.py" in names, names  # the subpackage too (pyproject's packages)

    # A fresh venv (the system's site packages visible: no index here to fetch from).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True)
    python = str(venv / "bin" / "python")
    env = _clean_env()
    env["PIP_NO_INDEX"] = "1"
    r = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index",
                        str(wheels[0])], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr

    r = subprocess.run([python, "-c", PROBE, str(venv), daemon.socket], env=_clean_env(),
                       cwd=str(tmp_path), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    package_version, library_version = r.stdout.split()
    assert package_version == library_version == _daemon_version(daemon)
