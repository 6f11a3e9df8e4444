"""mooncake.store - Mooncake's ``MooncakeDistributedStore`` on ferry's store.

A client of a store master (``mooncake_master`` / ``ferry store-master``;
docs/store.md): it contributes ``global_segment_size`` bytes of registered
memory to the pool and moves values with ferry WRITE/READ directly between
its buffers and the segment holding a replica. Methods keep Mooncake's names,
argument order and return convention: 0 or a count on success, a negative
Mooncake store error number on failure (never an exception), whose cause is
logged at WARNING on the ``mooncake.store`` logger.

``setup`` takes Mooncake's arguments positionally or by keyword
(``local_hostname, metadata_server, global_segment_size, local_buffer_size,
protocol, rdma_devices, master_server_addr, engine, enable_ssd_offload,
ssd_offload_path, tenant_id, enable_client_http_server, client_http_port``),
or one dict of them; sizes may be ints or strings such as ``"16MB"``.
``engine`` shares an initialized ``mooncake.engine.TransferEngine`` instead
of making one; ``tenant_id`` other than ``"default"`` and
``enable_client_http_server=True`` are refused (-600: one tenant, no client
HTTP server here).
``enable_ssd_offload=True`` (with ``ssd_offload_path=DIR``, else
``MOONCAKE_OFFLOAD_FILE_STORAGE_PATH``; the master runs with
``--enable_offload``) keeps copies of the objects in this client's segment in
files there, loaded back when a get of an evicted one needs them;
``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`` caps the files' bytes
(docs/store.md, "Client-owned SSD offload").

A full pool evicts least-recently-used objects (the master's
``--eviction_*`` flags); ``ReplicateConfig(with_soft_pin=True)`` keeps an
object until nothing unpinned is left, ``with_hard_pin=True`` keeps it until
removed (hard wins when both are set).

A ``local_hostname`` without a port gets one, as Mooncake's client does: a
free port picked at random in 12300-14300 (``MC_STORE_CLIENT_MIN_PORT`` /
``MC_STORE_CLIENT_MAX_PORT``), which the store's transfer engine listens on;
``get_hostname()`` is then ``"host:PORT"``, the segment's name. A
``preferred_segment`` naming the bare ``local_hostname`` means this client's
segment. ``local_buffer_size=0`` sets up, but the calls that copy through
the local buffer (``put``, ``put_batch``, ``upsert``, ``upsert_batch``,
``get``, ``batch_get_buffer``) fail with -600, as Mooncake's do.

``upsert`` (and ``upsert_from``, ``batch_upsert_from``, ``upsert_batch``,
``upsert_parts``) replaces a stored value: the new one is written into space
of its own and becomes visible whole; a get sees the old value or the new
one, and a get that started before keeps reading the old bytes (its lease
keeps their space). ``batch_put_from_multi_buffers`` and
``batch_get_into_multi_buffers`` take several registered buffers per key (one
per layer, say): the value is their concatenation, each buffer moved straight
to or from its place in the replica.

Tensors (CPU torch tensors, stored in Mooncake's format: a 304-byte header
with dtype and shape, then the bytes; _tensor.py): ``put_tensor``,
``get_tensor``, the ``batch_``, ``upsert_``, ``pub_`` (with a
ReplicateConfig) and ``_with_tp`` forms (shards under ``key_tp_<rank>``),
``get_tensor_into`` (a tensor viewing the caller's registered buffer) and
``put_tensor_from`` (a value already in the format). A tensor whose memory is
registered is put without a copy; others through one copy into a registered
block (docs/store.md, "Tensors"). The unified ``_with_parallelism`` calls
store one shard per TensorParallelism or writer partition and read a shard
or the whole tensor rebuilt from its shards (_parallel.py); ``BufferPool``
leases registered memory for the zero-copy calls (_buffer_pool.py).

``setup_dummy(mem_pool_size, local_buffer_size, server_address)`` makes a
*dummy client* instead, as Mooncake's does: no engine, segment or master
connection of its own; every call goes to the real client (``mooncake_client``)
on this host whose ``--port`` server_address names, over a local socket,
and the values move through memory the two share (memfds): the local
buffer, and ``alloc_from_mem_pool(size)`` allocations, which
``register_buffer`` shares whole. ``get_hostname()`` is the real client's
segment. Details: mooncake._dummy_client, docs/store.md.
"""

import ctypes
import enum
import itertools
import logging
import os
import random
import re
import time

import ferry
from ferry import _ferry

from mooncake import _parallel, _safetensors, _tensor
from mooncake._buffer_pool import BufferPool, RegisteredBufferPool  # noqa: F401 (Mooncake's names)
from mooncake._dummy_client import DummyConnection
from mooncake._replicas import (  # noqa: F401 (Mooncake's names)
    Descriptor, DiskDescriptor, LocalDiskDescriptor, MemoryDescriptor, ReplicaDescriptor,
    ReplicaStatus, descriptors as _descriptors)
from mooncake._parallel import ParallelAxis, ReadTarget, TensorParallelism  # noqa: F401
from mooncake.engine import TransferEngine, _split_host_port

__all__ = ["BufferHandle", "BufferPool", "MooncakeDistributedStore", "ParallelAxis", "ReadTarget",
           "ReplicateConfig", "SoftPinAction", "TensorParallelism"]

logger = logging.getLogger(__name__)

# Mooncake's store error numbers (mooncake-store's ErrorCode).
INTERNAL_ERROR = -1
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
FORCE_REMOVE_WAIT_S = 30.0  # remove(force=True): the longest lease it waits out
REPLICA_IS_NOT_READY = -703
TRANSFER_FAIL = -800
RPC_FAIL = -900
FILE_NOT_FOUND = -1100

_SETUP_ARGS = ("local_hostname", "metadata_server", "global_segment_size", "local_buffer_size",
               "protocol", "rdma_devices", "master_server_addr", "engine", "enable_ssd_offload",
               "ssd_offload_path", "tenant_id", "enable_client_http_server", "client_http_port")
_SETUP_DEFAULTS = {"global_segment_size": 3355443200, "local_buffer_size": 1073741824,
                   "protocol": "tcp", "rdma_devices": "", "master_server_addr": "127.0.0.1:50051"}
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30,
          "T": 1 << 40, "TB": 1 << 40, "TIB": 1 << 40}


class SoftPinAction(enum.IntEnum):
    """What a put or upsert does to the object's soft pin, as Mooncake's enum:
    PRESERVE keeps an upserted key's pin and its deadline (a new key: none),
    ENABLE pins it for ``soft_pin_ttl_ms`` from the commit, DISABLE unpins."""

    PRESERVE = _ferry.STORE_SOFT_PIN_PRESERVE
    ENABLE = _ferry.STORE_SOFT_PIN_ENABLE
    DISABLE = _ferry.STORE_SOFT_PIN_DISABLE

    def __str__(self):
        return "SoftPinAction." + self.name


class ReplicateConfig:
    """Where a put's replicas go: ``replica_num`` (1 to 8, each in its own
    segment) and ``preferred_segment`` (the first replica's segment, a client's
    ``get_hostname()`` as other clients see it; "" for any); and how eviction
    treats the object: ``soft_pin_action`` (a SoftPinAction, PRESERVE by
    default) with ``soft_pin_ttl_ms`` (ENABLE only; None: the master's
    ``default_kv_soft_pin_ttl``; 0: not pinned; above its
    ``max_kv_soft_pin_ttl``: refused), a soft-pinned object being evicted only
    when nothing unpinned can be, until the commit plus that TTL (gets do not
    extend it); ``with_soft_pin`` (ENABLE with the default TTL);
    ``with_hard_pin`` (never evicted). ``preferred_segments`` (a list; at
    most 9 with ``preferred_segment``): more segments tried in order after
    ``preferred_segment``, one replica in each while it has room, the rest
    in the roomiest."""

    def __init__(self, replica_num=1, preferred_segment="", with_soft_pin=False,
                 with_hard_pin=False, soft_pin_action=SoftPinAction.PRESERVE,
                 soft_pin_ttl_ms=None, preferred_segments=None):
        self.replica_num = replica_num
        self.preferred_segment = preferred_segment
        self.preferred_segments = list(preferred_segments or [])
        self.with_soft_pin = with_soft_pin
        self.with_hard_pin = with_hard_pin
        self.soft_pin_action = soft_pin_action
        self.soft_pin_ttl_ms = soft_pin_ttl_ms

    @property
    def soft_pin_action(self):
        return self._soft_pin_action

    @soft_pin_action.setter
    def soft_pin_action(self, action):
        if not isinstance(action, SoftPinAction):
            raise TypeError("soft_pin_action: a SoftPinAction, not %r" % (action,))
        self._soft_pin_action = action

    @property
    def soft_pin_ttl_ms(self):
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, ttl):
        # Mooncake's std::optional<uint64_t>: None or 0 to 2**64 - 1, else TypeError.
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or
                                not 0 <= ttl < 1 << 64):
            raise TypeError("soft_pin_ttl_ms: None or an int from 0 to 2**64 - 1, not %r" % (ttl,))
        self._soft_pin_ttl_ms = ttl

    def __repr__(self):
        return ("ReplicateConfig(replica_num=%r, preferred_segment=%r, preferred_segments=%r, "
                "with_soft_pin=%r, with_hard_pin=%r, soft_pin_action=%s, soft_pin_ttl_ms=%r)"
                % (self.replica_num, self.preferred_segment, self.preferred_segments,
                   self.with_soft_pin, self.with_hard_pin, self.soft_pin_action,
                   self.soft_pin_ttl_ms))


