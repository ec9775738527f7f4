"""xgr-bridge: TF feature graphs and custom ops in front of a Torch generative-retrieval engine.

The C++ TF ops compile from source here (``build_ext``), against the TF and torch installed in
the build environment: install with ``pip install --no-build-isolation``.
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _load_build_module():
    spec = importlib.util.spec_from_file_location("_xgr_build", ROOT / "custom_ops" / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_build = _load_build_module()
LIBRARIES = {lib.name: lib for lib in _build.discover_libraries(ROOT)}


class BuildOpLibraries(build_ext):
    """Builds each op library with TF's (and torch's) flags instead of distutils' compiler."""

    def build_extension(self, ext):
        output = Path(self.get_ext_fullpath(ext.name))
        _build.build_library(LIBRARIES[ext.name], ROOT, output.resolve(),
                             ROOT / "build" / "op_cache", log=print)


def _requirements(section: int):
    """Section 0: runtime pins; section 1: the test-only pins (the ``dev`` extra)."""
    text = (ROOT / "requirements.txt").read_text().split("# test-only")[section]
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


setup(
    name="xgr-bridge",
    version="0.1.0",
    description="Run TF feature graphs unchanged in front of a Torch generative-retrieval engine",
    packages=find_packages(include=["xgr_common*", "custom_ops*", "tf_frontend*", "torch_engine*",
                                    "bridge*", "xgr_checkpoint*", "xgr_catalog*", "xgr_export*",
                                    "xgr_world*",
                                    "xgr_train*", "xgr_batch*",
                                    "xgr_cli*"]),
    package_data={"custom_ops": ["cc/**/*.cc", "cc/**/*.h"]},
    ext_modules=[Extension(name, sources=[]) for name in LIBRARIES],
    cmdclass={"build_ext": BuildOpLibraries},
    python_requires=">=3.10",
    install_requires=_requirements(0),
    extras_require={"dev": _requirements(1)},
    entry_points={"console_scripts": ["xgr = xgr_cli.main:run"]},
)
