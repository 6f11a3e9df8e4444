/* engine.c - the Engine type: its creation from keyword options, close() and
 * the count that keeps threads out of a destroyed engine, its properties,
 * peers (probe, peer_regions, peer_transport) and notifications, and its
 * method table, which lists the methods of memory.c, batch.c, stats.c and
 * pool.c too.
 *
 * Lifetime rules: libferry lets calls on other threads race with the
 * engine's shutdown (they return FERRY_ECLOSED promptly) and keeps batch
 * handles valid after it. The binding only has to make sure no thread
 * enters the library after ferry_engine_destroy: a method counts itself in
 * Engine.active (under the GIL) from before it releases the GIL until it
 * has it back. close() calls ferry_engine_shutdown, which ends the calls in
 * progress, and whoever leaves last (close() itself or the last method)
 * then destroys the engine. Nobody waits or polls. The bytes of received
 * messages live in pool memory the engine frees, so a view of one (numpy's
 * frombuffer, a memoryview) also holds the destroy back: close() stops the
 * engine at once, and the last view's release destroys it (EngineObject.views
 * counts them). A Batch holds a reference to its Engine and the Py_buffers
 * of the objects its entries point into until it is freed. Buffer objects
 * passed to register() are held (their memory cannot be resized or freed)
 * until unregister() or close(). */
#include "_ferry.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

PyObject *raise_closed(void) { return raise_status(FERRY_ECLOSED, "the engine has been closed"); }

int eng_enter(EngineObject *self) {
  if (!self->eng || self->closing) {
    if (!self->initialized)
      raise_status(FERRY_EINVAL, "the engine was not initialized");
    else
      raise_closed();
    return -1;
  }
  self->active++;
  return 0;
}

/* Called with the GIL once close() began, by whoever may be last to need
 * the engine: a method leaving libferry, or the release of the last view of
 * a received message. The engine is shut down, so destroying it only frees
 * memory: the pools' memory too, which no view may outlive. */
void eng_destroy_if_unused(EngineObject *self) {
  if (self->active > 0 || self->views > 0 || !self->closing || !self->eng)
    return;
  ferry_engine *eng = self->eng;
  self->eng = NULL;
  ferry_engine_destroy(eng);
  Py_CLEAR(self->held);
}

void eng_leave(EngineObject *self) {
  self->active--;
  eng_destroy_if_unused(self);
}

/* Shuts the engine down (calls in progress end promptly, pending batches
 * fail) and destroys it, here or in the last method still inside. Called
 * with the GIL; a concurrent close() waits in shutdown for the first. */
static void engine_close_impl(EngineObject *self) {
  if (!self->eng)
    return;
  self->closing = 1;
  self->active++;
  ferry_engine *eng = self->eng;
  PyThreadState *ts_ = PyEval_SaveThread();
  ferry_engine_shutdown(eng);
  PyEval_RestoreThread(ts_);
  eng_leave(self);
}

static PyObject *engine_new(PyTypeObject *type, PyObject *Py_UNUSED(args),
                            PyObject *Py_UNUSED(kwds)) {
  EngineObject *self = (EngineObject *)type->tp_alloc(type, 0);
  return (PyObject *)self;
}

static void engine_dealloc(EngineObject *self) {
  if (self->eng) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    engine_close_impl(self);
    PyErr_Restore(et, ev, tb);
  }
  Py_CLEAR(self->held);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Optional unsigned keyword: leaves *out unchanged when o is NULL or None. */
static int opt_uint(PyObject *o, const char *what, uint64_t max, uint64_t *out) {
  if (!o || o == Py_None)
    return 0;
  uint64_t v;
  if (as_u64(o, &v) < 0)
    return -1;
  if (v > max) {
    PyErr_Format(PyExc_ValueError, "%s out of range", what);
    return -1;
  }
  *out = v;
  return 0;
}

static int parse_transports(PyObject *o, unsigned *out) {
  if (!o || o == Py_None)
    return 0;
  if (PyUnicode_Check(o)) {
    const char *s = PyUnicode_AsUTF8(o);
    if (!s)
      return -1;
    if (!s[0] || !strcasecmp(s, "all") || !strcasecmp(s, "auto")) {
      *out = FERRY_TRANSPORT_ALL;
      return 0;
    }
    unsigned bits = ferry_transport_parse(s);
    if (!bits) {
      PyErr_Format(PyExc_ValueError, "unknown transport list '%s' (use tcp, shm, fabric or all)",
                   s);
      return -1;
    }
    *out = bits;
    return 0;
  }
  uint64_t v;
  if (as_u64(o, &v) < 0)
    return -1;
  if (v & ~(uint64_t)FERRY_TRANSPORT_ALL) {
    PyErr_SetString(PyExc_ValueError, "unknown transport bits");
    return -1;
  }
  *out = (unsigned)v;
  return 0;
}

