"""test_epd_examples.py - runs examples/epd: an encoder process hands
float16 embeddings (256..4096 tokens x 4096) to a prefill process's ferry
pool, with the request id and the prefill's name carried over HTTP, gRPC
and ZMQ; the prefill checks every byte. The faults of issue 15: the prefill
restarted (http, grpc), its pool full (every plane: "nowait" refused with
FERRY_EBUSY, a waiting send let through by a release), an embedding larger
than the pool (zmq), and the encoder SIGKILLed mid-send (http, grpc; shm
and tcp). A control plane whose Debian package is missing (python3-grpcio,
python3-zmq) shows as skipped."""

import importlib.util
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EPD = os.path.join(ROOT, "examples", "epd")
MODULES = {"http": "http.server", "grpc": "grpc", "zmq": "zmq"}


ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + EPD)


def need_plane(plane):
    if importlib.util.find_spec(MODULES[plane]) is None:
        pytest.skip(f"{MODULES[plane]} is not installed (scripts/install-deps.sh installs it)")


def start_encoder(plane, *extra, env=ENV):
    """encoder.py on plane; returns the process and its control address."""
    proc = subprocess.Popen([sys.executable, os.path.join(EPD, "encoder.py"), "--plane", plane, *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    ready = proc.stdout.readline().split()
    assert ready and ready[0] == "READY", f"encoder did not start: {ready}"
    return proc, f"127.0.0.1:{ready[1]}"


def stop(proc):
    if proc.poll() is None:
        proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def encoder(request):
    """Starts encoder.py on request.param's plane; yields its control address."""
    need_plane(request.param)
    proc, address = start_encoder(request.param)
    try:
        yield request.param, address
    finally:
        stop(proc)


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
@pytest.mark.parametrize("encoder", ["grpc", "http"], indirect=True)
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


# Embeddings of 4096 tokens (32 MiB) only: two fill the prefill's 80 MiB pool
# and leave no room for a pre-grant, so a granted slot is a send in flight.
FULL = ("--min-tokens", "4096", "--max-tokens", "4096")


@pytest.mark.timeout_s(120)
@pytest.mark.parametrize("plane", sorted(MODULES))
def test_epd_pool_full(plane):
    """The prefill holds what it got: a "nowait" request is refused with
    FERRY_EBUSY naming the pool, reported over the control plane; asked
    again, the encoder's send waits for room and goes through once the
    prefill releases a message."""
    need_plane(plane)
    proc, address = start_encoder(plane, *FULL)
    try:
        prefill = run_prefill(plane, address, *FULL, "--fill-pool")
    finally:
        stop(proc)
    out = prefill.stdout
    assert f"{plane}-req-2: pool full with 2 held: " in out, out
    assert "pool 'embeddings' of 127.0.0.1:" in out and "is full" in out and "waited 0 ms" in out, out
    assert f"{plane}-req-2: the encoder waits for room; releasing {plane}-req-0" in out, out
    assert f"{plane}-req-2: 4096 x 4096 float16 verified" in out, out


def metric(port, series):
    """A value from the prefill's /metrics (series: the name and its labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(series + " "):
                return int(line.split()[1])
    raise AssertionError(f"{series} is not on /metrics")


def granted(port):
    return metric(port, "ferry_pool_bytes_granted")


def written(port):
    """Bytes the prefill took in from WRITE frames over tcp: messages of 32
    MiB each, whole once they landed."""
    return metric(port, 'ferry_served_bytes_total{op="write",transport="tcp"}')


def kill_mid_send(encoder, prefill, metrics_port, in_flight, limit_s=60):
    """SIGKILLs the encoder while in_flight(metrics_port): the prefill's pool
    holds a slot granted to it and not landed (no pre-grant exists with
    FULL), and over tcp some of its bytes landed. It watches the prefill,
    stops the encoder, and kills it only if that still holds while it is
    stopped; else it lets it go on and watches again. Returns how many
    stops came too late."""
    missed, deadline = 0, time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert prefill.poll() is None, "the prefill ended before a send was caught in flight"
        if in_flight(metrics_port):
            os.kill(encoder.pid, signal.SIGSTOP)
            if in_flight(metrics_port):
                os.kill(encoder.pid, signal.SIGKILL)
                encoder.wait(timeout=30)
                return missed
            os.kill(encoder.pid, signal.SIGCONT)
            missed += 1
        time.sleep(0.001)  # a poll of the gauge, not an ordering: the stop confirms
    raise AssertionError(f"no send caught in flight in {limit_s} s ({missed} stops too late)")


class Prefill:
    """prefill.py run with a fault, read line by line on a thread."""

    def __init__(self, plane, address, env, tmp_path, *extra):
        self.stderr = open(tmp_path / "prefill.err", "w+")
        self.proc = subprocess.Popen([sys.executable, os.path.join(EPD, "prefill.py"), "--plane", plane,
                                      "--encoder", address, *extra],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     env=env, text=True)
        self.seen, self.lines = [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def output(self):
        self.stderr.seek(0)
        return "\n".join(self.seen) + "\n--- stderr:\n" + self.stderr.read()

    def until(self, start):
        """The next line that starts with start (the ones before are kept in seen)."""
        while True:
            line = self.lines.get(timeout=60)
            assert line is not None, f"the prefill ended (rc {self.proc.wait()}):\n{self.output()}"
            self.seen.append(line)
            if line.startswith(start):
                return line

    def finish(self):
        rc = self.proc.wait(timeout=60)
        while (line := self.lines.get(timeout=10)) is not None:
            self.seen.append(line)
        assert rc == 0, self.output()
        return "\n".join(self.seen)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.stderr.close()


KILL_TRIES = 5  # encoders killed with their send landed anyway (tcp buffers drained) before we fail


@pytest.mark.timeout_s(150)
@pytest.mark.parametrize("plane,transports", [("http", "all"), ("grpc", "all"), ("http", "tcp")])
def test_epd_encoder_killed_mid_send(plane, transports, tmp_path):
    """SIGKILL of the encoder while its ferry.send of a 32 MiB embedding is in
    flight: nothing of it is delivered (the prefill's recv times out with
    FERRY_ETIMEDOUT naming tag and pool), its slot comes back to the pool
    (pool_bytes_granted 0), and a new encoder delivers the same request id,
    verified. "all" lets the two processes use shm (same host); "tcp" cuts
    a WRITE frame mid-payload. ZMQ is left out: its REQ socket never sees
    the encoder die, so the prefill would only learn it from its timeout."""
    need_plane(plane)
    if transports == "tcp":
        def in_flight(port):  # granted, and part of a message's WRITE frames landed
            return granted(port) and written(port) % (32 << 20)
    else:  # shm: the encoder copies into the pool itself, unseen by the prefill
        in_flight = granted
    env = dict(ENV, FERRY_TRANSPORTS=transports)
    encoder, address = start_encoder(plane, *FULL, env=env)
    prefill = Prefill(plane, address, dict(env, FERRY_METRICS_PORT="0"), tmp_path,
                      "--count", "200", *FULL, "--replace-lost-encoder")
    try:
        metrics_port = int(prefill.until("METRICS ").split()[1])
        for _ in range(KILL_TRIES):
            kill_mid_send(encoder, prefill.proc, metrics_port, in_flight)
            prefill.until("NEED ENCODER")
            encoder, address = start_encoder(plane, *FULL, env=env)
            prefill.proc.stdin.write(address + "\n")
            prefill.proc.stdin.flush()
            lost = next((line for line in prefill.seen if line.startswith("LOST ")), None)
            if lost:
                break
        assert lost, f"{KILL_TRIES} encoders killed, every send had landed:\n{prefill.output()}"
        request_id = lost.split()[1].rstrip(":")
        out = prefill.finish()
        assert "timed out" in lost and f"'{request_id}'" in lost and "'embeddings'" in lost, out
        assert f"{request_id}: 4096 x 4096 float16 verified" in out.split(lost, 1)[1], out
    finally:
        prefill.close()
        stop(encoder)
