"""test_mooncake_engine.py - mooncake.engine.TransferEngine against target processes.

Every TransferEngine method is exercised against a separate target process
(tests/python/target_proc.py): random bytes are written, checked in the
target's own memory, read back and compared. Covers P2PHANDSHAKE and the
`ferry metadata-server` mode, ten threads of 10,000-entry batches, error paths
(each followed by a good transfer) and a target restarted on the same port.
"""

import ctypes
import hashlib
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

import ferry
from conftest import free_port, make_engine
from mooncake import engine as mc
from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

UNREACHABLE = "127.0.0.1:1"


def sha(data):
    return hashlib.sha256(data).hexdigest()


def local_buffer(te, size, fill=True):
    """A managed buffer of `size` bytes filled with random data; (addr, data)."""
    addr = te.allocate_managed_buffer(size)
    assert addr, te.last_error()
    data = os.urandom(size) if fill else bytes(size)
    assert te.write_bytes_to_buffer(addr, data, size) == 0
    return addr, data


def wait_for(pred, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    return pred()


# ---- initialization -------------------------------------------------------

def test_initialize_p2p(engine):
    port = engine.get_rpc_port()
    assert 0 < port < 65536
    eng = engine.get_engine()
    assert isinstance(eng, ferry.Engine)
    assert eng.name == "127.0.0.1:%d" % port
    assert eng.port == port


def test_initialize_rdma_falls_back_and_logs(caplog):
    if os.environ.get("FERRY_FABRIC_PROVIDER"):
        pytest.skip("a forced fabric provider serves rdma: nothing falls back")
    caplog.set_level(logging.INFO, logger="mooncake.engine")
    te = TransferEngine()
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
        assert te.get_rpc_port() > 0
    finally:
        te.close()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("protocol 'rdma': no RDMA device here" in r.getMessage() for r in warnings)


def test_force_tcp(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="mooncake.engine")
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    te = make_engine(protocol="rdma")
    try:
        assert "MC_FORCE_TCP" in caplog.text
    finally:
        te.close()


def test_initialize_hostname_with_port(target):
    te = make_engine(hostname="127.0.0.1:65000")  # P2P: the port part is not used
    try:
        addr, data = local_buffer(te, 4096)
        assert te.transfer_sync_write(target.session, addr, target.addr, 4096) == 0
        assert target.dump(0, 4096) == data
    finally:
        te.close()


def test_unknown_metadata_scheme(caplog):
    te = TransferEngine()
    rc = te.initialize("127.0.0.1", "ftp://127.0.0.1:1/", "tcp", "")
    assert rc < 0
    assert "unknown URL form" in te.last_error()
    assert te.get_engine() is None
    assert te.get_rpc_port() == -1


def test_split_host_port():
    split = mc._split_host_port
    assert split("127.0.0.1") == ("127.0.0.1", None)
    assert split("127.0.0.1:1234") == ("127.0.0.1", 1234)
    assert split("[::1]:1234") == ("::1", 1234)
    assert split("[fe80::1]") == ("fe80::1", None)
    assert split("fe80::1") == ("fe80::1", None)
    assert split("node-a") == ("node-a", None)
    with pytest.raises(ValueError):
        split("host:notaport")


def test_not_initialized_and_double_initialize():
    te = TransferEngine()
    assert te.transfer_sync_write(UNREACHABLE, 0, 0, 8) < 0
    assert te.register_memory(0x1000, 10) < 0
    assert te.allocate_managed_buffer(10) == 0
    assert "not initialized" in te.last_error()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") < 0
    finally:
        te.close()


# ---- memory ---------------------------------------------------------------

def test_register_twice_unregister_unknown(engine):
    buf = ctypes.create_string_buffer(1 << 16)
    addr = ctypes.addressof(buf)
    assert engine.register_memory(addr, len(buf)) == 0
    assert engine.register_memory(addr, len(buf)) == 0  # identical region: harmless
    assert engine.unregister_memory(addr) == 0
    other = ctypes.create_string_buffer(64)
    rc = engine.unregister_memory(ctypes.addressof(other))
    assert rc < 0
    assert engine.last_error_code() == rc
    # still working
    a, _ = local_buffer(engine, 4096)
    assert engine.free_managed_buffer(a, 4096) == 0


def test_register_memory_refuses_a_pointer_the_cpu_cannot_touch(engine, cpu_inaccessible, caplog):
    caplog.set_level(logging.WARNING, logger="mooncake.engine")
    addr, size = cpu_inaccessible
    assert engine.register_memory(addr, size) == -1  # location "*": whatever the memory is
    assert engine.last_error_code() == -1
    for text in (engine.last_error(), caplog.text):
        assert "not mapped for the CPU: GPU memory, and the CUDA driver (if found) did not claim it" in text
        assert "ferry EFAULT" in text and "%#x" % addr in text
    if not ferry.cuda_available()[0]:  # "cuda:0" asked of a host without the driver says so
        assert engine.register_memory(addr, size, "cuda:0") < 0
        assert "no CUDA driver was found" in engine.last_error()


def test_register_overlap_rejected(engine):
    buf = ctypes.create_string_buffer(1 << 16)
    addr = ctypes.addressof(buf)
    assert engine.register_memory(addr, 4096) == 0
    assert engine.register_memory(addr + 1024, 8192) == -7  # overlaps a different region
    assert engine.unregister_memory(addr) == 0


def test_batch_register_unregister(engine, target):
    bufs = [ctypes.create_string_buffer(8192) for _ in range(4)]
    addrs = [ctypes.addressof(b) for b in bufs]
    assert engine.batch_register_memory(addrs, [8192] * 4) == 0
    # each of them can receive data from the target
    for i, a in enumerate(addrs):
        payload = bytes([i + 1]) * 100
        target.fill(i * 100, payload)
        assert engine.transfer_sync_read(target.session, a, target.addr + i * 100, 100) == 0
        assert bufs[i].raw[:100] == payload
    assert engine.batch_unregister_memory(addrs) == 0
    assert engine.batch_unregister_memory(addrs) < 0
    assert engine.batch_register_memory(addrs, [8192] * 3) < 0  # mismatched lists


def test_managed_buffer_and_bytes(engine):
    addr = engine.allocate_managed_buffer(1 << 20)
    assert addr
    assert engine.read_bytes_from_buffer(addr, 64) == bytes(64)  # zero-filled
    data = os.urandom(1000)
    assert engine.write_bytes_to_buffer(addr + 10, data, len(data)) == 0
    assert engine.read_bytes_from_buffer(addr + 10, len(data)) == data
    assert engine.write_bytes_to_buffer(addr, b"abc", 2) == 0  # only `length` bytes
    assert engine.read_bytes_from_buffer(addr, 3) == b"ab\x00"
    assert engine.write_bytes_to_buffer(addr, b"abc", 4) < 0  # more than given
    assert engine.free_managed_buffer(addr, 1 << 20) == 0


def test_get_first_buffer_address(engine, target):
    assert engine.get_first_buffer_address(target.session) == target.addr
    assert engine.get_first_buffer_address(UNREACHABLE) == 0


# ---- synchronous transfers ------------------------------------------------

def test_sync_write_read(engine, target):
    addr, data = local_buffer(engine, 1 << 20)
    assert engine.transfer_sync_write(target.session, addr, target.addr + 4096, 65536) == 0
    assert target.dump(4096, 65536) == data[:65536]

    other = os.urandom(50000)
    target.fill(200000, other)
    assert engine.transfer_sync_read(target.session, addr + 100000, target.addr + 200000,
                                     len(other)) == 0
    assert engine.read_bytes_from_buffer(addr + 100000, len(other)) == other

    # whole MiB (its middle now holds `other`)
    data = engine.read_bytes_from_buffer(addr, 1 << 20)
    assert engine.transfer_sync_write(target.session, addr, target.addr, 1 << 20) == 0
    assert target.sha256(0, 1 << 20) == sha(data)


def test_transfer_sync_opcodes_and_notify(engine, target):
    addr, data = local_buffer(engine, 8192)
    s = target.session
    assert engine.transfer_sync(s, addr, target.addr, 1024, TransferOpcode.Write) == 0
    assert engine.transfer_sync(s, addr + 1024, target.addr + 1024, 1024, 1) == 0
    assert engine.transfer_sync(s, addr + 2048, target.addr + 2048, 1024, mc.Write) == 0
    assert target.dump(0, 3072) == data[:3072]
    # read back into the second half with both opcode forms
    assert engine.transfer_sync(s, addr + 4096, target.addr, 2048, TransferOpcode.Read) == 0
    assert engine.transfer_sync(s, addr + 6144, target.addr + 2048, 1024, 0) == 0
    assert engine.read_bytes_from_buffer(addr + 4096, 3072) == data[:3072]
    assert engine.transfer_sync(s, addr, target.addr, 8, 7) < 0  # bad opcode

    # notify as TransferNotify, as a tuple and as any object with .name/.msg
    assert engine.transfer_sync(s, addr + 100, target.addr + 5000, 500, TransferOpcode.Write,
                                TransferNotify("done", "req-1")) == 0

    class Note:
        name, msg = "done", "req-3"

    assert engine.transfer_sync(s, addr, target.addr + 6000, 10, TransferOpcode.Write,
                                ("done", "req-2")) == 0
    assert engine.transfer_sync(s, addr, target.addr + 6000, 10, TransferOpcode.Write,
                                notify=Note()) == 0
    got = []
    wait_for(lambda: got.extend(target.notifies()) or len(got) >= 3)
    assert got == [("done", "req-1"), ("done", "req-2"), ("done", "req-3")]
    assert target.dump(5000, 500) == data[100:600]  # data landed before the notification


def test_batch_sync_write_read(engine, target):
    n, size = 1000, 512
    addr, data = local_buffer(engine, 2 * n * size)
    perm = np.random.default_rng(1).permutation(n)
    locals_ = [addr + i * size for i in range(n)]
    remotes = [target.addr + int(p) * size for p in perm]
    assert engine.batch_transfer_sync_write(target.session, locals_, remotes, [size] * n) == 0
    expected = bytearray(n * size)
    for i, p in enumerate(perm):
        expected[p * size:(p + 1) * size] = data[i * size:(i + 1) * size]
    assert target.sha256(0, n * size) == sha(bytes(expected))

    # read it back, un-permuted, into the second half
    back = [addr + n * size + i * size for i in range(n)]
    assert engine.batch_transfer_sync_read(target.session, back, remotes, [size] * n) == 0
    assert engine.read_bytes_from_buffer(addr + n * size, n * size) == data[:n * size]

    # numpy arrays of addresses and lengths work too, and batch_transfer_sync with notify
    ln = np.full(n, size, dtype=np.uint64)
    assert engine.batch_transfer_sync(target.session, np.array(locals_, dtype=np.uint64),
                                      np.array(remotes, dtype=np.uint64), ln,
                                      TransferOpcode.Write, TransferNotify("batch", "ok")) == 0
    assert wait_for(lambda: ("batch", "ok") in target.notifies())

    # mismatched lists: a negative code, not an exception
    assert engine.batch_transfer_sync_write(target.session, locals_, remotes[:-1],
                                            [size] * n) < 0


def test_batch_async_write_read(engine, target):
    n, size = 4000, 256
    addr, data = local_buffer(engine, 2 * n * size)
    ids = []
    chunk = n // 4
    for c in range(4):
        idx = range(c * chunk, (c + 1) * chunk)
        bid = engine.batch_transfer_async_write(
            target.session, [addr + i * size for i in idx],
            [target.addr + i * size for i in idx], [size] * chunk)
        assert bid != 0, engine.last_error()
        ids.append(bid)
    assert len(set(ids)) == 4
    assert engine.get_batch_transfer_status(ids) == 0
    assert target.sha256(0, n * size) == sha(data[:n * size])
    assert engine.get_batch_transfer_status(ids) < 0  # already freed

    bid = engine.batch_transfer_async_read(
        target.session, [addr + n * size + i * size for i in range(n)],
        [target.addr + i * size for i in range(n)], [size] * n)
    assert bid
    assert engine.get_batch_transfer_status([bid]) == 0
    assert engine.read_bytes_from_buffer(addr + n * size, n * size) == data[:n * size]

    bid = engine.batch_transfer_async(target.session, [addr], [target.addr], [size],
                                      TransferOpcode.Write)
    assert bid and engine.get_batch_transfer_status([bid]) == 0


def test_transfer_submit_write_check_status(engine, target):
    addr, data = local_buffer(engine, 1 << 20)
    bid = engine.transfer_submit_write(target.session, addr, target.addr, 1 << 20)
    assert bid
    status = wait_for(lambda: engine.transfer_check_status(bid) or None, timeout=60)
    assert status == 1
    assert target.sha256(0, 1 << 20) == sha(data)
    assert engine.transfer_check_status(bid) == -1  # finished and freed
    assert engine.transfer_check_status(123456789) == -1


def test_check_status_failed_batch(engine, target):
    addr, _ = local_buffer(engine, 4096)
    bid = engine.transfer_submit_write(target.session, addr, 0x10, 64)
    if bid == 0:  # refused at submit: also acceptable
        assert engine.last_error_code() < 0
    else:
        status = wait_for(lambda: engine.transfer_check_status(bid) or None, timeout=60)
        assert status in (-1, -2)
    assert engine.transfer_sync_write(target.session, addr, target.addr, 64) == 0


def test_send_probe(engine, target):
    assert engine.send_probe(target.session) == 0
    t0 = time.monotonic()
    assert engine.send_probe(UNREACHABLE) < 0
    assert time.monotonic() - t0 < 10


def test_get_notifies_from_peer(engine, target):
    assert engine.get_notifies() == []
    reply = target.cmd(cmd="notify", target=engine.get_engine().name, name="hello",
                       msg="world \u00e9")
    assert reply["rc"] == 0, reply
    got = []
    assert wait_for(lambda: got.extend(engine.get_notifies()) or got)
    assert got == [("hello", "world \u00e9")]
    assert got[0].name == "hello" and got[0].msg == "world \u00e9"
    assert engine.get_notifies() == []


# ---- failures leave the engine working ------------------------------------

def test_write_to_unregistered_remote(engine, target):
    addr, data = local_buffer(engine, 4096)
    t0 = time.monotonic()
    assert engine.transfer_sync_write(target.session, addr, 0x1000, 64) == -3
    assert time.monotonic() - t0 < 5
    assert "transfer_sync" in engine.last_error()
    # straddling the end of the target's region
    end = target.addr + target.size
    assert engine.transfer_sync_write(target.session, addr, end - 10, 64) == -3
    assert engine.batch_transfer_sync_write(target.session, [addr, addr + 64],
                                            [target.addr, 0x2000], [64, 64]) == -3
    assert engine.transfer_sync_write(target.session, addr, target.addr, 4096) == 0
    assert target.dump(0, 4096) == data


def test_local_unregistered(engine, target):
    buf = ctypes.create_string_buffer(4096)
    rc = engine.transfer_sync_write(target.session, ctypes.addressof(buf), target.addr, 64)
    assert rc < 0
    addr, data = local_buffer(engine, 64)
    assert engine.transfer_sync_write(target.session, addr, target.addr, 64) == 0


def test_unreachable_target(engine, target):
    addr, data = local_buffer(engine, 4096)
    t0 = time.monotonic()
    assert engine.transfer_sync_write(UNREACHABLE, addr, 0x1000, 64) < 0
    assert engine.transfer_sync_read(UNREACHABLE, addr, 0x1000, 64) < 0
    assert engine.batch_transfer_sync_write(UNREACHABLE, [addr], [0x1000], [64]) < 0
    assert time.monotonic() - t0 < 20
    assert engine.transfer_sync_write(target.session, addr, target.addr, 4096) == 0
    assert target.dump(0, 4096) == data


def test_async_to_unreachable(engine):
    addr, _ = local_buffer(engine, 64)
    t0 = time.monotonic()
    bid = engine.batch_transfer_async_write(UNREACHABLE, [addr], [0x1000], [64])
    if bid:
        assert engine.get_batch_transfer_status([bid]) < 0
    assert time.monotonic() - t0 < 15


# ---- concurrency ----------------------------------------------------------

@pytest.mark.timeout_s(300)
def test_ten_threads_batches_of_10000(shared_engine, shared_target):
    te, tgt = shared_engine, shared_target
    threads_n, n, size = 10, 10000, 256
    region = n * size
    total = threads_n * region
    assert total <= tgt.size
    src = np.random.default_rng(7).integers(0, 256, total, dtype=np.uint8)
    base = te.allocate_managed_buffer(total)
    assert base
    assert te.write_bytes_to_buffer(base, src.tobytes(), total) == 0
    perms = [np.random.default_rng(100 + t).permutation(n) for t in range(threads_n)]
    plans = []
    for t in range(threads_n):
        off = t * region
        locals_ = (base + off + np.arange(n, dtype=np.uint64) * size).astype(np.uint64)
        remotes = (tgt.addr + off + perms[t].astype(np.uint64) * size).astype(np.uint64)
        plans.append(([int(x) for x in locals_], [int(x) for x in remotes]))
    results = [None] * threads_n
    barrier = threading.Barrier(threads_n)

    def run(t):
        barrier.wait(timeout=30)
        results[t] = te.batch_transfer_sync_write(tgt.session, plans[t][0], plans[t][1],
                                                  [size] * n)

    ths = [threading.Thread(target=run, args=(t,)) for t in range(threads_n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(timeout=240)
    assert not any(th.is_alive() for th in ths)
    assert results == [0] * threads_n, te.last_error()

    expected = np.empty(total, dtype=np.uint8)
    ev = expected.reshape(threads_n, n, size)
    sv = src.reshape(threads_n, n, size)
    for t in range(threads_n):
        ev[t, perms[t]] = sv[t]
    assert tgt.sha256(0, total) == sha(expected.tobytes())


# ---- restart on the same port ---------------------------------------------

def start_on_port(start_target, port, timeout=60.0):
    """Starts a target bound to `port`, retrying while the port is still held."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return start_target("--port", port, "--size", 1 << 20)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.mark.timeout_s(180)
def test_restart_target_same_port(engine, start_target):
    t1 = start_target("--size", 1 << 20)
    port = t1.info["port"]
    session = t1.session
    addr, data = local_buffer(engine, 4096)
    assert engine.transfer_sync_write(session, addr, t1.addr, 4096) == 0
    t1.kill()

    t0 = time.monotonic()
    assert engine.send_probe(session) < 0
    assert engine.transfer_sync_write(session, addr, t1.addr, 4096) < 0
    assert time.monotonic() - t0 < 20

    t2 = start_on_port(start_target, port)
    assert t2.session == session
    assert wait_for(lambda: engine.send_probe(session) == 0, timeout=60)
    assert engine.transfer_sync_write(session, addr, t2.addr, 4096) == 0
    assert t2.dump(0, 4096) == data
    assert engine.get_first_buffer_address(session) == t2.addr


@pytest.mark.timeout_s(180)
def test_restart_target_transfer_reconnects_without_probe(engine, start_target):
    t1 = start_target("--size", 1 << 20)
    port, session = t1.info["port"], t1.session
    addr, data = local_buffer(engine, 4096)
    assert engine.transfer_sync_write(session, addr, t1.addr, 4096) == 0
    t1.kill()
    t2 = start_on_port(start_target, port)
    # the cached connection is dead: at most one failure, then it must work
    ok = wait_for(lambda: engine.transfer_sync_write(session, addr, t2.addr, 4096) == 0,
                  timeout=60, step=0.2)
    assert ok
    assert t2.dump(0, 4096) == data


# ---- metadata service -----------------------------------------------------

def http_get(url, key):
    q = url + ("&" if "?" in url else "?") + urllib.parse.urlencode({"key": key})
    try:
        with urllib.request.urlopen(q, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


@pytest.mark.timeout_s(180)
def test_metadata_server_mode(metadata_server, start_target, monkeypatch):
    url = metadata_server
    tag = "%d-%d" % (os.getpid(), int(time.monotonic() * 1000) % 100000)
    tname, lname = "seg-target-" + tag, "seg-local-" + tag
    tgt = start_target("--metadata", url, "--name", tname, "--size", 1 << 20,
                       env={"MC_TCP_BIND_ADDRESS": "127.0.0.1"})
    assert tgt.session == tname
    status, body = http_get(url, "mooncake/rpc_meta/" + tname)
    assert status == 200
    meta = json.loads(body)
    assert meta["rpc_port"] == tgt.info["port"]

    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    te = make_engine(hostname=lname, server=url)
    try:
        assert te.get_engine().name == lname
        assert http_get(url, "mooncake/rpc_meta/" + lname)[0] == 200
        assert te.send_probe(tname) == 0
        assert te.get_first_buffer_address(tname) == tgt.addr
        addr, data = local_buffer(te, 1 << 16)
        assert te.transfer_sync_write(tname, addr, tgt.addr, 1 << 16) == 0
        assert tgt.sha256(0, 1 << 16) == sha(data)
        n = 256
        assert te.batch_transfer_sync_read(tname, [addr + i * 64 for i in range(n)],
                                           [tgt.addr + (n - 1 - i) * 64 for i in range(n)],
                                           [64] * n) == 0
        got = te.read_bytes_from_buffer(addr, n * 64)
        for i in range(n):
            assert got[i * 64:(i + 1) * 64] == data[(n - 1 - i) * 64:(n - i) * 64]
        bid = te.batch_transfer_async_write(tname, [addr], [tgt.addr + 70000], [100])
        assert bid and te.get_batch_transfer_status([bid]) == 0
        assert tgt.dump(70000, 100) == got[:100]
        assert te.transfer_sync(tname, addr, tgt.addr, 10, TransferOpcode.Write,
                                TransferNotify("md", "x")) == 0
        assert wait_for(lambda: ("md", "x") in tgt.notifies())
        assert te.transfer_sync_write("seg-missing-" + tag, addr, 0x1000, 8) < 0
        assert te.transfer_sync_write(tname, addr, tgt.addr, 8) == 0
    finally:
        te.close()
    assert http_get(url, "mooncake/rpc_meta/" + lname)[0] == 404  # removed at shutdown


@pytest.mark.timeout_s(120)
def test_metadata_server_host_port_name(metadata_server, start_target):
    """Mooncake's usual form: local_hostname "ip:port" as the segment name."""
    url = metadata_server
    port = free_port()
    name = "127.0.0.1:%d" % port
    tgt = start_target("--metadata", url, "--name", name, "--size", 1 << 16)
    assert tgt.session == name
    assert tgt.info["port"] == port
    te = make_engine(hostname="127.0.0.1:%d" % free_port(), server=url)
    try:
        addr, data = local_buffer(te, 4096)
        assert te.transfer_sync_write(name, addr, tgt.addr, 4096) == 0
        assert tgt.dump(0, 4096) == data
    finally:
        te.close()


def test_region_registered_after_connect(engine, target):
    """A region the peer registers after we connected is reachable (refresh on miss)."""
    addr, data = local_buffer(engine, 8192)
    assert engine.transfer_sync_write(target.session, addr, target.addr, 64) == 0
    reply = target.cmd(cmd="register", size=8192)
    assert reply["rc"] == 0
    extra = reply["addr"]
    assert engine.transfer_sync_write(target.session, addr, extra, 8192) == 0
    assert target.dump(extra - target.addr, 8192) == data


def test_rdma_runs_on_the_fabric_transport(monkeypatch, caplog, target):
    """protocol "rdma" with FERRY_FABRIC_PROVIDER: ferry's fabric transport
    moves the bytes (here on the tcp provider: the verbs code path without a
    NIC); the target process runs fabric too when the suite is run so."""
    if "fabric" not in os.environ.get("FERRY_TRANSPORTS", ""):
        pytest.skip("run with FERRY_TRANSPORTS=fabric,tcp (make test-python does)")
    caplog.set_level(logging.INFO, logger="mooncake.engine")
    te = make_engine(protocol="rdma")
    try:
        addr, data = local_buffer(te, 1 << 20)
        assert te.transfer_sync_write(target.session, addr, target.addr, 1 << 20) == 0
        assert target.dump(0, 1 << 20) == data
        assert te.get_engine().peer_transport(target.session) == ferry.TRANSPORT_FABRIC
        assert "fabric transport (provider tcp;ofi_rxm)" in caplog.text
    finally:
        te.close()
