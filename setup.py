"""Builds the compiled token tree (srt_agent/drafting/trees/_tree.cpp); everything else is in pyproject.toml.

The extension is optional: without a C++ compiler the package installs and falls back to the
pure-Python tree (with a warning at import).
"""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

setup(
    ext_modules=[
        Pybind11Extension(
            "srt_agent.drafting.trees._tree",
            ["srt_agent/drafting/trees/_tree.cpp"],
            cxx_std=17,
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": build_ext},
)
