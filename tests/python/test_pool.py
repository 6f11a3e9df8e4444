"""test_pool.py - receive pools from Python: create_pool, send, recv into a
Message read in place (numpy views), release on views' end, the asyncio
form on the pool's fd, and the errors a sender and a receiver see. Two
engines in this process over tcp loopback."""

import asyncio
import os
import select
import threading

import numpy as np
import pytest

import ferry


@pytest.fixture
def pair():
    rx = ferry.Engine("127.0.0.1", transports="tcp")
    tx = ferry.Engine("127.0.0.1", transports="tcp")
    yield rx, tx
    tx.close()
    rx.close()


def test_send_recv_numpy_view(pair):
    rx, tx = pair
    with rx.create_pool("emb", 8 << 20) as pool:
        emb = np.random.default_rng(1).standard_normal((256, 4096)).astype(np.float16)
        tx.send(rx.name, "emb", b"req-1", emb)
        with rx.recv(pool, "req-1", timeout=5) as msg:
            assert msg.tag == b"req-1"
            assert msg.sender == tx.name
            assert len(msg) == emb.nbytes
            got = np.frombuffer(msg, dtype=np.float16).reshape(emb.shape)
            assert np.array_equal(got, emb)
            del got


def test_send_batch_delivers_each(pair):
    rx, tx = pair
    rng = np.random.default_rng(3)
    embs = [rng.standard_normal((n, 1024)).astype(np.float16) for n in (16, 300, 1024)]
    with rx.create_pool("emb", 16 << 20) as pool:
        tx.send_batch(rx.name, "emb", [(b"b%d" % i, e) for i, e in enumerate(embs)])
        for i, e in enumerate(embs):
            with rx.recv(pool, b"b%d" % i, timeout=5) as msg:
                assert bytes(msg) == e.tobytes()
        with pytest.raises(ferry.Error) as err:
            tx.send_batch(rx.name, "emb", [(b"ok", embs[0]), (b"big", bytes(32 << 20))])
        assert "message 1" in str(err.value) and "does not fit" in str(err.value)
        with rx.recv(pool, b"ok", timeout=5) as msg:
            assert bytes(msg) == embs[0].tobytes()
        with pytest.raises(TypeError):
            tx.send_batch(rx.name, "emb", [b"not a pair"])


def test_user_memory_pool_and_any_tag(pair):
    rx, tx = pair
    backing = bytearray(1 << 20)
    pool = rx.create_pool("user", backing)
    assert pool.size == len(backing)
    tx.send(rx.name, "user", "a", b"hello")
    msg = rx.recv(pool, timeout=5)
    assert bytes(memoryview(msg)) == b"hello"
    assert bytes(backing).find(b"hello") >= 0  # in place, in the caller's memory
    msg.release()
    pool.close()


def test_release_waits_for_views(pair):
    rx, tx = pair
    pool = rx.create_pool("small", 1 << 20)
    data = os.urandom(400 << 10)  # one sender's message: at most half the pool
    tx.send(rx.name, "small", "one", data)
    tx.send(rx.name, "small", "other", data)  # room is left for neither a third
    msg = rx.recv(pool, "one", timeout=5)
    view = np.frombuffer(msg, dtype=np.uint8)
    msg.release()  # the slot stays while `view` lives
    with pytest.raises(ferry.Error) as e:
        tx.send(rx.name, "small", "two", data, nowait=True)
    assert e.value.code == ferry.EBUSY
    with pytest.raises(BufferError):
        pool.close()
    assert view.tobytes() == data
    del view  # now the slot goes back
    tx.send(rx.name, "small", "two", data, nowait=True)
    with rx.recv(pool, "two", timeout=5) as m:
        assert bytes(memoryview(m)) == data
    pool.close()


def test_errors_name_pool_and_tag(pair):
    rx, tx = pair
    pool = rx.create_pool("p", 1 << 16)
    with pytest.raises(ferry.Error) as e:
        rx.recv(pool, "never", timeout=0.05)
    assert e.value.code == ferry.ETIMEDOUT
    assert "'never'" in e.value.detail and "pool 'p'" in e.value.detail
    with pytest.raises(ferry.Error) as e:
        tx.send(rx.name, "p", "big", bytes(1 << 17))
    assert e.value.code == ferry.EINVAL
    with pytest.raises(ferry.Error) as e:
        tx.send(rx.name, "nope", "t", b"x")
    assert e.value.code == ferry.ENOTFOUND
    pool.close()


def test_fd_and_recv_async(pair):
    rx, tx = pair
    pool = rx.create_pool("async", 1 << 20)
    assert select.select([pool.fileno()], [], [], 0)[0] == []

    async def main():
        waiting = asyncio.ensure_future(ferry.recv_async(rx, pool, timeout=10))
        await asyncio.sleep(0)  # let it reach the loop's reader
        sender = threading.Thread(target=tx.send, args=(rx.name, "async", "late", b"abc"))
        sender.start()
        msg = await waiting
        sender.join()
        return msg

    msg = asyncio.run(main())
    assert msg.tag == b"late" and bytes(memoryview(msg)) == b"abc"
    msg.release()

    async def nothing():
        return await ferry.recv_async(rx, pool, timeout=0.05)

    with pytest.raises(ferry.Error) as e:
        asyncio.run(nothing())
    assert e.value.code == ferry.ETIMEDOUT
    pool.close()


def test_recv_releases_the_gil(pair):
    rx, tx = pair
    pool = rx.create_pool("gil", 1 << 20)
    got = []
    t = threading.Thread(target=lambda: got.append(rx.recv(pool, "x", timeout=10)))
    t.start()
    tx.send(rx.name, "gil", "x", b"1234")  # runs while the receiver's thread waits
    t.join()
    assert bytes(memoryview(got[0])) == b"1234"
    got[0].release()
    pool.close()


def test_readme_handoff_runs():
    """The README's handoff in ten lines runs as written."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    section = text.split("## Message handoff", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    env = {"ferry": ferry, "np": np}
    exec(compile(code, "README.md", "exec"), env)
    env["pool"].close()
    env["encoder"].close()
    env["prefill"].close()
