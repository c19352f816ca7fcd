"""pip install ./client/python: the gradmesh package with its extension
built for the Python that runs pip (a virtual environment, another Python
version), from this source tree with CMake and Debian's build dependencies
(scripts/setup.sh installs them); nothing is fetched:

    python3 -m venv --system-site-packages venv
    venv/bin/pip install --no-build-isolation ./client/python

$GRADMESH_BUILD_DIR names the CMake build tree to use (default:
build-python<major><minor> at the top of the source tree, configured for
this Python); $GRADMESH_CUDA=ON builds the CUDA kernels into a new one.
An existing tree must have been configured for this Python.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(gradmesh VERSION ([0-9.]+)", f.read())[1]


def _check_python(cache):
    """Exits unless the build tree of `cache` builds for this Python."""
    with open(cache) as f:
        found = re.search(r"^Python3_EXECUTABLE:[A-Z]+=(.*)$", f.read(), re.M)
    if found is None or (os.path.realpath(found[1]) !=
                         os.path.realpath(sys.executable)):
        sys.exit(f"gradmesh: {os.path.dirname(cache)} builds for "
                 f"{found[1] if found else 'no Python'}, not "
                 f"{sys.executable}: set GRADMESH_BUILD_DIR to another "
                 "build tree (or leave it unset)")


class _BuildWithCMake(build_py):
    """Builds the extension (CMake target gradmesh_python) and puts it
    beside the package's Python files."""

    def run(self):
        build_dir = os.environ.get("GRADMESH_BUILD_DIR") or os.path.join(
            ROOT, f"build-python{sys.version_info[0]}{sys.version_info[1]}")
        cache = os.path.join(build_dir, "CMakeCache.txt")
        if os.path.exists(cache):
            _check_python(cache)
        else:
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
                "-DCMAKE_BUILD_TYPE=Release",
                f"-DPython3_EXECUTABLE={sys.executable}",
                f"-DGRADMESH_CUDA={os.environ.get('GRADMESH_CUDA', 'OFF')}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target",
                               "gradmesh_python"])
        super().run()
        built = glob.glob(os.path.join(build_dir, "client", "python",
                                       "gradmesh", "_gradmesh*.so"))
        if len(built) != 1:
            sys.exit(f"gradmesh: expected one built extension in {build_dir},"
                     f" found {built}")
        target = os.path.join(self.build_lib, "gradmesh")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(built[0], target)


class _WithExtension(Distribution):
    """A wheel for this Python and platform (the extension is CMake's)."""

    def has_ext_modules(self):
        return True


setup(
    name="gradmesh",
    distclass=_WithExtension,
    version=_version(),
    description="Sparse gradient all-reduce (SparDL) for PyTorch training",
    packages=["gradmesh", "gradmesh.torch"],
    python_requires=">=3.9",
    install_requires=["numpy"],
    cmdclass={"build_py": _BuildWithCMake},
    zip_safe=False,
)
