"""nixl._api - NIXL's agent API (nixl_agent, nixl_agent_config) on ferry.

An agent owns one ferry.Engine, created with its first backend. NIXL's
network backend names (UCX, LIBFABRIC, Mooncake) all map onto that engine,
which picks shm, the fabric transport or tcp per peer; the memory each
reports is what ferry moves (DRAM, and VRAM only where ferry found CUDA).

- Metadata is bytes the caller carries (get_agent_metadata /
  add_remote_agent): the engine's address and the registered regions.
  Loading it opens no connection; the first transfer connects.
- The listener (enable_listen_thread): the agent's engine listens on
  listen_port, and a receive pool on it takes the metadata peers send
  (send_local_metadata), their requests for ours (fetch_remote_metadata)
  and their invalidations, over ferry's own connections (so with a secret,
  only from peers that proved it). A thread answers them as they land.
  Metadata is taken only from the engine it names, an invalidation only
  from the engine the agent was known at.
- etcd (NIXL_ETCD_ENDPOINTS set): the same calls without ip_addr publish,
  fetch and invalidate through etcd, in NIXL's key layout (nixl._etcd).
- prep_xfer_dlist checks descriptors once (local: against this agent's
  registrations; remote: against the peer's metadata). make_prepped_xfer
  keeps the index arrays as int64 numpy arrays; transfer() runs them on a
  ferry.Plan made once per (local, remote) list pair, as a ferry batch
  whose notification (name: this agent, data: notif_msg) reaches the peer
  only after the data.
- A failed batch (peer died, reset, ferry's deadline) reads "ERR", never
  "PROC" forever; get_xfer_error(handle) (ferry's addition) says why.
- The POSIX backend (DRAM and FILE, as NIXL's): FILE descriptors are
  (offset, length, fd, meta); register_memory registers each fd with the
  engine once (ferry.File: O_DIRECT for aligned operations where the file
  system takes it) and deregister_memory drops it with its last descriptor.
  A transfer names this agent itself as the remote agent: initialize_xfer
  (op, DRAM descs, FILE descs, own name) or prepared lists, READ moving file
  -> memory and WRITE memory -> file, one ferry batch per file. FILE
  descriptors are not part of the agent's metadata (files are local).
"""

import enum
import itertools
import os
import threading
import time

import numpy as np

import ferry
from nixl import _bindings as nb
from nixl import _etcd
from nixl._utils import (Regions, decode_dlist, decode_metadata, encode_dlist, encode_metadata,
                         is_tensor, tensor_desc)
from nixl.logging import get_logger

log = get_logger("nixl")

DEFAULT_COMM_PORT = nb.DEFAULT_COMM_PORT
nixl_backend_handle = int
nixl_prepped_dlist_handle = int
nixl_xfer_handle = int

# NIXL backend names ferry serves, and those NIXL ships that it does not.
_FERRY_PLUGINS = ("UCX", "LIBFABRIC", "Mooncake", "POSIX")
_FILE_PLUGINS = ("POSIX",)  # DRAM <-> FILE in this process (ferry.File)
_OTHER_PLUGINS = {"GDS": "GPU memory and files (GPUDirect Storage)", "GDS_MT": "GPU memory and "
                  "files (GPUDirect Storage)", "HF3FS": "3FS files",
                  "OBJ": "object stores", "GUSLI": "block devices", "UCCL": "UCCL's engine",
                  "GPUNETIO": "GPU-initiated networking"}
_PLUGIN_PARAMS = {"ferry_host": "", "ferry_port": "0", "ferry_transports": "all"}
_MEM_NAMES = {"DRAM": nb.DRAM_SEG, "VRAM": nb.VRAM_SEG, "FILE": nb.FILE_SEG,
              "BLOCK": nb.BLK_SEG, "OBJ": nb.OBJ_SEG, "cpu": nb.DRAM_SEG, "cuda": nb.VRAM_SEG}
_OPS = {"READ": ferry.OP_READ, "WRITE": ferry.OP_WRITE}
# The listener's receive pool on the agent's engine, and its message tags.
_LISTENER_POOL = "nixl.listener"
_LISTENER_POOL_BYTES = 16 << 20
_LISTENER_SEND_S = 5  # a listener answer waits no longer on a peer's full pool
_MD, _FETCH, _INVALIDATE = b"metadata", b"fetch", b"invalidate"


class nixl_thread_sync_t(enum.Enum):
    """NIXL's thread-safety modes. Every mode is served as STRICT: an agent
    may be called from any thread."""

    NIXL_THREAD_SYNC_NONE = nb.NIXL_THREAD_SYNC_NONE
    NIXL_THREAD_SYNC_STRICT = nb.NIXL_THREAD_SYNC_STRICT
    NIXL_THREAD_SYNC_RW = nb.NIXL_THREAD_SYNC_RW
    NIXL_THREAD_SYNC_DEFAULT = nb.NIXL_THREAD_SYNC_DEFAULT


