"""test_pool.py - receive pools from Python: create_pool, send, recv into a
Message read in place (numpy views), release on views' end, views that
outlive Engine.close() (in a child process, so a crash fails the test),
the asyncio forms (recv_async on the pool's fd: no thread per wait, safe
to cancel; send_async), and the errors a sender and a receiver see. Two
engines in this process over tcp loopback."""

import asyncio
import os
import select
import subprocess
import sys
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


# ---- views outliving the engine ------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VIEWS_AFTER_CLOSE = r"""
import os, sys
import numpy as np
import ferry

def eventfd_open(fd):
    try:
        return os.readlink("/proc/self/fd/%d" % fd) == "anon_inode:[eventfd]"
    except OSError:
        return False

tx = ferry.Engine("127.0.0.1", transports="tcp")
data = np.arange(64 << 10, dtype=np.uint32)

# Leaving `with`: the view made inside stays readable; close stopped the engine.
with ferry.Engine("127.0.0.1", transports="tcp") as rx:
    name = rx.name
    pool = rx.create_pool("p", 1 << 20)
    fd = pool.fileno()
    tx.send(rx.name, "p", "a", data)
    view = np.frombuffer(rx.recv(pool, "a", timeout=5), dtype=np.uint32)
    raw = memoryview(view)
try:
    tx.probe(name)
    sys.exit("the closed engine still answers")
except ferry.Error:
    pass
assert rx.closed and eventfd_open(fd), "memory and pool kept while a view lives"
assert (view == data).all() and raw.tobytes() == data.tobytes()
try:
    pool.close()
    sys.exit("pool.close() with a live view")
except BufferError:
    pass
try:
    pool.fileno()
    sys.exit("fileno() of a closed engine's pool")
except ferry.Error as e:
    assert e.code == ferry.ECLOSED
del raw
del view  # the last view: now the engine is destroyed and its memory freed
assert not eventfd_open(fd), "the engine outlived its last view"
print("with: ok")

# close(); a message received and not viewed refuses a view afterwards.
rx = ferry.Engine("127.0.0.1", transports="tcp")
pool = rx.create_pool("p", 1 << 20)
tx.send(rx.name, "p", "b", data)
tx.send(rx.name, "p", "c", data)
kept = memoryview(rx.recv(pool, "b", timeout=5))
unread = rx.recv(pool, "c", timeout=5)
rx.close()
assert kept.tobytes() == data.tobytes()
try:
    memoryview(unread)
    sys.exit("a view made after close")
except BufferError as e:
    assert "engine has been closed" in str(e), e
print("close: ok")

# A pool over the caller's memory: a view after close reads it in place.
rx = ferry.Engine("127.0.0.1", transports="tcp")
backing = bytearray(1 << 20)
pool = rx.create_pool("u", backing)
tx.send(rx.name, "u", "d", b"in user memory")
user_view = memoryview(rx.recv(pool, "d", timeout=5))
rx.close()
assert user_view.tobytes() == b"in user memory"
print("user memory: ok")

# Interpreter exit with views of closed engines alive: freed in any order.
rx = ferry.Engine("127.0.0.1", transports="tcp")
pool = rx.create_pool("p", 1 << 20)
tx.send(rx.name, "p", "e", data)
at_exit = np.frombuffer(rx.recv(pool, "e", timeout=5), dtype=np.uint32)
rx.close()
tx.close()
print("exit: ok")
"""


def test_views_outlive_engine_close():
    """A view of a message stays readable after Engine.close() and after
    leaving `with Engine`: the memory is freed with the last view (the pool's
    eventfd, closed by the engine's destroy, shows when). Red: SIGSEGV."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run = subprocess.run([sys.executable, "-c", VIEWS_AFTER_CLOSE], env=env, capture_output=True,
                         text=True, timeout=90)
    assert run.returncode == 0, "exit %d\n%s%s" % (run.returncode, run.stdout, run.stderr)
    assert run.stdout.split("\n") == ["with: ok", "close: ok", "user memory: ok", "exit: ok", ""]


# ---- asyncio ------------------------------------------------------------------

def test_cancelled_tagged_wait_consumes_nothing(pair):
    """A tagged wait that timed out (wait_for) takes nothing: the message
    sent after it goes to the next wait."""
    rx, tx = pair
    pool = rx.create_pool("cancel", 1 << 20)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ferry.recv_async(rx, pool, b"A"), 0.2)
        tx.send(rx.name, "cancel", "A", b"after the timeout")
        return await ferry.recv_async(rx, pool, b"A", timeout=10)

    with asyncio.run(main()) as msg:
        assert bytes(msg) == b"after the timeout"
    pool.close()


