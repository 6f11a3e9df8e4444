"""test_mooncake_dummy.py - Mooncake's dummy-client mode on ferry (docs/store.md,
"Dummy clients"): a `ferry store-master`, a real client (`python -m
mooncake.mooncake_client`) and dummies (`setup_dummy`) in this process and in
others, all on loopback: every byte a dummy moves checked; two dummies on
one real client; a dummy killed mid-put; a peer stalled mid-frame; the real
client killed or stopped under a dummy, and restarted (the dummy reconnects
and shares its buffers again); a wrong secret; bad arguments. And the master's embedded
http metadata store (--enable_http_metadata_server)."""

import ctypes
import fcntl
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.request

import pytest

from test_mooncake_store import MiB, start_master, stop_master, tool_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, "..", "..", "python")
sys.path.insert(0, PYTHON_DIR)

import ferry  # noqa: E402
from mooncake import _dummy_ipc as ipc  # noqa: E402
from mooncake.store import MooncakeDistributedStore  # noqa: E402


def start_real_client(master_addr, *flags, env=None, port=None):
    """A mooncake_client process on a free --port, or on port: (process,
    port); process.segment is its segment's name."""
    fixed = port
    for _ in range(1 if fixed else 20):
        port = fixed or random.randint(20000, 60000)
        proc = subprocess.Popen(
            [sys.executable, "-m", "mooncake.mooncake_client", "--port=%d" % port,
             "--master_server_address=%s" % master_addr, "--metadata_server=P2PHANDSHAKE",
             "--global_segment_size=64MB"] + list(flags),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=PYTHON_DIR, **(env or {})))
        line = proc.stdout.readline()
        if line.startswith("ready mooncake_client="):
            proc.segment = line.split("segment=")[1].strip()
            return proc, port
        err = proc.communicate(timeout=30)[1]
        if "cannot listen" not in err:
            raise RuntimeError("mooncake_client did not start: %r %s" % (line, err))
    raise RuntimeError("no free --port for mooncake_client")


