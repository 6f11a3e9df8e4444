"""test_cli.py - the command line as a Python-only user meets it: `python -m
ferry` and `python -m mooncake.http_metadata_server` run the tool built with
the package; a bad value on the command line or in the environment is
refused with a message naming what is accepted, in the tools, the C
library and the Python packages alike; `ferry bench` keeps its result when
interrupted. Only 127.0.0.1 is used.
"""

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import ferry
from conftest import ROOT, LineReader

PYTHON_DIR = os.path.join(ROOT, "python")


def tool_env(**extra):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, FERRY_LOG="warn")
    env.update(extra)
    return env


def run_ferry(*args, timeout=60, **env):
    """`python -m ferry ARGS` -> CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-m", "ferry"] + list(args), env=tool_env(**env),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def test_python_m_ferry_runs_the_bundled_tool():
    env = tool_env()
    env.pop("FERRY_TOOL", None)  # the binary built with the package, not build/ferry
    out = subprocess.run([sys.executable, "-m", "ferry", "version"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ferry %s" % ferry.version()
    assert os.access(os.path.join(PYTHON_DIR, "ferry", "ferry-tool"), os.X_OK)


@pytest.mark.parametrize("args, rc, message", [
    (["bench", "--target", "127.0.0.1:1", "--op", "frobnicate"], 2,
     "invalid value 'frobnicate' for --op: expected write, read or send"),
    (["bench", "--target", "127.0.0.1:1", "--block", "1X"], 2,
     "invalid value '1X' for --block: expected a size in bytes, more than 0, with an optional "
     "binary K, M, G or T suffix"),
    (["bench", "--target", "127.0.0.1:1", "--threads", "5000"], 2,
     "value out of range '5000' for --threads: expected a whole number, 1 to 1024"),
    (["bench", "--target", "127.0.0.1:1", "--protocol", "rdma"], 2,
     "expected tcp, shm, fabric or all"),
    (["serve", "--port", "99999"], 2, "expected a port number, 0 to 65535"),
    (["probe", "127.0.0.1:99999"], 1, "port out of range (expected 1..65535)"),
])
def test_bad_values_name_what_is_accepted(args, rc, message):
    out = run_ferry(*args)
    assert out.returncode == rc, out.stderr
    assert message in out.stderr


@pytest.mark.parametrize("command", ["serve", "bench", "probe"])
def test_help_lists_every_transport(command):
    out = run_ferry(command, "--help")
    assert out.returncode == 0, out.stderr
    assert re.search(r"tcp.{0,3}shm.{0,3}fabric.{0,3}all", out.stdout), out.stdout


def test_errors_doc_commands_use_real_flags():
    """Every `ferry serve|bench|probe|doctor ...` in docs/errors.md parses:
    with --help added, the tool accepts the rest of the line."""
    with open(os.path.join(ROOT, "docs", "errors.md"), encoding="utf-8") as f:
        spans = re.findall(r"`ferry ((?:serve|bench|probe|doctor)(?: [^`]*)?)`", f.read())
    assert any(s.startswith("doctor") for s in spans), spans
    for span in spans:
        out = run_ferry(*(span.split() + ["--help"]))
        assert out.returncode == 0, (span, out.stderr)


class _Listener:
    """A TCP service on 127.0.0.1 for `ferry probe` to find: answers every
    connection with reply(first bytes received) (None: silence, b"": close)."""

    def __init__(self, reply):
        import socket
        import threading
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.target = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self.kept = []
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            answer = self.reply(conn.recv(4096))
            if answer is None:
                self.kept.append(conn)
                continue
            conn.sendall(answer)
            conn.close()

    def close(self):
        self.sock.close()
        for conn in self.kept:
            conn.close()


def _http_answer(first):
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n" if first.startswith(b"GET ") \
        else None  # waits for a line end, as HTTP servers do


def _tls_answer(first):
    return b"\x15\x03\x03\x00\x02\x02\x28" if first[:1] == b"\x16" else b""  # handshake_failure


@pytest.mark.parametrize("reply, said", [
    (_http_answer, 'an HTTP server answered ("HTTP/1.1 404 Not Found"), not a ferry engine'),
    (_tls_answer, "a TLS server answered (a TLS alert record), not a ferry engine"),
    (lambda first: None, "it accepted the connection but answered nothing in 1 s, and neither "
                         "HTTP nor TLS: not a ferry engine, which answers at once"),
    (lambda first: b"", "it closed the connection on ferry's HELLO without an answer, and "
                        "answered neither HTTP nor TLS: not a ferry engine"),
    (lambda first: b"+PONG\r\n" * 2, 'something that is not a ferry engine answered '
                                     '("+PONG")'),
])
def test_probe_says_what_answered_instead_of_a_ferry_engine(reply, said):
    """Not a handshake timeout seconds later: what listens there."""
    listener = _Listener(reply)
    try:
        probe = run_ferry("probe", listener.target)
        doctor = run_ferry("doctor", "--target", listener.target, timeout=120)
    finally:
        listener.close()
    assert probe.returncode == 1
    assert probe.stderr == "ferry probe: %s: %s\n" % (listener.target, said), probe.stderr
    assert re.search(r"^FAIL +%s +%s$" % (re.escape(listener.target), re.escape(said)),
                     doctor.stdout, re.M), doctor.stdout


def test_doctor_help_documents_its_options():
    out = run_ferry("doctor", "--help")
    assert out.returncode == 0
    assert "--target HOST:PORT" in out.stdout and "FAIL" in out.stdout
    assert run_ferry("doctor", "--frobnicate").returncode == 2


@pytest.mark.parametrize("args, said", [
    (["127.0.0.1:1"], "unexpected argument '127.0.0.1:1': a peer is checked with --target "
                      "127.0.0.1:1"),
    (["--frobnicate"], "unknown option '--frobnicate'"),
    (["--target"], "--target needs a value"),
])
def test_doctor_says_what_was_wrong_with_its_arguments(args, said):
    out = run_ferry("doctor", *args)
    assert out.returncode == 2
    assert out.stderr.startswith("ferry doctor: %s\n" % said), out.stderr
    assert "usage: ferry doctor" in out.stderr


@pytest.mark.parametrize("leftover", [False, True])
def test_doctor_finds_which_mooncake_engine_python_imports(tmp_path, leftover):
    """Mooncake's wheel installed into the same site-packages as ferry leaves
    mooncake/engine.cpython-*.so beside ferry's engine.py: Python imports the
    compiled one, and the doctor must say so."""
    import importlib.machinery
    import shutil
    package = tmp_path / "mooncake"
    shutil.copytree(os.path.join(PYTHON_DIR, "mooncake"), package)
    compiled = package / ("engine" + importlib.machinery.EXTENSION_SUFFIXES[0])
    if leftover:
        compiled.write_bytes(b"")
    out = run_ferry("doctor", timeout=120,
                    PYTHONPATH=os.pathsep.join([str(tmp_path), PYTHON_DIR]))
    found = [l for l in out.stdout.splitlines() if l.split()[1:2] == ["mooncake.engine"]]
    assert len(found) == 1, out.stdout
    verdict, _, detail = found[0].split(None, 2)
    if leftover:
        assert out.returncode == 1, out.stdout
        assert verdict == "FAIL", found[0]
        assert detail.startswith("%s would import Mooncake's compiled %s, not ferry's drop-in: "
                                 "remove it" % (sys.executable, compiled)), found[0]
    else:
        assert verdict == "OK", found[0]
        assert detail == "%s imports ferry's drop-in %s" % (sys.executable,
                                                            package / "engine.py"), found[0]


def test_doctor_reports_bad_environment_as_failures():
    out = run_ferry("doctor", FERRY_LOG="verbose", MC_TRANSFER_TIMEOUT="abc", MC_FORCE_TCP="yes")
    assert out.returncode == 1, out.stdout
    lines = out.stdout.splitlines()
    assert any(re.match(r"FAIL +FERRY_LOG .*\"verbose\".*debug, info, warn, error or off", l)
               for l in lines), out.stdout
    assert any(re.match(r"FAIL +MC_TRANSFER_TIMEOUT .*\"abc\".*whole seconds", l)
               for l in lines), out.stdout
    assert any(re.match(r"INFO +MC_FORCE_TCP +yes", l) for l in lines), out.stdout


@pytest.mark.parametrize("name, value, accepted", [
    ("FERRY_TRANSPORTS", "tpc", "tcp, shm, fabric or all"),
    ("FERRY_LOG", "verbose", "debug, info, warn, error or off"),
    ("MC_TRANSFER_TIMEOUT", "abc", "whole seconds, 1 to 4294967"),
    ("FERRY_SPIN_US", "abc", "microseconds, 0 to 10000"),
    ("MC_FORCE_TCP", "maybe", "1, 0, true, false, yes, no, on or off"),
])
def test_engine_refuses_bad_environment(monkeypatch, name, value, accepted):
    monkeypatch.setenv(name, value)
    with pytest.raises(ferry.Error) as info:
        ferry.Engine("127.0.0.1")
    assert info.value.code == ferry.EINVAL
    assert name in info.value.detail and '"%s"' % value in info.value.detail
    assert accepted in info.value.detail


def test_mooncake_initialize_refuses_bad_boolean(monkeypatch):
    from mooncake.engine import TransferEngine

    monkeypatch.setenv("MC_FORCE_TCP", "maybe")
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") < 0
    assert "MC_FORCE_TCP" in te.last_error()


def _transport_between_two_engines():
    with ferry.Engine("127.0.0.1") as a, ferry.Engine("127.0.0.1") as b:
        a.register(bytearray(4096))
        b.register(bytearray(4096))
        return ferry.transport_name(a.peer_transport(b.name))


@pytest.mark.parametrize("value, forced", [
    ("1", True), ("true", True), ("YES", True), ("on", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_boolean_spellings_in_c(monkeypatch, value, forced):
    """MC_FORCE_TCP is read by libferry itself: every spelling works there, as
    in the Python drop-in (same-host engines use shm unless tcp is forced)."""
    monkeypatch.delenv("FERRY_TRANSPORTS", raising=False)
    monkeypatch.setenv("MC_FORCE_TCP", value)
    assert _transport_between_two_engines() == ("tcp" if forced else "shm")


def _start(argv, ready_pattern, **env):
    proc = subprocess.Popen(argv, env=tool_env(**env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = LineReader(proc.stdout)
    line = out.get(30)
    m = re.search(ready_pattern, line or "")
    if not m:
        proc.kill()
        proc.wait(timeout=10)
        raise RuntimeError("%s did not start: %r %s" % (argv, line, proc.stderr.read()))
    return proc, m.group(1)


def _stop(proc):
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    proc.stdout.close()
    proc.stderr.close()


@pytest.mark.timeout_s(90)
def test_bench_interrupted_prints_the_partial_result():
    serve, target = _start([sys.executable, "-m", "ferry", "serve", "--host", "127.0.0.1",
                            "--port", "0", "--size", "8M"], r"ready target=(\S+)")
    bench = None
    try:
        bench = subprocess.Popen(
            [sys.executable, "-m", "ferry", "bench", "--target", target, "--block", "64K",
             "--duration", "600", "--json"], env=tool_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err = LineReader(bench.stderr)
        # Interrupt once a progress line shows bytes moved (every 5 s): on a
        # busy machine the first transfers may not have finished when the
        # timed run says it started.
        while True:
            line = err.get(60)
            assert line is not None, "bench printed no progress with bytes moved"
            moved = re.search(r": \d+ s: (\d+) MB", line)
            if moved and int(moved.group(1)) > 0:
                break
        bench.send_signal(signal.SIGINT)
        assert bench.wait(timeout=30) == 130
        result = json.loads(bench.stdout.read())
        assert result["interrupted"] is True
        assert 0 < result["seconds"] < 600
        assert result["bytes"] > 0 and result["errors"] == 0
        assert result["gbytes_per_s"] == result["gbps"] > 0
        assert result["gbytes_per_s"] == pytest.approx(  # printed rounded: %.4f, %.6f
            result["bytes"] / result["seconds"] / 1e9, rel=0.01, abs=1e-3)
    finally:
        if bench is not None:
            if bench.poll() is None:
                bench.kill()
                bench.wait(timeout=10)
            bench.stdout.close()
            bench.stderr.close()
        _stop(serve)


def _http(method, url, data=None):
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_mooncake_http_metadata_server():
    """What SGLang's and vLLM's docs start beside the engine, same path and
    answers as Mooncake's."""
    proc, url = _start([sys.executable, "-m", "mooncake.http_metadata_server", "--port", "0"],
                       r"url=(\S+)")
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metadata")
        assert _http("GET", url)[0] == 400
        assert _http("GET", url + "?key=")[0] == 400
        assert _http("GET", url + "?key=unknown")[0] == 404
        assert _http("PUT", url + "?key=k", b"v1")[0] == 200
        assert _http("GET", url + "?key=k") == (200, b"v1")
    finally:
        _stop(proc)
