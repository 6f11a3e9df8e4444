"""test_file.py - FILE memory from Python: ferry.File (Engine.register_file)
and NIXL's POSIX backend on it (nixl: DRAM <-> FILE with the agent itself
as the remote agent). Files live in /var/tmp (a disk file system, where
O_DIRECT works); every byte moved is compared with the file read back by
plain os.pread.
"""

import contextlib
import os
import tempfile

import numpy as np
import pytest

import ferry
from nixl import nixl_agent, nixl_agent_config
from nixl import _bindings as nb

BLOCK = 64 << 10


@pytest.fixture
def tmpfile():
    """An empty file in /var/tmp, opened O_RDWR: (fd, path)."""
    fd, path = tempfile.mkstemp(prefix="ferry-test-file-", dir="/var/tmp")
    yield fd, path
    os.close(fd)
    os.unlink(path)


@pytest.fixture
def engine():
    with ferry.Engine("127.0.0.1") as e:
        yield e


def test_file_round_trip(engine, tmpfile):
    fd, path = tmpfile
    out = np.random.default_rng(1).integers(0, 256, 64 * BLOCK, dtype=np.uint8)
    back = np.zeros_like(out)
    engine.register(out)
    engine.register(back)
    with engine.register_file(fd) as f:
        assert f.path == path and f.fd == fd
        assert f.direct == (f.why == "")
        n = 64
        f.transfer([(ferry.OP_WRITE, out.ctypes.data + i * BLOCK, i * BLOCK, BLOCK)
                    for i in range(n)], sync=True)
        assert os.pread(fd, out.nbytes, 0) == out.tobytes()
        with f.submit([(ferry.OP_READ, back.ctypes.data + i * BLOCK, (n - 1 - i) * BLOCK, BLOCK)
                       for i in range(n)]) as b:
            assert b.wait() is True
        expect = out.reshape(n, BLOCK)[::-1].reshape(-1)
        assert np.array_equal(back, expect)
        # a buffer object as local (length None: all of it)
        mem = bytearray(1000)
        engine.register(mem)
        f.transfer([(ferry.OP_READ, mem, 7, None)])
        assert bytes(mem) == out[7:1007].tobytes()
    assert not f.registered
    with pytest.raises(ferry.Error) as e:
        f.transfer([(ferry.OP_READ, back, 0, 16)])
    assert e.value.code == ferry.ENOTFOUND


def test_file_errors(engine, tmpfile):
    fd, path = tmpfile
    buf = np.zeros(2 * BLOCK, dtype=np.uint8)
    engine.register(buf)
    loose = np.zeros(BLOCK, dtype=np.uint8)
    with pytest.raises(ferry.Error) as e:
        engine.register_file(10**6)
    assert e.value.code == ferry.EINVAL and "not an open file descriptor" in e.value.detail
    with engine.register_file(fd) as f:
        with pytest.raises(ferry.Error) as e:
            f.transfer([(ferry.OP_WRITE, loose.ctypes.data, 0, BLOCK)])
        assert e.value.code == ferry.ENOTREG
        os.pwrite(fd, b"x" * 10000, 0)
        with pytest.raises(ferry.Error) as e:
            f.transfer([(ferry.OP_READ, buf.ctypes.data, 8192, 4096)])
        assert e.value.code == ferry.EIO
        assert "end of file at byte 10000" in e.value.detail and path in e.value.detail
    ro = os.open(path, os.O_RDONLY)
    try:
        with engine.register_file(ro) as f:
            with pytest.raises(ferry.Error) as e:
                f.transfer([(ferry.OP_WRITE, buf.ctypes.data, 0, 4096)])
            assert e.value.code == ferry.EINVAL and "read-only" in e.value.detail
    finally:
        os.close(ro)


def test_file_outlives_engine_close(tmpfile):
    fd, _ = tmpfile
    e = ferry.Engine("127.0.0.1")
    f = e.register_file(fd)
    e.close()  # unregisters the file
    assert not f.registered
    with pytest.raises(ferry.Error) as err:
        f.transfer([(ferry.OP_READ, 0, 0, 1)])
    assert err.value.code == ferry.ECLOSED
    f.unregister()  # harmless


# ---- nixl: the POSIX backend ---------------------------------------------------------

@pytest.fixture
def agent():
    with contextlib.closing(nixl_agent("kv", nixl_agent_config(backends=["POSIX"]))) as a:
        yield a


def wait_done(agent, handle):
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    return state


def test_nixl_posix_plugin(agent):
    assert "POSIX" in agent.get_plugin_list()
    assert agent.get_plugin_mem_types("POSIX") == ["DRAM", "FILE"]
    assert agent.get_backend_mem_types("POSIX") == ["DRAM", "FILE"]
    assert "FILE" not in agent.get_plugin_mem_types("UCX")