def stop(proc):
    """SIGTERM, then SIGKILL if it is still there 20 s later (a failed test
    must not leave a real client behind)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
    try:
        proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=20)
        raise


@pytest.fixture
def master():
    proc, addr = start_master("--default_kv_lease_ttl=500")
    yield addr
    stop_master(proc)


@pytest.fixture
def real_client(master):
    proc, port = start_real_client(master)
    yield port
    stop(proc)


def dummy(port, pool=64 * MiB, local=16 * MiB):
    store = MooncakeDistributedStore()
    assert store.setup_dummy(pool, local, "127.0.0.1:%d" % port) == 0
    return store


def pattern(seed, size):
    return random.Random(seed).randbytes(size)


def shared(store, data):
    """An alloc_from_mem_pool buffer holding data, registered: its address."""
    addr = store.alloc_from_mem_pool(len(data))
    assert addr
    ctypes.memmove(addr, data, len(data))
    assert store.register_buffer(addr, len(data)) == 0
    return addr


def run_dummy(port, code, env=None):
    """A dummy in a process of its own running code (store: its store);
    its stdin and stdout are pipes."""
    prologue = ("import ctypes, random, sys\n"
                "from mooncake.store import MooncakeDistributedStore\n"
                "store = MooncakeDistributedStore()\n"
                "assert store.setup_dummy(256 << 20, 16 << 20, '127.0.0.1:%d') == 0\n" % port)
    return subprocess.Popen([sys.executable, "-c", prologue + code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=PYTHON_DIR, **(env or {})))


def test_a_dummy_moves_every_byte(real_client):
    store = dummy(real_client)
    try:
        value = pattern(1, 3 * MiB + 17)
        assert store.put("d/one", value) == 0
        assert store.get_size("d/one") == len(value)
        assert store.get("d/one") == value
        assert store.upsert("d/one", value[::-1]) == 0
        assert store.get("d/one") == value[::-1]

        values = [pattern(10 + i, 1000 * i + 1) for i in range(8)]
        keys = ["d/batch%d" % i for i in range(8)]
        assert store.put_batch(keys, values) == 0
        assert store.batch_is_exist(keys + ["d/absent"]) == [1] * 8 + [0]
        assert [bytes(h) for h in store.batch_get_buffer(keys)] == values

        # Zero-copy: shared buffers, whole values, several buffers per key, ranges.
        src = shared(store, b"".join(values))
        sizes = [len(v) for v in values]
        offsets = [sum(sizes[:i]) for i in range(8)]
        keys2 = ["d/from%d" % i for i in range(8)]
        assert store.batch_put_from(keys2, [src + o for o in offsets], sizes) == [0] * 8
        dst = shared(store, bytes(sum(sizes)))
        assert store.batch_get_into(keys2, [dst + o for o in offsets], sizes) == sizes
        assert ctypes.string_at(dst, sum(sizes)) == b"".join(values)

        assert store.batch_put_from_multi_buffers(["d/multi"], [[src, src + offsets[3]]],
                                                  [[sizes[0], sizes[3]]]) == [0]
        ctypes.memset(dst, 0, sum(sizes))
        assert store.batch_get_into_multi_buffers(["d/multi"], [[dst + 20000, dst]],
                                                  [[sizes[0], sizes[3]]]) == [sizes[0] + sizes[3]]
        joined = values[0] + values[3]
        assert ctypes.string_at(dst + 20000, sizes[0]) == joined[:sizes[0]]
        assert ctypes.string_at(dst, sizes[3]) == joined[sizes[0]:]

        ctypes.memset(dst, 0, 64)
        assert store.get_into_ranges([dst], [["d/one", "d/batch7"]], [[[0], [10]]],
                                     [[[5], [3000]]], [[[4], [20]]]) == [[[4], [20]]]
        assert ctypes.string_at(dst, 4) == value[::-1][5:9]
        assert ctypes.string_at(dst + 10, 20) == values[7][3000:3020]

        assert store.get_hostname()  # the real client's segment
        assert store.put("d/clear", value) == 0  # not read: no lease holds it
        assert store.batch_replica_clear(["d/clear", "d/absent"],
                                         segment_name=store.get_hostname()) == ["d/clear"]
        assert store.is_exist("d/clear") == 0
        assert store._dummy.status() == {"dummies": 1, "regions": 3}  # local buffer + 2
        assert store.unregister_buffer(src) == 0
        assert store._dummy.status()["regions"] == 2
        for key in ["d/one", "d/multi"] + keys + keys2:
            assert store.remove(key) in (0, -706)
    finally:
        store.close()


def test_two_dummies_share_one_real_client(real_client):
    a = dummy(real_client)
    try:
        b = run_dummy(real_client, (
            "data = bytes(random.Random(7).randbytes(1 << 20))\n"
            "addr = store.alloc_from_mem_pool(len(data))\n"
            "ctypes.memmove(addr, data, len(data))\n"
            "assert store.register_buffer(addr, len(data)) == 0\n"
            "assert store.put_from('two/from_b', addr, len(data)) == 0\n"
            "assert store.put('two/put_b', data[:1000]) == 0\n"
            "print(store.get_hostname(), flush=True)\n"
            "assert sys.stdin.readline() == 'go\\n'\n"
            "assert store.get('two/from_a') == b'from a' * 1000\n"))
        hostname = b.stdout.readline().strip()
        assert hostname == a.get_hostname()
        data = pattern(7, 1 << 20)
        dst = shared(a, bytes(len(data)))
        assert a.get_into("two/from_b", dst, len(data)) == len(data)
        assert ctypes.string_at(dst, len(data)) == data
        assert a.get("two/put_b") == data[:1000]
        assert a._dummy.status()["dummies"] == 2
        assert a.put("two/from_a", b"from a" * 1000) == 0
        b.stdin.write("go\n")
        b.stdin.close()
        assert b.wait(timeout=60) == 0
    finally:
        a.close()


def test_a_dummy_killed_mid_put_leaves_nothing_and_the_real_client_serves_on(real_client):
    a = dummy(real_client)
    try:
        size = 8 * MiB
        b = run_dummy(real_client, (
            "addr = store.alloc_from_mem_pool(%d)\n"
            "assert store.register_buffer(addr, %d) == 0\n"
            "for i in range(1000):\n"
            "    ctypes.memset(addr, i & 0xff, %d)\n"
            "    print('putting', i, flush=True)\n"
            "    store.put_from('kill/%%d' %% i, addr, %d)\n" % (size, size, size, size)))
        for _ in range(3):
            assert b.stdout.readline().startswith("putting")
        b.kill()
        b.wait(timeout=30)
        # The real client saw it go: its regions released once its last request ended.
        status = a._dummy.status()
        for _ in range(200):
            if status == {"dummies": 1, "regions": 1}:
                break
            time.sleep(0.05)
            status = a._dummy.status()
        assert status == {"dummies": 1, "regions": 1}
        # A value is whole or absent.
        dst = shared(a, bytes(size))
        for i in range(4):
            got = a.get_into("kill/%d" % i, dst, size)
            assert got in (size, -704)
            if got == size:
                assert ctypes.string_at(dst, size) == bytes([i & 0xFF]) * size

        # A request cut short on the wire is dropped whole; the others go on.
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect(ipc.socket_name(real_client))
        ipc.recv(raw)
        ipc.send(raw, {"op": "hello", "version": ipc.VERSION, "nonce": "00", "proof": None})
        assert "ok" in ipc.recv(raw)[0]
        body = b'{"op":"put_from","keys":["kill/cut"],"addrs":[1],"sizes":[1],"rep":[1,null,0]}'
        raw.sendall(len(body).to_bytes(4, "little") + body[:20])
        raw.close()
        assert a.put("kill/after", b"still serving") == 0
        assert a.get("kill/after") == b"still serving"
        assert a.is_exist("kill/cut") == 0
    finally:
        a.close()


def in_time(fn, limit):
    """fn() run on a thread that must end within limit seconds (a call
    that hangs fails the test instead of hanging it): fn's result."""
    out = []

    def run():
        try:
            out.append(fn())
        except BaseException as e:  # raised here, on the test's thread
            out.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), "the call did not end within %s s" % limit
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def unread(sock):
    """Bytes sent on sock that its peer has not read yet (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock, termios.TIOCOUTQ, b"\0" * 4))[0]


def pause(proc):
    """SIGSTOP, returning once every thread of proc is stopped (the signal
    is delivered asynchronously)."""
    proc.send_signal(signal.SIGSTOP)
    task = "/proc/%d/task" % proc.pid
    deadline = time.monotonic() + 10
    while not all(open("%s/%s/stat" % (task, t)).read().rsplit(")", 1)[1].split()[0] == "T"
                  for t in os.listdir(task)):
        assert time.monotonic() < deadline, "pid %d did not stop" % proc.pid
        time.sleep(0.01)


def kill(proc):
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait(timeout=30)


def test_the_real_client_dying_fails_calls_clearly(master, caplog, monkeypatch):
    monkeypatch.setenv("FERRY_DUMMY_TIMEOUT_S", "1")
    proc, port = start_real_client(master)
    store = dummy(port)
    try:
        assert store.put("gone/k", b"v") == 0
        pause(proc)  # stopped: no answer comes, the call must not hang
        started = time.monotonic()
        assert store.get("gone/k") == b""
        assert time.monotonic() - started < 10
        assert "no answer within the timeout" in caplog.text
        assert store.put("gone/k2", b"v") == -900  # the connection stays failed
    finally:
        store.close()
        stop(proc)

    proc, port = start_real_client(master)
    store = dummy(port)
    try:
        proc.kill()  # killed: the socket closes, calls fail at once
        proc.wait(timeout=30)
        caplog.clear()
        assert store.put("gone/k3", b"v") == -900
        assert store.batch_is_exist(["gone/k3"]) == [-900]
        assert "real client (mooncake_client) at @ferry-mooncake-client-%d" % port in caplog.text
        assert "the next call tries again" in caplog.text
    finally:
        store.close()
        stop(proc)


def test_a_dummy_reconnects_to_its_restarted_real_client(master, caplog, monkeypatch):
    """The real client killed under a call in flight, killed between calls,
    down for a call, restarted on the same --port: the call in flight fails
    naming it, the call while it is down fails within FERRY_DUMMY_RECONNECT_S,
    and the first call after each restart works on the buffers registered
    before (shared again by the reconnect)."""
    monkeypatch.setenv("FERRY_DUMMY_RECONNECT_S", "0.5")
    proc, port = start_real_client(master)
    store = dummy(port)
    address = "@ferry-mooncake-client-%d" % port
    try:
        size = 2 * MiB + 3
        src = shared(store, pattern(21, size))
        dst = shared(store, bytes(size))
        assert store.put("re/before", b"v") == 0

        # A call in flight: its request is on the socket, unread (the real
        # client stopped), when the real client is killed.
        pause(proc)
        caplog.clear()
        t = threading.Thread(target=lambda: results.append(
            store.batch_put_from(["re/inflight"], [src], [size])), daemon=True)
        results = []
        t.start()
        sock = None
        while sock is None or unread(sock) == 0:  # the request is sent (bounded below)
            assert t.is_alive()
            sock = store._dummy.sock
            time.sleep(0.01)
        kill(proc)
        t.join(10)
        assert not t.is_alive() and results == [[-900]]
        # "the connection was closed", or "Connection reset by peer" when the
        # request was still unread in the killed process's socket.
        assert re.search(r"the real client \(mooncake_client\) at %s: .* during put_from; the "
                         r"call failed and is not sent again" % address, caplog.text)

        # Down: each call fails, naming it, after a bounded retry.
        caplog.clear()
        started = time.monotonic()
        assert in_time(lambda: store.put("re/down", b"v"), 10) == -900
        assert time.monotonic() - started < 5
        assert "%s is not back: Connection refused" % address in caplog.text
        assert in_time(lambda: store.batch_get_into(["re/before"], [dst], [1]), 10) == [-900]

        for round in range(2):
            proc, _ = start_real_client(master, port=port)
            # The first call after the restart works, on memory registered before.
            value = pattern(22 + round, size)
            ctypes.memmove(src, value, size)
            assert store.batch_put_from(["re/after%d" % round], [src], [size]) == [0]
            ctypes.memset(dst, 0, size)
            assert store.batch_get_into(["re/after%d" % round], [dst], [size]) == [size]
            assert ctypes.string_at(dst, size) == value
            assert store.put("re/put%d" % round, b"through the local buffer") == 0
            assert store.get("re/put%d" % round) == b"through the local buffer"
            assert store.get_hostname() == proc.segment
            assert store._dummy.status() == {"dummies": 1, "regions": 3}
            # The second round's kill comes between calls: the next call finds
            # the connection closed before it sends anything, and reconnects.
            kill(proc)
        # A buffer unregistered while the real client is down stays so.
        assert store.unregister_buffer(src) == 0
        proc, _ = start_real_client(master, port=port)
        assert store.batch_put_from(["re/unreg"], [src], [size]) == [-600]
        assert store._dummy.status() == {"dummies": 1, "regions": 2}
    finally:
        store.close()
        stop(proc)


def test_the_real_client_drops_a_dummy_stalled_mid_frame(master):
    """A peer that stalls inside a frame, or in the handshake, is dropped
    after FERRY_DUMMY_TIMEOUT_S and its shared memory released; a dummy idle
    between requests longer than that keeps its connection."""
    proc, port = start_real_client(master, env={"FERRY_DUMMY_TIMEOUT_S": "1"})
    a = dummy(port)
    try:
        before = a._dummy.sock
        stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stalled.connect(ipc.socket_name(port))
        ipc.recv(stalled)
        ipc.send(stalled, {"op": "hello", "version": ipc.VERSION, "nonce": "00", "proof": None})
        assert "ok" in ipc.recv(stalled)[0]
        fd, addr = ipc.new_shared(4096, "stalled")
        ipc.send(stalled, {"op": "register", "addr": addr, "size": 4096}, fd)
        assert ipc.recv(stalled)[0] == {"ok": 0}
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(ipc.socket_name(port))
        assert "hello" in ipc.recv(silent)[0]  # and says nothing back
        assert a._dummy.status() == {"dummies": 3, "regions": 2}
        body = b'{"op":"exists","keys":["k"]}'
        stalled.sendall(len(body).to_bytes(4, "little") + body[:10])
        for peer in (stalled, silent):
            peer.settimeout(20)
            assert peer.recv(1) == b""  # the real client closed it
            peer.close()
        assert a._dummy.status() == {"dummies": 1, "regions": 1}
        assert a._dummy.sock is before  # idle meanwhile, not dropped
        assert a.put("stall/k", b"v") == 0 and a.get("stall/k") == b"v"
        ipc.unmap(addr, 4096)
        os.close(fd)
    finally:
        a.close()
        stop(proc)


def stand_in(port, serve):
    """A raw listener at the real client's socket name (it died): serve(conn)
    runs on a thread for the first connection. Returns the listener (to
    close) and the thread."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(ipc.socket_name(port))
    sock.listen(1)

    def run():
        conn, _ = sock.accept()
        serve(conn)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return sock, t


