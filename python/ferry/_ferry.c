/* _ferry.c - CPython extension module `ferry._ferry`, a thin binding over the
 * public C API of libferry (include/ferry.h). This file holds the module:
 * its functions (strerror, version, transport names), its constants and
 * PyInit__ferry; the types and the rest live in the files _ferry.h lists.
 *
 * Types:
 *   Engine  one ferry_engine; registration, transfers, probes, notifications.
 *   Batch   an asynchronous batch returned by Engine.submit*().
 *   Pool    a receive pool (Engine.create_pool); Message, what recv returns.
 *   Error   ferry.Error(code, message[, detail]), a RuntimeError subclass with
 *           .code (ferry_status), .mooncake_code and .detail.
 *
 * Every call that may block releases the GIL. The detail of a failure
 * (ferry_last_error(), per thread) is copied in the same thread right after
 * the failing call, before the GIL is taken back. engine.c states the
 * lifetime rules that keep every thread out of a destroyed engine. */
#include "_ferry.h"

static PyObject *mod_strerror(PyObject *Py_UNUSED(m), PyObject *arg) {
  long code = PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred())
    return NULL;
  return PyUnicode_FromString(ferry_strerror((ferry_status)code));
}

static PyObject *mod_to_mooncake(PyObject *Py_UNUSED(m), PyObject *arg) {
  long code = PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred())
    return NULL;
  return PyLong_FromLong(ferry_status_to_mooncake((ferry_status)code));
}

static PyObject *mod_version(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs)) {
  return PyUnicode_FromString(ferry_version());
}

static PyObject *mod_last_error(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs)) {
  return PyUnicode_FromString(ferry_last_error());
}

static PyObject *mod_transport_name(PyObject *Py_UNUSED(m), PyObject *arg) {
  uint64_t v;
  if (as_u64(arg, &v) < 0)
    return NULL;
  return PyUnicode_FromString(ferry_transport_name((unsigned)v));
}

static PyObject *mod_transport_parse(PyObject *Py_UNUSED(m), PyObject *arg) {
  const char *s = PyUnicode_AsUTF8(arg);
  if (!s)
    return NULL;
  return PyLong_FromUnsignedLong(ferry_transport_parse(s));
}

/* (available, why): whether libferry found a CUDA driver and a device. */
static PyObject *mod_cuda_available(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs)) {
  char why[256] = "";
  int on = ferry_memory_cuda_available(why, sizeof why);
  return Py_BuildValue("(Os)", on ? Py_True : Py_False, why);
}

