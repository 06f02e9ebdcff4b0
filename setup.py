"""Builds the C++ core (torch_neuronx/_C) against the installed torch.

Install without build isolation so the core links against the torch that will run it:
    pip install --no-build-isolation -e .
"""
import glob
import os
import platform

# Importing torch autoloads an installed torch_neuronx, possibly a stale build of
# this very project: the build must not depend on it.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# torch's x86-64 builds compile each CPU kernel for AVX2 and AVX-512, which shapes the declarations of
# its DispatchStubs; declaring the same lets fast_ops.cpp call CPU's kernels on neuron tensors directly.
DIRECT_CPU_STUBS = (["-DNEURON_DIRECT_CPU_STUBS", "-DHAVE_AVX512_CPU_DEFINITION", "-DHAVE_AVX2_CPU_DEFINITION"]
                    if platform.machine() in ("x86_64", "AMD64") else [])


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
            # -g0: Python's flags ask for debug info, which nearly doubles the compile time of these
            # template-heavy files and makes most of the library's size; nothing here reads it.
            extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", "-Wno-unused-parameter", *DIRECT_CPU_STUBS],
        )
    ],
    cmdclass={"build_ext": BuildCore},
)
