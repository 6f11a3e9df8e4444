"""setup.py - builds the Python packages `ferry` (with its C extension
ferry._ferry) and `mooncake` (Mooncake-compatible TransferEngine).

The extension compiles python/ferry/_ferry.c together with every libferry
source (src/**/*.c), so it needs no separately installed libferry; it links
libcrypto, libcurl, jansson and hiredis.

  /usr/bin/python3 setup.py build_ext --inplace        # in-place, for tests
  /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages .
"""

import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _sources():
    # Relative paths, sorted, so builds are reproducible.
    libferry = sorted(
        os.path.relpath(p, HERE)
        for p in glob.glob(os.path.join(HERE, "src", "**", "*.c"), recursive=True)
    )
    return ["python/ferry/_ferry.c"] + libferry


class ParallelBuildExt(build_ext):
    """Compiles the many libferry sources in parallel unless -j is given."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


ferry_ext = Extension(
    "ferry._ferry",
    sources=_sources(),
    include_dirs=["include", "src"],
    define_macros=[("_GNU_SOURCE", "1")],  # as the CMake build
    libraries=["crypto", "curl", "jansson", "hiredis", "pthread"],
    extra_compile_args=["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

setup(
    package_dir={"": "python"},
    packages=["ferry", "mooncake"],
    ext_modules=[ferry_ext],
    cmdclass={"build_ext": ParallelBuildExt},
    # Intermediate files under python/build (gitignored), away from CMake's build/.
    options={"build": {"build_base": "python/build"}},
    zip_safe=False,
)