static PyMethodDef module_methods[] = {
    {"cuda_available", mod_cuda_available, METH_NOARGS,
     "cuda_available() -> (bool, why not): whether the CUDA driver loaded and found a device"},
    {"strerror", mod_strerror, METH_O, "strerror(code) -> str"},
    {"to_mooncake", mod_to_mooncake, METH_O, "to_mooncake(code) -> Mooncake's error number"},
    {"version", mod_version, METH_NOARGS, "version() -> libferry version string"},
    {"last_error", mod_last_error, METH_NOARGS,
     "last_error() -> this thread's last libferry error detail"},
    {"transport_name", mod_transport_name, METH_O, "transport_name(bit) -> 'tcp', 'shm', ..."},
    {"transport_parse", mod_transport_parse, METH_O,
     "transport_parse('tcp,shm') -> bits (0 if unknown)"},
    {"set_log_level", mod_set_log_level, METH_O,
     "set_log_level(level): 0-4 or 'debug'/'info'/'warn'/'error'/'off'"},
    {"get_log_level", mod_get_log_level, METH_NOARGS, "get_log_level() -> int"},
    {"_log_route", mod_log_route, METH_O,
     "_log_route(on): libferry's lines to _log_take or stderr"},
    {"_log_wait", mod_log_wait, METH_O, "_log_wait(timeout_s) -> True once a line is queued"},
    {"_log_take", mod_log_take, METH_NOARGS, "_log_take() -> the queued lines, as tuples"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ferry_module = {
    PyModuleDef_HEAD_INIT,
    "ferry._ferry",
    "Binding over libferry's C API; use the `ferry` package.",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__ferry(void) {
  ErrorType.tp_base = (PyTypeObject *)PyExc_RuntimeError;
  if (PyType_Ready(&ErrorType) < 0 || PyType_Ready(&EngineType) < 0 ||
      PyType_Ready(&BatchType) < 0 || PyType_Ready(&PoolType) < 0 ||
      PyType_Ready(&MessageType) < 0 || PyType_Ready(&PlanType) < 0 ||
      PyType_Ready(&StoreType) < 0 || PyType_Ready(&FileType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&ferry_module);
  if (!m)
    return NULL;
  Py_INCREF(&ErrorType);
  Py_INCREF(&EngineType);
  Py_INCREF(&BatchType);
  Py_INCREF(&PoolType);
  Py_INCREF(&MessageType);
  Py_INCREF(&PlanType);
  Py_INCREF(&FileType);
  Py_INCREF(&StoreType);
  if (PyModule_AddObject(m, "Error", (PyObject *)&ErrorType) < 0 ||
      PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0 ||
      PyModule_AddObject(m, "Batch", (PyObject *)&BatchType) < 0 ||
      PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0 ||
      PyModule_AddObject(m, "Message", (PyObject *)&MessageType) < 0 ||
      PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0 ||
      PyModule_AddObject(m, "File", (PyObject *)&FileType) < 0 ||
      PyModule_AddObject(m, "Store", (PyObject *)&StoreType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  struct {
    const char *name;
    long value;
  } consts[] = {
      {"OK", FERRY_OK},
      {"EINVAL", FERRY_EINVAL},
      {"ENOTREG", FERRY_ENOTREG},
      {"EOVERLAP", FERRY_EOVERLAP},
      {"ENOMEM", FERRY_ENOMEM},
      {"ESOCKET", FERRY_ESOCKET},
      {"EDNS", FERRY_EDNS},
      {"EHANDSHAKE", FERRY_EHANDSHAKE},
      {"EVERSION", FERRY_EVERSION},
      {"EAUTH", FERRY_EAUTH},
      {"ETIMEDOUT", FERRY_ETIMEDOUT},
      {"EPROTO", FERRY_EPROTO},
      {"EMETADATA", FERRY_EMETADATA},
      {"EJSON", FERRY_EJSON},
      {"ENOTIMPL", FERRY_ENOTIMPL},
      {"EBUSY", FERRY_EBUSY},
      {"ECHECKSUM", FERRY_ECHECKSUM},
      {"ETRANSPORT", FERRY_ETRANSPORT},
      {"ECLOSED", FERRY_ECLOSED},
      {"ENOTFOUND", FERRY_ENOTFOUND},
      {"EREMOTE", FERRY_EREMOTE},
      {"EINPROGRESS", FERRY_EINPROGRESS},
      {"EFAULT", FERRY_EFAULT},
      {"ECANCELED", FERRY_ECANCELED},
      {"EIO", FERRY_EIO},
      {"OP_READ", FERRY_OP_READ},
      {"OP_WRITE", FERRY_OP_WRITE},
      {"PLAN_NO_MERGE", FERRY_PLAN_NO_MERGE},
      {"TRANSPORT_TCP", FERRY_TRANSPORT_TCP},
      {"TRANSPORT_SHM", FERRY_TRANSPORT_SHM},
      {"TRANSPORT_FABRIC", FERRY_TRANSPORT_FABRIC},
      {"TRANSPORT_ALL", FERRY_TRANSPORT_ALL},
      {"BATCH_PENDING", FERRY_BATCH_PENDING},
      {"BATCH_DONE", FERRY_BATCH_DONE},
      {"BATCH_FAILED", FERRY_BATCH_FAILED},
      {"BATCH_TIMEDOUT", FERRY_BATCH_TIMEDOUT},
      {"LOG_DEBUG", FERRY_LOG_DEBUG},
      {"LOG_INFO", FERRY_LOG_INFO},
      {"LOG_WARN", FERRY_LOG_WARN},
      {"LOG_ERROR", FERRY_LOG_ERROR},
      {"LOG_OFF", FERRY_LOG_OFF},
      {"STORE_PIN_NONE", FERRY_STORE_PIN_NONE},
      {"STORE_PIN_SOFT", FERRY_STORE_PIN_SOFT},
      {"STORE_PIN_HARD", FERRY_STORE_PIN_HARD},
      {"STORE_SOFT_PIN_PRESERVE", FERRY_STORE_SOFT_PIN_PRESERVE},
      {"STORE_SOFT_PIN_ENABLE", FERRY_STORE_SOFT_PIN_ENABLE},
      {"STORE_SOFT_PIN_DISABLE", FERRY_STORE_SOFT_PIN_DISABLE},
  };
  for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++) {
    if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) < 0) {
      Py_DECREF(m);
      return NULL;
    }
  }
  if (PyModule_AddStringConstant(m, "VERSION_STRING", FERRY_VERSION_STRING) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