class nixl_agent_config:
    """Agent options as NIXL names them. enable_prog_thread: ferry always
    progresses transfers on its own threads. enable_listen_thread: NIXL's
    metadata listener, on the agent's engine at listen_port (0: a free port
    the system picks, as in NIXL; peers answer a fetch at whatever port it
    is). capture_telemetry: keep what get_xfer_telemetry reports. sync_mode:
    a nixl_thread_sync_t or None."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=0,
                 capture_telemetry=False, num_threads=0, backends=None, sync_mode=None):
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.backends = ["UCX"] if backends is None else list(backends)
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t (got "
                            f"{type(sync_mode).__name__!r})")
        self.sync_mode = sync_mode


def _cuda():
    ok, why = ferry.cuda_available()
    return ok, why


def _mem_types():
    return ["DRAM", "VRAM"] if _cuda()[0] else ["DRAM"]


def _plugin_mem_types(backend):
    return ["DRAM", "FILE"] if backend in _FILE_PLUGINS else _mem_types()


class _FileBatches:
    """The ferry Batches of one transfer to FILE descriptors (one per
    file), read as one Batch: failed as soon as one failed, done once all
    are."""

    def __init__(self, batches):
        self.batches = batches
        self.error, self.detail = 0, None

    def status(self):
        states = [b.status() for b in self.batches]
        for b, s in zip(self.batches, states):
            if s in (ferry.BATCH_FAILED, ferry.BATCH_TIMEDOUT):
                self.error, self.detail = b.error, b.detail
                return s
        return ferry.BATCH_PENDING if ferry.BATCH_PENDING in states else ferry.BATCH_DONE

    def cancel(self):
        for b in self.batches:
            b.cancel()

    def free(self):
        for b in self.batches:
            b.free()


class _DList:
    """A prepared descriptor list: local (target None) or toward a peer."""

    def __init__(self, descs, mem_type, agent, target):
        self.descs = descs  # N x 3 uint64
        self.mem_type = mem_type
        self.agent = agent
        self.target = target
        self.pairs = np.ascontiguousarray(descs[:, :2])
        self.lengths = descs[:, 1]


class _Xfer:
    def __init__(self, op, local, remote, li, ri, notif, merge, owned=()):
        self.op, self.local, self.remote = op, local, remote
        self.li, self.ri = li, ri
        self.notif, self.merge = notif, merge
        self.owned = owned  # dlist handles made by initialize_xfer for this transfer
        self.batch = None
        self.error = None
        self.posted = False
        self.telemetry = None
        self.started_ns = 0
        self.t0 = 0
        self.post_ns = 0


class nixl_agent:
    """NIXL's agent on one ferry engine. Names, arguments and results follow
    NIXL's nixl._api; see the module's comment for how they map."""

    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        conf = nixl_conf or nixl_agent_config()
        default_sync = (nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if conf.enable_listen
                        else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE)
        self.agent = nb.nixlAgent(agent_name, nb.nixlAgentConfig(
            syncMode=(conf.sync_mode or default_sync).value,
            captureTelemetry=_telemetry_wanted(conf), useListenThread=bool(conf.enable_listen),
            listenPort=conf.port))
        self.name = agent_name
        self._capture = self.agent.config.captureTelemetry
        self.conf = conf
        self.notifs = {}
        self.backends = {}
        self.backend_mems = {}
        self.backend_options = {}
        self.plugin_list = list(_FERRY_PLUGINS)
        self._engine = None
        self._engine_params = None
        self._listener = None  # (pool, thread) with enable_listen_thread
        self._etcd = None  # _etcd.EtcdMetadata, made by the first call that needs it
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._regs = {}  # addr -> (len, dev_id, memory name, meta)
        self._files = {}  # fd -> [ferry.File, FILE descriptors registered on it]
        self._remotes = {}  # agent -> (engine name or None, Regions, [region rows])
        self._dlists = {}
        self._xfers = {}
        self._plans = {}  # (local handle, remote handle) -> ferry.Plan
        for name in (self.plugin_list if instantiate_all and nixl_conf is None else conf.backends):
            self.create_backend(name)
        log.info("nixl agent %s on ferry %s", agent_name,
                 self._engine.name if self._engine else "(no backend)")

    # ---- plugins and backends ------------------------------------------------

    def get_plugin_list(self):
        return list(self.plugin_list)

    def _known_plugin(self, name):
        if name in _FERRY_PLUGINS:
            return
        if name in _OTHER_PLUGINS:
            raise nb.nixlNotSupportedError(
                f"backend {name!r}: NIXL's {name} moves data to {_OTHER_PLUGINS[name]}, which "
                f"ferry does not do; ferry serves {', '.join(_FERRY_PLUGINS)}")
        raise nb.nixlNotFoundError(f"backend {name!r}: no such plugin (available: "
                                   f"{', '.join(_FERRY_PLUGINS)})")

    # The queries answer empty for a name that is not a ferry plugin or not
    # a backend of this agent, as NIXL's do.

    def get_plugin_mem_types(self, backend):
        return _plugin_mem_types(backend) if backend in _FERRY_PLUGINS else []

    def get_plugin_params(self, backend):
        return dict(_PLUGIN_PARAMS) if backend in _FERRY_PLUGINS else {}

    def get_backend_mem_types(self, backend):
        return list(self.backend_mems.get(backend, ()))

    def get_backend_params(self, backend):
        return dict(self.backend_options.get(backend, {}))

    def _backend(self, name):
        if name not in self.backends:
            raise nb.nixlNotFoundError(f"backend {name!r} was not created on agent {self.name} "
                                       f"(created: {sorted(self.backends) or 'none'})")
        return self.backends[name]

    def create_backend(self, backend, initParams=None):
        """Makes the agent's ferry engine with the first backend (initParams:
        ferry_host, ferry_port, ferry_transports); later backends share it."""
        self._known_plugin(backend)
        params = dict(_PLUGIN_PARAMS)
        unknown = set(initParams or {}) - set(params)
        if unknown:
            raise nb.nixlInvalidParamError(f"backend {backend!r}: unknown parameters "
                                           f"{sorted(unknown)} (known: {sorted(params)})")
        params.update({k: str(v) for k, v in (initParams or {}).items()})
        with self._lock:
            if backend in self.backends:
                raise nb.nixlNotAllowedError(f"backend {backend!r} already created on agent "
                                             f"{self.name}")
            if self._engine is None:
                self._engine = self._start_engine(backend, params)
                self._engine_params = params
            elif initParams and params != self._engine_params:
                raise nb.nixlNotAllowedError(
                    f"backend {backend!r}: the backends of agent {self.name} share one ferry "
                    f"engine, made with {self._engine_params}; got {params}")
            self.backends[backend] = next(self._ids)
            self.backend_mems[backend] = _plugin_mem_types(backend)
            self.backend_options[backend] = dict(self._engine_params, ferry_engine=self._engine.name)
        return self.backends[backend]

    def _start_engine(self, backend, params):
        port = int(params["ferry_port"]) if params["ferry_port"].isdigit() else -1
        if self.conf.enable_listen:
            listen = self.conf.port
            if port not in (0, listen) and listen:
                raise nb.nixlInvalidParamError(
                    f"backend {backend!r}: ferry_port {port} and listen_port {listen} differ; "
                    f"the listener is the engine's port")
            port = listen or port
        try:
            engine = ferry.Engine(params["ferry_host"] or None, port=port,
                                  transports=params["ferry_transports"])
        except (ferry.Error, ValueError, OverflowError) as e:
            raise nb.nixlBackendError(f"backend {backend!r}: ferry engine did not start: {e}",
                                      e) from e
        if self.conf.enable_listen:
            self._start_listener(engine)
        return engine

    def _eng(self, what):
        if self._engine is None:
            raise nb.nixlNotFoundError(f"{what}: agent {self.name} has no backend "
                                       f"(nixl_agent_config(backends=[...]) or create_backend)")
        return self._engine

    # ---- descriptors ---------------------------------------------------------

    def _mem_code(self, mem_type, what):
        if mem_type not in _MEM_NAMES:
            raise nb.nixlUnknownNameError(f"{what}: unknown memory type {mem_type!r} "
                                          f"(known: {', '.join(_MEM_NAMES)})")
        return _MEM_NAMES[mem_type]

    def _descs(self, data, mem_type, cls, what):
        if isinstance(data, cls):
            return data
        if data is None:
            raise nb.nixlInvalidParamError(f"{what}: no descriptors (None: the get_reg_descs or "
                                           f"get_xfer_descs that made them failed; its ERROR "
                                           f"line says why)")
        if isinstance(data, (nb.nixlRegDList, nb.nixlXferDList)):
            raise nb.nixlInvalidParamError(f"{what}: got a {type(data).__name__}, "
                                           f"need a {cls.__name__}")
        if is_tensor(data):
            data = [data]
        if isinstance(data, (list, tuple)) and data and is_tensor(data[0]):
            rows, mems = zip(*(tensor_desc(t, f"{what}[{i}]") for i, t in enumerate(data)))
            if len(set(mems)) > 1:
                raise nb.nixlInvalidParamError(f"{what}: tensors on different devices ({mems})")
            return cls(_MEM_NAMES[mems[0]], list(rows))
        if mem_type is None:
            raise nb.nixlInvalidParamError(f"{what}: descriptors other than tensors need "
                                           f"mem_type (\"DRAM\", \"VRAM\", ...)")
        return cls(self._mem_code(mem_type, what), data)

    def _reg_descs(self, data, mem_type=None, what="get_reg_descs"):
        return self._descs(data, mem_type, nb.nixlRegDList, what)

    def _xfer_descs(self, data, mem_type=None, what="get_xfer_descs"):
        return self._descs(data, mem_type, nb.nixlXferDList, what)

    def _public_descs(self, data, mem_type, cls, what):
        """As NIXL: None for descriptors it cannot make (the reason logged as
        an ERROR), KeyError for an unknown memory type name."""
        try:
            return self._descs(data, mem_type, cls, what)
        except nb.nixlUnknownNameError:
            raise
        except nb.nixlInvalidParamError as e:
            log.error("%s", e)
            return None

    def get_reg_descs(self, descs, mem_type=None):
        return self._public_descs(descs, mem_type, nb.nixlRegDList, "get_reg_descs")

    def query_memory(self, reg_list, backend, mem_type=None):
        """What NIXL's POSIX backend answers for files named in the
        descriptors' metadata: per descriptor {"size", "mode", "mtime"}
        (decimal strings, from stat) or None when the name is empty or
        stat fails. Other backends answer nothing about memory."""
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nb.nixlInvalidParamError("query_memory: the descriptors are not valid (the "
                                           "nixl logger says why)")
        self._backend(backend)
        if backend != "POSIX":
            raise nb.nixlNotSupportedError(f"query_memory: backend {backend!r} answers no "
                                           f"queries; POSIX answers for files")
        return [_file_info(name) for name in descs.metas]

    def get_xfer_descs(self, descs, mem_type=None):
        return self._public_descs(descs, mem_type, nb.nixlXferDList, "get_xfer_descs")

    # ---- registration --------------------------------------------------------

    def _location(self, mem_type, dev_id):
        if mem_type == nb.DRAM_SEG:
            return "cpu:0"
        name = nb.MEM_TYPE_NAMES[mem_type]
        if mem_type == nb.VRAM_SEG:
            ok, why = _cuda()
            if ok:
                return f"cuda:{dev_id}"
            raise nb.nixlNotSupportedError(
                f"register_memory: VRAM needs the CUDA driver and a device, and ferry found "
                f"none ({why}); register host memory (DRAM), e.g. vLLM's kv_buffer_device=\"cpu\"")
        raise nb.nixlNotSupportedError(f"register_memory: ferry does not move {name} memory "
                                       f"(it moves DRAM and, with CUDA, VRAM)")

    def register_memory(self, reg_list, mem_type=None, backends=None):
        """Registers every descriptor with the agent's engine (all or none)."""
        for b in backends or ():
            self._backend(b)
        descs = self._reg_descs(reg_list, mem_type)
        eng = self._eng("register_memory")
        if descs.mem_type == nb.FILE_SEG:
            return self._register_files(eng, descs)
        done = []
        try:
            for i, (addr, length, dev_id, meta) in enumerate(descs):
                location = self._location(descs.mem_type, dev_id)
                try:
                    eng.register(addr, length, location)
                except ferry.Error as e:
                    raise nb.nixlBackendError(f"register_memory: descriptor {i} (addr {addr:#x}, "
                                              f"len {length}): {e}", e) from e
                done.append(addr)
                with self._lock:
                    self._regs[addr] = (length, dev_id, nb.MEM_TYPE_NAMES[descs.mem_type], meta)
        except BaseException:
            self._unregister(done)
            raise
        return descs

    def _file_backend(self, what):
        if not any(b in self.backends for b in _FILE_PLUGINS):
            raise nb.nixlNotSupportedError(
                f"{what}: FILE memory needs the POSIX backend (nixl_agent_config(backends=[..., "
                f"\"POSIX\"]) or create_backend(\"POSIX\")); agent {self.name} has "
                f"{sorted(self.backends) or 'none'}")

    def _register_files(self, eng, descs):
        """FILE descriptors (offset, length, fd, meta): each fd registered once."""
        self._file_backend("register_memory")
        done = []
        try:
            for i, (_, _, fd, _) in enumerate(descs):
                with self._lock:
                    known = self._files.get(fd)
                    if known:
                        known[1] += 1
                        done.append(fd)
                        continue
                try:
                    f = eng.register_file(fd)
                except ferry.Error as e:
                    raise nb.nixlBackendError(f"register_memory: FILE descriptor {i} (fd {fd}): "
                                              f"{e}", e) from e
                with self._lock:
                    self._files[fd] = [f, 1]
                done.append(fd)
        except BaseException:
            self._unregister_files(done)
            raise
        return descs

    def _unregister_files(self, fds):
        for fd in fds:
            with self._lock:
                known = self._files.get(fd)
                if not known:
                    continue
                known[1] -= 1
                last = known[1] == 0
                if last:
                    del self._files[fd]
            if last:
                known[0].unregister()

    def _unregister(self, addrs):
        for addr in addrs:
            with self._lock:
                self._regs.pop(addr, None)
            self._engine.unregister(addr)

    def deregister_memory(self, dereg_list, backends=None):
        for b in backends or ():
            self._backend(b)
        descs = self._reg_descs(dereg_list)
        if descs.mem_type == nb.FILE_SEG:
            with self._lock:
                missing = [d for d in descs if d[2] not in self._files]
            if missing:
                raise nb.nixlNotFoundError(f"deregister_memory: FILE fd {missing[0][2]} is not "
                                           f"registered")
            self._unregister_files([d[2] for d in descs])
            return
        with self._lock:
            missing = [d for d in descs if d[0] not in self._regs]
        if missing:
            raise nb.nixlNotFoundError(f"deregister_memory: not registered: {missing[0][:3]}")
        self._unregister([d[0] for d in descs])

    # ---- metadata ------------------------------------------------------------

    def _region_rows(self, only=None):
        with self._lock:
            rows = [(a, n, d, m) for a, (n, d, m, _) in self._regs.items()]
        return [r for r in rows if only is None or r[0] in only]

    def get_agent_metadata(self):
        return encode_metadata(self.name, self._eng("get_agent_metadata").name,
                               self._region_rows())

    def get_partial_agent_metadata(self, descs, inc_conn_info=False, backends=None):
        only = {d[0] for d in self._reg_descs(descs)} if descs is not None else set()
        engine = self._eng("get_partial_agent_metadata").name if inc_conn_info else None
        return encode_metadata(self.name, engine, self._region_rows(only))

    def add_remote_agent(self, metadata):
        """Loads a peer's metadata (full or partial; partial adds to what is
        known) and returns its agent name, as bytes (NIXL's type; every call
        takes a name as bytes or str). Opens no connection."""
        agent, engine, rows = decode_metadata(metadata)
        if agent == self.name:
            raise nb.nixlInvalidParamError(f"add_remote_agent: the metadata is this agent's own "
                                           f"({agent}); loopback transfers name it directly")
        with self._lock:
            old = self._remotes.get(agent)
            if old and engine is None:
                engine, rows = old[0], old[2] + rows
            elif old and old[0] != engine:
                self._drop_plans(agent)  # a new incarnation: plans made toward the old one go
            self._remotes[agent] = (engine, Regions([(a, n) for a, n, _, _ in rows]), rows)
        return agent.encode()

    def check_remote_metadata(self, agent, descs=None):
        agent = _agent(agent, "check_remote_metadata")
        with self._lock:
            known = self._remotes.get(agent)
        if not known or not known[0]:
            return False
        if descs is None:
            return True
        return known[1].first_outside(self._xfer_descs(descs).descs) < 0

    def get_serialized_descs(self, descs):
        """A descriptor list as bytes for a peer (deserialize_descs there)."""
        return encode_dlist(descs, "get_serialized_descs")

    def deserialize_descs(self, serialized_descs):
        return decode_dlist(serialized_descs, "deserialize_descs")

    # ---- the listener ----------------------------------------------------------

    def _start_listener(self, engine):
        try:
            pool = engine.create_pool(_LISTENER_POOL, _LISTENER_POOL_BYTES)
        except ferry.Error as e:
            engine.close()
            raise nb.nixlBackendError(f"agent {self.name}: the metadata listener did not start: "
                                      f"{e}", e) from e
        thread = threading.Thread(target=self._listen, args=(engine, pool), daemon=True,
                                  name=f"nixl-listener-{self.name}")
        self._listener = (pool, thread)
        thread.start()

    def _listen(self, engine, pool):
        """The listener thread: one message at a time until the engine closes."""
        while True:
            try:
                msg = engine.recv(pool)
            except ferry.Error as e:
                if e.code != ferry.ECLOSED:
                    log.error("nixl listener of agent %s stopped: %s", self.name, e)
                return
            try:
                self._on_listener_message(engine, msg.tag, bytes(msg), msg.sender)
            except Exception as e:  # a bad message costs only itself
                log.warning("nixl listener of agent %s: dropped a %r message from %s: %s",
                            self.name, msg.tag, msg.sender, e)
            finally:
                msg.release()

    def _on_listener_message(self, engine, tag, data, sender):
        if tag == _MD:
            agent, conn, _ = decode_metadata(data)
            with self._lock:
                known = self._remotes.get(agent)
            at = conn if conn is not None else (known[0] if known else None)
            if at != sender:
                raise ValueError(f"metadata of agent {agent!r} for engine {at} came from "
                                 f"another engine")
            self.add_remote_agent(data)
        elif tag == _FETCH:
            asked = data.decode("utf-8", "replace")
            if asked != self.name:
                raise ValueError(f"asked for agent {asked!r}; this is agent {self.name!r}")
            engine.send(sender, _LISTENER_POOL, _MD, self.get_agent_metadata(),
                        timeout=_LISTENER_SEND_S)
        elif tag == _INVALIDATE:
            agent = data.decode("utf-8", "replace")
            with self._lock:
                known = self._remotes.get(agent)
            if not known or known[0] != sender:
                raise ValueError(f"invalidation of agent {agent!r}, not known at that engine")
            self.remove_remote_agent(agent)
        else:
            raise ValueError("unknown tag")

    def _to_listener(self, what, ip_addr, port, tag, data):
        """Sends one message to the listener at ip_addr:port."""
        if not ip_addr:
            raise nb.nixlInvalidParamError(f"{what}: no ip_addr given, and NIXL_ETCD_ENDPOINTS "
                                           f"is not set; name the peer's listener as ip_addr "
                                           f"and port, or set NIXL_ETCD_ENDPOINTS")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise nb.nixlInvalidParamError(f"{what}: port must be 1..65535, not {port!r}")
        target = f"[{ip_addr}]:{port}" if ":" in ip_addr else f"{ip_addr}:{port}"
        try:
            self._eng(what).send(target, _LISTENER_POOL, tag, data)
        except ferry.Error as e:
            raise nb.nixlBackendError(f"{what}: the listener at {target}: {e}", e) from e

    # ---- etcd ------------------------------------------------------------------

    def _central(self, ip_addr):
        """The etcd client when a call without ip_addr goes to etcd, else None."""
        if ip_addr or not os.environ.get("NIXL_ETCD_ENDPOINTS"):
            return None
        with self._lock:
            if self._etcd is None:
                try:
                    self._etcd = _etcd.EtcdMetadata(
                        self.name, os.environ["NIXL_ETCD_ENDPOINTS"],
                        os.environ.get("NIXL_ETCD_NAMESPACE"), self._load_fetched,
                        self._forget_deleted)
                except _etcd.EtcdError as e:
                    raise nb.nixlInvalidParamError(str(e)) from None
            return self._etcd

    def _etcd_call(self, what, fn, *args):
        try:
            return fn(*args)
        except _etcd.EtcdError as e:
            raise nb.nixlBackendError(f"{what}: {e}", e) from e

    def _load_fetched(self, agent, blob):
        named = decode_metadata(blob)[0]
        if named != agent:
            raise ValueError(f"the metadata under agent {agent!r}'s key names agent {named!r}")
        self.add_remote_agent(blob)

    def _forget_deleted(self, agent):
        with self._lock:
            if agent in self._remotes:
                del self._remotes[agent]
                self._drop_plans(agent)

    # ---- metadata exchange -------------------------------------------------------

    def fetch_remote_metadata(self, remote_name, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        """Asks the listener at ip_addr:port for agent remote_name's metadata;
        its answer lands on this agent's listener (check_remote_metadata says
        when). Needs enable_listen_thread here, and there. Without ip_addr,
        with NIXL_ETCD_ENDPOINTS: reads it from etcd (label's key, default
        "metadata"), waiting up to 5 s for it to appear, in the background."""
        central = self._central(ip_addr)
        if central is not None:
            central.fetch(_agent(remote_name, "fetch_remote_metadata"),
                          label or _etcd.DEFAULT_LABEL)
            return
        if self._listener is None:
            raise nb.nixlNotAllowedError("fetch_remote_metadata: the answer comes to this "
                                         "agent's listener: nixl_agent_config("
                                         "enable_listen_thread=True)")
        name = _agent(remote_name, "fetch_remote_metadata")
        self._to_listener("fetch_remote_metadata", ip_addr, port, _FETCH, name.encode())

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        """To the listener at ip_addr:port; without ip_addr, to etcd under
        the "metadata" label (label is ignored, as in NIXL)."""
        central = self._central(ip_addr)
        if central is not None:
            self._etcd_call("send_local_metadata", central.put, _etcd.DEFAULT_LABEL,
                            self.get_agent_metadata())
            return
        self._to_listener("send_local_metadata", ip_addr, port, _MD, self.get_agent_metadata())

    def send_partial_agent_metadata(self, descs, inc_conn_info=False, backends=None, ip_addr="",
                                    port=DEFAULT_COMM_PORT, label=""):
        data = self.get_partial_agent_metadata(descs, inc_conn_info, backends)
        central = self._central(ip_addr)
        if central is not None:
            if not label:
                raise nb.nixlInvalidParamError("send_partial_agent_metadata: etcd needs a label "
                                               "for partial metadata (the reader fetches it "
                                               "by that label)")
            self._etcd_call("send_partial_agent_metadata", central.put, label, data)
            return
        self._to_listener("send_partial_agent_metadata", ip_addr, port, _MD, data)

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        """The listener at ip_addr:port forgets this agent (as remove_remote_agent).
        Without ip_addr, with NIXL_ETCD_ENDPOINTS: deletes this agent's keys
        from etcd, and every agent that fetched it from there forgets it."""
        central = self._central(ip_addr)
        if central is not None:
            self._etcd_call("invalidate_local_metadata", central.delete_all)
            return
        self._to_listener("invalidate_local_metadata", ip_addr, port, _INVALIDATE,
                          self.name.encode())

    def remove_remote_agent(self, agent):
        agent = _agent(agent, "remove_remote_agent")
        with self._lock:
            if agent not in self._remotes:
                raise nb.nixlNotFoundError(f"remove_remote_agent: unknown agent {agent!r}")
            del self._remotes[agent]
            self._drop_plans(agent)

    def _drop_plans(self, agent):
        for key in [k for k in self._plans if self._dlists[k[1]].agent == agent]:
            self._plans.pop(key).free()

    # ---- prepared lists and transfers ----------------------------------------

    def _peer(self, agent_name, what):
        """(target engine name, Regions) of a remote agent or of this one."""
        agent_name = _agent(agent_name, what)
        if agent_name == self.name:
            with self._lock:
                return self._eng(what).name, Regions([(a, r[0]) for a, r in self._regs.items()])
        with self._lock:
            known = self._remotes.get(agent_name)
        if not known:
            raise nb.nixlNotFoundError(f"{what}: unknown agent {agent_name!r} (add_remote_agent "
                                       f"with its metadata first)")
        if not known[0]:
            raise nb.nixlNotFoundError(f"{what}: agent {agent_name!r}'s metadata had no "
                                       f"connection info (partial metadata without it)")
        return known

    def _prep_files(self, agent_name, descs, what):
        """A FILE list: (offset, length, fd) on files this agent registered,
        named by this agent's own name (NIXL's POSIX backend: the "remote"
        side of a transfer to storage is the agent itself)."""
        if agent_name != self.name:
            raise nb.nixlInvalidParamError(
                f"{what}: FILE descriptors are this agent's own files: name agent "
                f"{self.name!r} as their agent (got {agent_name!r})")
        self._file_backend(what)
        with self._lock:
            files = dict(self._files)
        for i, (offset, length, fd) in enumerate(descs):
            if fd not in files:
                raise nb.nixlNotFoundError(f"{what}: FILE descriptor {i} names fd {fd}, which is "
                                           f"not registered (register_memory with mem_type "
                                           f"\"FILE\" first)")
        handle = next(self._ids)
        with self._lock:
            self._dlists[handle] = _DList(descs.descs, descs.mem_type, self.name, "FILE")
        return handle

    def _prep(self, agent_name, xfer_list, mem_type, what):
        agent_name = _agent(agent_name, what)
        descs = self._xfer_descs(xfer_list, mem_type)
        if len(descs) == 0:
            raise nb.nixlInvalidParamError(f"{what}: empty descriptor list")
        if descs.mem_type == nb.FILE_SEG:
            return self._prep_files(agent_name, descs, what)
        local = agent_name in (nb.NIXL_INIT_AGENT, "")
        if local:
            target, agent = None, None
            with self._lock:
                regions = Regions([(a, r[0]) for a, r in self._regs.items()])
        else:
            target, regions = self._peer(agent_name, what)[:2]
            agent = agent_name
        bad = regions.first_outside(descs.descs)
        if bad >= 0:
            side = "this agent's registered memory" if local else f"agent {agent_name}'s metadata"
            raise nb.nixlNotFoundError(f"{what}: descriptor {bad} {descs[bad]} is not inside "
                                       f"{side}")
        handle = next(self._ids)
        with self._lock:
            self._dlists[handle] = _DList(descs.descs, descs.mem_type, agent, target)
        return handle

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=None):
        """A handle to descriptors checked once: agent_name "NIXL_INIT_AGENT"
        (or "") for this agent's side, a remote agent's name, or this agent's
        own name for loopback."""
        return self._prep(agent_name, xfer_list, mem_type, "prep_xfer_dlist")

    def release_dlist_handle(self, handle):
        with self._lock:
            if handle not in self._dlists:
                raise nb.nixlNotFoundError(f"release_dlist_handle: unknown handle {handle!r}")
            for key in [k for k in self._plans if handle in k]:
                self._plans.pop(key).free()
            del self._dlists[handle]

    def _dlist(self, handle, local, what):
        with self._lock:
            d = self._dlists.get(handle)
        if d is None:
            raise nb.nixlNotFoundError(f"{what}: unknown descriptor list handle {handle!r}")
        if (d.target is None) != local:
            raise nb.nixlInvalidParamError(
                f"{what}: handle {handle} is a {'local' if d.target is None else 'remote'} list "
                f"where a {'local' if local else 'remote'} one belongs")
        return d

    @staticmethod
    def _indices(values, count, what):
        idx = np.array(values, dtype=np.int64, copy=True).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= count):
            bad = int(np.flatnonzero((idx < 0) | (idx >= count))[0])
            raise nb.nixlInvalidParamError(f"make_prepped_xfer: {what}[{bad}] = {idx[bad]} is "
                                           f"outside the list's {count} descriptors")
        return idx

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side,
                          remote_indices, notif_msg=b"", backends=None, skip_desc_merge=False):
        what = "make_prepped_xfer"
        op = self._op(operation, what)
        local = self._dlist(local_xfer_side, True, what)
        remote = self._dlist(remote_xfer_side, False, what)
        li = self._indices(local_indices, len(local.descs), "local_indices")
        ri = self._indices(remote_indices, len(remote.descs), "remote_indices")
        if li.size != ri.size or li.size == 0:
            raise nb.nixlInvalidParamError(f"{what}: {li.size} local and {ri.size} remote "
                                           f"indices (need as many, at least one)")
        if remote.mem_type == nb.FILE_SEG and _msg(notif_msg):
            raise nb.nixlNotSupportedError(f"{what}: the POSIX backend sends no notifications "
                                           f"(a transfer to FILE descriptors stays in this agent)")
        if (local.mem_type == nb.FILE_SEG) or (remote.mem_type == nb.FILE_SEG and
                                               local.mem_type != nb.DRAM_SEG):
            raise nb.nixlNotSupportedError(f"{what}: FILE descriptors are the remote side, DRAM "
                                           f"the local one (the POSIX backend)")
        differ = np.flatnonzero(local.lengths[li] != remote.lengths[ri])
        if differ.size:
            i = int(differ[0])
            raise nb.nixlInvalidParamError(
                f"{what}: pair {i} has lengths {local.lengths[li[i]]} (local {li[i]}) and "
                f"{remote.lengths[ri[i]]} (remote {ri[i]}); a pair moves equal lengths")
        return self._new_xfer(_Xfer(op, local_xfer_side, remote_xfer_side, li, ri,
                                    _msg(notif_msg), not skip_desc_merge))

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent, notif_msg=b"",
                        backends=None):
        """A transfer of local_descs[i] <-> remote_descs[i] at remote_agent."""
        what = "initialize_xfer"
        self._op(operation, what)
        lh = self._prep(nb.NIXL_INIT_AGENT, local_descs, None, what)
        try:
            rh = self._prep(remote_agent, remote_descs, None, what)
        except BaseException:
            self.release_dlist_handle(lh)
            raise
        try:
            handle = self.make_prepped_xfer(operation, lh, np.arange(len(self._dlists[lh].descs)),
                                            rh, np.arange(len(self._dlists[rh].descs)), notif_msg)
        except BaseException:
            self.release_dlist_handle(lh)
            self.release_dlist_handle(rh)
            raise
        self._xfers[handle].owned = (lh, rh)
        return handle

    @staticmethod
    def _op(operation, what):
        if operation not in _OPS:
            raise nb.nixlUnknownNameError(f"{what}: operation must be \"READ\" or \"WRITE\", "
                                          f"got {operation!r}")
        return _OPS[operation]

    def _new_xfer(self, xfer):
        handle = next(self._ids)
        with self._lock:
            self._xfers[handle] = xfer
        return handle

    def _xfer(self, handle, what):
        with self._lock:
            x = self._xfers.get(handle)
        if x is None:
            raise nb.nixlNotFoundError(f"{what}: unknown transfer handle {handle!r}")
        return x

    def _plan(self, x):
        key = (x.local, x.remote)
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                local, remote = self._dlists[x.local], self._dlists[x.remote]
                plan = self._eng("transfer").plan(remote.target, local.pairs, remote.pairs)
                self._plans[key] = plan
        return plan

    def transfer(self, handle, notif_msg=b""):
        """Posts the transfer: "DONE", "PROC" or "ERR" (get_xfer_error says
        why). A handle may be posted again once it is no longer "PROC"."""
        x = self._xfer(handle, "transfer")
        if x.batch is not None and self._state(handle, x) == "PROC":
            raise nb.nixlRepostActiveError(f"transfer: handle {handle} is still in progress")
        if x.batch is not None:
            x.batch.free()
            x.batch = None
        msg = _msg(notif_msg) or x.notif
        if msg and self._dlists[x.remote].mem_type == nb.FILE_SEG:
            raise nb.nixlNotSupportedError("transfer: the POSIX backend sends no notifications")
        x.error, x.posted, x.telemetry = None, True, None
        x.started_ns = time.time_ns()
        t0 = time.perf_counter_ns()
        try:
            notify = (self.name, msg) if msg else None
            if self._dlists[x.remote].mem_type == nb.FILE_SEG:
                x.batch = self._submit_files(x)
            else:
                x.batch = self._plan(x).submit(x.op, x.li, x.ri, notify=notify, merge=x.merge)
        except ferry.Error as e:
            self._failed(handle, x, e.code, e.detail or str(e))
            return "ERR"
        x.post_ns = time.perf_counter_ns() - t0
        x.t0 = t0
        return self._state(handle, x)

    def _submit_files(self, x):
        """One ferry batch per file: (op, local addr, offset, length) entries."""
        local, remote = self._dlists[x.local].descs, self._dlists[x.remote].descs
        by_fd = {}
        for l, r in zip(x.li.tolist(), x.ri.tolist()):
            offset, length, fd = (int(v) for v in remote[r])
            by_fd.setdefault(fd, []).append((x.op, int(local[l][0]), offset, length))
        batches = []
        try:
            for fd, entries in by_fd.items():
                with self._lock:
                    known = self._files.get(fd)
                if known is None:
                    raise ferry.Error(ferry.ENOTFOUND, f"fd {fd} was deregistered")
                batches.append(known[0].submit(entries))
        except BaseException:
            _FileBatches(batches).cancel()
            _FileBatches(batches).free()
            raise
        return _FileBatches(batches)

    def _failed(self, handle, x, code, detail):
        remote = self._dlists[x.remote]
        x.error = nb.nixlBackendError(
            f"transfer {handle} to agent {remote.agent or self.name} ({remote.target}) failed: "
            f"{ferry.strerror(code)}: {detail}", (code, detail))
        log.error("%s", x.error)

    def _state(self, handle, x):
        if x.error is not None:
            return "ERR"
        if x.batch is None:
            raise nb.nixlInvalidParamError(f"check_xfer_state: handle {handle} was never posted "
                                           f"(call transfer first)")
        state = x.batch.status()
        if state == ferry.BATCH_PENDING:
            return "PROC"
        if state == ferry.BATCH_DONE:
            if x.telemetry is None and self._capture:
                x.telemetry = self._telemetry(x)
            return "DONE"
        self._failed(handle, x, x.batch.error, x.batch.detail or "")
        return "ERR"

    def _telemetry(self, x):
        """Durations in µs, rounded up: a post that took 300 ns reads 1."""
        lengths = self._dlists[x.local].lengths
        post_us = -(-x.post_ns // 1000)
        xfer_us = -(-(time.perf_counter_ns() - x.t0) // 1000)
        return nb.nixlXferTelemetry(
            startTime=x.started_ns // 1000, postDuration=post_us,
            xferDuration=max(xfer_us, post_us), totalBytes=int(lengths[x.li].sum()),
            descCount=int(x.li.size))

    def check_xfer_state(self, handle):
        return self._state(handle, self._xfer(handle, "check_xfer_state"))

    def get_xfer_error(self, handle):
        """ferry's addition: the nixlBackendError that made handle "ERR"
        (its .cause is ferry's (status, detail)), or None."""
        return self._xfer(handle, "get_xfer_error").error

    def get_xfer_telemetry(self, handle):
        x = self._xfer(handle, "get_xfer_telemetry")
        if not self._capture:
            raise nb.nixlNoTelemetryError(f"get_xfer_telemetry: agent {self.name} was made "
                                          f"without nixl_agent_config(capture_telemetry=True) "
                                          f"or NIXL_TELEMETRY_ENABLE=y (or with "
                                          f"NIXL_TELEMETRY_ENABLE=n)")
        if x.telemetry is None:
            raise nb.nixlNoTelemetryError(f"get_xfer_telemetry: handle {handle} is not DONE")
        return x.telemetry

    def query_xfer_backend(self, handle):
        self._xfer(handle, "query_xfer_backend")
        return next(iter(self.backends))

    def release_xfer_handle(self, handle):
        """Releases a transfer; one still in progress is aborted: what has
        not started does not start, and this returns once the parts in
        flight ended (bounded by ferry's transfer deadline), so the buffers
        are free to reuse. What an aborted WRITE had moved may have landed."""
        with self._lock:
            x = self._xfers.pop(handle, None)
        if x is None:
            raise nb.nixlNotFoundError(f"release_xfer_handle: unknown handle {handle!r}")
        if x.batch is not None:
            x.batch.cancel()
            x.batch.free()
        for h in x.owned:
            self.release_dlist_handle(h)

    # ---- notifications -------------------------------------------------------

    def make_connection(self, remote_agent, backends=None):
        """Connects to the agent's engine now (transfers would on first use):
        a ping, nixlBackendError naming the agent when it does not answer."""
        target = self._peer(remote_agent, "make_connection")[0]
        try:
            self._eng("make_connection").probe(target)
        except ferry.Error as e:
            raise nb.nixlBackendError(f"make_connection to agent {_agent(remote_agent, '')} "
                                      f"({target}): {e}", e) from e

    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        target = self._peer(remote_agent_name, "send_notif")[0]
        try:
            self._eng("send_notif").notify(target, self.name, _msg(notif_msg))
        except ferry.Error as e:
            raise nb.nixlBackendError(f"send_notif to agent {remote_agent_name} ({target}): {e}",
                                      e) from e

    def _drain(self):
        out = {}
        if self._engine is not None:
            for agent, msg in self._engine.drain_notifications():
                out.setdefault(agent, []).append(bytes(msg))
        return out

    def get_new_notifs(self, backends=None):
        """{agent name: [bytes, ...]} received since the last call."""
        return self._drain()

    def update_notifs(self, backends=None):
        for agent, msgs in self._drain().items():
            self.notifs.setdefault(agent, []).extend(msgs)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag, backends=None,
                               tag_is_prefix=True):
        """True (and the message removed) once a notification from the agent
        starts with (tag_is_prefix) or contains lookup_tag."""
        self.update_notifs()
        remote_agent_name = _agent(remote_agent_name, "check_remote_xfer_done")
        tag = _msg(lookup_tag)
        msgs = self.notifs.get(remote_agent_name, [])
        for i, m in enumerate(msgs):
            if m.startswith(tag) if tag_is_prefix else tag in m:
                del msgs[i]
                return True
        return False

    # ---- lifetime ------------------------------------------------------------

    def close(self):
        """ferry's addition: frees the plans and stops the engine (NIXL's
        agents end with the process)."""
        with self._lock:
            plans, self._plans = list(self._plans.values()), {}
        for p in plans:
            p.free()
        if self._etcd is not None:
            self._etcd.close()
        if self._engine is not None:
            self._engine.close()  # the listener's recv ends with ECLOSED
        if self._listener is not None:
            self._listener[1].join(timeout=10)



def _file_info(name):
    if not name:
        return None
    try:
        st = os.stat(name)
    except OSError:
        return None
    return {"size": str(st.st_size), "mode": str(st.st_mode), "mtime": str(int(st.st_mtime))}

def _telemetry_wanted(conf):
    """NIXL_TELEMETRY_ENABLE (y/yes/1/true/on or n/no/0/false/off) decides
    when set, as in NIXL; else capture_telemetry."""
    env = os.environ.get("NIXL_TELEMETRY_ENABLE", "").strip().lower()
    if env in ("y", "yes", "1", "true", "on"):
        return True
    if env in ("n", "no", "0", "false", "off"):
        return False
    if env:
        log.warning("NIXL_TELEMETRY_ENABLE=%r is neither yes nor no: ignored", env)
    return bool(conf.capture_telemetry)


def _agent(name, what):
    """An agent name as NIXL takes it: str, or the bytes add_remote_agent returns."""
    if isinstance(name, (bytes, bytearray)):
        try:
            return bytes(name).decode()
        except UnicodeDecodeError:
            raise nb.nixlInvalidParamError(f"{what}: agent name {bytes(name)!r} is not UTF-8") \
                from None
    return name


def _msg(m):
    if m is None:
        return b""
    return m.encode() if isinstance(m, str) else bytes(m)
