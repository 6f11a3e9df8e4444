"""mooncake.engine - Mooncake's ``TransferEngine`` Python API implemented on ferry.

Every method keeps Mooncake's name, argument order, defaults and return
convention: integers (0 or a negative Mooncake error number), never an
exception for a transfer failure. The cause of a failure is logged at WARNING
on the ``mooncake.engine`` logger and kept: ``last_error()`` returns the
message of the calling thread's last call (None once a call succeeds),
``last_error_code()`` its Mooncake code. A call after ``close()`` names the
engine that was closed.

``initialize(local_hostname, metadata_server, protocol, device_name)``:

- ``"P2PHANDSHAKE"``: the host part of ``local_hostname`` is advertised and
  bound (unless ``MC_TCP_BIND_ADDRESS`` is set, which libferry then uses);
  the RPC port is picked by the engine (``get_rpc_port()``), or, with
  ``MC_LEGACY_RPC_PORT_BINDING`` set, taken from ``local_hostname``.
- a metadata store: ``"http://host:port/path"`` (``ferry metadata-server`` or
  Mooncake's), ``"redis://[user[:password]@]host:port[/db]"`` (with
  ``MC_REDIS_USERNAME`` / ``MC_REDIS_PASSWORD`` / ``MC_REDIS_DB_INDEX``),
  ``"etcd://host:port[,host:port...]"`` or a bare ``"host:port"`` (etcd);
  ``local_hostname`` is the segment name, verbatim. Its keys live under a
  lease (``FERRY_METADATA_TTL_MS``, default 5 s), so a killed engine's
  segment disappears. A store that cannot be reached fails initialize.
- ``protocol``: ``"tcp"`` restricts ferry to TCP. ``"rdma"`` runs ferry's
  fabric transport on libfabric's ``verbs;ofi_rxm`` provider (InfiniBand,
  RoCE), ``"efa"`` on its ``efa`` provider; on a host without such a device
  ferry falls back to tcp/shm with a WARNING (once per engine) saying why
  (libfabric's own words). ``FERRY_FABRIC_PROVIDER`` overrides the provider
  (``"tcp;ofi_rxm"`` runs the same RMA path without an RDMA NIC). Anything
  else (``"nvlink"``, ...) lets ferry choose among all its transports, with
  a WARNING naming what was asked for and why it is not available.
  ``MC_FORCE_TCP=1`` (or true/yes/on) forces TCP. Ascend NPUs (protocol
  ``"ascend"``, or a ``local_hostname`` ending in ``:npu_N``) are refused
  with -303 (not implemented): ferry moves host memory only.
- ``device_name``: with ``"rdma"``/``"efa"``, the NIC (libfabric domain,
  e.g. ``"mlx5_0"``) the fabric transport uses; a list uses its first (one
  rail). One that does not exist fails initialize naming those that do.
  Otherwise not used; one that names no device of this host is reported at
  WARNING with the devices that exist.

Failures are explained in ferry's docs/errors.md, by Mooncake code.

Timeouts follow libferry's defaults (30 s + time per byte;
``MC_TRANSFER_TIMEOUT`` overrides the base in seconds).
"""

import ctypes
import enum
import functools
import inspect
import itertools
import logging
import json
import os
import re
import threading
from collections import namedtuple

import ferry

logger = logging.getLogger("mooncake.engine")

__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write"]

# Mooncake build features. ferry moves host memory over its own transports, and
# CUDA device memory over tcp (staged) when the driver loads.
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False
# True when libferry found the CUDA driver (libcuda.so.1) and a device:
# register_memory then takes device memory ("cuda:N"), moved over tcp
# through pinned bounce buffers.
SUPPORT_CUDA = ferry.cuda_available()[0]

_P2PHANDSHAKE = "P2PHANDSHAKE"
_ERRORS_DOC = "docs/errors.md"
_START_FAILED = re.compile(r"^engine start failed: ")  # libferry's step, not the cause
_RDMA_SYSFS = "/sys/class/infiniband"  # where RDMA devices are listed
_NO_LIBRARY = "which cannot be loaded on this host"  # libferry: libfabric is missing
_STRERROR = re.compile(r" \(docs/errors\.md#[^)]*\)$")  # the pointer, given once below
_CODE_NAMES = {getattr(ferry, n): n for n in ferry.__all__
               if n.startswith("E") and isinstance(getattr(ferry, n), int)}