static int engine_init(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"host",
                           "bind_host",
                           "port",
                           "transports",
                           "connections",
                           "workers",
                           "timeout_ms",
                           "secret",
                           "metadata_url",
                           "segment_name",
                           "checksum",
                           "log_level",
                           "advertise_host",
                           "connect_timeout_ms",
                           "timeout_ns_per_mb",
                           "slice_size",
                           "spin_us",
                           "fabric_provider",
                           "fabric_device",
                           NULL};
  const char *host = NULL, *bind_host = NULL, *secret = NULL, *metadata_url = NULL,
             *segment_name = NULL, *advertise_host = NULL, *fabric_provider = NULL,
             *fabric_device = NULL;
  PyObject *port = NULL, *transports = NULL, *connections = NULL, *workers = NULL,
           *timeout_ms = NULL, *checksum = NULL, *log_level = NULL, *connect_timeout_ms = NULL,
           *timeout_ns_per_mb = NULL, *slice_size = NULL, *spin_us = NULL;
  if (self->initialized) {
    PyErr_SetString(PyExc_RuntimeError, "Engine is already initialized");
    return -1;
  }
  if (!PyArg_ParseTupleAndKeywords(
          args, kwds, "|z$zOOOOOzzzOOzOOOOzz:Engine", kwlist, &host, &bind_host, &port, &transports,
          &connections, &workers, &timeout_ms, &secret, &metadata_url, &segment_name, &checksum,
          &log_level, &advertise_host, &connect_timeout_ms, &timeout_ns_per_mb, &slice_size,
          &spin_us, &fabric_provider, &fabric_device))
    return -1;

  ferry_config cfg;
  ferry_config_init(&cfg);
  if (host) {
    cfg.advertise_host = host;
    cfg.bind_host = host;
  }
  if (bind_host)
    cfg.bind_host = bind_host;
  if (advertise_host)
    cfg.advertise_host = advertise_host;
  /* Numeric options go through uint64_t; each keeps its default unless given. */
  uint64_t port_v = cfg.port, connections_v = cfg.tcp_connections, workers_v = cfg.workers,
           timeout_v = cfg.timeout_ms, connect_timeout_v = cfg.connect_timeout_ms,
           ns_per_mb_v = cfg.timeout_ns_per_mb, slice_v = cfg.slice_size, spin_v = cfg.spin_us;
  if (opt_uint(port, "port", 65535, &port_v) < 0 ||
      parse_transports(transports, &cfg.transports) < 0 ||
      opt_uint(connections, "connections", UINT32_MAX, &connections_v) < 0 ||
      opt_uint(workers, "workers", UINT32_MAX, &workers_v) < 0 ||
      opt_uint(timeout_ms, "timeout_ms", UINT32_MAX, &timeout_v) < 0 ||
      opt_uint(connect_timeout_ms, "connect_timeout_ms", UINT32_MAX, &connect_timeout_v) < 0 ||
      opt_uint(timeout_ns_per_mb, "timeout_ns_per_mb", UINT32_MAX, &ns_per_mb_v) < 0 ||
      opt_uint(slice_size, "slice_size", SIZE_MAX, &slice_v) < 0 ||
      opt_uint(spin_us, "spin_us", FERRY_SPIN_US_MAX, &spin_v) < 0)
    return -1;
  cfg.port = (uint16_t)port_v;
  cfg.tcp_connections = (unsigned)connections_v;
  cfg.workers = (unsigned)workers_v;
  cfg.timeout_ms = (uint32_t)timeout_v;
  cfg.connect_timeout_ms = (uint32_t)connect_timeout_v;
  cfg.timeout_ns_per_mb = (uint32_t)ns_per_mb_v;
  cfg.slice_size = (size_t)slice_v;
  cfg.spin_us = (unsigned)spin_v;
  if (secret)
    cfg.secret = secret;
  if (metadata_url)
    cfg.metadata_url = metadata_url;
  if (segment_name)
    cfg.segment_name = segment_name;
  if (fabric_provider) /* read only while the engine starts */
    cfg.fabric_provider = fabric_provider;
  if (fabric_device)
    cfg.fabric_device = fabric_device;
  if (checksum && checksum != Py_None) {
    int t = PyObject_IsTrue(checksum);
    if (t < 0)
      return -1;
    cfg.checksum = t;
  }
  if (log_level && log_level != Py_None) {
    if (parse_log_level(log_level, &cfg.log_level) < 0)
      return -1;
    cfg.log_level_set = 1;
  }

  ferry_engine *eng = NULL;
  CallResult r;
  CALL_WITHOUT_GIL(r, ferry_engine_create(&cfg, &eng));
  if (r.st != FERRY_OK) {
    raise_result(&r);
    return -1;
  }
  self->held = PyDict_New();
  if (!self->held) {
    PyThreadState *ts_ = PyEval_SaveThread();
    ferry_engine_destroy(eng);
    PyEval_RestoreThread(ts_);
    return -1;
  }
  self->eng = eng;
  self->initialized = 1;
  return 0;
}