def test_cancel_after_the_take_puts_the_message_back(pair):
    """The loop's reader took the message for a wait and resolved its future;
    the task is cancelled before it resumed: the message goes back to the
    pool (ferry_pool_requeue), in place for the next wait. Driven by the
    loop's order: the reader's callback runs after the poller's step of the
    same turn, the waiting task's step in the next turn after the poller's."""
    rx, tx = pair
    pool = rx.create_pool("race", 1 << 20)

    async def main():
        task = asyncio.ensure_future(ferry.recv_async(rx, pool, b"R"))
        await asyncio.sleep(0)  # the task waits on its future
        waiter = task._fut_waiter
        assert waiter is not None and not waiter.done()
        tx.send(rx.name, "race", "R", b"taken then cancelled")  # landed: the fd is signalled
        while not waiter.done():
            await asyncio.sleep(0)
        task.cancel()  # the future holds the message; the task has not resumed
        with pytest.raises(asyncio.CancelledError):
            await task
        return await ferry.recv_async(rx, pool, b"R", timeout=10)

    with asyncio.run(main()) as msg:
        assert bytes(msg) == b"taken then cancelled"
    pool.close()


def test_tagged_waits_hold_no_thread(pair):
    """Eight tagged waits park no thread (the default executor stays free
    for to_thread work), and each gets its own message."""
    rx, tx = pair
    pool = rx.create_pool("eight", 1 << 20)

    async def main():
        threads = threading.active_count()
        waits = [asyncio.ensure_future(ferry.recv_async(rx, pool, b"t%d" % i)) for i in range(8)]
        await asyncio.sleep(0)
        assert threading.active_count() == threads
        assert not any(w.done() for w in waits)
        assert await asyncio.wait_for(asyncio.to_thread(lambda: 42), 30) == 42
        for i in reversed(range(8)):
            tx.send(rx.name, "eight", b"t%d" % i, b"m%d" % i)
        return await asyncio.gather(*waits)

    for i, msg in enumerate(asyncio.run(main())):
        assert msg.tag == b"t%d" % i and bytes(msg) == b"m%d" % i
        msg.release()
    pool.close()


def test_tagged_wait_behind_other_tags(pair, monkeypatch):
    """A message nobody waits for sits in the pool (its fd readable): a wait
    for another tag neither spins on it (the dispatcher's reader runs once
    in 100 turns of the loop, where a level-triggered one would run in each)
    nor misses its own tag's arrival (libferry signals the fd on every
    landing)."""
    from ferry import _async

    rx, tx = pair
    pool = rx.create_pool("backlog", 1 << 20)
    tx.send(rx.name, "backlog", "other", b"unclaimed")
    wakes = []
    on_arrival = _async._Arrivals._on_arrival
    monkeypatch.setattr(_async._Arrivals, "_on_arrival",
                        lambda self: (wakes.append(1), on_arrival(self)))

    async def main():
        wait = asyncio.ensure_future(ferry.recv_async(rx, pool, b"mine"))
        for _ in range(100):
            await asyncio.sleep(0)
        assert len(wakes) <= 1 and not wait.done()
        await asyncio.to_thread(tx.send, rx.name, "backlog", "mine", b"behind the backlog")
        return await asyncio.wait_for(wait, 30)

    with asyncio.run(main()) as msg:
        assert bytes(msg) == b"behind the backlog"
    with rx.recv(pool, "other", timeout=5) as msg:
        assert bytes(msg) == b"unclaimed"
    pool.close()


def test_two_untagged_waits_on_one_pool(pair):
    """Two waits for any tag on one pool in one loop (no timeout of their
    own): each gets a message (send_async's), none is left without a reader."""
    rx, tx = pair
    pool = rx.create_pool("any", 1 << 20)

    async def main():
        waits = [asyncio.ensure_future(ferry.recv_async(rx, pool)) for _ in range(2)]
        await asyncio.sleep(0)
        for tag in (b"x", b"y"):
            await ferry.send_async(tx, rx.name, "any", tag, tag * 3)
        return await asyncio.wait_for(asyncio.gather(*waits), 30)

    got = asyncio.run(main())
    assert sorted(bytes(m) for m in got) == [b"xxx", b"yyy"]
    for m in got:
        m.release()
    pool.close()


def test_async_timeout_states_the_wait(pair):
    """A wait that ends at its timeout says how long it waited."""
    rx, _ = pair
    pool = rx.create_pool("slow", 1 << 16)
    for tag, words in ((None, "no message within 300 ms"),
                       ("z", "no message tagged 'z' within 300 ms")):
        with pytest.raises(ferry.Error) as e:
            asyncio.run(ferry.recv_async(rx, pool, tag, timeout=0.3))
        assert e.value.code == ferry.ETIMEDOUT
        assert words in e.value.detail and "pool 'slow'" in e.value.detail, e.value.detail
    pool.close()


def test_close_ends_async_waits(pair):
    """Closing the pool, then the engine, ends the waits on them with an
    error at once (libferry signals the pool's fd), not at their timeout."""
    rx, _ = pair
    pool = rx.create_pool("closing", 1 << 16)

    async def wait_then(close):
        wait = asyncio.ensure_future(ferry.recv_async(rx, pool, b"never", timeout=60))
        await asyncio.sleep(0)
        close()
        with pytest.raises(ferry.Error) as e:
            await asyncio.wait_for(wait, 30)
        return e.value

    err = asyncio.run(wait_then(pool.close))
    assert err.code == ferry.EINVAL and "pool has been closed" in str(err)
    pool = rx.create_pool("closing", 1 << 16)
    err = asyncio.run(wait_then(rx.close))
    assert err.code == ferry.ECLOSED