class BufferHandle(bytearray):
    """A value read by ``batch_get_buffer``: its bytes (``bytes(handle)``,
    ``memoryview(handle)``), ``size()`` and ``ptr()`` (their address), as
    Mooncake's ``BufferHandle``. The store READ the value straight into it."""

    def size(self):
        return len(self)

    def ptr(self):
        return _address(self)


def _address(buffer):
    """The address of a writable buffer object's first byte."""
    return ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))


def _port_range():
    """Mooncake's range for a store client's port: MC_STORE_CLIENT_MIN_PORT to
    MC_STORE_CLIENT_MAX_PORT, 12300-14300 when unset or not a valid range."""
    try:
        low = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", 12300))
        high = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", 14300))
    except ValueError:
        return 12300, 14300
    return (low, high) if 0 < low <= high <= 65535 else (12300, 14300)


def _with_port(host, port):
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def _size(value, name):
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError("%s: %r is not a size (bytes, or a number with KB, MB, GB, TB)"
                         % (name, value))
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def _replicate(config):
    """(replicas, preferred segment, pin) of a ReplicateConfig, as _ferry.Store takes them."""
    if config is None:
        return (1, None, _ferry.STORE_PIN_NONE)
    if getattr(config, "prefer_alloc_in_same_node", False):
        raise ValueError("prefer_alloc_in_same_node is not supported (Mooncake's client refuses "
                         "it too)")
    pin = (_ferry.STORE_PIN_HARD if getattr(config, "with_hard_pin", False) else
           _ferry.STORE_PIN_SOFT if getattr(config, "with_soft_pin", False) else
           _ferry.STORE_PIN_NONE)
    pin = (pin, int(getattr(config, "soft_pin_action", SoftPinAction.PRESERVE)),
           getattr(config, "soft_pin_ttl_ms", None))
    first = getattr(config, "preferred_segment", "") or ""
    more = list(getattr(config, "preferred_segments", None) or [])
    return (int(getattr(config, "replica_num", 1) or 1),
            [first] + more if more else first or None, pin)


_MISSING = object()  # _rebuild: a shard could not be read


def _tp_key(key, rank, tp_size):
    """Where Mooncake's tensor-parallel calls keep rank's shard of key."""
    return key if tp_size <= 1 else "%s_tp_%d" % (key, rank)


def _code(status, detail, busy=OBJECT_HAS_LEASE):
    """The Mooncake store error number of a ferry status."""
    if status == ferry.ENOTFOUND:
        return OBJECT_NOT_FOUND
    if status == ferry.ENOMEM:
        return NO_AVAILABLE_HANDLE
    if status in (ferry.EINVAL, ferry.ENOTREG):
        return INVALID_PARAMS
    if status == ferry.EBUSY:
        return busy
    if detail and ("store master" in detail or "real client" in detail):
        return RPC_FAIL
    return TRANSFER_FAIL