def test_a_reconnect_checks_the_secret_again(monkeypatch, caplog):
    """A process holding the real client's socket after it died, without
    the secret (a raw peer here), is refused at the reconnect; the real
    client restarted, the next call works."""
    monkeypatch.setenv("FERRY_SECRET", "right-secret")
    mproc, addr = start_master("--default_kv_lease_ttl=500")
    proc, port = start_real_client(addr)
    store = dummy(port)
    try:
        assert store.put("resecret/k", b"v") == 0
        kill(proc)
        def pretend(conn):
            ipc.send(conn, {"hello": "ferry-mooncake-client", "version": ipc.VERSION,
                            "nonce": "00", "auth": True})
            ipc.recv(conn)
            ipc.send(conn, {"ok": {"segment": "impostor", "proof": "00" * 32}})
            conn.close()
        impostor, t = stand_in(port, pretend)
        caplog.clear()
        assert in_time(lambda: store.put("resecret/k", b"v"), 20) < 0
        t.join(10)
        assert "reconnecting: the real client at @ferry-mooncake-client-%d did not prove the " \
               "shared secret" % port in caplog.text
        assert store.get_hostname() != "impostor"
        impostor.close()
        proc, _ = start_real_client(addr, port=port)
        assert store.put("resecret/k", b"v") == 0 and store.get("resecret/k") == b"v"
        assert store.get_hostname() == proc.segment
    finally:
        store.close()
        stop(proc)
        stop_master(mproc)


