"""test_epd_examples.py - runs examples/epd: an encoder process hands
float16 embeddings (256..4096 tokens x 4096) to a prefill process's ferry
pool, with the request id and the prefill's name carried over HTTP, gRPC
and ZMQ; the prefill checks every byte. A control plane whose Debian
package is missing (python3-grpcio, python3-zmq) shows as skipped."""

import importlib.util
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EPD = os.path.join(ROOT, "examples", "epd")
MODULES = {"http": "http.server", "grpc": "grpc", "zmq": "zmq"}


@pytest.mark.timeout_s(180)
@pytest.mark.parametrize("plane", sorted(MODULES))
def test_epd_handoff(plane):
    if importlib.util.find_spec(MODULES[plane]) is None:
        pytest.skip(f"{MODULES[plane]} is not installed (scripts/install-deps.sh installs it)")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + EPD)
    encoder = subprocess.Popen([sys.executable, os.path.join(EPD, "encoder.py"), "--plane", plane],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        ready = encoder.stdout.readline().split()
        assert ready and ready[0] == "READY", f"encoder did not start: {ready}"
        prefill = subprocess.run([sys.executable, os.path.join(EPD, "prefill.py"), "--plane", plane,
                                  "--encoder", f"127.0.0.1:{ready[1]}", "--count", "3"],
                                 env=env, capture_output=True, text=True, timeout=150)
        assert prefill.returncode == 0, prefill.stdout + prefill.stderr
        assert "verified 3" in prefill.stdout
    finally:
        encoder.stdin.close()
        encoder.wait(timeout=30)
