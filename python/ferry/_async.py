"""_async.py - the asyncio forms of Engine.recv and Engine.send.

recv_async waits in the event loop, with no thread per waiting receive.
One dispatcher per (loop, pool), alive while receives wait, polls a dup of
the pool's fd in its own edge-triggered epoll, itself a reader of the loop.
libferry signals that fd on every landing, even while other messages wait,
so a wait for one tag is not blind behind a backlog of other tags (a
level-triggered reader would spin on them). On each arrival the dispatcher
tries a receive that does not wait (timeout 0) for every tag waited on,
in the loop's thread, and hands each message to the earliest waiter of its
tag, resolving its future at once. Hence a cancelled wait never consumes a
message: a future cancelled before an arrival is skipped, and a task
cancelled after its future got a message but before it resumed puts the
message back in its place in the pool (Message._requeue, libferry's
ferry_pool_requeue). The dup keeps the epoll's registration when the pool
closes its fd: libferry signals a destroyed pool and a shut-down engine,
and the waiters get the receive's error (ECLOSED, or EINVAL "the pool has
been closed").

send_async runs Engine.send in the loop's default executor: ferry_send
blocks (a grant round trip, the WRITE, its acknowledgement) and libferry
has no send that completes on an fd. Each send holds a thread for at most
its timeout (a full pool's wait; nowait=True refuses at once instead).
"""

import asyncio
import collections
import functools
import os
import select

from ferry._ferry import ECLOSED, ETIMEDOUT, Error, strerror

_dispatchers = {}  # (loop, pool) -> _Arrivals, while a receive waits


def _tag_key(tag):
    """The tag as bytes (None: any tag), as Engine.recv reads it."""
    if tag is None or isinstance(tag, bytes):
        return tag
    if isinstance(tag, str):
        return tag.encode("utf-8", "surrogateescape")
    return bytes(tag)


def _timed_out(engine, pool, tag, timeout):
    """ETIMEDOUT as Engine.recv words it, naming the wait's real bound."""
    what = "no message" if tag is None else "no message tagged '%s'" % tag.decode(
        "utf-8", "backslashreplace")
    detail = "recv on pool '%s' of %s: %s within %d ms" % (pool.name, engine.name, what,
                                                           round(timeout * 1000))
    return Error(ETIMEDOUT, "%s (%d): %s" % (strerror(ETIMEDOUT), ETIMEDOUT, detail), detail)


class _Arrivals:
    """The receives waiting on one pool in one event loop."""

    def __init__(self, loop, engine, pool):
        self._loop = loop
        self._engine = engine
        self._pool = pool
        self._waiters = {}  # tag (None: any) -> deque of futures, earliest first
        self._fd = os.dup(pool.fileno())
        try:
            self._epoll = select.epoll()
            self._epoll.register(self._fd, select.EPOLLIN | select.EPOLLET)
            loop.add_reader(self._epoll.fileno(), self._on_arrival)
        except BaseException:
            os.close(self._fd)
            raise

    @classmethod
    def of(cls, loop, engine, pool):
        key = (loop, pool)
        arrivals = _dispatchers.get(key)
        if arrivals is None:
            arrivals = _dispatchers[key] = cls(loop, engine, pool)
        return arrivals

    def wait(self, tag):
        """A future for the next message with tag; served at once when one
        waits already (and no earlier waiter of the tag is served first)."""
        fut = self._loop.create_future()
        self._waiters.setdefault(tag, collections.deque()).append(fut)
        self._serve(tag)
        return fut

    def expire(self, tag, fut, timeout):
        self._serve(tag)  # an arrival the loop has not dispatched yet
        if not fut.done():
            fut.set_exception(_timed_out(self._engine, self._pool, tag, timeout))

    def forget(self, tag, fut):
        queue = self._waiters.get(tag)
        if queue is not None and fut in queue:
            queue.remove(fut)
        self._drop_if_empty(tag)

    def _on_arrival(self):
        self._epoll.poll(0)  # takes the edges: the next landing makes a new one
        for tag in list(self._waiters):
            self._serve(tag)

    def _serve(self, tag):
        queue = self._waiters.get(tag, ())
        while queue:
            fut = queue[0]
            if not fut.done():
                try:
                    fut.set_result(self._engine.recv(self._pool, tag, 0))
                except Error as e:
                    if e.code == ETIMEDOUT:
                        break  # none with this tag waits
                    fut.set_exception(e)
            queue.popleft()
        self._drop_if_empty(tag)

    def _drop_if_empty(self, tag):
        if tag in self._waiters and not self._waiters[tag]:
            del self._waiters[tag]
        if self._waiters or _dispatchers.get((self._loop, self._pool)) is not self:
            return
        del _dispatchers[(self._loop, self._pool)]
        self._loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        os.close(self._fd)


def _put_back(fut):
    """A wait whose task ends before it took its future's message (a
    cancel that came after the take): the message waits in the pool again."""
    if not fut.done() or fut.cancelled() or fut.exception() is not None:
        return
    try:
        fut.result()._requeue()
    except Error as e:
        if e.code != ECLOSED:  # a closed engine took the message with it
            raise


async def recv_async(engine, pool, tag=None, timeout=None):
    """Awaitable Engine.recv(pool, tag, timeout): waits in the event loop on
    the pool's fd (no thread), any tag or one. Cancelling it (wait_for,
    task.cancel) never consumes a message. Past timeout seconds: ferry.Error
    ETIMEDOUT naming the pool, the tag and the wait."""
    loop = asyncio.get_running_loop()
    tag = _tag_key(tag)
    arrivals = _Arrivals.of(loop, engine, pool)
    fut = arrivals.wait(tag)
    timer = None
    if timeout is not None and not fut.done():
        timer = loop.call_later(max(timeout, 0), arrivals.expire, tag, fut, max(timeout, 0))
    try:
        return await fut
    except BaseException:
        _put_back(fut)
        raise
    finally:
        if timer is not None:
            timer.cancel()
        arrivals.forget(tag, fut)


async def send_async(engine, target, pool, tag, data, length=None, timeout=None, nowait=False):
    """Awaitable Engine.send, run in the loop's default executor (ferry_send
    blocks; libferry has no send that completes on an fd). Cancelling the
    await does not stop the send: the message may still be delivered."""
    loop = asyncio.get_running_loop()
    send = functools.partial(engine.send, target, pool, tag, data, length=length,
                             timeout=timeout, nowait=nowait)
    return await loop.run_in_executor(None, send)