def test_a_region_the_new_real_client_refuses_is_left_unregistered(master, caplog):
    """At a reconnect, a region the real client refuses is left unregistered
    (a WARN names it) and the call goes on; register_buffer shares it again."""
    proc, port = start_real_client(master)
    store = dummy(port)
    try:
        ok = shared(store, pattern(31, 4096))
        refused = shared(store, pattern(32, 4096))
        kill(proc)
        def serve(conn):
            ipc.send(conn, {"hello": "ferry-mooncake-client", "version": ipc.VERSION,
                            "nonce": "00", "auth": False})
            ipc.recv(conn)
            ipc.send(conn, {"ok": {"segment": "fake", "proof": None}})
            while True:
                msg, fds = ipc.recv(conn)
                for fd in fds:
                    os.close(fd)
                if msg["op"] == "register" and msg["addr"] == refused:
                    ipc.send(conn, {"error": [ferry.EINVAL, "no room for it"]})
                elif msg["op"] == "register":
                    ipc.send(conn, {"ok": 0})
                else:
                    ipc.send(conn, {"ok": [[1] * len(msg["keys"]), None]})
                    conn.close()
                    return
        fake, t = stand_in(port, serve)
        caplog.clear()
        assert in_time(lambda: store.batch_is_exist(["k"]), 20) == [1]
        t.join(10)
        fake.close()
        assert "refused region %#x (+4096 bytes) on reconnect: no room for it" % refused \
            in caplog.text
        proc, _ = start_real_client(master, port=port)
        assert store.batch_put_from(["refused/a", "refused/b"], [ok, refused],
                                    [4096, 4096]) == [0, -600]
        assert store.register_buffer(refused, 4096) == 0
        assert store.batch_put_from(["refused/b"], [refused], [4096]) == [0]
    finally:
        store.close()
        stop(proc)


