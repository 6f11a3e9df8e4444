"""ferry - one-sided WRITE/READ of registered memory between processes.

This package is a thin layer over libferry's C API (the extension module
``ferry._ferry``). The main objects are:

``Engine(host=None, *, port=0, transports="all", metadata_url=None, ...)``
    One engine per process. It listens on an RPC port; peers name it by
    ``engine.name`` ("host:port", or its segment name with a metadata service).
    A bad option, or a bad value of an environment variable libferry reads
    (``FERRY_TRANSPORTS``, ``MC_FORCE_TCP``, ...), raises ``Error`` with code
    ``EINVAL`` naming it, its value and what is accepted.

    - ``register(buf_or_addr, length=None)`` / ``unregister(addr)`` and the
      ``*_batch`` forms; ``alloc(length)`` / ``free(addr)`` for a registered,
      zero-filled buffer.
    - ``write(target, local, remote_addr, length=None)`` and ``read(...)``:
      synchronous, return once the bytes are at the destination.
    - ``transfer_batch(target, entries, notify=None)`` with entries
      ``(op, local, remote_addr, length)``; ``submit(...)`` returns a ``Batch``
      (``status()``, ``wait(timeout_ms=-1)``, ``free()``, context manager).
      ``transfer_arrays`` / ``submit_arrays`` take one op and three parallel
      integer sequences (the fast path for very large batches).
    - Receive pools (message handoff): ``create_pool(name, buffer_or_size)``
      -> ``Pool`` (``.name``, ``.size``, ``fileno()``, ``close()``, context
      manager); ``send(target, pool, tag, data, timeout=None, nowait=False)``
      moves ``data`` into the target's pool and returns once the receiver has
      it; ``recv(pool, tag=None, timeout=None)`` -> ``Message``, the bytes in
      place (buffer protocol: ``numpy.frombuffer`` / ``torch.frombuffer``
      give a view) with ``.tag``, ``.sender``, ``.release()`` and a context
      manager. ``await recv_async(engine, pool, tag=None, timeout=None)`` is
      the asyncio form.
    - ``probe(target)``, ``notify(target, name, data)``,
      ``drain_notifications()`` -> ``[(name, bytes)]``,
      ``peer_regions(target)``, ``peer_transport(target)``, ``close()``.

    ``local`` is an int address (e.g. ``tensor.data_ptr()``) or any contiguous
    object supporting the buffer protocol (bytearray, memoryview, numpy
    arrays; read-only ones such as bytes only as a WRITE source). Blocking
    calls release the GIL.

``Error``
    Raised by every failing call: a ``RuntimeError`` with ``.code`` (the
    ferry status, one of the ``E*`` constants), ``.mooncake_code`` (the same
    cause in Mooncake's numbering) and ``.detail`` (libferry's message naming
    the step, the peer and the cause).

Module functions: ``strerror(code)``, ``to_mooncake(code)``, ``version()``,
``transport_name(bit)``, ``transport_parse(names)``, ``set_log_level(level)``,
``get_log_level()``; constants ``OK``, ``EINVAL`` ... ``EINPROGRESS``,
``OP_READ``, ``OP_WRITE``, ``TRANSPORT_*``, ``BATCH_*``, ``LOG_*``.

``mooncake.engine.TransferEngine`` (installed alongside) offers Mooncake's
Python API on top of this package.

``python -m ferry COMMAND ...`` (or the ``ferry`` command) runs the ferry
command-line tool built with this package: ``metadata-server``, ``doctor``,
``bench``, ``serve``, ``probe``.
"""

from ferry._ferry import (  # noqa: F401
    BATCH_DONE,
    BATCH_FAILED,
    BATCH_PENDING,
    BATCH_TIMEDOUT,
    EAUTH,
    EBUSY,
    ECHECKSUM,
    ECLOSED,
    EDNS,
    EHANDSHAKE,
    EINPROGRESS,
    EINVAL,
    EJSON,
    EMETADATA,
    ENOMEM,
    ENOTFOUND,
    ENOTIMPL,
    ENOTREG,
    EOVERLAP,
    EPROTO,
    EREMOTE,
    ESOCKET,
    ETIMEDOUT,
    ETRANSPORT,
    EVERSION,
    LOG_DEBUG,
    LOG_ERROR,
    LOG_INFO,
    LOG_OFF,
    LOG_WARN,
    OK,
    OP_READ,
    OP_WRITE,
    TRANSPORT_ALL,
    TRANSPORT_FABRIC,
    TRANSPORT_SHM,
    TRANSPORT_TCP,
    VERSION_STRING,
    Batch,
    Engine,
    Error,
    Message,
    Pool,
    get_log_level,
    last_error,
    set_log_level,
    strerror,
    to_mooncake,
    transport_name,
    transport_parse,
    version,
)

__version__ = VERSION_STRING

__all__ = [
    "Engine",
    "Batch",
    "Error",
    "Pool",
    "Message",
    "recv_async",
    "strerror",
    "to_mooncake",
    "version",
    "last_error",
    "transport_name",
    "transport_parse",
    "set_log_level",
    "get_log_level",
    "OK",
    "EINVAL",
    "ENOTREG",
    "EOVERLAP",
    "ENOMEM",
    "ESOCKET",
    "EDNS",
    "EHANDSHAKE",
    "EVERSION",
    "EAUTH",
    "ETIMEDOUT",
    "EPROTO",
    "EMETADATA",
    "EJSON",
    "ENOTIMPL",
    "EBUSY",
    "ECHECKSUM",
    "ETRANSPORT",
    "ECLOSED",
    "ENOTFOUND",
    "EREMOTE",
    "EINPROGRESS",
    "OP_READ",
    "OP_WRITE",
    "TRANSPORT_TCP",
    "TRANSPORT_SHM",
    "TRANSPORT_FABRIC",
    "TRANSPORT_ALL",
    "BATCH_PENDING",
    "BATCH_DONE",
    "BATCH_FAILED",
    "BATCH_TIMEDOUT",
    "LOG_DEBUG",
    "LOG_INFO",
    "LOG_WARN",
    "LOG_ERROR",
    "LOG_OFF",
    "VERSION_STRING",
]


async def recv_async(engine, pool, tag=None, timeout=None):
    """Awaitable Engine.recv. Any tag: waits on the pool's fd in the event
    loop (no thread parked); a given tag: in the loop's default executor, as
    other tags' messages also make the fd readable."""
    import asyncio

    loop = asyncio.get_running_loop()
    if tag is not None:
        return await loop.run_in_executor(None, lambda: engine.recv(pool, tag, timeout))
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        try:
            return engine.recv(pool, None, 0)
        except Error as e:
            if e.code != ETIMEDOUT:
                raise
        ready = loop.create_future()
        loop.add_reader(pool.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            await asyncio.wait_for(ready, left)
        except asyncio.TimeoutError:
            return engine.recv(pool, None, 0)  # raises ETIMEDOUT naming the pool
        finally:
            loop.remove_reader(pool.fileno())
