"""test_wheel.py - the wheel README.md's "Install" builds: built once without
network (`pip wheel --no-build-isolation --no-index`), installed with `pip
install --no-index` into a fresh venv without system site-packages, and the
quick start's examples (ferry and the mooncake drop-in) run from there; it
holds the nixl package too (which needs numpy, absent from that venv). Its
binaries link exactly the runtime libraries README.md lists, and an import on
a host without one of them says which, and which package brings it; a host
without one of the libraries that serve a single feature (libcurl, hiredis,
libfabric) keeps everything else, and the feature says what is missing."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from test_readme import ROOT, python_blocks

sys.path.insert(0, os.path.join(ROOT, "python"))
from ferry._runtime import FEATURE_LIBRARIES, RUNTIME_LIBRARIES  # noqa: E402

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


@pytest.mark.parametrize("command, args, said", [
    ("ferry", ["version"], "ferry "),
    ("mooncake_master", ["--help"], "usage: ferry store-master"),
    ("transfer_engine_bench", ["--help"], "usage: transfer_engine_bench"),
])
def test_console_commands_are_on_path(venv, tmp_path, command, args, said):
    """The wheel's console commands (pyproject.toml [project.scripts]), as
    Mooncake's wheel test finds its own: on PATH, and running the tool."""
    python, _ = venv
    bindir = os.path.dirname(python)
    found = shutil.which(command, path=bindir)
    assert found == os.path.join(bindir, command), os.listdir(bindir)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FERRY_"))}
    done = subprocess.run([found] + args, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert said in done.stdout, done.stdout


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
    for soname, (package, _) in {**RUNTIME_LIBRARIES, **FEATURE_LIBRARIES}.items():
        assert re.search(r"`%s`.*`%s`" % (re.escape(package), re.escape(soname)), table), soname


def test_a_missing_library_names_its_package(venv, tmp_path):
    """A copy of the installed package whose extension asks for a jansson
    that no host has: the loader fails, and the ImportError says what to do."""
    _, site = venv
    copy = tmp_path / "site"
    shutil.copytree(os.path.join(site, "ferry"), copy / "ferry")
    (ext,) = (copy / "ferry").glob("_ferry*.so")
    data = ext.read_bytes()
    assert data.count(b"libjansson.so.4\0") >= 1  # the NEEDED entry, and its symbol versions
    ext.write_bytes(data.replace(b"libjansson.so.4\0", b"libjansson.so.9\0"))
    python, _ = venv
    done = run_in_venv(python, "import sys; sys.path.insert(0, %r); import ferry" % str(copy),
                       tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert ("ImportError: ferry cannot load its C extension: libjansson.so.9 is missing on "
            "this host (used for segment descriptors") in last, last
    assert "Fix: apt-get install libjansson4" in last, last
    assert "README.md, 'Runtime libraries'" in last, last


# Each feature library unusable at once (an empty file the loader finds
# first, through LD_LIBRARY_PATH): the rest of ferry must not need them.
WITHOUT_FEATURE_LIBRARIES = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
import ferry
from mooncake.engine import TransferEngine
for metadata, protocol in (("redis://127.0.0.1:1", "tcp"), ("http://127.0.0.1:1/metadata", "tcp"),
                           ("P2PHANDSHAKE", "rdma")):
    te = TransferEngine()
    rc = te.initialize("127.0.0.1", metadata, protocol, "")
    print("initialize", metadata, protocol, rc, te.last_error())
    te.close()
"""


def test_a_missing_feature_library_loses_only_its_feature(venv, tmp_path):
    python, site = venv
    hide = tmp_path / "hide"
    hide.mkdir()
    for soname in FEATURE_LIBRARIES:
        (hide / soname).write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "FERRY_"))}
    env["LD_LIBRARY_PATH"] = str(hide)

    def run_hidden(args):
        done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        return done, done.stdout + done.stderr

    done, out = run_hidden([python, "-c", python_blocks("Quick start")[0]])
    assert done.returncode == 0, out  # import, engines, tcp/shm transfers
    done, out = run_hidden([python, "-c", WITHOUT_FEATURE_LIBRARIES])
    assert done.returncode == 0, out
    for soname, (package, feature) in FEATURE_LIBRARIES.items():
        assert ("not available without %s, which cannot be loaded on this host (dlopen: %s: "
                % (soname, hide / soname)) in out, (soname, out)
        assert "Fix: apt-get install %s" % package in out, (soname, out)
    assert re.search(r"initialize redis://\S+ tcp -303 .*the redis metadata store", out), out
    assert re.search(r"initialize http://\S+ tcp -303 .*the http and etcd metadata", out), out
    assert "initialize P2PHANDSHAKE rdma 0 None" in out, out  # fell back, and said why:
    assert ("WARNING protocol 'rdma': ferry's fabric transport is not available (fabric "
            "provider verbs;ofi_rxm cannot start: the fabric transport") in out, out
    done, out = run_hidden([os.path.join(site, "ferry", "ferry-tool"), "doctor"])
    assert re.search(r"INFO +fabric +the fabric transport .*: not available without "
                     r"libfabric\.so\.1", out), out
    assert re.search(r"OK +transport tcp ", out), out