def test_a_dummy_without_the_secret_is_refused(monkeypatch, caplog):
    env = {"FERRY_SECRET": "right-secret"}
    monkeypatch.setenv("FERRY_SECRET", "right-secret")
    mproc, addr = start_master("--default_kv_lease_ttl=500")
    proc, port = start_real_client(addr, env=env)
    try:
        store = dummy(port)  # the right secret
        assert store.put("secret/k", b"v") == 0
        store.close()
        # The real client refuses a wrong proof itself (a dummy checks the real
        # client's proof too: below), and a peer that skips the handshake.
        for hello in ({"op": "hello", "version": ipc.VERSION, "nonce": "00", "proof": "00" * 32},
                      {"op": "remove_all"}):
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.connect(ipc.socket_name(port))
            assert ipc.recv(raw)[0]["auth"] is True
            ipc.send(raw, hello)
            assert "error" in ipc.recv(raw)[0]
            raw.close()
        for wrong in ("wrong-secret", None):
            if wrong:
                monkeypatch.setenv("FERRY_SECRET", wrong)
            else:
                monkeypatch.delenv("FERRY_SECRET")
            caplog.clear()
            store = MooncakeDistributedStore()
            assert store.setup_dummy(MiB, MiB, "127.0.0.1:%d" % port) == -900
            assert "refused the shared secret's proof" in caplog.text
    finally:
        stop(proc)
        stop_master(mproc)