static PyObject *engine_get_port(EngineObject *self, void *Py_UNUSED(closure)) {
  if (!self->eng || self->closing)
    return raise_closed();
  return PyLong_FromLong((long)ferry_engine_port(self->eng));
}

static PyObject *engine_get_name(EngineObject *self, void *Py_UNUSED(closure)) {
  if (!self->eng || self->closing)
    return raise_closed();
  return PyUnicode_FromString(ferry_engine_name(self->eng));
}

static PyObject *engine_get_metrics_port(EngineObject *self, void *Py_UNUSED(closure)) {
  if (!self->eng || self->closing)
    return raise_closed();
  return PyLong_FromLong((long)ferry_engine_metrics_port(self->eng));
}

static PyObject *engine_get_closed(EngineObject *self, void *Py_UNUSED(closure)) {
  return PyBool_FromLong(self->eng == NULL || self->closing);
}

static PyObject *engine_repr(EngineObject *self) {
  if (!self->eng || self->closing)
    return PyUnicode_FromString("<ferry.Engine closed>");
  return PyUnicode_FromFormat("<ferry.Engine %s>", ferry_engine_name(self->eng));
}

/* ---- peers and notifications ------------------------------------------ */

/* Parses the lone `target` argument of probe() and peer_*(), then enters
 * the engine. */
static int target_arg_enter(EngineObject *self, PyObject *args, PyObject *kwds, const char *fmt,
                            const char **target) {
  static char *kwlist[] = {"target", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, fmt, kwlist, target))
    return -1;
  return eng_enter(self);
}

static PyObject *engine_probe(EngineObject *self, PyObject *args, PyObject *kwds) {
  const char *target;
  if (target_arg_enter(self, args, kwds, "s:probe", &target) < 0)
    return NULL;
  CallResult r;
  ENGINE_CALL(self, r, ferry_probe(self->eng, target));
  return none_or_raise(&r);
}

static PyObject *engine_notify(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"target", "name", "data", NULL};
  const char *target;
  PyObject *name_o, *data_o = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "sO|O:notify", kwlist, &target, &name_o, &data_o))
    return NULL;
  PyObject *name = to_bytes(name_o);
  if (!name)
    return NULL;
  PyObject *data =
      data_o && data_o != Py_None ? to_bytes(data_o) : PyBytes_FromStringAndSize("", 0);
  if (!data) {
    Py_DECREF(name);
    return NULL;
  }
  if (eng_enter(self) < 0) {
    Py_DECREF(name);
    Py_DECREF(data);
    return NULL;
  }
  const char *np = PyBytes_AS_STRING(name);
  const char *dp = PyBytes_AS_STRING(data);
  size_t dl = (size_t)PyBytes_GET_SIZE(data);
  CallResult r;
  ENGINE_CALL(self, r, ferry_notify_send(self->eng, target, np, dp, dl));
  Py_DECREF(name);
  Py_DECREF(data);
  return none_or_raise(&r);
}

static PyObject *engine_drain(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  if (eng_enter(self) < 0)
    return NULL;
  ferry_notification *list = NULL;
  size_t count = 0;
  CallResult r;
  ENGINE_CALL(self, r, ferry_notify_drain(self->eng, &list, &count));
  if (r.st != FERRY_OK)
    return raise_result(&r);
  PyObject *result = PyList_New((Py_ssize_t)count);
  for (size_t i = 0; result && i < count; i++) {
    const char *nm = list[i].name ? list[i].name : "";
    PyObject *name = PyUnicode_DecodeUTF8(nm, (Py_ssize_t)strlen(nm), "surrogateescape");
    PyObject *data =
        PyBytes_FromStringAndSize(list[i].data ? list[i].data : "", (Py_ssize_t)list[i].length);
    PyObject *t = name && data ? PyTuple_Pack(2, name, data) : NULL;
    Py_XDECREF(name);
    Py_XDECREF(data);
    if (!t)
      Py_CLEAR(result);
    else
      PyList_SET_ITEM(result, (Py_ssize_t)i, t);
  }
  ferry_notify_free(list, count);
  return result;
}

