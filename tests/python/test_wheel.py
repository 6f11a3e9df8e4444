"""test_wheel.py - the wheel README.md's "Install" builds: built once without
network (`pip wheel --no-build-isolation --no-index`), installed with `pip
install --no-index` into a fresh venv without system site-packages, and the
quick start's examples (ferry and the mooncake drop-in) run from there; it
holds the nixl package too (which needs numpy, absent from that venv). Its
binaries need exactly the runtime libraries README.md lists, and an import on
a host without one of them says which, and which package brings it."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from test_readme import ROOT, python_blocks

sys.path.insert(0, os.path.join(ROOT, "python"))
from ferry._runtime import RUNTIME_LIBRARIES  # noqa: E402

# What every Linux program links: not listed.
LIBC = {"libc.so.6", "libm.so.6", "libpthread.so.0", "ld-linux-x86-64.so.2",
        "ld-linux-aarch64.so.1"}


def run(args, **kwargs):
    return subprocess.run(args, check=True, timeout=600, stdout=subprocess.DEVNULL, **kwargs)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """The venv the wheel was installed into, and its site-packages."""
    tmp = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "--no-index", "-w", str(tmp / "dist"), ROOT])
    wheels = list((tmp / "dist").glob("ferry-*.whl"))
    assert len(wheels) == 1, wheels
    run([sys.executable, "-m", "venv", str(tmp / "venv")])
    python = str(tmp / "venv" / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", "--no-index", str(wheels[0])])
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    return python, site


def run_in_venv(python, code, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FERRY_"))}
    return subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_venv_sees_only_the_wheel(venv, tmp_path):
    python, site = venv
    done = run_in_venv(python, "import sys, ferry, mooncake.engine as m; "
                       "print(ferry.__file__, m.__file__, *sys.path, sep='\\n')", tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(path.startswith(site) for path in lines[:2]), lines
    assert not [p for p in lines[2:] if "site-packages" in p and not p.startswith(site)
                or "dist-packages" in p], lines


def test_wheel_holds_nixl(venv):
    _, site = venv
    for module in ("__init__", "_api", "_bindings", "_utils", "logging"):
        assert os.path.isfile(os.path.join(site, "nixl", module + ".py")), module


@pytest.mark.parametrize("index", [0, 1])
def test_quick_start_runs_from_the_wheel(venv, tmp_path, index):
    python, _ = venv
    done = run_in_venv(python, python_blocks("Quick start")[index], tmp_path)
    assert done.returncode == 0, done.stderr


def needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True,
                         text=True).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.*?)\]", out))


def test_readme_lists_every_runtime_library(venv):
    _, site = venv
    binaries = [os.path.join(site, "ferry", "ferry-tool")]
    binaries += [os.path.join(site, "ferry", f) for f in os.listdir(os.path.join(site, "ferry"))
                 if f.startswith("_ferry") and f.endswith(".so")]
    libraries = set().union(*(needed(b) for b in binaries)) - LIBC
    assert libraries == set(RUNTIME_LIBRARIES), libraries
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    table = text.split("\n### Runtime libraries\n", 1)[1].split("\n#", 1)[0]
    for soname, (package, _) in RUNTIME_LIBRARIES.items():
        assert re.search(r"`%s`.*`%s`" % (re.escape(package), re.escape(soname)), table), soname


def test_a_missing_library_names_its_package(venv, tmp_path):
    """A copy of the installed package whose extension asks for a hiredis
    that no host has: the loader fails, and the ImportError says what to do."""
    _, site = venv
    copy = tmp_path / "site"
    shutil.copytree(os.path.join(site, "ferry"), copy / "ferry")
    (ext,) = (copy / "ferry").glob("_ferry*.so")
    data = ext.read_bytes()
    assert data.count(b"libhiredis.so.0.14\0") == 1
    ext.write_bytes(data.replace(b"libhiredis.so.0.14\0", b"libhiredis.so.0.99\0"))
    python, _ = venv
    done = run_in_venv(python, "import sys; sys.path.insert(0, %r); import ferry" % str(copy),
                       tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert ("ImportError: ferry cannot load its C extension: libhiredis.so.0.99 is missing on "
            "this host (used for the redis metadata store") in last, last
    assert "Fix: apt-get install libhiredis0.14" in last, last
    assert "README.md, 'Runtime libraries'" in last, last
