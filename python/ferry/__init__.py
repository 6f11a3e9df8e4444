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
    - ``plan(target, local, remote)`` -> ``Plan``: descriptor lists, each
      ``(addr, length)`` pairs or an N x 2 integer array, checked once (local
      against this engine's registrations, remote against the target's);
      ``Plan.transfer(op, local_idx, remote_idx, notify=None, merge=True)``
      moves pairs ``local_idx[i] <-> remote_idx[i]`` (numpy int64 index arrays
      are read in place), ``Plan.submit(...)`` returns a ``Batch``; adjacent
      pairs merge into one operation unless ``merge=False``. Unregistering a
      local region a plan uses fails its later transfers (``ENOTREG``); a
      restarted target's table is checked again by the next transfer.
    - Receive pools (message handoff): ``create_pool(name, buffer_or_size)``
      -> ``Pool`` (``.name``, ``.size``, ``fileno()``, ``close()``, context
      manager); ``send(target, pool, tag, data, timeout=None, nowait=False)``
      moves ``data`` into the target's pool and returns once the receiver has
      it; ``send_batch(target, pool, [(tag, data), ...], timeout=None,
      nowait=False)`` the same for many, all in flight together; ``recv(pool, tag=None, timeout=None)`` -> ``Message``, the bytes in
      place (buffer protocol: ``numpy.frombuffer`` / ``torch.frombuffer``
      give a view) with ``.tag``, ``.sender``, ``.release()`` and a context
      manager. asyncio: ``await recv_async(engine, pool, tag=None,
      timeout=None)`` waits in the event loop on the pool's fd (no thread
      per wait, any tag or one; a cancelled wait never consumes a message),
      ``await send_async(engine, target, pool, tag, data, ...)`` runs
      ``send`` in the loop's default executor. A view of a message (numpy,
      memoryview) stays readable after ``Engine.close()``: the pool memory
      is freed with the last view.
    - FILE memory: ``register_file(fd, buffered=False)`` -> ``File``
      (``.path``, ``.direct``, ``.why``, ``.align``, ``unregister()``,
      context manager); ``File.transfer(entries, sync=False)`` and
      ``File.submit(...)`` -> ``Batch`` move ``(op, local, offset, length)``
      entries between registered memory and the file (``OP_READ``: file ->
      memory, ``OP_WRITE``: memory -> file) with preadv/pwritev, O_DIRECT for
      aligned operations where the file system takes it; ``sync=True``
      fdatasyncs before done. A READ past the end of the file raises ``EIO``.
    - ``probe(target)``, ``notify(target, name, data)``,
      ``drain_notifications()`` -> ``[(name, bytes)]``,
      ``peer_regions(target)``, ``peer_transport(target)``, ``close()``.
    - ``stats()`` -> dict: bytes and operations by op, per peer and
      transport (``links``), errors by code, batches in flight, registered
      memory, queued notifications, sync-call latency histogram;
      ``stats_text()`` the same in Prometheus' format; ``metrics_port`` the
      port of ``/metrics`` when ``FERRY_METRICS_PORT`` is set (0 otherwise).

    ``local`` is an int address (e.g. ``tensor.data_ptr()``) or any contiguous
    object supporting the buffer protocol (bytearray, memoryview, numpy
    arrays). A read-only one such as bytes is refused (``EINVAL``) where the
    memory would be written: by ``register`` (peers may WRITE a region) and
    as a READ's destination. Blocking calls release the GIL.

``Error``
    Raised by every failing call: a ``RuntimeError`` with ``.code`` (the
    ferry status, one of the ``E*`` constants), ``.mooncake_code`` (the same
    cause in Mooncake's numbering) and ``.detail`` (libferry's message naming
    the step, the peer and the cause).

Module functions: ``strerror(code)``, ``to_mooncake(code)``, ``version()``,
``transport_name(bit)``, ``transport_parse(names)``, ``cuda_available()``, ``set_log_level(level)``,
``get_log_level()``; constants ``OK``, ``EINVAL`` ... ``EINPROGRESS``, ``EFAULT``, ``ECANCELED``, ``EIO``,
``OP_READ``, ``OP_WRITE``, ``TRANSPORT_*``, ``BATCH_*``, ``LOG_*``.

Logging: libferry's lines (the ``listening`` line, refused connections,
fallbacks, ...) go to Python's ``logging``, logger ``"ferry"``, at the
matching level, with the engine's name in front of the message and as the
record's ``ferry_engine`` attribute (``ferry_thread``: the kernel thread
id). They reach your handlers from a daemon thread; nothing is written to
stderr by libferry itself unless you call ``log_to_stderr()``. libferry's
own level still applies first (``FERRY_LOG``, ``set_log_level``; default
info), so ``set_log_level("debug")`` is needed for its DEBUG lines.
``flush_log()`` hands over every line queued so far.