static PyObject *engine_peer_regions(EngineObject *self, PyObject *args, PyObject *kwds) {
  const char *target;
  if (target_arg_enter(self, args, kwds, "s:peer_regions", &target) < 0)
    return NULL;
  ferry_region *regions = NULL;
  size_t count = 0;
  CallResult r;
  ENGINE_CALL(self, r, ferry_peer_regions(self->eng, target, &regions, &count));
  if (r.st != FERRY_OK)
    return raise_result(&r);
  PyObject *result = PyList_New((Py_ssize_t)count);
  for (size_t i = 0; result && i < count; i++) {
    PyObject *t = Py_BuildValue("(KK)", (unsigned long long)regions[i].addr,
                                (unsigned long long)regions[i].length);
    if (!t)
      Py_CLEAR(result);
    else
      PyList_SET_ITEM(result, (Py_ssize_t)i, t);
  }
  free(regions);
  return result;
}

static PyObject *engine_peer_transport(EngineObject *self, PyObject *args, PyObject *kwds) {
  const char *target;
  if (target_arg_enter(self, args, kwds, "s:peer_transport", &target) < 0)
    return NULL;
  unsigned t = 0;
  CallResult r;
  ENGINE_CALL(self, r, ferry_peer_transport(self->eng, target, &t));
  if (r.st != FERRY_OK)
    return raise_result(&r);
  return PyLong_FromUnsignedLong(t);
}

static PyObject *engine_close(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  engine_close_impl(self);
  Py_RETURN_NONE;
}

