"""test_ferry_engine.py - the ferry.Engine binding itself.

Two engines in this process (and one target process where a separate peer
matters): module functions and constants, ferry.Error (code, mooncake_code,
detail), buffer-protocol arguments, held registrations, batches, notifications
after data, context managers and close() while other threads are in calls.
"""

import ctypes
import os
import pickle
import signal
import threading
import time

import numpy as np
import pytest

import ferry

UNREACHABLE = "127.0.0.1:1"


def registered_buffers(pair, size):
    """A zeroed source registered on a and a destination registered on b:
    returns (src, dst, dst's address)."""
    a, b = pair
    src = bytearray(size)
    dst = bytearray(size)
    a.register(src)
    return src, dst, b.register(dst)


# ---- module ---------------------------------------------------------------

def test_module_functions_and_constants():
    assert ferry.version() == ferry.VERSION_STRING == ferry.__version__
    assert ferry.OK == 0 and ferry.EINVAL == -1 and ferry.ENOTREG == -2
    assert ferry.EINPROGRESS == -21
    assert (ferry.OP_READ, ferry.OP_WRITE) == (0, 1)
    assert ferry.strerror(ferry.ENOTREG) == "address not registered (docs/errors.md#ferry_enotreg)"
    assert ferry.to_mooncake(ferry.ENOTREG) == -3
    assert ferry.to_mooncake(ferry.EOVERLAP) == -7
    assert ferry.to_mooncake(ferry.OK) == 0
    assert ferry.transport_name(ferry.TRANSPORT_TCP) == "tcp"
    assert ferry.transport_parse("tcp,shm") == ferry.TRANSPORT_TCP | ferry.TRANSPORT_SHM
    assert ferry.transport_parse("carrier-pigeon") == 0
    level = ferry.get_log_level()
    ferry.set_log_level("error")
    assert ferry.get_log_level() == ferry.LOG_ERROR
    ferry.set_log_level(level)
    with pytest.raises(ValueError):
        ferry.set_log_level("loud")


def test_error_class():
    assert issubclass(ferry.Error, RuntimeError)
    e = ferry.Error(ferry.ENOTREG, "no such region")
    assert (e.code, e.mooncake_code, e.detail) == (ferry.ENOTREG, -3, "no such region")
    assert str(e) == "no such region"
    e = ferry.Error(ferry.ESOCKET, "socket error", "connect to x failed")
    assert e.detail == "connect to x failed" and e.mooncake_code == -102
    e2 = pickle.loads(pickle.dumps(e))
    assert e2.code == ferry.ESOCKET and str(e2) == "socket error"
    with pytest.raises(ferry.Error) as info:
        raise e
    assert info.value is e


def test_engine_properties_and_bad_options(pair):
    a, b = pair
    assert a.port > 0 and a.port != b.port
    assert a.name == "127.0.0.1:%d" % a.port
    assert a.name in repr(a)
    assert not a.closed
    with pytest.raises(ValueError):
        ferry.Engine("127.0.0.1", transports="bogus")
    with pytest.raises(ValueError):
        ferry.Engine("127.0.0.1", log_level="loud")
    with pytest.raises(ValueError):
        ferry.Engine("127.0.0.1", port=70000)
    with pytest.raises(TypeError):
        ferry.Engine("127.0.0.1", no_such_option=1)


def test_spin_option():
    """spin_us (FERRY_SPIN_US) changes how receives wait, never what arrives;
    out of range is refused."""
    with pytest.raises((ValueError, OverflowError)):
        ferry.Engine("127.0.0.1", spin_us=10001)
    a = ferry.Engine("127.0.0.1", transports="tcp", spin_us=200)
    b = ferry.Engine("127.0.0.1", transports="tcp", spin_us=200)
    try:
        for size in (1, 4096, 100000, 3 << 20):
            src, dst, daddr = registered_buffers((a, b), size)
            src[:] = os.urandom(size)
            a.write(b.name, src, daddr)
            back = bytearray(size)
            a.register(back)
            a.read(b.name, back, daddr)
            assert bytes(dst) == bytes(src) == bytes(back)
    finally:
        a.close()
        b.close()