def test_bad_arguments_are_refused_by_name(real_client, master, caplog):
    store = MooncakeDistributedStore()
    assert store.setup_dummy(MiB, MiB, "127.0.0.1") == -600  # no port
    assert store.setup_dummy(MiB, "lots", "127.0.0.1:%d" % real_client) == -600
    assert store.alloc_from_mem_pool(100) == 0  # not a dummy
    free_port = real_client + 1 if real_client < 60000 else real_client - 1
    caplog.clear()
    assert store.setup_dummy(MiB, MiB, "127.0.0.1:%d" % free_port) == -900
    assert "cannot reach the real client at @ferry-mooncake-client-%d" % free_port in caplog.text

    store = dummy(real_client, pool=4 * MiB, local=MiB)
    try:
        assert store.setup_dummy(MiB, MiB, "127.0.0.1:%d" % real_client) == -600  # twice
        assert store.alloc_from_mem_pool(8 * MiB) == 0  # past mem_pool_size
        assert store.put("bad/big", bytes(MiB + 1)) == -600  # past local_buffer_size
        private = ctypes.create_string_buffer(4096)
        assert store.register_buffer(ctypes.addressof(private), 4096) == -600
        addr = store.alloc_from_mem_pool(4096)
        assert store.register_buffer(addr, 2048) == -600  # not the whole allocation
        assert store.register_buffer(addr, 4096) == 0
        caplog.clear()
        # A range that starts in shared memory and runs past it: refused, nothing moves.
        assert store.put("bad/k", b"x" * 8192) == 0
        assert store.batch_get_into(["bad/k"], [addr + 10], [8192]) == [-600]
        assert "is not in memory dummy" in caplog.text
        assert store.batch_put_from(["bad/k2"], [addr + 4000], [200]) == [-600]
        assert store.is_exist("bad/k2") == 0
        assert store.batch_get_into(["bad/k"], [ctypes.addressof(private)], [4096]) == [-600]
    finally:
        store.close()

    for flags, why in ((["--enable_http_server"], "not implemented"),
                       (["--port=0"], "not a port"),
                       (["--tenant_id=other"], "one tenant")):
        out = subprocess.run([sys.executable, "-m", "mooncake.mooncake_client"] + flags,
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=PYTHON_DIR))
        assert out.returncode == 2 and why in out.stderr, (flags, out.stderr)
    out = subprocess.run([sys.executable, "-m", "mooncake.mooncake_client",
                          "--port=%d" % real_client, "--master_server_address=%s" % master,
                          "--metadata_server=P2PHANDSHAKE", "--global_segment_size=1MB"],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=PYTHON_DIR))
    assert out.returncode == 1 and "another mooncake_client with --port" in out.stderr


def test_the_master_serves_the_http_metadata_store(tmp_path):
    proc = subprocess.Popen([tool_or_skip(), "store-master",
                             "--port=0", "--enable_http_metadata_server=true",
                             "--http_metadata_server_port=0"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        url = re.match(r"ready metadata-server url=(\S+)", proc.stdout.readline()).group(1)
        master = re.match(r"ready master=(\S+)", proc.stdout.readline()).group(1)
        put = urllib.request.Request(url + "?key=k1", data=b"v1", method="PUT")
        assert urllib.request.urlopen(put, timeout=10).status == 200
        assert urllib.request.urlopen(url + "?key=k1", timeout=10).read() == b"v1"
        # A store client whose engine publishes itself there.
        store = MooncakeDistributedStore()
        assert store.setup("127.0.0.1", url, 8 * MiB, MiB, "tcp", "", master) == 0
        assert store.put("md/k", b"v") == 0 and store.get("md/k") == b"v"
        store.close()
    finally:
        stop_master(proc)
    bad = subprocess.run([tool_or_skip(), "store-master",
                          "--enable_http_metadata_server=maybe"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "takes true or false" in bad.stderr


def test_a_dummy_puts_and_gets_tensors(real_client):
    """Tensor calls through a dummy: the value (header and bytes) goes
    through the shared local buffer, as put does (a dummy registers only
    whole pool allocations, so the tensor's own memory cannot be)."""
    torch = pytest.importorskip("torch")
    store = dummy(real_client)
    try:
        t = torch.arange(40, dtype=torch.int32).reshape(5, 8)
        assert store.put_tensor("d/t", t) == 0
        assert torch.equal(store.get_tensor("d/t"), t)
        assert store.batch_put_tensor(["d/t1", "d/t2"], [t + 1, t + 2]) == [0, 0]
        assert torch.equal(store.batch_get_tensor(["d/t1", "d/t2"])[1], t + 2)
        assert store.upsert_tensor("d/t", t * 3) == 0
        assert torch.equal(store.get_tensor("d/t"), t * 3)
    finally:
        store.close()