# Protocols Mooncake offers that ferry replaces by its own transports: what
# each one is, for the fallback warning (EFA is not RDMA verbs).
_FALLBACK_PROTOCOLS = {
    "rdma": "RDMA (InfiniBand/RoCE verbs)",
    "efa": "AWS EFA (Elastic Fabric Adapter, through libfabric; not RDMA verbs)",
    "nvlink": "NVLink",
    "nvlink_intra": "intra-node NVLink",
    "mnnvl": "multi-node NVLink",
    "hip": "AMD HIP IPC",
    "cxl": "CXL shared memory",
    "nvmeof": "NVMe over Fabrics",
    "barex": "Barex",
}
# The protocols ferry's fabric transport serves, by libfabric provider.
_FABRIC_PROTOCOLS = {"rdma": "verbs;ofi_rxm", "efa": "efa"}
_ASCEND_PROTOCOLS = ("ascend", "ascend_direct", "hccl", "npu")
_NPU_HOST = re.compile(r":npu_\d+$")
_WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]", "*")


class TransferOpcode(enum.IntEnum):
    """Direction of a transfer: Read (remote -> local) = 0, Write (local -> remote) = 1."""

    Read = 0
    Write = 1


# Mooncake exports the enum values at module level too.
Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify(namedtuple("TransferNotify", ["name", "msg"])):
    """A notification: ``name`` and ``msg``.

    Pass one as ``notify`` to ``transfer_sync``/``batch_transfer_sync``; it is
    delivered to the target after the data. ``get_notifies()`` returns these.
    Being a tuple, it also unpacks as ``(name, msg)``. Unlike Mooncake's, its
    fields are read-only (build a new one instead of assigning).
    """

    __slots__ = ()

    def __new__(cls, name="", msg=""):
        return super().__new__(cls, name, msg)


