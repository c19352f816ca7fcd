"""pip install ./client/python: the gradmesh package with its extension
built for the Python that runs pip (a virtual environment, another Python
version), from this source tree with CMake and Debian's build dependencies
(scripts/setup.sh installs them); nothing is fetched:

    python3 -m venv --system-site-packages venv
    venv/bin/pip install --no-build-isolation ./client/python

$GRADMESH_BUILD_DIR names the CMake build tree to use (absolute, or
relative to the top of the source tree; default: build-python<major><minor>
there, made for this Python). An existing tree must have been configured
for this Python. Needs pip 21.3 or later (it builds in place).
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(gradmesh VERSION ([0-9.]+)", f.read())[1]


def _check_python(cache):
    """Exits unless the build tree of `cache` builds for this Python (the
    interpreter CMake found, as its cache records it)."""
    with open(cache) as f:
        text = f.read()
    found = (re.search(r"^_Python3_EXECUTABLE:INTERNAL=(.*)$", text, re.M) or
             re.search(r"^Python3_EXECUTABLE:[A-Z]+=(.*)$", text, re.M))
    if found is None or (os.path.realpath(found[1]) !=
                         os.path.realpath(sys.executable)):
        sys.exit(f"gradmesh: {os.path.dirname(cache)} builds for "
                 f"{found[1] if found else 'no Python'}, not "
                 f"{sys.executable}: set GRADMESH_BUILD_DIR to a build tree "
                 "made for this Python, or leave it unset")


def _configure(build_dir):
    """A new build tree for this Python (the extension has no CUDA code)."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    try:
        subprocess.check_call(
            ["cmake", "-S", ROOT, "-B", build_dir, *generator,
             "-DCMAKE_BUILD_TYPE=Release", "-DGRADMESH_CUDA=OFF",
             "-DGRADMESH_WERROR=OFF",
             f"-DPython3_EXECUTABLE={os.path.realpath(sys.executable)}"])
    except subprocess.CalledProcessError:
        shutil.rmtree(build_dir, ignore_errors=True)  # the next try anew
        sys.exit("gradmesh: configuring the build failed (above); "
                 "scripts/setup.sh installs what it needs")


class _BuildWithCMake(build_py):
    """Builds the extension (CMake target gradmesh_python) and puts it
    beside the package's Python files."""

    def run(self):
        build_dir = os.path.join(ROOT, os.environ.get("GRADMESH_BUILD_DIR") or
                                 f"build-python{sys.version_info[0]}"
                                 f"{sys.version_info[1]}")
        cache = os.path.join(build_dir, "CMakeCache.txt")
        if os.path.exists(cache):
            _check_python(cache)
        else:
            _configure(build_dir)
        if subprocess.call(["cmake", "--build", build_dir, "--target",
                            "gradmesh_python"]) != 0:
            sys.exit(f"gradmesh: building the extension in {build_dir} "
                     "failed (above); without pybind11-dev and python3-dev "
                     "(scripts/setup.sh) CMake leaves it out")
        super().run()
        name = "_gradmesh" + sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(build_dir, "client", "python", "gradmesh", name)
        if not os.path.exists(built):
            sys.exit(f"gradmesh: {built} was not built")
        target = os.path.join(self.build_lib, "gradmesh")
        os.makedirs(target, exist_ok=True)
        shutil.copy2(built, target)


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
