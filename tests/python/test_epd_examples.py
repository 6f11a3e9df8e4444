"""test_epd_examples.py - runs examples/epd: an encoder process hands
float16 embeddings (256..4096 tokens x 4096) to a prefill process's ferry
pool, with the request id and the prefill's name carried over HTTP, gRPC
and ZMQ; the prefill checks every byte, also after it restarted. A control plane whose Debian
package is missing (python3-grpcio, python3-zmq) shows as skipped."""

import importlib.util
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EPD = os.path.join(ROOT, "examples", "epd")
MODULES = {"http": "http.server", "grpc": "grpc", "zmq": "zmq"}


ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + EPD)


@pytest.fixture
def encoder(request):
    """Starts encoder.py on request.param's plane; yields its control address."""
    plane = request.param
    if importlib.util.find_spec(MODULES[plane]) is None:
        pytest.skip(f"{MODULES[plane]} is not installed (scripts/install-deps.sh installs it)")
    proc = subprocess.Popen([sys.executable, os.path.join(EPD, "encoder.py"), "--plane", plane],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV, text=True)
    try:
        ready = proc.stdout.readline().split()
        assert ready and ready[0] == "READY", f"encoder did not start: {ready}"
        yield plane, f"127.0.0.1:{ready[1]}"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def run_prefill(plane, address, *extra, ok=True):
    prefill = subprocess.run([sys.executable, os.path.join(EPD, "prefill.py"), "--plane", plane,
                              "--encoder", address, "--count", "3", *extra],
                             env=ENV, capture_output=True, text=True, timeout=150)
    if ok:
        assert prefill.returncode == 0, prefill.stdout + prefill.stderr
        assert "verified 3" in prefill.stdout
    return prefill


@pytest.mark.timeout_s(180)
@pytest.mark.parametrize("encoder", sorted(MODULES), indirect=True)
def test_epd_handoff(encoder):
    run_prefill(*encoder)


@pytest.mark.timeout_s(180)
@pytest.mark.parametrize("encoder", ["http"], indirect=True)
def test_epd_prefill_restarted(encoder):
    """A new prefill process under the same name (port): the encoder, which
    still knows the old one, reaches the new one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    run_prefill(*encoder, "--port", port)
    run_prefill(*encoder, "--port", port, "--first", "3")


@pytest.mark.timeout_s(120)
@pytest.mark.parametrize("encoder", ["zmq"], indirect=True)
def test_epd_embedding_larger_than_pool(encoder):
    """A pool smaller than one embedding: the encoder's send fails at once
    with a reason naming the pool, and the prefill reports it."""
    prefill = run_prefill(*encoder, "--pool-mb", "1", ok=False)
    assert prefill.returncode != 0
    assert "does not fit pool 'embeddings'" in prefill.stderr, prefill.stderr
