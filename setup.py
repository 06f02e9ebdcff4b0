"""Builds the C++ core (torch_neuronx/_C) against the installed torch.

Install without build isolation so the core links against the torch that will run it:
    pip install --no-build-isolation -e .
"""
import glob
import os

# Importing torch autoloads an installed torch_neuronx, possibly a stale build of
# this very project: the build must not depend on it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildCore(BuildExtension.with_options(use_ninja=True)):
    """One object folder for editable installs and wheels, kept between builds: ninja then
    recompiles only the files that changed (pip's editable builds use a new one each time)."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(HERE, "build", "core")


setup(
    ext_modules=[
        CppExtension(
            name="torch_neuronx._C",
            sources=sorted(glob.glob("csrc/*.cpp")),
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildCore},
)