def test_uninitialized_engine():
    e = ferry.Engine.__new__(ferry.Engine)
    with pytest.raises(ferry.Error) as info:
        e.probe(UNREACHABLE)
    assert info.value.code == ferry.EINVAL
    e.close()


def test_engine_create_failure_raises():
    with pytest.raises(ferry.Error) as info:
        ferry.Engine("127.0.0.1", metadata_url="http://127.0.0.1:1/metadata",
                     segment_name="nowhere")
    assert info.value.code < 0
    assert info.value.detail


# ---- buffers ------------------------------------------------------------

def test_buffer_protocol_objects(pair):
    a, b = pair
    dst = bytearray(1 << 16)
    daddr = b.register(dst)
    assert daddr == ctypes.addressof(ctypes.c_char.from_buffer(dst))

    src = np.frombuffer(os.urandom(1 << 16), dtype=np.uint8).copy()
    a.register(src)
    a.write(b.name, src, daddr)  # whole buffer by default
    assert bytes(dst) == src.tobytes()

    # a slice of a registered buffer (memoryview), explicit length
    mv = memoryview(src)[100:300]
    a.write(b.name, mv, daddr + 1000, 50)
    assert dst[1000:1050] == src[100:150].tobytes()

    # read into a registered 2-D numpy array
    out = np.zeros((16, 4096), dtype=np.uint8)
    a.register(out)
    a.read(b.name, out, daddr)
    assert out.tobytes() == bytes(dst)

    # bytes: read-only, so refused as a region (peers may write it) and as a
    # READ destination, with EINVAL naming why
    blob = os.urandom(4096)
    for refused in (lambda: a.register(blob), lambda: a.register_batch([blob]),
                    lambda: a.read(b.name, blob, daddr)):
        with pytest.raises(ferry.Error) as info:
            refused()
        assert info.value.code == ferry.EINVAL
        assert "read-only bytes object" in info.value.detail

    with pytest.raises(ValueError):
        a.write(b.name, src, daddr, len(src) + 1)  # longer than the buffer
    with pytest.raises(TypeError):
        a.write(b.name, int(src.ctypes.data), daddr)  # address without length
    with pytest.raises(TypeError):
        a.write(b.name, "not a buffer", daddr, 4)
    with pytest.raises((ValueError, BufferError)):
        a.write(b.name, out[:, ::2], daddr)  # not contiguous

    # int addresses (torch's data_ptr()) and numpy integer addresses
    a.write(b.name, int(src.ctypes.data), daddr + 2, 10)
    a.write(b.name, np.uint64(src.ctypes.data), daddr + 2, np.int64(10))
    assert dst[2:12] == src[:10].tobytes()


def test_registered_buffer_is_held(pair):
    a, _ = pair
    ba = bytearray(4096)
    a.register(ba)
    a.register(ba)  # identical region twice: fine
    with pytest.raises(BufferError):
        ba.extend(b"x")  # cannot move while registered
    a.unregister(ba)
    ba.extend(b"x")
    with pytest.raises(ferry.Error) as info:
        a.unregister(ba)
    assert info.value.code < 0


def test_register_refuses_memory_the_cpu_cannot_touch(pair, cpu_inaccessible):
    a, _ = pair
    addr, size = cpu_inaccessible
    with pytest.raises(ferry.Error) as info:
        a.register(addr, size)
    e = info.value
    assert (e.code, e.mooncake_code) == (ferry.EFAULT, -1)
    assert "register [%#x, +%d)" % (addr, size) in e.detail
    assert "not mapped for the CPU: GPU memory, and the CUDA driver (if found) did not claim it" in e.detail
    assert ferry.strerror(ferry.EFAULT).endswith("(docs/errors.md#ferry_efault)")


def test_register_batch(pair):
    a, b = pair
    bufs = [bytearray(1024) for _ in range(3)]
    raw = ctypes.create_string_buffer(2048)
    addrs = b.register_batch(bufs + [ctypes.addressof(raw)], [None, None, 512, 2048])
    assert addrs[3] == ctypes.addressof(raw)
    regions = set(a.peer_regions(b.name))
    assert (addrs[0], 1024) in regions and (addrs[2], 512) in regions
    assert (addrs[3], 2048) in regions
    b.unregister_batch(addrs)
    assert not any(r[0] in addrs for r in a.peer_regions(b.name))
    with pytest.raises(TypeError):
        b.register_batch([ctypes.addressof(raw)])  # address without a length


