"""setuptools glue for `pip install ./python`: metadata lives in pyproject.toml; this file only
copies libtierclient.so into the package (tier/_lib/), where tier._lib looks first, and tags the
wheel as platform-specific (it carries a native library; no Python extension, so any CPython 3).

Where the library comes from, first match wins: $TIER_LIBRARY; $TIER_BUILD_DIR/client/; one
already in tier/_lib/; the newest ../build*/client/ of this source checkout. If none exists the
package is built without it and finds a system-installed libtierclient.so at run time.
"""

import glob
import os
import shutil
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = "libtierclient.so"


def find_library():
    candidates = []
    if os.environ.get("TIER_LIBRARY"):
        candidates.append(os.environ["TIER_LIBRARY"])
    if os.environ.get("TIER_BUILD_DIR"):
        candidates.append(os.path.join(os.environ["TIER_BUILD_DIR"], "client", LIB))
    candidates.append(os.path.join(HERE, "tier", "_lib", LIB))
    trees = glob.glob(os.path.join(os.path.dirname(HERE), "build*", "client", LIB))
    candidates.extend(sorted(trees, key=os.path.getmtime, reverse=True))
    for path in candidates:
        if os.path.isfile(path):
            return os.path.realpath(path)
    return None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = find_library()
        if lib is None:
            sys.stderr.write("tierd-client: libtierclient.so not found (set TIER_LIBRARY or "
                             "TIER_BUILD_DIR); the package will look for a system install\n")
            return
        dest = os.path.join(self.build_lib, "tier", "_lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copyfile(lib, os.path.join(dest, LIB))
        sys.stderr.write("tierd-client: bundling %s\n" % lib)


cmdclass = {"build_py": BuildPyWithLibrary}

try:  # setuptools >= 70.1 has its own bdist_wheel; older ones use the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False  # a native library inside

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel

class NativeLibraryDistribution(Distribution):
    """The package carries a native library (no extension module): setuptools then installs it
    into platlib, so a wheel holds tier/ at its root rather than under .data/purelib/."""

    def has_ext_modules(self):
        return True


setup(cmdclass=cmdclass, distclass=NativeLibraryDistribution)
