"""stores.py - real metadata stores for the Python tests: one redis-server
or single-member etcd (Debian's) on a loopback port the test picks, with its
data under a temporary folder, killed at the end even when the test fails."""

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import free_port


class Store:
    """One redis-server or single-member etcd on 127.0.0.1."""

    def __init__(self, kind, password=None):
        self.kind = kind
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="ferry-pystore-")
        self.port = free_port()
        if kind == "redis":
            args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                    "--dir", self.dir, "--save", "", "--appendonly", "no"]
            if password:
                args += ["--requirepass", password]
            self.url = "redis://127.0.0.1:%d" % self.port
        else:
            peer = "http://127.0.0.1:%d" % free_port()
            client = "http://127.0.0.1:%d" % self.port
            args = ["etcd", "--name", "m0", "--data-dir", os.path.join(self.dir, "m0"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", "m0=" + peer, "--log-level", "error"]
            self.url = "etcd://127.0.0.1:%d" % self.port
        self.args = args
        self._start()

    def _start(self):
        with open(os.path.join(self.dir, "log"), "a") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL)
        self._wait_ready()

    def restart(self):
        """Kills the store and starts it again on its port with its data (an
        etcd member that died and came back)."""
        self.proc.kill()
        self.proc.wait(timeout=10)
        self._start()

    def _answers(self):
        if self.kind == "redis":
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        req = urllib.request.Request("http://127.0.0.1:%d/v3/kv/range" % self.port,
                                     data=b'{"key":"eA=="}', method="POST")
        with urllib.request.urlopen(req, timeout=1) as r:
            return r.status == 200

    def _wait_ready(self):
        deadline = time.monotonic() + 60  # a process's start: not what is tested
        while time.monotonic() < deadline:
            try:
                if self._answers():
                    return
            except OSError:
                pass
            time.sleep(0.05)  # a process we do not control: nothing to wait on
        self.stop()
        raise RuntimeError("%s did not become ready" % self.kind)

    def has(self, key):
        if self.kind == "redis":
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                if self.password:
                    s.sendall(b"AUTH %s\r\n" % self.password.encode())
                    assert s.recv(64).startswith(b"+OK")
                s.sendall(b"EXISTS %s\r\n" % key.encode())
                return s.recv(64).startswith(b":1")
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        req = urllib.request.Request("http://127.0.0.1:%d/v3/kv/range" % self.port,
                                     data=body, method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            return bool(json.loads(r.read()).get("kvs"))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def need(binary):
    if not shutil.which(binary):
        pytest.skip("%s is not installed (scripts/install-deps.sh)" % binary)
