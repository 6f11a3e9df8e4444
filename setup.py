"""setup.py - builds the Python packages `ferry` (with its C extension
ferry._ferry), `mooncake` (Mooncake-compatible TransferEngine) and `nixl`
(NIXL's Python API, on ferry; needs numpy), and the
`ferry` command-line tool they carry (ferry/ferry-tool, run by `python -m
ferry`, the `ferry` and `mooncake_http_metadata_server` commands and
`python -m mooncake.http_metadata_server`); `mooncake_client` (`python -m
mooncake.mooncake_client`) is Python over the binding.

The extension compiles the binding, python/ferry/*.c (one file per concept;
python/ferry/_ferry.h lists them), together with every libferry source
(src/**/*.c), so it needs no separately installed libferry; it links
libcrypto and jansson, and loads libcurl, hiredis and libfabric when their
feature is first used (src/base/library.h). The tool links the same objects with
tools/*.c and libmicrohttpd.

  /usr/bin/python3 setup.py build_ext --inplace        # in-place, for tests
  /usr/bin/python3 -m pip install --no-build-isolation --break-system-packages .
  /usr/bin/python3 -m pip wheel --no-build-isolation --no-deps --no-index -w dist .

The wheel links the system's libraries by soname and bundles none
(ferry/_runtime.py lists them; README.md, "Runtime libraries").
"""

import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _glob(pattern):
    # Relative paths, sorted, so builds are reproducible.
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern),
                                                              recursive=True))


BINDING_SOURCES = _glob("python/ferry/*.c")
BINDING_HEADERS = _glob("python/ferry/*.h")  # a change rebuilds the extension
LIBFERRY_SOURCES = _glob("src/**/*.c")
TOOL_SOURCES = _glob("tools/*.c")
TOOL_NAME = "ferry-tool"  # inside the ferry package, next to the extension


class ParallelBuildExt(build_ext):
    """Compiles the many libferry sources in parallel unless -j is given, and
    links the `ferry` tool from the extension's libferry objects."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extension(self, ext):
        super().build_extension(ext)
        if ext.name == "ferry._ferry":
            self._build_tool(ext)

    def _build_tool(self, ext):
        compile_args = dict(output_dir=self.build_temp, macros=ext.define_macros,
                            include_dirs=ext.include_dirs, extra_postargs=ext.extra_compile_args)
        objects = self.compiler.compile(TOOL_SOURCES, **compile_args)
        objects += self.compiler.object_filenames(LIBFERRY_SOURCES, output_dir=self.build_temp)
        package_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
        self.compiler.link_executable(objects, TOOL_NAME, output_dir=package_dir,
                                      libraries=ext.libraries + ["microhttpd", "m"])

    def copy_extensions_to_source(self):
        # --inplace: the tool goes next to the extension in python/ferry too.
        super().copy_extensions_to_source()
        built = os.path.join(self.build_lib, "ferry", TOOL_NAME)
        self.copy_file(built, os.path.join(HERE, "python", "ferry", TOOL_NAME))


ferry_ext = Extension(
    "ferry._ferry",
    sources=BINDING_SOURCES + LIBFERRY_SOURCES,
    depends=BINDING_HEADERS,
    include_dirs=["include", "src"],
    define_macros=[("_GNU_SOURCE", "1")],  # as the CMake build
    libraries=["crypto", "jansson", "pthread", "dl"],
    extra_compile_args=["-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

setup(
    package_dir={"": "python"},
    packages=["ferry", "mooncake", "nixl"],
    ext_modules=[ferry_ext],
    cmdclass={"build_ext": ParallelBuildExt},
    # Intermediate files under python/build (gitignored), away from CMake's build/.
    options={"build": {"build_base": "python/build"}},
    zip_safe=False,
)
