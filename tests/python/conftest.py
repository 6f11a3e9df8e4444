"""conftest.py - shared fixtures for ferry's Python tests.

Puts python/ on sys.path (the extension must already be built in place:
`/usr/bin/python3 setup.py build_ext --inplace`), bounds every test in time,
and provides target processes (tests/python/target_proc.py), a local
mooncake TransferEngine and a `ferry metadata-server` process, all cleaned up
by finalizers. Only 127.0.0.1 is used.
"""

import ctypes
import faulthandler
import json
import mmap
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

TARGET_SCRIPT = os.path.join(HERE, "target_proc.py")
DEFAULT_TEST_TIMEOUT = 120  # seconds; @pytest.mark.timeout_s(N) overrides


def pytest_configure(config):
    config.addinivalue_line("markers", "timeout_s(n): per-test time limit in seconds")


class TimeLimitExceeded(Exception):
    pass


@pytest.fixture(autouse=True)
def _time_limit(request):
    """Fails a test that runs past its limit (SIGALRM), and kills the whole run
    with a traceback dump if it is still stuck 30 s later."""
    marker = request.node.get_closest_marker("timeout_s")
    limit = int(marker.args[0]) if marker else DEFAULT_TEST_TIMEOUT

    def on_alarm(signum, frame):
        raise TimeLimitExceeded("test exceeded %d s" % limit)

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    faulthandler.dump_traceback_later(limit + 30, exit=True)
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)


def free_port():
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LineReader:
    """Reads a pipe's lines on a thread so that waits can be bounded."""

    def __init__(self, stream):
        self.q = queue.Queue()
        self.t = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self.t.start()

    def _run(self, stream):
        for line in iter(stream.readline, ""):
            self.q.put(line)
        self.q.put(None)

    def get(self, timeout):
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None


class Target:
    """A target_proc.py process. `info` is its first JSON line."""

    def __init__(self, *args, env=None, start_timeout=30):
        full_env = dict(os.environ)
        full_env.setdefault("FERRY_LOG", "warn")
        if env:
            full_env.update(env)
        self.proc = subprocess.Popen(
            [sys.executable, TARGET_SCRIPT] + [str(a) for a in args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=full_env, cwd=ROOT)
        self.out = LineReader(self.proc.stdout)
        self.err = LineReader(self.proc.stderr)
        line = self.out.get(start_timeout)
        if line is None:
            self.stop()
            raise RuntimeError("target did not start: %s" % self.stderr_text())
        self.info = json.loads(line)
        if "error" in self.info:
            self.stop()
            raise RuntimeError("target failed: %r %s" % (self.info, self.stderr_text()))
        self.session = self.info["session"]
        self.addr = self.info["addr"]
        self.size = self.info["size"]

    def stderr_text(self):
        lines = []
        while True:
            line = self.err.get(0.05)
            if not line:
                break
            lines.append(line)
        return "".join(lines)

    def cmd(self, timeout=30, **kw):
        self.proc.stdin.write(json.dumps(kw) + "\n")
        self.proc.stdin.flush()
        line = self.out.get(timeout)
        if line is None:
            raise RuntimeError("target gave no answer to %r: %s" % (kw, self.stderr_text()))
        return json.loads(line)

    def sha256(self, off, length):
        return self.cmd(cmd="sha256", off=off, len=length)["sha256"]

    def dump(self, off, length):
        import base64
        return base64.b64decode(self.cmd(cmd="dump", off=off, len=length)["data"])

    def fill(self, off, data):
        import base64
        return self.cmd(cmd="fill", off=off, data=base64.b64encode(data).decode())

    def notifies(self):
        return [tuple(n) for n in self.cmd(cmd="notifies")["notifies"]]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self):
        """Closes stdin (the target exits), killing it if it does not."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


@pytest.fixture
def start_target(request):
    """start_target(*args, env=None) -> Target, stopped at the end of the test."""
    started = []

    def start(*args, **kw):
        t = Target(*args, **kw)
        started.append(t)
        return t

    yield start
    for t in started:
        t.stop()


@pytest.fixture
def target(start_target):
    """A P2PHANDSHAKE target on 127.0.0.1 with a 4 MiB buffer."""
    return start_target("--size", 4 << 20)


@pytest.fixture(scope="module")
def shared_target():
    """A module-wide P2PHANDSHAKE target with a 32 MiB buffer."""
    t = Target("--size", 32 << 20)
    yield t
    t.stop()


def make_engine(protocol=None, hostname="127.0.0.1", server="P2PHANDSHAKE"):
    """protocol None: FERRY_TEST_PROTOCOL, else "tcp" (the Makefile runs the
    drop-in's tests once with "rdma" on the fabric transport's tcp provider)."""
    from mooncake.engine import TransferEngine

    protocol = protocol or os.environ.get("FERRY_TEST_PROTOCOL") or "tcp"

    te = TransferEngine()
    rc = te.initialize(hostname, server, protocol, "")
    assert rc == 0, te.last_error()
    return te


def ferry_engine_pair():
    """Two ferry.Engine on 127.0.0.1 over tcp, closed when the generator is
    resumed: the body of the `pair` fixture, for a module whose own `pair`
    sets something up first."""
    import ferry

    a = ferry.Engine("127.0.0.1", transports="tcp")
    b = ferry.Engine("127.0.0.1", transports="tcp")
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def pair():
    """Two ferry.Engine (a, b) on 127.0.0.1 over tcp; a module may override it."""
    yield from ferry_engine_pair()


@pytest.fixture
def engine():
    """A local mooncake TransferEngine (P2PHANDSHAKE, tcp, 127.0.0.1)."""
    te = make_engine()
    yield te
    te.close()


@pytest.fixture(scope="module")
def shared_engine():
    te = make_engine()
    yield te
    te.close()


@pytest.fixture
def cpu_inaccessible():
    """(address, size) of 1 MiB mapped PROT_NONE: what a CUDA device pointer
    (SGLang registers tensor.data_ptr()) is to a CPU no driver maps it for."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    size = 1 << 20
    addr = libc.mmap(None, size, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    yield addr, size
    libc.munmap(addr, size)


def ferry_tool():
    path = os.environ.get("FERRY_TOOL") or os.path.join(ROOT, "build", "ferry")
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


@pytest.fixture
def metadata_server():
    """A `ferry metadata-server --port 0`; yields its URL."""
    tool = ferry_tool()
    if not tool:
        pytest.skip("ferry tool not found (set FERRY_TOOL or build build/ferry)")
    proc = subprocess.Popen([tool, "metadata-server", "--port", "0"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = LineReader(proc.stdout)
    url = None
    seen = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = out.get(max(0.1, deadline - time.monotonic()))
        if line is None:
            break
        seen.append(line)
        m = re.search(r"ready metadata-server url=(\S+)", line)
        if m:
            url = m.group(1)
            break
    if url is None:
        proc.kill()
        proc.wait(timeout=10)
        raise RuntimeError("metadata-server did not become ready: %r" % "".join(seen))
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    proc.stdout.close()