def test_nixl_query_memory(agent, tmpfile):
    """NIXL's query_memory on POSIX: per descriptor, the named file's size,
    mode and mtime (stat's, as decimal strings), or None for an empty or
    missing name (NIXL's query_mem_example)."""
    fd, path = tmpfile
    os.pwrite(fd, b"x" * 1234, 0)
    st = os.stat(path)
    got = agent.query_memory([(0, 0, 0, path), (0, 0, 0, "/nonexistent/ferry"), (0, 0, 0, "")],
                             "POSIX", mem_type="FILE")
    assert got == [{"size": "1234", "mode": str(st.st_mode), "mtime": str(int(st.st_mtime))},
                   None, None]
    with pytest.raises(nb.nixlNotFoundError, match="was not created"):
        agent.query_memory([(0, 0, 0, path)], "GDS", mem_type="FILE")

def test_nixl_posix_write_then_read_back(agent, tmpfile):
    """NIXL's POSIX flow: register DRAM and the file, WRITE DRAM -> FILE,
    READ it back FILE -> DRAM, both with the agent itself as the remote."""
    fd, _ = tmpfile
    n = 16
    src = np.random.default_rng(2).integers(0, 256, n * BLOCK, dtype=np.uint8)
    dst = np.zeros_like(src)
    agent.register_memory([(src.ctypes.data, src.nbytes, 0, ""),
                           (dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    file_reg = agent.register_memory([(0, n * BLOCK, fd, "kv-file")], "FILE")
    dram = agent.get_xfer_descs([(src.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(n)],
                                "DRAM")
    files = agent.get_xfer_descs([(i * BLOCK, BLOCK, fd) for i in range(n)], "FILE")
    h = agent.initialize_xfer("WRITE", dram, files, agent.name)
    assert wait_done(agent, h) == "DONE"
    agent.release_xfer_handle(h)
    assert os.pread(fd, src.nbytes, 0) == src.tobytes()

    back = agent.get_xfer_descs([(dst.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(n)],
                                "DRAM")
    h = agent.initialize_xfer("READ", back, files, agent.name)
    assert wait_done(agent, h) == "DONE"
    assert np.array_equal(dst, src)
    # a handle may be posted again: the file changed, the READ sees it
    os.pwrite(fd, bytes(BLOCK), 0)
    assert wait_done(agent, h) == "DONE"
    assert not dst[:BLOCK].any() and np.array_equal(dst[BLOCK:], src[BLOCK:])
    agent.release_xfer_handle(h)
    assert b"kv-file" not in agent.get_agent_metadata()  # files are not published
    agent.deregister_memory(file_reg)
    with pytest.raises(nb.nixlNotFoundError, match="not registered"):
        agent.initialize_xfer("READ", back, files, agent.name)


def test_nixl_posix_read_past_end_is_err(agent, tmpfile):
    fd, _ = tmpfile
    buf = np.zeros(BLOCK, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    agent.register_memory([(0, 0, fd, "")], "FILE")
    h = agent.initialize_xfer("READ", agent.get_xfer_descs([(buf.ctypes.data, BLOCK, 0)], "DRAM"),
                              agent.get_xfer_descs([(0, BLOCK, fd)], "FILE"), agent.name)
    assert wait_done(agent, h) == "ERR"
    err = agent.get_xfer_error(h)
    assert "end of file" in str(err) and err.cause[0] == ferry.EIO
    agent.release_xfer_handle(h)


def test_nixl_file_needs_posix(tmpfile):
    fd, _ = tmpfile
    with contextlib.closing(nixl_agent("net", nixl_agent_config(backends=["UCX"]))) as a:
        with pytest.raises(nb.nixlNotSupportedError, match="POSIX"):
            a.register_memory([(0, 0, fd, "")], "FILE")
    with contextlib.closing(nixl_agent("both", nixl_agent_config(backends=["UCX", "POSIX"]))) as a:
        a.register_memory([(0, 0, fd, "")], "FILE")
        buf = np.zeros(4096, dtype=np.uint8)
        a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
        files = a.get_xfer_descs([(0, 4096, fd)], "FILE")
        dram = a.get_xfer_descs([(buf.ctypes.data, 4096, 0)], "DRAM")
        with pytest.raises(nb.nixlInvalidParamError, match="own files"):
            a.initialize_xfer("WRITE", dram, files, "someone-else")
        with pytest.raises(nb.nixlNotSupportedError, match="notifications"):
            a.initialize_xfer("WRITE", dram, files, a.name, notif_msg=b"x")
