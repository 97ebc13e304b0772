"""A PEP 517 backend that is setuptools.build_meta, found without a network.

pip builds in an isolated environment and installs the build requirements into it from an index;
offline that fails. This backend declares no requirements and imports the interpreter's own
setuptools (and wheel) from its site directories, which the isolated environment hides. Where the
interpreter has no setuptools it asks pip for it (online builds keep working).
"""

import os
import site
import sys


def _site_dirs():
    dirs = []
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:  # old virtualenv's site module
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    return [d for d in dirs if os.path.isdir(d)]


def _importable(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def _backend():
    """setuptools.build_meta, from the isolated environment if pip put it there, else from the
    interpreter's site directories."""
    if not _importable("setuptools"):
        for d in _site_dirs():
            if d not in sys.path:
                sys.path.append(d)  # appended: what the isolated environment has wins
    from setuptools import build_meta
    return build_meta


def _missing_requirements(requirements):
    out = []
    for req in requirements:
        name = req.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            name = name.split(sep)[0]
        if not _importable(name.strip()):
            out.append(req)
    return out


def _requires(hook, config_settings):
    try:
        backend = _backend()
    except ImportError:
        return ["setuptools>=61", "wheel"]
    return _missing_requirements(getattr(backend, hook)(config_settings))


def get_requires_for_build_wheel(config_settings=None):
    return _requires("get_requires_for_build_wheel", config_settings)


def get_requires_for_build_sdist(config_settings=None):
    return _requires("get_requires_for_build_sdist", config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _requires("get_requires_for_build_editable", config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    return _backend().prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _backend().build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _backend().build_sdist(sdist_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return _backend().prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _backend().build_editable(wheel_directory, config_settings, metadata_directory)