def test_alloc_free(pair):
    a, b = pair
    addr = b.alloc(1 << 20)
    assert ctypes.string_at(addr, 4096) == bytes(4096)
    src = bytearray(os.urandom(1 << 20))
    a.register(src)
    a.write(b.name, src, addr)
    assert ctypes.string_at(addr, 1 << 20) == bytes(src)
    b.free(addr)
    with pytest.raises(ferry.Error):
        b.free(addr)


# ---- errors ---------------------------------------------------------------

def test_errors_carry_code_and_detail(pair):
    a, b = pair
    src = bytearray(64)
    a.register(src)
    with pytest.raises(ferry.Error) as info:
        a.write(b.name, src, 0x1000)
    e = info.value
    assert isinstance(e, RuntimeError)
    assert e.code == ferry.ENOTREG and e.mooncake_code == -3
    assert isinstance(e.detail, str) and e.detail
    assert e.detail in str(e)

    t0 = time.monotonic()
    with pytest.raises(ferry.Error) as info:
        a.probe(UNREACHABLE)
    assert info.value.code < 0 and info.value.detail
    assert time.monotonic() - t0 < 10

    with pytest.raises(ferry.Error):
        a.unregister(0x1234)
    with pytest.raises(ValueError):
        a.transfer_batch(b.name, [(5, src, 0x1000, 1)])
    with pytest.raises(TypeError):
        a.transfer_batch(b.name, [(1, src)])

    dst = bytearray(64)
    b.register(dst)
    src[:] = b"z" * 64
    a.write(b.name, src, ctypes.addressof(ctypes.c_char.from_buffer(dst)))
    assert dst == src


def test_peer_info(pair):
    a, b = pair
    buf = bytearray(4096)
    addr = b.register(buf)
    assert (addr, 4096) in a.peer_regions(b.name)
    assert a.peer_transport(b.name) & ferry.TRANSPORT_ALL
    a.probe(b.name)


# ---- batches and notifications ----------------------------------------------

def test_transfer_batch_with_notification_after_data(pair):
    a, b = pair
    src = np.frombuffer(os.urandom(1 << 20), dtype=np.uint8).copy()
    dst = bytearray(1 << 20)
    a.register(src)
    daddr = b.register(dst)
    half = 1 << 19
    entries = [
        (ferry.OP_WRITE, src[:half], daddr + half, None),
        (ferry.OP_WRITE, int(src.ctypes.data) + half, daddr, half),
    ]
    a.transfer_batch(b.name, entries, notify=("kv-done", b"\x00\xffreq"))
    got = []
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        got = b.drain_notifications()
        time.sleep(0.01)
    assert got == [("kv-done", b"\x00\xffreq")]
    assert dst[half:] == src[:half].tobytes() and dst[:half] == src[half:].tobytes()
    assert b.drain_notifications() == []

    a.notify(b.name, "plain", "text \u00e9")
    deadline = time.monotonic() + 10
    while not got[1:] and time.monotonic() < deadline:
        got += b.drain_notifications()
        time.sleep(0.01)
    assert got[1] == ("plain", "text \u00e9".encode())

    # reads in a batch, into a buffer object
    back = bytearray(1 << 20)
    a.register(back)
    a.transfer_batch(b.name, [(ferry.OP_READ, back, daddr, None)])
    assert back == dst