``mooncake.engine.TransferEngine`` (installed alongside) offers Mooncake's
Python API on top of this package.

``python -m ferry COMMAND ...`` (or the ``ferry`` command) runs the ferry
command-line tool built with this package: ``metadata-server``, ``doctor``,
``bench``, ``serve``, ``probe``.

``Store(engine, master, segment_size=0, local_buffer_size=0, secret=None, timeout_ms=0)``
    A client of a store master (``ferry store-master``; docs/store.md): it
    contributes ``segment_size`` bytes of the engine's memory to the pool.
    ``put(key, data, replicas=1, preferred_segment=None)``, ``get(key)``,
    ``remove(key)``, ``remove_all()`` raise ``Error``; ``batch_put_from(keys,
    addrs, sizes, ...)``, ``batch_get_into(keys, addrs, sizes)`` (addresses
    registered on the engine), ``batch_exists(keys)``, ``put_batch(keys,
    values, ...)`` (bytes-like values, staged) and ``get_ranges(keys, addrs,
    offsets, lengths)`` (one byte range of a value per index) answer per key
    or range and return ``(list, first failure's detail or None)``. ``segment``,
    ``close()`` (before the engine's). ``mooncake.store`` builds
    ``MooncakeDistributedStore`` on it.
"""

try:
    from ferry._ferry import (  # noqa: F401
        BATCH_DONE,
        BATCH_FAILED,
        BATCH_PENDING,
        BATCH_TIMEDOUT,
        EAUTH,
        EBUSY,
        ECANCELED,
        EIO,
        ECHECKSUM,
        ECLOSED,
        EDNS,
        EFAULT,
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
        PLAN_NO_MERGE,
        TRANSPORT_ALL,
        TRANSPORT_FABRIC,
        TRANSPORT_SHM,
        TRANSPORT_TCP,
        VERSION_STRING,
        Batch,
        Engine,
        File,
        Error,
        Message,
        Plan,
        Pool,
        Store,
        cuda_available,
        get_log_level,
        last_error,
        set_log_level,
        strerror,
        to_mooncake,
        transport_name,
        transport_parse,
        version,
    )
except ImportError as _err:  # a runtime library missing: say which, and its package
    from ferry._runtime import missing_library_error

    raise missing_library_error(_err) from _err

import atexit as _atexit
import logging as _logging
import os as _os
import threading as _threading

from ferry import _ferry
from ferry._async import recv_async, send_async  # noqa: F401

__version__ = VERSION_STRING

logger = _logging.getLogger("ferry")
_LEVELS = (_logging.DEBUG, _logging.INFO, _logging.WARNING, _logging.ERROR)
_log_lock = _threading.Lock()  # one hand-over at a time, so flush_log sees all


def _emit(level, time_ns, thread, engine, message):
    levelno = _LEVELS[min(level, len(_LEVELS) - 1)]
    if not logger.isEnabledFor(levelno):
        return
    text = f"{engine}: {message}" if engine else message
    record = logger.makeRecord(logger.name, levelno, "libferry", 0, text, None, None,
                               extra={"ferry_engine": engine, "ferry_thread": thread})
    if time_ns:
        record.created = time_ns / 1e9
        record.msecs = (time_ns // 1000000) % 1000
    logger.handle(record)


def flush_log():
    """Hands every libferry line queued so far to the logger "ferry"."""
    with _log_lock:
        for line in _ferry._log_take():
            _emit(*line)


def _drain_forever():
    while True:
        if _ferry._log_wait(1.0):
            flush_log()


def log_to_stderr(enable=True):
    """libferry writes its lines to stderr itself (True) or hands them to
    the logger "ferry" (False, the default)."""
    flush_log()
    _ferry._log_route(not enable)


def _start_drain():
    _threading.Thread(target=_drain_forever, name="ferry-log", daemon=True).start()


_ferry._log_route(True)
_start_drain()
_os.register_at_fork(after_in_child=_start_drain)  # a forked child has no drain thread
_atexit.register(flush_log)

__all__ = [
    "Engine",
    "File",
    "Batch",
    "Error",
    "Pool",
    "Message",
    "recv_async",
    "send_async",
    "strerror",
    "to_mooncake",
    "version",
    "last_error",
    "transport_name",
    "transport_parse",
    "set_log_level",
    "get_log_level",
    "flush_log",
    "log_to_stderr",
    "logger",
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
    "EFAULT",
    "ECANCELED",
    "EIO",
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
