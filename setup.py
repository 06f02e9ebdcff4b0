"""Builds the C++ core (torch_neuronx/_C) against the installed torch.

Install without build isolation so the core links against the torch that will run it:
    pip install --no-build-isolation -e .
"""
import glob

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    ext_modules=[
        CppExtension(
            name="torch_neuronx._C",
            sources=sorted(glob.glob("csrc/*.cpp")),
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