def test_submit_batch(pair):
    a, b = pair
    n, size = 2000, 512
    src = np.frombuffer(os.urandom(n * size), dtype=np.uint8).copy()
    dst = bytearray(n * size)
    a.register(src)
    daddr = b.register(dst)
    perm = np.random.default_rng(3).permutation(n).astype(np.uint64)
    locals_ = np.uint64(src.ctypes.data) + np.arange(n, dtype=np.uint64) * np.uint64(size)
    remotes = np.uint64(daddr) + perm * np.uint64(size)
    lengths = np.full(n, size, dtype=np.uint64)
    with a.submit_arrays(b.name, ferry.OP_WRITE, locals_, remotes, lengths,
                         notify=("sub", "1")) as batch:
        assert isinstance(batch, ferry.Batch)
        assert batch.wait() is True
        assert batch.status() == ferry.BATCH_DONE
        assert batch.error == 0 and batch.detail is None
    assert batch.freed
    batch.free()  # twice is fine
    assert batch.state == ferry.BATCH_DONE
    expected = np.empty(n * size, dtype=np.uint8)
    expected.reshape(n, size)[perm.astype(np.int64)] = src.reshape(n, size)
    assert bytes(dst) == expected.tobytes()

    # entries form, polled with status()
    back = bytearray(n * size)
    a.register(back)
    batch = a.submit(b.name, [(ferry.OP_READ, back, daddr, None)])
    deadline = time.monotonic() + 20
    while batch.status() == ferry.BATCH_PENDING and time.monotonic() < deadline:
        time.sleep(0.005)
    assert batch.status() == ferry.BATCH_DONE
    batch.free()
    assert back == dst
    # a freed batch keeps reporting how it ended
    assert batch.status() == ferry.BATCH_DONE and batch.wait() is True

    # the synchronous form of the same arrays
    a.transfer_arrays(b.name, ferry.OP_WRITE, [int(x) for x in locals_], list(remotes),
                      [size] * n)
    with pytest.raises(ValueError):
        a.transfer_arrays(b.name, ferry.OP_WRITE, [1, 2], [3], [4, 5])


def test_failed_batch(pair):
    a, b = pair
    src = bytearray(4096)
    a.register(src)
    # an unregistered remote address is refused at submit (the peer's region
    # table is known) or fails the batch
    try:
        batch = a.submit(b.name, [(ferry.OP_WRITE, src, 0x1000, 64)])
    except ferry.Error as e:
        assert e.code == ferry.ENOTREG and e.detail
        batch = None
    if batch is not None:
        with pytest.raises(ferry.Error) as info:
            batch.wait(10000)
        assert info.value.code == ferry.ENOTREG
        assert batch.status() == ferry.BATCH_FAILED
        assert batch.error == ferry.ENOTREG and batch.detail
        batch.free()

    # a batch that fails on the target's side: the region is unregistered there
    # after the submit-time check could have seen it
    dst = bytearray(1 << 20)
    daddr = b.register(dst)
    big = bytearray(1 << 20)
    a.register(big)
    a.write(b.name, big, daddr, 64)  # a's view of b's regions now includes dst
    b.unregister(daddr)
    try:
        batch = a.submit(b.name, [(ferry.OP_WRITE, big, daddr, None)])
    except ferry.Error as e:
        assert e.code == ferry.ENOTREG
    else:
        with pytest.raises(ferry.Error) as info:
            batch.wait(10000)
        assert info.value.code in (ferry.ENOTREG, ferry.EREMOTE)
        assert batch.status() == ferry.BATCH_FAILED and batch.error == info.value.code
        assert batch.detail
        batch.free()


def test_wait_timeout_zero_returns_bool(pair):
    a, b = pair
    src, dst, daddr = registered_buffers(pair, 8 << 20)
    batch = a.submit(b.name, [(ferry.OP_WRITE, src, daddr, None)])
    first = batch.wait(0)
    assert first in (True, False)
    assert batch.wait() is True
    batch.free()


# ---- lifetime -------------------------------------------------------------

def test_context_manager_and_closed_engine():
    with ferry.Engine("127.0.0.1") as e:
        name = e.name
        assert name.startswith("127.0.0.1:")
    assert e.closed
    with pytest.raises(ferry.Error) as info:
        e.probe(name)
    assert info.value.code == ferry.ECLOSED
    with pytest.raises(ferry.Error):
        e.port
    e.close()  # twice is fine