class MooncakeDistributedStore:
    """``mooncake.store.MooncakeDistributedStore`` (module docstring)."""

    def __init__(self):
        self._engine = None
        self._own_engine = False
        self._store = None
        self._hostname = None
        self._bare_hostname = None
        self._staging = None
        self._dummy = None
        self._told_copied_reads = False

    # ---- lifetime -------------------------------------------------------------------------

    def setup(self, *args, **kwargs):
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            kwargs, args = dict(args[0]), ()
        if len(args) > len(_SETUP_ARGS):
            return self._fail("setup", INVALID_PARAMS, "takes at most %d positional arguments"
                              % len(_SETUP_ARGS))
        conf = dict(_SETUP_DEFAULTS)
        conf.update(zip(_SETUP_ARGS, args))
        unknown = set(kwargs) - set(_SETUP_ARGS) - {"device_name"}
        if unknown:
            return self._fail("setup", INVALID_PARAMS, "unknown argument(s) %s"
                              % ", ".join(sorted(unknown)))
        conf.update(kwargs)
        if "device_name" in kwargs:
            conf["rdma_devices"] = kwargs["device_name"]
        engine = conf.get("engine")
        if conf.get("tenant_id", "default") not in ("default", ""):
            return self._fail("setup", INVALID_PARAMS, "tenant_id=%r: ferry's store has one "
                              "tenant (default)" % (conf["tenant_id"],))
        if conf.get("enable_client_http_server"):
            return self._fail("setup", INVALID_PARAMS, "enable_client_http_server: Mooncake's "
                              "client HTTP server is not implemented here")
        if self._store is not None:
            return self._fail("setup", INVALID_PARAMS, "this store is set up already")
        offload_dir = None
        if conf.get("enable_ssd_offload"):
            # Mooncake's: the argument, else its environment variable.
            offload_dir = (conf.get("ssd_offload_path")
                           or os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"))
            if not offload_dir:
                return self._fail("setup", INVALID_PARAMS, "enable_ssd_offload needs "
                                  "ssd_offload_path or MOONCAKE_OFFLOAD_FILE_STORAGE_PATH")
        offload_max = os.environ.get("MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "0") or "0"
        try:
            segment = _size(conf["global_segment_size"], "global_segment_size")
            offload_max = _size(offload_max, "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES")
            staging = _size(conf["local_buffer_size"], "local_buffer_size")
            for name in ("local_hostname", "metadata_server"):
                if name not in conf:
                    raise ValueError("%s is required" % name)
        except ValueError as e:
            return self._fail("setup", INVALID_PARAMS, str(e))
        cxl_path, cxl_size = None, 0
        if str(conf["protocol"]).strip().lower() == "cxl":
            # Mooncake's: the device every client maps; the master's pool
            # holds every value, this client contributes no segment.
            cxl_path = os.environ.get("MC_CXL_DEV_PATH") or "/dev/dax0.0"
            try:
                cxl_size = _size(os.environ.get("MC_CXL_DEV_SIZE", ""), "MC_CXL_DEV_SIZE")
            except ValueError as e:
                return self._fail("setup", INVALID_PARAMS, "protocol cxl: %s (the bytes of "
                                  "MC_CXL_DEV_PATH to map)" % e)
            segment = 0
            conf = dict(conf, protocol="tcp", rdma_devices="")  # it moves nothing here
        if engine is None:
            engine, rc = self._new_engine(conf)
            if rc != 0:
                return self._fail("setup", rc, "its transfer engine: %s" % engine.last_error())
            self._own_engine = True
        try:
            # local_buffer_size=0: the calls that need it refuse (_no_staging);
            # the C client's smallest staging buffer stays unused.
            self._store = _ferry.Store(engine._engine, conf["master_server_addr"], segment,
                                       staging or 64, offload_dir=offload_dir,
                                       offload_max_bytes=offload_max, cxl_path=cxl_path,
                                       cxl_size=cxl_size)
        except ferry.Error as e:
            if self._own_engine:
                engine.close()
            self._own_engine = False
            return self._fail("setup", _code(e.code, e.detail), e.detail)
        self._engine = engine
        self._hostname = self._store.segment
        self._bare_hostname = str(conf["local_hostname"]).strip()
        self._staging = staging
        return 0

    def _new_engine(self, conf):
        """The store's own transfer engine, named local_hostname; one without a
        port gets a free one in _port_range(), at random (a port taken meanwhile
        is tried again with another, up to MC_STORE_CLIENT_SETUP_RETRIES)."""
        name = str(conf["local_hostname"]).strip()
        args = (conf["metadata_server"], conf["protocol"], conf["rdma_devices"] or "")
        try:
            host, port = _split_host_port(name)
        except ValueError:
            host, port = name, 1  # initialize names what is wrong with it
        if port is not None or str(conf["metadata_server"]).strip().upper() == "P2PHANDSHAKE":
            engine = TransferEngine()
            return engine, engine.initialize(name, *args)
        low, high = _port_range()
        tries = max(1, int(os.environ.get("MC_STORE_CLIENT_SETUP_RETRIES", 20) or 20))
        for _ in range(tries):
            engine = TransferEngine()
            rc = engine.initialize(_with_port(host, random.randint(low, high)), *args)
            if rc == 0 or "in use" not in (engine.last_error() or ""):
                return engine, rc
        return engine, rc

    def setup_dummy(self, mem_pool_size, local_buffer_size, server_address):
        """A dummy client of the real client (mooncake_client) whose --port
        server_address ("HOST:PORT", this host) names: 0, or a negative code."""
        if self._store is not None:
            return self._fail("setup_dummy", INVALID_PARAMS, "this store is set up already")
        try:
            pool = _size(mem_pool_size, "mem_pool_size")
            staging = _size(local_buffer_size, "local_buffer_size")
            port = _split_host_port(str(server_address))[1]
            if port is None or not 0 < port < 65536:
                raise ValueError("server_address %r has no port (the real client's --port)"
                                 % (server_address,))
        except ValueError as e:
            return self._fail("setup_dummy", INVALID_PARAMS, str(e))
        try:
            dummy = DummyConnection(port, pool, staging)
        except ferry.Error as e:
            return self._fail("setup_dummy", _code(e.code, e.detail), e.detail)
        except OSError as e:
            return self._fail("setup_dummy", INTERNAL_ERROR, "the local buffer (%d bytes): %s"
                              % (staging, e.strerror))
        self._store = self._engine = self._dummy = dummy
        self._own_engine = False
        self._hostname = dummy.segment
        self._staging = staging
        return 0

    def alloc_from_mem_pool(self, size):
        """A dummy's shared memory: the address of size bytes, or 0 (logged)."""
        if self._dummy is None:
            self._fail("alloc_from_mem_pool", INVALID_PARAMS, "a dummy client's call: "
                       "setup_dummy() first")
            return 0
        try:
            return self._dummy.alloc(size)
        except ValueError as e:
            self._fail("alloc_from_mem_pool", NO_AVAILABLE_HANDLE, str(e))
            return 0

    def init_all(self, protocol, device_name, mount_segment_size=16 * 1024 * 1024):
        return self._fail("init_all", INVALID_PARAMS, "not implemented; use setup()")

    def close(self):
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._own_engine and self._engine is not None:
            self._engine.close()
        self._engine = self._dummy = None
        return 0

    def health_check(self):
        return 0 if self._store is not None else INTERNAL_ERROR

    def get_hostname(self):
        """The name other clients reach this one's segment by (a dummy's: its
        real client's, as of its last handshake: a restarted real client has
        a segment of its own)."""
        if self._dummy is not None:
            return self._dummy.segment or ""
        return self._hostname or ""

    # ---- registered memory ----------------------------------------------------------------

    def register_buffer(self, buffer_ptr, size):
        if self._engine is None:
            return self._fail("register_buffer", INVALID_PARAMS, "setup() first")
        rc = self._engine.register_memory(buffer_ptr, size)
        return rc if rc == 0 else self._fail("register_buffer", INVALID_PARAMS,
                                             self._engine.last_error())

    def unregister_buffer(self, buffer_ptr):
        if self._engine is None:
            return self._fail("unregister_buffer", INVALID_PARAMS, "setup() first")
        rc = self._engine.unregister_memory(buffer_ptr)
        return rc if rc == 0 else self._fail("unregister_buffer", INVALID_PARAMS,
                                             self._engine.last_error())

    # ---- objects --------------------------------------------------------------------------

    def put(self, key, value, config=None):
        if self._staging == 0:
            return self._no_staging("put")
        return self._call("put", lambda: self._store.put(key, bytes(value), *self._rep(config)),
                          busy=OBJECT_ALREADY_EXISTS)

    def upsert(self, key, value, config=None):
        if self._staging == 0:
            return self._no_staging("upsert")
        return self._call("upsert", lambda: self._store.put(key, bytes(value), *self._rep(config),
                                                             upsert=True),
                          busy=REPLICA_IS_NOT_READY)

    def upsert_parts(self, key, *parts, config=None):
        return self.upsert(key, b"".join(bytes(p) for p in parts), config)

    def upsert_batch(self, keys, values, config=None):
        """One upsert per key (each through the staging buffer); 0, or the
        first failure's code."""
        keys, values = list(keys), list(values)
        if len(keys) != len(values):
            return self._fail("upsert_batch", INVALID_PARAMS, "%d keys, %d values"
                              % (len(keys), len(values)))
        codes = [self.upsert(k, v, config) for k, v in zip(keys, values)]
        return next((c for c in codes if c != 0), 0)

    def get(self, key):
        if self._staging == 0:
            self._no_staging("get")
            return b""
        result = self._call("get", lambda: self._store.get(key), quiet_missing=True)
        return result if isinstance(result, bytes) else b""

    def remove(self, key, force=False):
        """0, or a negative code (-704 absent, -706 held by a get's lease).
        force=True (Mooncake's keyword) does not fail on a get's lease: it
        waits the lease out (at most FORCE_REMOVE_WAIT_S) and removes then.
        Mooncake frees the object at once; ferry never frees memory a
        reader may still be reading, so force waits instead."""
        if not force or self._store is None:
            return self._call("remove", lambda: self._store.remove(key))
        deadline, pause = time.monotonic() + FORCE_REMOVE_WAIT_S, 0.005
        while True:
            try:
                self._store.remove(key)
                return 0
            except ferry.Error as e:
                code = _code(e.code, e.detail, OBJECT_HAS_LEASE)
                if code != OBJECT_HAS_LEASE or time.monotonic() >= deadline:
                    return self._fail("remove", code, e.detail)
            time.sleep(pause)  # the lease ends at the master: nothing here to wait on
            pause = min(pause * 2, 0.1)

    def get_offload_rpc_read_count(self):
        """Mooncake's count of its reads served from an owner's offload disk:
        here, this client's gets answered with a copy the owner loaded back
        from its disk (ferry_store_owner_disk_reads; 0 before setup)."""
        return self._store.owner_disk_reads if self._store is not None else 0

    def remove_all(self):
        return self._call("remove_all", self._store.remove_all if self._store else None)

    def batch_replica_clear(self, keys, segment_name=""):
        """The keys whose replicas were given back once no get's lease held
        them: all of a key's (segment_name "": the object goes, as remove), or
        those in the segment named, with the copy its client keeps on its
        offload disk (the object goes when nothing is left). Keys absent,
        leased, under an offload or with nothing there are left out, as
        Mooncake's. Unlike Mooncake's, a key another client put is cleared
        too: any client may remove any key here."""
        keys = list(keys)
        if not keys:
            return []
        answers = self._batch("batch_replica_clear",
                              lambda: self._store.batch_clear(keys, segment_name or ""),
                              len(keys))
        return [k for k, a in zip(keys, answers) if a == 0]

    def is_exist(self, key):
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys):
        answers = self._batch("batch_is_exist", lambda: self._store.batch_exists(list(keys)),
                              len(keys))
        return [1 if a >= 0 else 0 if a == OBJECT_NOT_FOUND else a for a in answers]

    def get_replica_desc(self, key):
        """Where key's object is: a list of ReplicaDescriptor ([] when the
        key is absent, or the master cannot answer: logged, as Mooncake)."""
        return self.batch_get_replica_desc([key]).get(key, [])

    def batch_get_replica_desc(self, keys):
        """{key: [ReplicaDescriptor]} for the stored keys; absent ones are
        left out, and a master that cannot answer gives {} (logged)."""
        keys = list(keys)
        answers = self._call("batch_get_replica_desc",
                             lambda: self._store.batch_replicas(keys))
        if isinstance(answers, int):
            return {}
        found = {}
        for key, answer in zip(keys, answers):
            if answer is not None:
                found[key] = _descriptors(answer)
        return found

    def get_size(self, key):
        return self._batch("get_size", lambda: self._store.batch_exists([key]), 1)[0]

    def put_from(self, key, buffer_ptr, size, config=None):
        return self.batch_put_from([key], [buffer_ptr], [size], config)[0]

    def get_into(self, key, buffer_ptr, size):
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_put_from(self, keys, buffer_ptrs, sizes, config=None):
        return self._batch("batch_put_from",
                           lambda: self._store.batch_put_from(list(keys), list(buffer_ptrs),
                                                              list(sizes), *self._rep(config)),
                           len(keys), busy=OBJECT_ALREADY_EXISTS)

    def upsert_from(self, key, buffer_ptr, size, config=None):
        return self.batch_upsert_from([key], [buffer_ptr], [size], config)[0]

    def batch_upsert_from(self, keys, buffer_ptrs, sizes, config=None):
        return self._batch("batch_upsert_from",
                           lambda: self._store.batch_put_from(list(keys), list(buffer_ptrs),
                                                              list(sizes), *self._rep(config),
                                                              upsert=True),
                           len(keys), busy=REPLICA_IS_NOT_READY)

    def batch_put_from_multi_buffers(self, keys, all_buffer_ptrs, all_sizes, config=None):
        return self._batch("batch_put_from_multi_buffers",
                           lambda: self._store.batch_put_from_multi(
                               list(keys), [list(p) for p in all_buffer_ptrs],
                               [list(z) for z in all_sizes], *self._rep(config)),
                           len(keys), busy=OBJECT_ALREADY_EXISTS)

    def batch_get_into_multi_buffers(self, keys, all_buffer_ptrs, all_sizes,
                                     prefer_alloc_in_same_node=False):
        """Bytes read per key, or a negative code; prefer_alloc_in_same_node is
        accepted and has no effect (the first live replica is read)."""
        return self._batch("batch_get_into_multi_buffers",
                           lambda: self._store.batch_get_into_multi(
                               list(keys), [list(p) for p in all_buffer_ptrs],
                               [list(z) for z in all_sizes]),
                           len(keys))

    def batch_get_into(self, keys, buffer_ptrs, sizes):
        return self._batch("batch_get_into",
                           lambda: self._store.batch_get_into(list(keys), list(buffer_ptrs),
                                                              list(sizes)),
                           len(keys))

    def put_batch(self, keys, values, config=None):
        """Stores values[i] (bytes-like) under keys[i], copied through the local
        buffer as put's are, in one batch. 0, or the first failing key's code."""
        if self._staging == 0:
            return self._no_staging("put_batch")
        if len(keys) != len(values):
            return self._fail("put_batch", INVALID_PARAMS, "%d keys but %d values"
                              % (len(keys), len(values)))
        answers = self._batch("put_batch",
                              lambda: self._store.put_batch(list(keys), list(values),
                                                            *self._rep(config)),
                              len(keys), busy=OBJECT_ALREADY_EXISTS)
        return next((a for a in answers if a < 0), 0)

    def batch_get_buffer(self, keys, _call="batch_get_buffer"):
        """Each key's value in a BufferHandle that the store READ it into, or
        None when it cannot be read (absent, failed: logged)."""
        keys = list(keys)
        if not keys:
            return []
        if self._staging == 0:
            self._no_staging(_call)
            return [None] * len(keys)
        if self._dummy is not None:  # its memory is the shared local buffer: get copies out
            values = [self._call(_call, lambda k=k: self._store.get(k),
                                 quiet_missing=True) for k in keys]
            return [BufferHandle(v) if isinstance(v, bytes) else None for v in values]
        sizes = self._batch(_call, lambda: self._store.batch_exists(keys),
                            len(keys))
        wanted = [i for i, n in enumerate(sizes) if n > 0]
        handles = [BufferHandle(sizes[i]) for i in wanted]
        ptrs = [h.ptr() for h in handles]
        out = [None] * len(keys)
        if not wanted:
            return out
        rc = self._engine.batch_register_memory(ptrs, [len(h) for h in handles])
        if rc != 0:
            self._fail(_call, INVALID_PARAMS, self._engine.last_error())
            return out
        try:
            got = self._batch(_call, lambda: self._store.batch_get_into(
                [keys[i] for i in wanted], ptrs, [len(h) for h in handles]), len(wanted))
        finally:
            self._engine.batch_unregister_memory(ptrs)
        for i, h, n in zip(wanted, handles, got):
            out[i] = h if n == len(h) else None
        return out

    def get_batch(self, keys):
        """Each key's value as bytes; b"" for one that cannot be read
        (absent, failed: logged), as get answers."""
        return [b"" if h is None else bytes(h)
                for h in self.batch_get_buffer(keys, _call="get_batch")]

    def get_buffer(self, key):
        """batch_get_buffer of one key: its BufferHandle, or None."""
        return self.batch_get_buffer([key])[0]

    def get_into_ranges(self, buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets,
                        all_sizes):
        """Byte ranges of values into registered buffers, buffer-major:
        buffer i gets, for its j-th key, all_sizes[i][j][k] bytes from offset
        all_src_offsets[i][j][k] of the value at all_dst_offsets[i][j][k].
        The answer has all_dst_offsets' shape: per range the bytes read or a
        negative code (-600 for a range whose lists do not line up, one past
        the value's end or outside the buffer's registered region; -704 for
        a missing key). Every range is read in one batch."""
        results = [[[INVALID_PARAMS] * len(d) for d in dsts] for dsts in all_dst_offsets]
        lists = (all_keys, all_dst_offsets, all_src_offsets, all_sizes)
        if any(len(x) != len(buffer_ptrs) for x in lists):
            self._fail("get_into_ranges", INVALID_PARAMS, "%d buffers, %d key lists, %d/%d/%d "
                       "offset and size lists: one of each per buffer"
                       % ((len(buffer_ptrs),) + tuple(len(x) for x in lists)))
            return results
        flat, where = ([], [], [], []), []
        for i, ptr in enumerate(buffer_ptrs):
            if not ptr or len({len(x[i]) for x in lists}) != 1:
                continue
            for j, key in enumerate(all_keys[i]):
                dst, src, size = all_dst_offsets[i][j], all_src_offsets[i][j], all_sizes[i][j]
                if not len(dst) == len(src) == len(size):
                    continue
                for k in range(len(dst)):
                    for column, value in zip(flat, (key, ptr + dst[k], src[k], size[k])):
                        column.append(value)
                    where.append((i, j, k))
        if not where:
            return results
        answers = self._batch("get_into_ranges", lambda: self._store.get_ranges(*flat),
                              len(where))
        for (i, j, k), a in zip(where, answers):
            results[i][j][k] = a
        return results

    # ---- tensors (Mooncake's stored-tensor format, _tensor.py) ----------------------------
    #
    # A put stores the header and the tensor's bytes as one value. When the
    # tensor's memory is registered (register_buffer), the header is written
    # from a small registered block and the bytes straight from the tensor
    # (a multi-buffer put: no copy); otherwise, and for every upsert (the
    # multi-buffer form has none), header and bytes are copied into one
    # registered block first. Puts answer 0 or a negative code per key; gets
    # answer a torch tensor, or None with the cause logged.

    def put_tensor(self, key, tensor):
        return self._put_tensors("put_tensor", [key], [tensor])[0]

    def batch_put_tensor(self, keys, tensors_list):
        return self._put_tensors("batch_put_tensor", keys, tensors_list)

    def upsert_tensor(self, key, tensor):
        return self._put_tensors("upsert_tensor", [key], [tensor], upsert=True)[0]

    def batch_upsert_tensor(self, keys, tensors_list):
        return self._put_tensors("batch_upsert_tensor", keys, tensors_list, upsert=True)

    def pub_tensor(self, key, tensor, config=None):
        return self._put_tensors("pub_tensor", [key], [tensor], config)[0]

    def batch_pub_tensor(self, keys, tensors_list, config=None):
        return self._put_tensors("batch_pub_tensor", keys, tensors_list, config)

    def upsert_pub_tensor(self, key, tensor, config=None):
        return self._put_tensors("upsert_pub_tensor", [key], [tensor], config, upsert=True)[0]

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None):
        return self._put_tensors("batch_upsert_pub_tensor", keys, tensors_list, config,
                                 upsert=True)

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0):
        """Every rank's shard of tensor (tp_size equal pieces along split_dim)
        under key_tp_<rank>; tp_rank is accepted for Mooncake's signature.
        tp_size 1: put_tensor."""
        return self.batch_pub_tensor_with_tp([key], [tensor], None, tp_rank, tp_size, split_dim,
                                             _call="put_tensor_with_tp")[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                 split_dim=0):
        return self.batch_pub_tensor_with_tp(base_keys, tensors_list, None, tp_rank, tp_size,
                                             split_dim, _call="batch_put_tensor_with_tp")

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1, split_dim=0):
        return self.batch_pub_tensor_with_tp([key], [tensor], config, tp_rank, tp_size,
                                             split_dim, _call="pub_tensor_with_tp")[0]

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                 tp_size=1, split_dim=0, _call="batch_pub_tensor_with_tp"):
        tp = (int(tp_size), int(split_dim)) if tp_size > 1 else None
        return self._put_tensors(_call, base_keys, tensors_list, config, tp=tp)

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        """A whole tensor in Mooncake's format in a registered buffer, stored
        as put_tensor_with_tp stores it (tp_size 1: put_tensor_from)."""
        return self.batch_put_tensor_with_tp_from([key], [buffer_ptr], [size], tp_rank, tp_size,
                                                  split_dim, _call="put_tensor_with_tp_from")[0]

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0, _call="batch_put_tensor_with_tp_from"):
        """Per key 0 or a code; a buffer that is not a tensor fails its key (-600)."""
        if tp_size <= 1:
            return self._put_tensor_from(_call, base_keys, buffer_ptrs, sizes)
        keys = list(base_keys)
        results, wanted, tensors = self._decode_buffers(_call, keys, buffer_ptrs, sizes)
        done = self._put_tensors(_call, [keys[i] for i in wanted], tensors,
                                 tp=(int(tp_size), int(split_dim)))
        for i, code in zip(wanted, done):
            results[i] = code
        return results

    def put_tensor_from(self, key, buffer_ptr, size):
        """A value already in Mooncake's format ([header][bytes], as
        get_tensor_into leaves it) put from a registered buffer; its header is
        checked first."""
        return self._put_tensor_from("put_tensor_from", [key], [buffer_ptr], [size])[0]

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes):
        return self._put_tensor_from("batch_put_tensor_from", keys, buffer_ptrs, sizes)

    def upsert_tensor_from(self, key, buffer_ptr, size):
        return self._put_tensor_from("upsert_tensor_from", [key], [buffer_ptr], [size],
                                     upsert=True)[0]

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes):
        return self._put_tensor_from("batch_upsert_tensor_from", keys, buffer_ptrs, sizes,
                                     upsert=True)

    def get_tensor(self, key):
        return self._get_tensors("get_tensor", [key])[0]

    def batch_get_tensor(self, keys):
        return self._get_tensors("batch_get_tensor", keys)

    def save_tensor_to_safetensor(self, key, file_name=None):
        """Writes the tensor under key to a safetensors file (file_name, or
        the key as the file's name), the tensor named by the key: 0, -1100
        (FILE_NOT_FOUND) when the key holds no tensor, -600 when the file
        cannot be written."""
        tensor = self.get_tensor(key)
        if tensor is None:
            return self._fail("save_tensor_to_safetensor", FILE_NOT_FOUND,
                              "no tensor under %r to save" % key)
        path = key if file_name is None else file_name
        try:
            _safetensors.save({key: tensor}, path)
        except (OSError, _safetensors.SafetensorsError) as e:
            return self._fail("save_tensor_to_safetensor", INVALID_PARAMS,
                              "cannot write %s: %s" % (path, e))
        return 0

    def load_tensor_from_safetensor(self, key, file_name):
        """Puts a tensor of the safetensors file file_name under key (None:
        under the file's name) and answers it, or None (logged): the one
        named key, else the file's first in name order."""
        call = "load_tensor_from_safetensor"
        try:
            tensors = _safetensors.load(file_name)
        except (OSError, _safetensors.SafetensorsError) as e:
            return self._none(call, INVALID_PARAMS, "cannot read %s: %s" % (file_name, e))
        if not tensors:
            return self._none(call, INVALID_PARAMS, "%s holds no tensor" % file_name)
        target = file_name if key is None else key
        if key is not None and key not in tensors:
            logger.warning("%s: %s has no tensor %r; storing its first, %r", call, file_name,
                           key, next(iter(tensors)))
        tensor = tensors.get(key) if key in tensors else next(iter(tensors.values()))
        rc = self.put_tensor(target, tensor)
        if rc != 0:
            return self._none(call, rc, "put_tensor of %r answered %d" % (target, rc))
        return tensor

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        """This rank's shard (key_tp_<tp_rank>); tp_size 1: get_tensor(key)."""
        return self._get_tensors("get_tensor_with_tp", [_tp_key(key, tp_rank, tp_size)])[0]

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1):
        return self._get_tensors("batch_get_tensor_with_tp",
                                 [_tp_key(k, tp_rank, tp_size) for k in base_keys])

    def get_tensor_into(self, key, buffer_ptr, size):
        """The value READ into a registered buffer and returned as a tensor
        viewing that buffer (no copy: it is valid while the buffer is); None
        when it cannot be read or is not a tensor (logged)."""
        return self._get_tensors_into("get_tensor_into", [key], [buffer_ptr], [size])[0]

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes):
        return self._get_tensors_into("batch_get_tensor_into", keys, buffer_ptrs, sizes)

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1,
                                split_dim=0):
        return self._get_tensors_into("get_tensor_with_tp_into",
                                      [_tp_key(key, tp_rank, tp_size)], [buffer_ptr], [size])[0]

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0,
                                      tp_size=1):
        return self._get_tensors_into("batch_get_tensor_with_tp_into",
                                      [_tp_key(k, tp_rank, tp_size) for k in base_keys],
                                      buffer_ptrs, sizes)

    # Mooncake's unified *_with_parallelism calls (_parallel.py). A write
    # stores the whole tensor, or the one shard its TensorParallelism or
    # writer partition names, under that shard's key with the shard's
    # identity in its header. A read (ReadTarget) returns the object as
    # stored, a named shard, or the whole tensor rebuilt from its shards: their
    # headers are read first (one ranged read), checked to make one tensor,
    # then every shard's rows are read straight into place behind a whole
    # tensor's header (one more ranged read, get_into_ranges).

    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                    writer_partition=None):
        return self._par_put("put_tensor_with_parallelism", [key], [tensor], [parallelism],
                             [writer_partition], config, False)[0]

    def batch_put_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                          config=None, writer_partitions=None):
        return self._par_put("batch_put_tensor_with_parallelism", keys, tensors_list,
                             parallelisms, writer_partitions, config, False)

    def upsert_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                       writer_partition=None):
        return self._par_put("upsert_tensor_with_parallelism", [key], [tensor], [parallelism],
                             [writer_partition], config, True)[0]

    def batch_upsert_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                             config=None, writer_partitions=None):
        return self._par_put("batch_upsert_tensor_with_parallelism", keys, tensors_list,
                             parallelisms, writer_partitions, config, True)

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                         config=None, writer_partition=None):
        return self._par_put_from("put_tensor_with_parallelism_from", [key], [buffer_ptr],
                                  [size], None if parallelism is None else [parallelism],
                                  None if writer_partition is None else [writer_partition],
                                  config, False)[0]

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, parallelisms=None,
                                               config=None, writer_partitions=None):
        return self._par_put_from("batch_put_tensor_with_parallelism_from", keys, buffer_ptrs,
                                  sizes, parallelisms, writer_partitions, config, False)

    def upsert_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                            config=None, writer_partition=None):
        return self._par_put_from("upsert_tensor_with_parallelism_from", [key], [buffer_ptr],
                                  [size], None if parallelism is None else [parallelism],
                                  None if writer_partition is None else [writer_partition],
                                  config, True)[0]

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                                  parallelisms=None, config=None,
                                                  writer_partitions=None):
        return self._par_put_from("batch_upsert_tensor_with_parallelism_from", keys,
                                  buffer_ptrs, sizes, parallelisms, writer_partitions, config,
                                  True)

    def get_tensor_with_parallelism(self, key, target=None):
        return self._par_get("get_tensor_with_parallelism", [key], [target])[0]

    def batch_get_tensor_with_parallelism(self, keys, targets=None):
        return self._par_get("batch_get_tensor_with_parallelism", keys, targets)

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        return self._par_get("get_tensor_with_parallelism_into", [key], [target],
                             ([buffer_ptr], [size]))[0]

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes, targets=None):
        return self._par_get("batch_get_tensor_with_parallelism_into", keys, targets,
                             (list(buffer_ptrs), list(sizes)))

    def _par_put(self, call, keys, tensors, parallelisms, partitions, config, upsert):
        keys, layouts = list(keys), []
        for name, given in (("parallelisms", parallelisms), ("writer_partitions", partitions)):
            given = [None] * len(keys) if given is None else list(given)
            if len(given) != len(keys):
                return [self._fail(call, INVALID_PARAMS, "%d keys but %d %s"
                                   % (len(keys), len(given), name))] * len(keys)
            layouts.append(given)
        return self._put_tensors(call, keys, tensors, config, upsert,
                                 layouts=list(zip(*layouts)))

    def _par_put_from(self, call, keys, buffer_ptrs, sizes, parallelisms, partitions, config,
                      upsert):
        """Buffers in Mooncake's format: whole (no layout) as put_tensor_from
        puts them, which places replicas itself (a config is refused, not
        dropped); with a layout, the tensor each holds written as
        _par_put writes it (a buffer that is not a tensor fails its key)."""
        keys = list(keys)
        if parallelisms is None and partitions is None:
            if config is not None:
                return [self._fail(call, INVALID_PARAMS, "a whole-tensor _from put stores the "
                                   "buffer as put_tensor_from does: no config")] * len(keys)
            return self._put_tensor_from(call, keys, buffer_ptrs, sizes, upsert=upsert)
        results, wanted, tensors = self._decode_buffers(call, keys, buffer_ptrs, sizes)
        layouts = [None if given is None else list(given)
                   for given in (parallelisms, partitions)]
        if any(given is not None and len(given) != len(keys) for given in layouts):
            return [self._fail(call, INVALID_PARAMS, "%d keys but %s parallelisms and %s "
                               "writer_partitions" % ((len(keys),) + tuple(
                                   "no" if g is None else len(g) for g in layouts)))] * len(keys)
        if not wanted:
            return results
        done = self._par_put(call, [keys[i] for i in wanted], tensors,
                             *[None if given is None else [given[i] for i in wanted]
                               for given in layouts], config, upsert)
        for i, code in zip(wanted, done):
            results[i] = code
        return results

    def _decode_buffers(self, call, keys, buffer_ptrs, sizes):
        """(results, indices of the tensors, tensors viewing the buffers): a
        null, empty or non-tensor buffer fails its key (-600)."""
        buffer_ptrs, sizes = list(buffer_ptrs), list(sizes)
        results, wanted, tensors = [INVALID_PARAMS] * len(keys), [], []
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            self._fail(call, INVALID_PARAMS, "%d keys, %d buffers, %d sizes"
                       % (len(keys), len(buffer_ptrs), len(sizes)))
            return results, wanted, tensors
        for i, (key, ptr, size) in enumerate(zip(keys, buffer_ptrs, sizes)):
            if not ptr or size <= 0:
                self._fail(call, INVALID_PARAMS, "key %r: a null or empty buffer" % (key,))
                continue
            tensor = self._decode(call, key, (ctypes.c_ubyte * size).from_address(ptr))
            if tensor is not None:
                wanted.append(i)
                tensors.append(tensor)
        return results, wanted, tensors

    def _par_get(self, call, keys, targets, into=None):
        """Per key a tensor or None (logged); into=(buffer_ptrs, sizes) for the _into forms."""
        keys = list(keys)
        targets = [None] * len(keys) if targets is None else list(targets)
        if len(targets) != len(keys) or (into and not len(into[0]) == len(into[1]) == len(keys)):
            self._fail(call, INVALID_PARAMS, "%d keys, %d targets%s" % (
                len(keys), len(targets),
                ", %d buffers, %d sizes" % (len(into[0]), len(into[1])) if into else ""))
            return [None] * len(keys)
        out, plain = [None] * len(keys), []  # plain: (index, key read as stored)
        for i, (key, target) in enumerate(zip(keys, targets)):
            try:
                mode, axes = _parallel.read_request(target)
            except _tensor.TensorFormatError as e:
                self._fail(call, INVALID_PARAMS, "key %r: %s" % (key, e))
                continue
            mine = None if into is None else (into[0][i], into[1][i])
            got = (self._get_full(call, key, axes, mine) if mode == "full" else
                   self._remapped_shard(call, key, axes, mine) if mode == "shard" else _MISSING)
            if got is not _MISSING:
                out[i] = got
            else:
                plain.append((i, key if axes is None else _parallel.shard_key(key, axes),
                              _parallel.lone_tp_writer_key(key, axes) if mode == "shard"
                              else None))
        if plain:
            at, read = [i for i, _, _ in plain], self._shard_keys(plain)
            got = (self._get_tensors(call, read) if into is None else
                   self._get_tensors_into(call, read, [into[0][i] for i in at],
                                          [into[1][i] for i in at]))
            for i, tensor in zip(at, got):
                out[i] = tensor
        return out

    def _shard_keys(self, plain):
        """The key each plain read reads: its own, or where it is absent and a
        writer partition of the same cut has the shard, that one's."""
        keys = [k for _, k, _ in plain]
        ask = [j for j, (_, _, alt) in enumerate(plain) if alt]
        if ask:
            there = self.batch_is_exist([keys[j] for j in ask])
            for j, found in zip(ask, there):
                if found != 1:
                    keys[j] = plain[j][2]
        return keys

    def _get_full(self, call, key, axes, into):
        """The whole tensor of key rebuilt from the shards axes name (None: the
        writer partitions key__writer_manifest names, else a whole value
        under key, else the legacy TP shards key_tp_<rank>, their count from
        key_tp_0's header; with a TP axis, its count and split_dim from
        key__parallelism_manifest when that is there, as Mooncake's reads);
        None with the cause logged."""
        found = self._manifest_plan(call, key, axes)
        if found is not None:
            got = self._rebuild(call, key, *found, into)
            if got is not _MISSING:
                return got
        if axes is None:
            if self.is_exist(key) == 1:
                return (self._get_tensors(call, [key])[0] if into is None else
                        self._get_tensors_into(call, [key], [into[0]], [into[1]])[0])
            axes = self._legacy_tp_axes(call, key)
            if axes is None:
                return None
        try:
            plan = _parallel.Rebuild(key, axes)
        except _tensor.TensorFormatError as e:
            return self._none(call, INVALID_PARAMS, "key %r: %s" % (key, e))
        lone_tp = len(axes) == 1 and axes[0].kind == _parallel.KINDS["tp"]
        got = self._rebuild(call, key, plan, None, into, quiet=lone_tp)
        if got is _MISSING and lone_tp:  # the TP shards, else the same cut by writer partitions
            got = self._rebuild(call, key, _parallel.Rebuild(key, axes, writers=True), None, into)
        return None if got is _MISSING else got

    def _remapped_shard(self, call, key, axes, into):
        """A "shard" read whose TP count is not the one the shards were stored
        with (key__parallelism_manifest says which): the target's rows read
        from the stored shards that hold them, behind the target shard's
        header; _MISSING when there is no TP axis, no manifest, the counts
        agree or a stored shard is absent (then the shard key is read as
        stored); None (logged) when the target is not equal pieces of them."""
        tp = next((a for a in axes if a.kind == _parallel.KINDS["tp"]), None)
        found = None if tp is None else self._manifest(
            call, _parallel.parallelism_manifest_key(key))
        if found is None or found[3] == tp.size:
            return _MISSING
        code, shape, split, count = found
        if tp.split not in (-1, split) or shape[split] % tp.size:
            return self._none(call, INVALID_PARAMS, "key %r: stored as %d shards along dimension "
                              "%d of %s; %d equal shards along dimension %d are not a cut of it"
                              % (key, count, split, shape, tp.size, tp.split))
        stored = _parallel.writer_partition((0, count, split))
        try:
            plan = _parallel.Rebuild(key, [stored if a is tp else a for a in axes])
        except _tensor.TensorFormatError as e:
            return self._none(call, INVALID_PARAMS, "key %r: %s" % (key, e))
        return self._rebuild(call, key, plan, (code, shape), into,
                             window=(tp.rank, tp.size, axes))

    def _manifest_plan(self, call, key, axes):
        """(Rebuild, (dtype code, shape) it must make) from the manifest a full
        read of key with axes has, or None (none, or one Mooncake would not
        use either: a split_dim other than the TP axis's, a dimension the
        counts do not divide; logged)."""
        tp = None if axes is None else next(
            (a for a in axes if a.kind == _parallel.KINDS["tp"]), None)
        if axes is not None and tp is None:
            return None
        found = self._manifest(call, _parallel.writer_manifest_key(key) if axes is None else
                               _parallel.parallelism_manifest_key(key))
        if found is None:
            return None
        code, shape, split, count = found
        cut = _parallel.writer_partition((0, count, split))
        if tp is not None and (tp.split not in (-1, split) or shape[split] % tp.size
                               or shape[split] % count):
            logger.warning("%s: key %r: its parallelism manifest cuts dimension %d of %s into %d; "
                           "the read asks %d along %d: read without it", call, key, split,
                           shape, count, tp.size, tp.split)
            return None
        try:
            plan = (_parallel.Rebuild(key, [cut], writers=True) if axes is None else
                    _parallel.Rebuild(key, [cut if a is tp else a for a in axes]))
        except _tensor.TensorFormatError as e:
            logger.warning("%s: key %r: %s; read without its manifest", call, key, e)
            return None
        return plan, (code, shape)

    def _rebuild(self, call, key, plan, expect, into, quiet=False, window=None):
        """The whole tensor read through plan (its shards' headers first), or
        None (logged), or _MISSING when a shard cannot be read (logged unless
        quiet); expect: the (dtype code, shape) the shards must make;
        window: one shard of another cut instead (Rebuild.check)."""
        heads = self._headers(call, plan.keys, quiet=quiet or expect is not None)
        if heads is None:
            return _MISSING
        try:
            head, total, ranges = plan.check(heads, window)
            code, shape, _, _ = _tensor.layout(head, total)
            if expect is not None and (code, shape) != expect:
                raise _tensor.TensorFormatError(
                    "the shards make a %s tensor of shape %s; its manifest names %s of %s"
                    % (_tensor.dtype_name(code), shape, _tensor.dtype_name(expect[0]), expect[1]))
        except _tensor.TensorFormatError as e:
            return self._none(call, INVALID_PARAMS, "key %r: %s" % (key, e))
        if into is not None and into[1] < total:
            return self._none(call, INVALID_PARAMS, "key %r: the whole tensor is %d bytes, the "
                              "buffer holds %d" % (key, total, into[1]))
        block = None if into is not None else bytearray(total)
        try:
            base = into[0] if block is None else self._registered(block)
        except ferry.Error as e:
            return self._none(call, INVALID_PARAMS, e.detail)
        try:
            # the first shard's header lands first where the whole one goes:
            # a destination the ranged read refuses is never written to here
            if not self._read_ranges(call, base, [(plan.keys[0], 0, 0, _tensor.HEADER_SIZE)]
                                     + ranges):
                return None
            ctypes.memmove(base, head, len(head))
        finally:
            if block is not None:
                self._engine.unregister_memory(base)
        return self._decode(call, key, block if block is not None else
                            (ctypes.c_ubyte * total).from_address(base))

    def _legacy_tp_axes(self, call, key):
        """[the TP axis] key_tp_0's header names, or None (logged)."""
        heads = self._headers(call, [_tp_key(key, 0, 2)], quiet=True)
        try:
            if heads is None:
                raise _tensor.TensorFormatError("not found")
            _, _, _, axes = _tensor.layout(*heads[0])
            tp = [a for a in axes if a[0] == _parallel.KINDS["tp"]]
            if not tp:
                raise _tensor.TensorFormatError("its header has no tp axis")
            return [_parallel.writer_partition((0, tp[0][2], tp[0][3]))]
        except _tensor.TensorFormatError as e:
            self._fail(call, OBJECT_NOT_FOUND, "key %r: no whole value, and %r: %s (a layout "
                       "other than the TP calls' needs the ReadTarget's parallelism to name "
                       "its shards)" % (key, _tp_key(key, 0, 2), e))
            return None

    def _headers(self, call, keys, quiet=False):
        """[(header bytes, value size the header declares)] of keys, read in
        one ranged read; None when one cannot be read (logged unless quiet)."""
        size = _tensor.HEADER_SIZE
        block = bytearray(size * len(keys))
        try:
            base = self._registered(block)
        except ferry.Error as e:
            return self._none(call, INVALID_PARAMS, e.detail)
        try:
            if not self._read_ranges(call, base, [(k, 0, j * size, size)
                                                  for j, k in enumerate(keys)], quiet):
                return None
        finally:
            self._engine.unregister_memory(base)
        heads = [bytes(block[j * size:(j + 1) * size]) for j in range(len(keys))]
        return [(h, _tensor.declared_size(h)) for h in heads]

    def _read_ranges(self, call, base, ranges, quiet=False):
        """Reads ranges [(key, source offset, destination offset, size)] into
        base in one get_into_ranges; False when one fails (logged unless quiet)."""
        by_key = {}
        for key, src, dst, size in ranges:
            entry = by_key.setdefault(key, ([], [], []))
            for column, value in zip(entry, (dst, src, size)):
                column.append(value)
        keys = list(by_key)
        got = self._call(call, lambda: self._store.get_ranges(
            *map(list, zip(*[(k, base + d, s, n) for k in keys
                             for d, s, n in zip(*by_key[k])]))), quiet_missing=quiet)
        if isinstance(got, int):
            return False
        answers, detail = got
        if any(a < 0 for a in answers):
            if not quiet:
                self._fail(call, _code(next(a for a in answers if a < 0), detail), detail)
            return False
        return True

    def _put_tensors(self, call, keys, tensors, config=None, upsert=False, tp=None,
                     layouts=None):
        """Per key 0 or a code; tp=(tp_size, split_dim) stores each tensor's
        shards under key_tp_<rank> (a key's code: its first failing shard's);
        layouts, per key (TensorParallelism or None, writer partition or
        None), stores the piece _parallel.write_parts names."""
        keys, tensors = list(keys), list(tensors)
        layouts = [(None, None)] * len(keys) if layouts is None else list(layouts)
        if not len(keys) == len(tensors) == len(layouts):
            return [self._fail(call, INVALID_PARAMS, "%d keys but %d tensors and %d layouts"
                               % (len(keys), len(tensors), len(layouts)))] * len(keys)
        results, values = [0] * len(keys), []  # values: (key index, store key, tensor, header)
        manifests = []  # (key index, manifest key, bytes): written once the key's shards are
        for i, (key, tensor) in enumerate(zip(keys, tensors)):
            name = "the tensor of key %r" % (key,)
            try:
                tensor, code = _tensor.inspect(tensor, name)
                parts, manifest = (_parallel.write_parts(key, tensor, code, name, *layouts[i])
                                   if tp is None else
                                   ([(_tp_key(key, r, tp[0]),) + s for r, s in enumerate(
                                       _tensor.shards(tensor, code, tp[0], tp[1], name))], None))
            except _tensor.TensorFormatError as e:
                results[i] = self._fail(call, INVALID_PARAMS, str(e))
                continue
            values += [(i,) + p for p in parts]
            if manifest is not None:
                manifests.append((i,) + manifest)
        codes = self._write_tensors(call, [v[1:] for v in values], config, upsert)
        for (i, *_), code in zip(values, codes):
            results[i] = results[i] or code
        first = {}  # manifest key -> its bytes: once per batch (ranks of one tensor share it)
        for i, mkey, data in manifests:
            if results[i] == 0:
                first.setdefault(mkey, data)
        if first:
            codes = dict(zip(first, self._write_manifests(call, list(first.items()), config,
                                                          upsert)))
            for i, mkey, _ in manifests:
                if results[i] == 0:
                    results[i] = codes[mkey]
        return results

    def _write_manifests(self, call, manifests, config, upsert):
        """Puts (or upserts) Mooncake's manifests [(key, bytes)] from one
        registered block: 0 or a code each. A put of one stored already (by
        another rank) keeps it, as Mooncake's; one another rank is putting
        at the same time (-705) is that rank's to finish: 0 (a read checks
        the shards against it)."""
        if self._dummy is not None:  # as _write_tensors: values as bytes
            put = self.upsert if upsert else self.put
            return [put(key, data, config) for key, data in manifests]
        size = _parallel.MANIFEST_SIZE
        block = bytearray(b"".join(data for _, data in manifests))
        try:
            base = self._registered(block)
        except ferry.Error as e:
            return [self._fail(call, INVALID_PARAMS, e.detail)] * len(manifests)
        try:
            keys = [key for key, _ in manifests]
            ptrs = [base + j * size for j in range(len(keys))]
            busy = REPLICA_IS_NOT_READY if upsert else OBJECT_ALREADY_EXISTS
            got = self._call(call, lambda: self._store.batch_put_from(
                keys, ptrs, [size] * len(keys), *self._rep(config), upsert=upsert), busy)
            if isinstance(got, int):
                return [got] * len(keys)
            answers, detail = got
            codes = [0 if a >= 0 else _code(a, detail, busy) for a in answers]
            codes = [0 if c == OBJECT_ALREADY_EXISTS else c for c in codes]
            if any(codes):
                self._fail(call, next(c for c in codes if c), detail)
            return codes
        finally:
            self._engine.unregister_memory(base)

    def _manifest(self, call, key):
        """The manifest under key decoded (_parallel.decode_manifest), or None
        when there is none (not logged) or it is not one (logged, as Mooncake
        then reads without it)."""
        block = bytearray(_parallel.MANIFEST_SIZE)
        try:
            base = self._registered(block)
        except ferry.Error:
            return None
        try:
            if not self._read_ranges(call, base, [(key, 0, 0, len(block))], quiet=True):
                return None
        finally:
            self._engine.unregister_memory(base)
        try:
            return _parallel.decode_manifest(bytes(block))
        except _tensor.TensorFormatError as e:
            logger.warning("%s: %r: %s; read without it", call, key, e)
            return None

    def _write_tensors(self, call, items, config, upsert):
        """Stores items [(key, contiguous tensor, header)]: 0 or a code each."""
        if not items:
            return []
        if self._store is None:
            return [self._fail(call, INVALID_PARAMS, "setup() first, or the store was closed")
                    ] * len(items)
        if self._dummy is not None:  # it registers only whole pool allocations: values as bytes
            put = self.upsert if upsert else self.put
            return [put(key, bytes(head) + ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()),
                        config) for key, t, head in items]
        busy = REPLICA_IS_NOT_READY if upsert else OBJECT_ALREADY_EXISTS
        statuses, detail = [ferry.ENOTREG] * len(items), None
        try:
            rep = self._rep(config)
            if not upsert:
                statuses, detail = self._put_direct(items, rep)
            copy = [j for j, st in enumerate(statuses) if st == ferry.ENOTREG]
            if copy:  # memory not registered (nothing was stored): through a copy
                again, again_detail = self._put_copied([items[j] for j in copy], rep, upsert)
                detail = again_detail or detail
                for j, st in zip(copy, again):
                    statuses[j] = st
        except ferry.Error as e:
            statuses, detail = [e.code] * len(items), e.detail
        except (TypeError, ValueError, OverflowError) as e:
            statuses, detail = [ferry.EINVAL] * len(items), str(e)
        codes = [0 if st >= 0 else _code(st, detail, busy) for st in statuses]
        if any(codes):
            self._fail(call, next(c for c in codes if c), detail)
        return codes

    def _registered(self, block):
        """Registers a bytearray for one call; ferry.Error when refused."""
        if self._engine.register_memory(_address(block), len(block)) != 0:
            raise ferry.Error(ferry.EINVAL, "registering a %d-byte tensor block: %s"
                              % (len(block), self._engine.last_error()))
        return _address(block)

    def _put_direct(self, items, rep):
        """Each header from one registered block, each tensor's bytes from the
        tensor itself: all ENOTREG when a tensor's memory is not registered
        (every buffer is checked before the master is asked: nothing was
        stored)."""
        size = _tensor.HEADER_SIZE
        heads = bytearray(b"".join(h for _, _, h in items))
        base = self._registered(heads)
        try:
            addrs, sizes = [], []
            for j, (_, tensor, _) in enumerate(items):
                nbytes = tensor.numel() * tensor.element_size()
                addrs.append([base + j * size] + ([tensor.data_ptr()] if nbytes else []))
                sizes.append([size] + ([nbytes] if nbytes else []))
            return self._store.batch_put_from_multi([k for k, _, _ in items], addrs, sizes, *rep)
        except ferry.Error as e:
            if e.code != ferry.ENOTREG:
                raise
            return [e.code] * len(items), e.detail
        finally:
            self._engine.unregister_memory(base)

    def _put_copied(self, items, rep, upsert):
        """Header and bytes copied into one registered block, then put (or upserted)."""
        lengths = [len(h) + t.numel() * t.element_size() for _, t, h in items]
        block = bytearray(sum(lengths))
        base = self._registered(block)
        try:
            at, ptrs = 0, []
            for (_, tensor, head), length in zip(items, lengths):
                block[at:at + len(head)] = head
                ctypes.memmove(base + at + len(head), tensor.data_ptr(), length - len(head))
                ptrs.append(base + at)
                at += length
            return self._store.batch_put_from([k for k, _, _ in items], ptrs, lengths, *rep,
                                              upsert=upsert)
        finally:
            self._engine.unregister_memory(base)

    def _put_tensor_from(self, call, keys, buffer_ptrs, sizes, upsert=False):
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        problem = ("%d keys, %d buffers, %d sizes" % (len(keys), len(buffer_ptrs), len(sizes))
                   if not len(keys) == len(buffer_ptrs) == len(sizes) else None)
        for key, ptr, size in zip(keys, buffer_ptrs, sizes):
            if problem:
                break
            try:
                if not ptr:
                    raise _tensor.TensorFormatError("a null buffer")
                head = ctypes.string_at(ptr, min(size, _tensor.HEADER_SIZE))
                _tensor.check(head, size)
            except _tensor.TensorFormatError as e:
                problem = "the buffer of key %r: %s" % (key, e)
        if problem:  # as Mooncake's: one bad buffer refuses the whole batch
            return [self._fail(call, INVALID_PARAMS, problem)] * len(keys)
        return self._batch(call, lambda: self._store.batch_put_from(keys, buffer_ptrs, sizes,
                                                                    upsert=upsert),
                           len(keys), busy=REPLICA_IS_NOT_READY if upsert else
                           OBJECT_ALREADY_EXISTS)

    def _get_tensors(self, call, keys):
        keys = list(keys)
        handles = self.batch_get_buffer(keys, _call=call)
        return [None if h is None else self._decode(call, k, h) for k, h in zip(keys, handles)]

    def _get_tensors_into(self, call, keys, buffer_ptrs, sizes):
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if not len(keys) == len(buffer_ptrs) == len(sizes) or not all(buffer_ptrs):
            return [self._fail(call, INVALID_PARAMS, "%d keys, %d buffers, %d sizes, or a null "
                               "buffer" % (len(keys), len(buffer_ptrs), len(sizes)))] * len(keys)
        got = self._batch(call, lambda: self._read_into(call, keys, buffer_ptrs, sizes),
                          len(keys))
        return [None if n < 0 else
                self._decode(call, k, (ctypes.c_ubyte * n).from_address(p) if n else bytearray())
                for k, p, n in zip(keys, buffer_ptrs, got)]

    def _read_into(self, call, keys, buffer_ptrs, sizes):
        """batch_get_into; where a buffer is not registered (every buffer is
        checked before the master is asked: nothing was read), the values are
        read into one registered block and copied into the buffers, as a
        tensor put copies from unregistered memory (Mooncake's tensor calls
        take any buffer)."""
        try:
            return self._store.batch_get_into(keys, buffer_ptrs, sizes)
        except ferry.Error as e:
            if e.code != ferry.ENOTREG:
                raise
        if not self._told_copied_reads:
            self._told_copied_reads = True
            logger.info("%s: a buffer is not registered: values are read through a copy "
                        "(register_buffer it to read in place)", call)
        block = bytearray(max(sum(sizes), 1))
        base = self._registered(block)
        try:
            offsets = list(itertools.accumulate([0] + sizes[:-1]))
            answers, detail = self._store.batch_get_into(keys, [base + o for o in offsets], sizes)
            for ptr, off, n in zip(buffer_ptrs, offsets, answers):
                if n > 0:
                    ctypes.memmove(ptr, base + off, n)
            return answers, detail
        finally:
            self._engine.unregister_memory(base)

    def _decode(self, call, key, buffer):
        """The tensor in a value's buffer (sharing its memory), or None: logged."""
        try:
            return _tensor.decode(buffer)
        except _tensor.TensorFormatError as e:
            self._fail(call, INVALID_PARAMS, "key %r: %s" % (key, e))
            return None

    # ---- plumbing -------------------------------------------------------------------------

    def _rep(self, config):
        """_replicate(config), with a preferred_segment naming this client by
        its bare local_hostname (no port: LMCache passes that) mapped to the
        segment's name."""
        rep = _replicate(config)
        if not self._bare_hostname or rep[1] is None:
            return rep
        named = [self._hostname if s == self._bare_hostname else s
                 for s in (rep[1] if isinstance(rep[1], list) else [rep[1]])]
        return (rep[0], named if isinstance(rep[1], list) else named[0]) + tuple(rep[2:])

    def _no_staging(self, call):
        return self._fail(call, INVALID_PARAMS, "local_buffer_size is 0: no local buffer to "
                          "copy the value through (use put_from / get_into with a registered "
                          "buffer)")

    def _fail(self, call, code, detail):
        logger.warning("%s failed (%d): %s", call, code, detail)
        return code

    def _none(self, call, code, detail):
        """A read's failure: logged, None."""
        self._fail(call, code, detail)

    def _call(self, call, fn, busy=OBJECT_HAS_LEASE, quiet_missing=False):
        if self._store is None or fn is None:
            return self._fail(call, INVALID_PARAMS, "setup() first, or the store was closed")
        try:
            result = fn()
        except ferry.Error as e:
            code = _code(e.code, e.detail, busy)
            if quiet_missing and code == OBJECT_NOT_FOUND:
                return code
            return self._fail(call, code, e.detail)
        except (TypeError, ValueError, OverflowError) as e:
            return self._fail(call, INVALID_PARAMS, str(e))
        return 0 if result is None else result

    def _batch(self, call, fn, count, busy=OBJECT_HAS_LEASE):
        result = self._call(call, fn, busy)
        if isinstance(result, int):
            return [result] * count
        answers, detail = result
        if detail is not None:
            codes = [a for a in answers if a < 0]
            code = _code(codes[0], detail, busy) if codes else INTERNAL_ERROR
            if code != OBJECT_NOT_FOUND or call != "batch_is_exist":
                self._fail(call, code, detail)
        return [a if a >= 0 else _code(a, detail, busy) for a in answers]


# ---- Mooncake's module-level tensor serializers ---------------------------------------------

def _serialize_tensor(tensor):
    """(header bytes, data_ptr, size in bytes, owner) of a CPU tensor in
    Mooncake's stored-tensor format, owner being the contiguous tensor whose
    bytes follow the header; ValueError for one the format cannot carry."""
    owner, code = _tensor.inspect(tensor)
    return (_tensor.header_of(owner, code), owner.data_ptr(),
            owner.numel() * owner.element_size(), owner)


def _tensor_metadata_size():
    """The size of the header in Mooncake's stored-tensor format (304)."""
    return _tensor.HEADER_SIZE


def _deserialize_tensor(payload):
    """The tensor in a header-plus-bytes payload (copied); ValueError when the
    payload is not one."""
    return _tensor.decode(bytearray(payload))