static PyObject *engine_enter_ctx(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  if (!self->eng || self->closing)
    return raise_closed();
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *engine_exit_ctx(EngineObject *self, PyObject *Py_UNUSED(args)) {
  engine_close_impl(self);
  Py_RETURN_FALSE;
}

static PyMethodDef engine_methods[] = {
    {"register", KW(engine_register),
     "register(buf_or_addr, length=None, location=None) -> int\n\nRegisters memory (an int "
     "address with a length, or a buffer object, held until unregistered) and returns its "
     "address. location, as Mooncake names it ('cpu:0', 'cuda:1', '*'), is checked against what "
     "the CUDA driver says the memory is (ferry_memory_register_at). A read-only "
     "buffer (bytes) may be registered to serve as a WRITE source, but peers can write into any "
     "registered memory: register read-only objects only with trusted peers."},
    {"unregister", KW(engine_unregister), "unregister(addr)"},
    {"register_batch", KW(engine_register_batch),
     "register_batch(items, lengths=None, locations=None) -> list of addresses\n\nlocations: "
     "one location for all, or one per item."},
    {"unregister_batch", KW(engine_unregister_batch), "unregister_batch(addrs)"},
    {"alloc", KW(engine_alloc), "alloc(length) -> int: a new registered, zero-filled buffer"},
    {"free", KW(engine_free), "free(addr): frees a buffer from alloc()"},
    {"write", KW(engine_write),
     "write(target, local, remote_addr, length=None): local -> remote, returns when the bytes "
     "are in the target's memory"},
    {"read", KW(engine_read), "read(target, local, remote_addr, length=None): remote -> local"},
    {"transfer_batch", KW(engine_transfer_batch),
     "transfer_batch(target, entries, notify=None)\n\nentries: (op, local, remote_addr, length) "
     "tuples; notify: None or (name, data) delivered after the data."},
    {"submit", KW(engine_submit), "submit(target, entries, notify=None) -> Batch"},
    {"transfer_arrays", KW(engine_transfer_arrays),
     "transfer_arrays(target, op, local_addrs, remote_addrs, lengths, notify=None)\n\nLike "
     "transfer_batch with one op and three parallel integer sequences (fast path)."},
    {"submit_arrays", KW(engine_submit_arrays),
     "submit_arrays(target, op, local_addrs, remote_addrs, lengths, notify=None) -> Batch"},
    {"submit_on_stream", KW(engine_submit_on_stream),
     "submit_on_stream(target, op, local_addrs, remote_addrs, lengths, stream=None, "
     "notify=None, watch=True) -> Batch or None\n\nsubmit_arrays ordered on a CUDA stream (an "
     "int handle or a torch.cuda.Stream; None: the default stream): the transfer starts after "
     "the work queued on it before, and work queued on it after waits until the transfer "
     "ended. watch=False: no Batch; a failure is logged."},
    {"plan", KW(engine_plan),
     "plan(target, local, remote) -> Plan: descriptor lists checked once, transferred by "
     "index\n\nlocal, remote: (addr, length) pairs, or an N x 2 array of integers."},
    {"register_file", KW(engine_register_file),
     "register_file(fd, buffered=False) -> File: FILE memory, a file whose byte ranges are "
     "a transfer's far side\n\nfd: an int or an object with fileno() (ferry duplicates it). "
     "O_DIRECT is used for aligned operations where the file system takes it, unless "
     "buffered=True (File.direct and File.why say which)."},
    {"probe", KW(engine_probe), "probe(target): raises ferry.Error unless the peer answers"},
    {"notify", KW(engine_notify), "notify(target, name, data=b'')"},
    {"drain_notifications", (PyCFunction)engine_drain, METH_NOARGS,
     "drain_notifications() -> list of (name: str, data: bytes)"},
    {"peer_regions", KW(engine_peer_regions),
     "peer_regions(target) -> list of (addr, length) the peer has registered"},
    {"peer_transport", KW(engine_peer_transport),
     "peer_transport(target) -> TRANSPORT_* bit used with that peer"},
    {"stats", (PyCFunction)engine_stats, METH_NOARGS,
     "stats() -> dict\n\nA snapshot of the engine's statistics (ferry_stats_snapshot): 'links' "
     "(per peer and transport: 'peer', 'transport', 'bytes' and 'ops' by 'read'/'write', "
     "'connections_opened'), their sums 'bytes' and 'ops', 'served_bytes' and "
     "'served_requests' (as target, over tcp), 'errors' ({ferry.E*: count}), "
     "'batches_in_flight', 'registered_bytes', 'registered_regions', "
     "'notifications_queued', 'control_connections_opened' and 'sync_latency' "
     "({'buckets': [(upper bound in seconds, count)], 'sum_seconds', 'count'}), "
     "'pool_messages_landed', 'pool_landed_inband', 'pool_senders_waiting' and "
     "'pool_bytes_granted' (receive pools)."},
    {"stats_text", (PyCFunction)engine_stats_text, METH_NOARGS,
     "stats_text() -> str: the same snapshot in Prometheus' text format"},
    {"close", (PyCFunction)engine_close, METH_NOARGS,
     "close(): stops the engine; calls in progress on other threads end with ECLOSED and "
     "pending batches fail (Batch objects stay usable)"},
    {"create_pool", KW(engine_create_pool),
     "create_pool(name, buffer_or_size) -> Pool: a receive pool over a writable buffer, or\n"
     "of that many bytes ferry allocates"},
    {"send", KW(engine_send),
     "send(target, pool, tag, data, length=None, timeout=None, nowait=False): moves data\n"
     "into the target's pool under tag; returns once the receiver has it. A full pool is\n"
     "waited on up to timeout seconds (None: the engine's timeout), or EBUSY at once with\n"
     "nowait"},
    {"send_batch", KW(engine_send_batch),
     "send_batch(target, pool, items, timeout=None, nowait=False): sends every (tag, data)\n"
     "of items into the target's pool with all their WRITEs in flight together; returns\n"
     "once the receiver has them all, or raises the first failure (naming the message)"},
    {"recv", KW(engine_recv),
     "recv(pool, tag=None, timeout=None) -> Message: the earliest landed message with tag\n"
     "(None: any), waiting up to timeout seconds (None: without bound); ETIMEDOUT past it"},
    {"__enter__", (PyCFunction)engine_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)engine_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef engine_getset[] = {
    {"port", (getter)engine_get_port, NULL, "the RPC port actually bound", NULL},
    {"name", (getter)engine_get_name, NULL, "the name peers pass as target", NULL},
    {"closed", (getter)engine_get_closed, NULL, "True once close() has been called", NULL},
    {"metrics_port", (getter)engine_get_metrics_port, NULL,
     "the port /metrics is served on (FERRY_METRICS_PORT), 0 when it is not", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_repr = (reprfunc)engine_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine(host=None, *, bind_host=None, port=0, transports='all', connections=None,\n"
              "       workers=None, timeout_ms=None, secret=None, metadata_url=None,\n"
              "       segment_name=None, checksum=None, log_level=None, advertise_host=None,\n"
              "       connect_timeout_ms=None, timeout_ns_per_mb=None, slice_size=None,\n"
              "       spin_us=None)\n\n"
              "A ferry transfer engine. host is both the advertised and the bound address.\n"
              "Options left as None keep libferry's defaults (including those from the\n"
              "environment: MC_TCP_BIND_ADDRESS, MC_TRANSFER_TIMEOUT, FERRY_SPIN_US).",
    .tp_methods = engine_methods,
    .tp_getset = engine_getset,
    .tp_init = (initproc)engine_init,
    .tp_new = engine_new,
};