def test_cancelled_batch(start_target):
    """A batch cancelled while its target is stopped fails with ECANCELED
    once the target resumes; a second cancel finds nothing to cancel."""
    size, mib = 256 << 20, 1 << 20
    t = start_target("--size", size, "--protocol", "tcp")
    a = ferry.Engine("127.0.0.1", transports="tcp")
    src = bytearray(size)
    try:
        a.register(src)
        base = ctypes.addressof((ctypes.c_char * size).from_buffer(src))
        a.write(t.session, memoryview(src)[:mib], t.addr)  # first contact
        os.kill(t.info["pid"], signal.SIGSTOP)
        try:
            batch = a.submit(t.session, [(ferry.OP_WRITE, base + off, t.addr + off, mib)
                                         for off in range(0, size, mib)])
            assert batch.cancel() is True
        finally:
            os.kill(t.info["pid"], signal.SIGCONT)
        with pytest.raises(ferry.Error) as info:
            batch.wait(-1)
        assert info.value.code == ferry.ECANCELED, info.value
        assert "cancelled by the caller" in info.value.detail
        assert batch.status() == ferry.BATCH_FAILED and batch.error == ferry.ECANCELED
        assert batch.cancel() is False
        batch.free()
    finally:
        a.close()


def test_close_with_outstanding_batch(pair):
    a, b = pair
    src, dst, daddr = registered_buffers(pair, 4 << 20)
    batch = a.submit(b.name, [(ferry.OP_WRITE, src, daddr, None)])
    a.close()
    # The batch outlives its engine: final once close() returned, and its
    # methods still work.
    assert not batch.freed
    state = batch.status()
    assert state in (ferry.BATCH_DONE, ferry.BATCH_FAILED, ferry.BATCH_TIMEDOUT)
    if state == ferry.BATCH_DONE:
        assert batch.wait() is True
        assert dst == src
    else:
        with pytest.raises(ferry.Error) as info:
            batch.wait()
        assert info.value.code == ferry.ECLOSED
    batch.free()
    assert batch.freed


@pytest.mark.timeout_s(120)
def test_close_while_threads_transfer(pair):
    a, b = pair
    src, dst, daddr = registered_buffers(pair, 1 << 16)
    stop = threading.Event()
    outcomes = []

    def worker():
        n = 0
        while not stop.is_set():
            try:
                a.write(b.name, src, daddr)
                n += 1
            except ferry.Error as e:
                outcomes.append((n, e.code))
                return
        outcomes.append((n, 0))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    a.close()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 8
    assert all(code in (0, ferry.ECLOSED) for _, code in outcomes), outcomes
    assert sum(n for n, _ in outcomes) > 0


@pytest.mark.timeout_s(60)
def test_close_while_a_call_is_blocked_in_a_handshake():
    """A listener that accepts and never answers: the call is inside the
    library, blocked on its socket, when close() runs. close() must end it
    (libferry wakes it) instead of waiting for its 60 s deadline."""
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    target = "127.0.0.1:%d" % listener.getsockname()[1]
    e = ferry.Engine("127.0.0.1", transports="tcp", timeout_ms=60000,
                     connect_timeout_ms=60000)
    outcome = []

    def prober():
        try:
            e.probe(target)
            outcome.append(0)
        except ferry.Error as err:
            outcome.append(err.code)

    t = threading.Thread(target=prober)
    t.start()
    conn, _ = listener.accept()
    conn.settimeout(30)
    assert conn.recv(1)  # its HELLO: the probe now waits for a reply
    started = time.monotonic()
    e.close()
    t.join(timeout=30)
    assert not t.is_alive()
    assert time.monotonic() - started < 20
    assert outcome == [ferry.ECLOSED]
    conn.close()
    listener.close()


@pytest.mark.timeout_s(120)
def test_threads_share_engine(pair):
    a, b = pair
    threads_n, size = 8, 1 << 18
    src = np.frombuffer(os.urandom(threads_n * size), dtype=np.uint8).copy()
    dst = bytearray(threads_n * size)
    back = np.zeros(threads_n * size, dtype=np.uint8)
    a.register(src)
    a.register(back)
    daddr = b.register(dst)
    errors = []

    def run(t):
        try:
            for _ in range(20):
                a.write(b.name, src[t * size:(t + 1) * size], daddr + t * size)
                a.read(b.name, back[t * size:(t + 1) * size], daddr + t * size)
        except Exception as e:  # collected and asserted below
            errors.append(e)

    ths = [threading.Thread(target=run, args=(t,)) for t in range(threads_n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(timeout=100)
    assert not errors
    assert bytes(dst) == src.tobytes() == back.tobytes()