def _split_host_port(hostname):
    """"host", "host:port", "[v6]:port", "[v6]" or a bare IPv6 address ->
    (host, port or None). Raises ValueError for a malformed port."""
    s = (hostname or "").strip()
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise ValueError("unterminated '[' in %r" % hostname)
        host, rest = s[1:end], s[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError("unexpected text after ']' in %r" % hostname)
        return host, _parse_port(rest[1:], hostname)
    if s.count(":") == 1:
        host, port = s.split(":")
        return host, _parse_port(port, hostname)
    return s, None  # plain host name or bare IPv6 address


def _parse_port(text, whole):
    if not text.isdigit() or int(text) > 65535:
        raise ValueError("bad port %r in %r" % (text, whole))
    return int(text)


def _env_true(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _opcode(opcode):
    """TransferOpcode, int, or anything with an int value -> ferry op."""
    value = int(getattr(opcode, "value", opcode))
    if value not in (ferry.OP_READ, ferry.OP_WRITE):
        raise ValueError("opcode must be TransferOpcode.Read (0) or TransferOpcode.Write (1)")
    return value


def _op_name(opcode):
    value = getattr(opcode, "value", opcode)
    return {0: "read", 1: "write"}.get(value, "opcode %r" % (opcode,))


def _notify(notify):
    """None, TransferNotify, (name, msg) or an object with .name/.msg -> (name, msg)."""
    if notify is None:
        return None
    if isinstance(notify, (tuple, list)):
        name, msg = notify
    else:
        name, msg = notify.name, notify.msg
    return (name, msg)


class TransferEngine:
    """Mooncake's ``TransferEngine`` on ferry. Create, then ``initialize()``."""

    TransferOpcode = TransferOpcode
    TransferNotify = TransferNotify

    def __init__(self):
        self._engine = None
        self._lock = threading.Lock()
        self._batches = {}
        self._ids = itertools.count(1)
        self._tls = threading.local()
        self._closed_name = None  # the session name of the engine close() stopped

    # ---- errors ---------------------------------------------------------
    def _fail(self, what, err, explained=None):
        """Logs and records a ferry.Error (or argument error); returns the Mooncake code.
        explained: the cause in the caller's terms, instead of libferry's detail."""
        if isinstance(err, ferry.Error):
            code = err.mooncake_code
            cause = explained or "%s: %s" % (_STRERROR.sub("", ferry.strerror(err.code)),
                                             err.detail)
            text = "%s [Mooncake %d, ferry %s; see %s#mooncake-%d]" % (
                cause, code, _CODE_NAMES.get(err.code, err.code), _ERRORS_DOC, code)
        else:
            code = -1
            text = "invalid argument: %s [Mooncake -1; see %s#mooncake--1]" % (err, _ERRORS_DOC)
        self._tls.error = "%s failed: %s" % (what, text)
        self._tls.code = code
        logger.warning("%s", self._tls.error)
        return code

    def last_error(self):
        """The calling thread's failure message from its last call of this
        engine (None if that call succeeded). ferry extra."""
        return getattr(self._tls, "error", None)

    def last_error_code(self):
        """last_error() as a Mooncake code (0 if none). ferry extra."""
        return getattr(self._tls, "code", 0)

    def _eng(self):
        eng = self._engine
        if eng is None and self._closed_name:
            raise ferry.Error(ferry.ECLOSED, "engine closed",
                              "TransferEngine %s is closed (close() was called); create and "
                              "initialize a new one" % self._closed_name)
        if eng is None:
            raise ferry.Error(ferry.EINVAL,
                              "TransferEngine is not initialized; call initialize() first")
        return eng

    # ---- initialization -------------------------------------------------
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """Starts the engine; 0 on success, negative on failure."""
        return self._initialize(local_hostname, metadata_server, protocol, device_name)

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type):
        """Like initialize(); metadata_type prefixes a metadata_server without a scheme."""
        server = metadata_server or ""
        if server != _P2PHANDSHAKE and "://" not in server and metadata_type:
            server = "%s://%s" % (metadata_type, server)
        return self._initialize(local_hostname, server, protocol, device_name)

    def _initialize(self, local_hostname, metadata_server, protocol, device_name):
        if self._engine is not None:
            return self._fail("initialize", ferry.Error(
                ferry.EINVAL, "already initialized", "this TransferEngine is already initialized"))
        proto = (protocol or "").strip().lower()
        if proto in _ASCEND_PROTOCOLS or _NPU_HOST.search((local_hostname or "").strip()):
            return self._fail("initialize", ferry.Error(ferry.ENOTIMPL, "Ascend"),
                              _ascend_refusal(protocol, local_hostname))
        server = (metadata_server or "").strip()
        kwargs = {}
        try:
            host, port = _split_host_port(local_hostname)
        except ValueError as e:
            return self._fail("initialize", e)
        if server.upper() == _P2PHANDSHAKE:
            # Mooncake picks the RPC port itself, unless MC_LEGACY_RPC_PORT_BINDING
            # asks for the port given in local_hostname.
            if not os.environ.get("MC_LEGACY_RPC_PORT_BINDING"):
                port = 0
            port = port or 0
        else:
            # http(s)://..., redis://[user[:password]@]host:port[/db] (MC_REDIS_USERNAME,
            # MC_REDIS_PASSWORD, MC_REDIS_DB_INDEX fill what it leaves out),
            # etcd://host:port[,host:port...] or a bare host:port (etcd): libferry
            # parses the URL and names what is wrong with one it cannot use.
            kwargs["metadata_url"] = server
            kwargs["segment_name"] = local_hostname
            port = port or 0

        if os.environ.get("MC_TCP_BIND_ADDRESS"):
            pass  # libferry's config takes the address from the environment
        elif host and host not in _WILDCARD_HOSTS:
            kwargs["host"] = host
        elif host:
            kwargs["bind_host"] = "::" if ":" in host else "0.0.0.0"

        fallback = None
        if proto == "tcp":
            kwargs["transports"] = "tcp"
        elif _env_true("MC_FORCE_TCP"):
            kwargs["transports"] = "tcp"
            logger.info("MC_FORCE_TCP is set: protocol %r replaced by tcp", protocol)
        else:
            # No transports argument: libferry's default, all it has built in
            # (FERRY_TRANSPORTS narrows it).
            fallback = proto
        no_device = None
        if fallback in _FABRIC_PROTOCOLS and not _fabric_allowed():
            _check_device_name(device_name, "FERRY_TRANSPORTS=%s leaves the fabric transport "
                               "out" % os.environ.get("FERRY_TRANSPORTS"))
        elif fallback in _FABRIC_PROTOCOLS:
            _fabric_kwargs(fallback, device_name, kwargs)
        else:
            _check_device_name(device_name, "it picks the fabric transport's NIC for protocol "
                               "'rdma' or 'efa' only, not %r" % protocol)

        try:
            try:
                engine = ferry.Engine(port=port, **kwargs)
            except ferry.Error as e:
                # The others FERRY_TRANSPORTS allows; without fabric, just found
                # missing, so the engine need not look again (and log it again).
                others = _allowed_transports() & ~ferry.TRANSPORT_FABRIC
                if "fabric_provider" not in kwargs or not others or not _no_rdma_device(e):
                    raise
                no_device = e.detail  # libfabric found no such device: fall back
                kwargs.pop("fabric_provider")
                kwargs.pop("fabric_device", None)
                kwargs["transports"] = others
                engine = ferry.Engine(port=port, **kwargs)
        except ferry.Error as e:
            return self._fail("initialize", e)
        self._engine = engine
        if no_device is not None:
            _warn_no_device(protocol, no_device)
        elif fallback in _FABRIC_PROTOCOLS and _fabric_allowed():
            logger.info("protocol %r: ferry's fabric transport (provider %s)", protocol,
                        os.environ.get("FERRY_FABRIC_PROVIDER") or kwargs["fabric_provider"])
        elif fallback is not None:
            _warn_fallback(protocol)
        logger.info("transfer engine ready: session %s (ferry %s)", engine.name, ferry.version())
        return 0

    def get_rpc_port(self):
        """The RPC port actually bound (-1 before initialize)."""
        eng = self._engine
        return eng.port if eng is not None else -1

    def get_engine(self):
        """The underlying ``ferry.Engine`` (None before initialize)."""
        return self._engine

    def get_stats(self):
        """ferry's statistics as ``ferry.Engine.stats()`` returns them (bytes,
        operations, errors, latency...); {} before initialize. Prometheus can
        scrape the same with FERRY_METRICS_PORT set; MC_TE_METRIC=1 logs a
        throughput line every MC_TE_METRIC_INTERVAL_SECONDS (default 5)."""
        eng = self._engine
        return eng.stats() if eng is not None else {}

    def get_local_topology(self, device_name=None):
        """Mooncake's NIC topology as JSON; ferry does not report one: an empty object."""
        return "{}"

    def warmup_efa_segment(self, segment_name):
        """No-op (no EFA in ferry); connections are opened lazily. Returns 0."""
        return 0

    def release_remote_segment(self, target_hostname):
        """No NVLink mappings to release; returns 0."""
        return 0

    # ---- memory ---------------------------------------------------------
    def register_memory(self, buffer_addr, capacity, location="*"):
        """Registers capacity bytes at buffer_addr (an int address, or a writable
        buffer object: a read-only one such as bytes is refused, since peers
        may write a registered region). 0 or negative."""
        try:
            self._eng().register(buffer_addr, int(capacity), location=location)
            return 0
        except (ferry.Error, TypeError, ValueError, OverflowError) as e:
            return self._fail("register_memory(%s, %s)" % (_describe(buffer_addr), capacity), e)

    def unregister_memory(self, buffer_addr):
        try:
            self._eng().unregister(int(buffer_addr))
            return 0
        except ferry.Error as e:
            return self._fail("unregister_memory(%#x)" % buffer_addr, e)

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        """location: one for every buffer ("cpu:0", "cuda:1", "*"), or a list
        of one per buffer. 0 or negative."""
        try:
            addrs = [int(a) for a in buffer_addresses]
            lens = [int(n) for n in capacities]
            if len(addrs) != len(lens):
                raise ValueError("%d addresses but %d capacities" % (len(addrs), len(lens)))
            self._eng().register_batch(addrs, lens, locations=location)
            return 0
        except (ferry.Error, ValueError) as e:
            return self._fail("batch_register_memory", e)

    def batch_unregister_memory(self, buffer_addresses):
        try:
            self._eng().unregister_batch([int(a) for a in buffer_addresses])
            return 0
        except ferry.Error as e:
            return self._fail("batch_unregister_memory", e)

    def allocate_managed_buffer(self, length):
        """A new registered, zero-filled buffer; its address, 0 on failure."""
        try:
            return self._eng().alloc(int(length))
        except (ferry.Error, ValueError, OverflowError) as e:
            self._fail("allocate_managed_buffer(%d)" % length, e)
            return 0

    def free_managed_buffer(self, buffer_addr, length):
        """Frees a buffer from allocate_managed_buffer; 0 (negative if ferry refuses)."""
        try:
            self._eng().free(int(buffer_addr))
            return 0
        except ferry.Error as e:
            return self._fail("free_managed_buffer(%#x)" % buffer_addr, e)

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        """Copies ``length`` bytes of ``src_ptr`` (bytes or str) to local memory; 0."""
        data = src_ptr.encode() if isinstance(src_ptr, str) else bytes(src_ptr)
        if length > len(data):
            return self._fail("write_bytes_to_buffer", ValueError(
                "length %d exceeds the %d bytes given" % (length, len(data))))
        ctypes.memmove(int(dest_address), data, int(length))
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        """``length`` bytes of local memory at ``source_address``, as bytes."""
        return ctypes.string_at(int(source_address), int(length))

    def get_first_buffer_address(self, segment_name):
        """Address of the first region the peer registered; 0 if none or on failure."""
        try:
            regions = self._eng().peer_regions(segment_name)
        except ferry.Error as e:
            self._fail("get_first_buffer_address(%s)" % segment_name, e)
            return 0
        return regions[0][0] if regions else 0

    # ---- synchronous transfers -----------------------------------------
    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length,
                                  TransferOpcode.Write)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        return self.transfer_sync(target_hostname, buffer, peer_buffer_address, length,
                                  TransferOpcode.Read)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        """One transfer; returns when the data is at its destination. 0 or negative."""
        try:
            op = _opcode(opcode)
            note = _notify(notify)
            eng = self._eng()
            if note is None:
                if op == ferry.OP_WRITE:
                    eng.write(target_hostname, int(buffer), int(peer_buffer_address), int(length))
                else:
                    eng.read(target_hostname, int(buffer), int(peer_buffer_address), int(length))
            else:
                eng.transfer_batch(target_hostname,
                                   [(op, int(buffer), int(peer_buffer_address), int(length))],
                                   notify=note)
            return 0
        except (ferry.Error, ValueError, OverflowError) as e:
            return self._fail("transfer_sync(%s, %s, %s bytes)" % (
                target_hostname, _op_name(opcode), length), e,
                _explain(e, [buffer], [peer_buffer_address], [length]))

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Write)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses,
                                 lengths, transport_hint=""):
        return self.batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses,
                                        lengths, TransferOpcode.Read)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint=""):
        """Many transfers to one target in one call. 0 or negative."""
        try:
            op = _opcode(opcode)
            self._eng().transfer_arrays(target_hostname, op, buffers, peer_buffer_addresses,
                                        lengths, notify=_notify(notify))
            return 0
        except (ferry.Error, ValueError, OverflowError) as e:
            return self._fail("batch_transfer_sync(%s, %d entries)" % (
                target_hostname, _safe_len(buffers)), e,
                _explain(e, buffers, peer_buffer_addresses, lengths))

    # ---- stream-ordered transfers ---------------------------------------
    # Mooncake's GPU builds' *_on_cuda: queued on a CUDA stream (stream_ptr:
    # an int handle such as torch.cuda.Stream.cuda_stream; 0: the default
    # stream of the calling thread's current context). The transfer starts
    # once the work queued on the stream before it completed, and the work
    # queued after waits until it ended (ferry_batch_submit_on_stream: an
    # event, and cuStreamWaitValue32 or a host function). They return None at
    # once, as Mooncake's do. What is refused before anything is queued
    # (not initialized, an unknown target, unregistered memory, no CUDA
    # driver, the driver refusing the stream) raises RuntimeError naming the
    # call, the step and the device, as Mooncake raises on its setup errors;
    # a transfer that fails later is logged by ferry (error level, with its
    # cause), and the stream goes on: Mooncake exits the process there.
    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                               stream_ptr=0, transport_hint=""):
        self._on_cuda("transfer_write_on_cuda", target_hostname, ferry.OP_WRITE, [buffer],
                      [peer_buffer_address], [length], stream_ptr)

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                              stream_ptr=0, transport_hint=""):
        self._on_cuda("transfer_read_on_cuda", target_hostname, ferry.OP_READ, [buffer],
                      [peer_buffer_address], [length], stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                     lengths, stream_ptr=0, transport_hint=""):
        self._on_cuda("batch_transfer_write_on_cuda", target_hostname, ferry.OP_WRITE, buffers,
                      peer_buffer_addresses, lengths, stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                    lengths, stream_ptr=0, transport_hint=""):
        self._on_cuda("batch_transfer_read_on_cuda", target_hostname, ferry.OP_READ, buffers,
                      peer_buffer_addresses, lengths, stream_ptr)

    def _on_cuda(self, what, target_hostname, op, buffers, peer_buffer_addresses, lengths,
                 stream_ptr):
        try:
            self._eng().submit_on_stream(target_hostname, op, [int(b) for b in buffers],
                                         [int(a) for a in peer_buffer_addresses],
                                         [int(n) for n in lengths], stream=int(stream_ptr or 0),
                                         watch=False)
        except (ferry.Error, ValueError, OverflowError, TypeError) as e:
            self._fail("%s(%s, %d entries)" % (what, target_hostname, _safe_len(buffers)), e,
                       _explain(e, buffers, peer_buffer_addresses, lengths))
            raise RuntimeError(self.last_error()) from e

    # ---- asynchronous transfers ----------------------------------------
    def _submit(self, what, target_hostname, op, buffers, peer_buffer_addresses, lengths):
        try:
            batch = self._eng().submit_arrays(target_hostname, _opcode(op), buffers,
                                              peer_buffer_addresses, lengths)
        except (ferry.Error, ValueError, OverflowError) as e:
            self._fail("%s(%s, %d entries)" % (what, target_hostname, _safe_len(buffers)), e,
                       _explain(e, buffers, peer_buffer_addresses, lengths))
            return 0
        with self._lock:
            batch_id = next(self._ids)
            self._batches[batch_id] = batch
        return batch_id

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        """Starts a batch of writes; returns its id (non-zero), 0 on failure."""
        return self._submit("batch_transfer_async_write", target_hostname, ferry.OP_WRITE,
                            buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        """Starts a batch of reads; returns its id (non-zero), 0 on failure."""
        return self._submit("batch_transfer_async_read", target_hostname, ferry.OP_READ,
                            buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        """Starts a batch; returns its id (non-zero), 0 on failure."""
        return self._submit("batch_transfer_async", target_hostname, opcode, buffers,
                            peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        """Starts one write; returns its batch id (non-zero), 0 on failure."""
        return self._submit("transfer_submit_write", target_hostname, ferry.OP_WRITE,
                            [buffer], [peer_buffer_address], [length])

    def get_batch_transfer_status(self, batch_ids):
        """Waits for every batch; 0 if all succeeded, else the first failure's code.
        The batches are freed either way."""
        with self._lock:
            batches = [(bid, self._batches.pop(bid, None)) for bid in batch_ids]
        result = 0
        for bid, batch in batches:
            if batch is None:
                if result == 0:
                    result = self._fail("get_batch_transfer_status", _unknown_batch(bid))
                continue
            try:
                batch.wait(-1)
            except ferry.Error as e:
                code = self._fail("get_batch_transfer_status(batch %d)" % bid, e)
                if result == 0:
                    result = code
            finally:
                batch.free()
        return result

    def transfer_check_status(self, batch_id):
        """1 done, 0 pending, -1 failed, -2 timed out; a finished batch is freed."""
        with self._lock:
            batch = self._batches.get(batch_id)
        if batch is None:
            self._fail("transfer_check_status", _unknown_batch(batch_id))
            return -1
        try:
            state = batch.status()
        except ferry.Error as e:
            self._fail("transfer_check_status(batch %d)" % batch_id, e)
            state = ferry.BATCH_FAILED
        if state == ferry.BATCH_PENDING:
            return 0
        with self._lock:
            owned = self._batches.pop(batch_id, None) is batch
        if state != ferry.BATCH_DONE and batch.error:
            self._fail("transfer_check_status(batch %d)" % batch_id, ferry.Error(
                batch.error, ferry.strerror(batch.error), batch.detail))
        if owned:
            batch.free()
        if state == ferry.BATCH_DONE:
            return 1
        return -2 if state == ferry.BATCH_TIMEDOUT else -1

    # ---- peers and notifications ---------------------------------------
    def send_probe(self, peer_server_name):
        """0 if the peer answers, negative otherwise."""
        try:
            self._eng().probe(peer_server_name)
            return 0
        except ferry.Error as e:
            return self._fail("send_probe(%s)" % peer_server_name, e)

    def get_notifies(self):
        """Notifications received since the last call, as TransferNotify(name, msg) tuples."""
        try:
            items = self._eng().drain_notifications()
        except ferry.Error as e:
            self._fail("get_notifies", e)
            return []
        return [TransferNotify(name, data.decode("utf-8", "surrogateescape"))
                for name, data in items]

    # ---- ferry extras ---------------------------------------------------
    def close(self):
        """Stops the engine, then frees outstanding batches (final by then:
        the engine's shutdown failed what it had not finished). ferry extra."""
        eng, self._engine = self._engine, None
        if eng is not None:
            self._closed_name = eng.name
            eng.close()
        with self._lock:
            batches = list(self._batches.values())
            self._batches.clear()
        for batch in batches:
            batch.free()


def _clears_last_error(method):
    """method, starting with no error recorded for the calling thread, so
    that last_error() describes the thread's last call, not an older one."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        self._tls.error, self._tls.code = None, 0
        return method(self, *args, **kwargs)
    return call


for _name, _method in list(vars(TransferEngine).items()):
    if inspect.isfunction(_method) and not _name.startswith("_") and \
            _name not in ("last_error", "last_error_code"):
        setattr(TransferEngine, _name, _clears_last_error(_method))


def _describe(obj):
    if isinstance(obj, int):
        return "%#x" % obj
    return "a %s object" % type(obj).__name__


def _ascend_refusal(protocol, local_hostname):
    return ("Ascend NPUs are not supported by ferry (protocol %r, local_hostname %r): ferry "
            "moves host (CPU) memory (over tcp, shm or its fabric transport), not NPU "
            "memory. Run without Ascend (KV cache in host memory, protocol 'tcp', "
            "local_hostname 'host' or "
            "'host:port'), or use Mooncake's own transfer engine built with Ascend support"
            % (protocol, local_hostname))


def _warn_fallback(protocol):
    """The WARNING of an engine that got ferry's transports instead of protocol."""
    proto = (protocol or "").strip().lower()
    what = _FALLBACK_PROTOCOLS.get(proto, "protocol %r, which ferry does not know" % protocol)
    env = os.environ.get("FERRY_TRANSPORTS")
    why = ("FERRY_TRANSPORTS leaves ferry's fabric transport out" if proto in _FABRIC_PROTOCOLS
           else "which ferry does not provide (it has no such transport)")
    logger.warning(
        "protocol %r asks for %s, %s; "
        "using ferry's own transports instead (%s; tcp between hosts, shm on one host). "
        "Between hosts this runs at TCP speed, which can be orders of magnitude below %s. "
        "Pass protocol 'tcp' (or set MC_FORCE_TCP=1) to choose this on purpose. See %s.",
        protocol, what, why, "FERRY_TRANSPORTS=%s" % env if env else "all built in",
        proto.upper() if proto in _FALLBACK_PROTOCOLS else "it", _ERRORS_DOC)


def _fabric_allowed():
    """FERRY_TRANSPORTS (when set) lets the fabric transport run."""
    env = (os.environ.get("FERRY_TRANSPORTS") or "all").lower()
    return "fabric" in env or "all" in env


def _fabric_kwargs(proto, device_name, kwargs):
    """The fabric provider (FERRY_FABRIC_PROVIDER wins: libferry reads it)
    and device for protocol "rdma" or "efa"."""
    if not os.environ.get("FERRY_FABRIC_PROVIDER"):
        kwargs["fabric_provider"] = _FABRIC_PROTOCOLS[proto]
    try:
        devices = _device_names(str(device_name)) if device_name else []
    except (OSError, ValueError) as e:
        logger.warning("device_name %r cannot be read (%s); the provider's first device is "
                       "used", device_name, e)
        devices = []
    devices = list(dict.fromkeys(devices))  # a JSON mapping may name a NIC for several GPUs
    if len(devices) > 8:
        logger.warning("device_name %r names %d devices; ferry's fabric transport drives the "
                       "first 8 (a domain and rail each)", device_name, len(devices))
    if devices:
        kwargs["fabric_device"] = ",".join(devices[:8])  # a domain per device, each a rail


def _no_rdma_device(err):
    """libferry's refusal of a fabric provider that has no device here."""
    return err.code == ferry.ETRANSPORT and ("no such provider or device here" in err.detail
                                            or "its devices: none" in err.detail
                                            or _NO_LIBRARY in err.detail)


def _allowed_transports():
    """The FERRY_TRANSPORT_* bits FERRY_TRANSPORTS allows (all when unset)."""
    env = os.environ.get("FERRY_TRANSPORTS")
    return ferry.transport_parse(env) if env else ferry.TRANSPORT_ALL


def _warn_no_device(protocol, reason):
    """The one WARNING of an "rdma"/"efa" engine that fell back: no such device."""
    reason = _START_FAILED.sub("", reason)
    names = [n for n in ("tcp", "shm") if _allowed_transports() & ferry.transport_parse(n)]
    what = ("ferry's fabric transport is not available" if _NO_LIBRARY in reason else
            "no %s device here" % ("EFA" if protocol.strip().lower() == "efa" else "RDMA"))
    logger.warning("protocol %r: %s (%s); using %s; pass protocol 'tcp' to choose this (see "
                   "%s#warnings-that-are-not-errors)", protocol, what, reason, "/".join(names),
                   _ERRORS_DOC)


def _rdma_devices():
    try:
        return sorted(os.listdir(_RDMA_SYSFS))
    except OSError:
        return []


def _device_names(device_name):
    """The device names in Mooncake's device_name: "mlx5_0,mlx5_1", a JSON
    mapping (or a path to a JSON file) whose values name devices."""
    text = device_name.strip()
    if not text.startswith("{") and os.path.isfile(text):
        with open(text, encoding="utf-8") as f:
            text = f.read()
    if text.startswith("{"):
        names = []
        for value in json.loads(text).values():
            names.extend(value if isinstance(value, list) else re.split(r"[,\s]+", str(value)))
        return [n for n in names if n]
    return [n for n in re.split(r"[,\s]+", text) if n]


def _check_device_name(device_name, why):
    """device_name where the fabric transport will not use it; why: the
    reason, as the end of a sentence."""
    if not device_name:
        return
    try:
        asked = _device_names(str(device_name))
    except (OSError, ValueError) as e:
        logger.warning("device_name %r cannot be read (%s); not used: %s", device_name, e, why)
        return
    have = _rdma_devices()
    missing = [n for n in asked if n not in have]
    if missing:
        logger.warning("device_name %r: no device %s on this host (devices here: %s); not "
                       "used: %s", device_name, ", ".join(missing), ", ".join(have) or "none",
                       why)
    else:
        logger.debug("device_name %r not used: %s", device_name, why)


def _unknown_batch(batch_id):
    # Mooncake's numbering has no "not found" code for a batch: -1 (invalid
    # argument) tells the caller the id is its mistake, not the metadata
    # service's (-200).
    return ferry.Error(ferry.EINVAL, "batch id not found",
                       "batch id %r not found: never returned by this engine, or already "
                       "finished (get_batch_transfer_status and a final "
                       "transfer_check_status free a batch)" % (batch_id,))


_LOCAL_UNREGISTERED = re.compile(r"entry (\d+): local address")
_REMOTE_UNREGISTERED = re.compile(r"of entry (\d+) is not registered at (\S+)")
_NOT_A_TRANSFER = re.compile(r"entry (\d+): op -?\d+, local")


def _explain(err, buffers, peer_addresses, lengths):
    """The cause of a transfer failure in the caller's terms (its buffer,
    the peer's address, the length it passed), or None to keep libferry's."""
    if not isinstance(err, ferry.Error):
        return None
    detail = err.detail or ""
    try:
        m = _LOCAL_UNREGISTERED.search(detail)
        if m:
            i = int(m.group(1))
            return ("local buffer %#x (%d bytes) is not registered with this engine: call "
                    "register_memory first" % (int(buffers[i]), int(lengths[i])))
        m = _REMOTE_UNREGISTERED.search(detail)
        if m:
            i = int(m.group(1))
            return ("peer buffer %#x (%d bytes) is not registered at %s: the target must "
                    "register_memory it (or it unregistered it)"
                    % (int(peer_addresses[i]), int(lengths[i]), m.group(2)))
        m = _NOT_A_TRANSFER.search(detail)
        if m:
            i = int(m.group(1))
            if not int(buffers[i]):
                return "local buffer address is 0 (NULL): pass the address of registered memory"
            if not int(lengths[i]):
                return "length is 0: nothing to transfer"
    except (IndexError, TypeError, ValueError):
        pass
    return None


def _safe_len(seq):
    try:
        return len(seq)
    except TypeError:
        return -1
