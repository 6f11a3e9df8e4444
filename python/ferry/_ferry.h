/* _ferry.h - what the files of the extension module `ferry._ferry` share:
 * the conversions of Python arguments (ints, lengths, local memory through
 * the buffer protocol, bytes), a ferry_status raised as ferry.Error, a
 * libferry call made without the GIL, the Engine object with its entry and
 * exit, and the methods and types one file defines and another lists.
 *
 * The module is one shared object built from these files (setup.py):
 *   _ferry.c   the module: its functions, constants and PyInit__ferry
 *   errors.c   ferry.Error, and raising it for a ferry_status
 *   convert.c  Python arguments as libferry's: ints, lengths, local memory, bytes
 *   log.c      log levels; libferry's log lines queued for Python's logging
 *   engine.c   the Engine type: lifetime, options, peers, notifications
 *   memory.c   Engine methods that register, unregister, allocate and free memory
 *   batch.c    transfers (entries, arrays, a notification) and the Batch type
 *   stats.c    Engine.stats() and stats_text()
 *   pool.c     receive pools: the Pool and Message types, send and recv
 *   plan.c     prepared transfer plans: Engine.plan() and the Plan type
 *   file.c     FILE memory: Engine.register_file() and the File type
 *   store.c    the Store type: a client of a store master (ferry_store_*)
 *
 * Every declaration below is hidden: what the files share stays inside the
 * module, which exports PyInit__ferry (and libferry's own API, compiled in). */
#ifndef FERRY_PY_FERRY_H
#define FERRY_PY_FERRY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>

#include "ferry.h"

#define ERRBUF_SIZE 1024

#pragma GCC visibility push(hidden)

/* ---- errors.c: ferry.Error ------------------------------------------- */

extern PyTypeObject ErrorType;

PyObject *raise_status(ferry_status st, const char *detail);
void capture_error(char *buf);

/* A libferry call's status and, when it failed, the ferry_last_error() text
 * captured right after it. */
typedef struct {
  ferry_status st;
  char err[ERRBUF_SIZE];
} CallResult;

/* Runs `call`, an expression yielding a ferry_status, with the GIL released
 * and records it in the CallResult res. A failure's detail is captured
 * before the GIL is taken back, while it still describes this call. */
#define CALL_WITHOUT_GIL(res, call)                                                                \
  do {                                                                                             \
    PyThreadState *ts_ = PyEval_SaveThread();                                                      \
    (res).st = (call);                                                                             \
    if ((res).st != FERRY_OK)                                                                      \
      capture_error((res).err);                                                                    \
    PyEval_RestoreThread(ts_);                                                                     \
  } while (0)

PyObject *raise_result(const CallResult *r);
PyObject *none_or_raise(const CallResult *r);

/* ---- convert.c: Python arguments ------------------------------------- */

int as_u64(PyObject *o, uint64_t *out);
int as_size(PyObject *o, size_t *out);

/* What writes a local buffer, for the refusal of a read-only one. */
#define READ_DESTINATION "the destination of a READ (the READ writes into it)"
#define REGION "registered: peers may WRITE into registered memory"

/* A local memory argument: an int address, a contiguous buffer object, or
 * an array object (device.c: the view owns it; buf is its address, which
 * may be device memory: never read). */
typedef struct {
  void *ptr;
  size_t len; /* buffer length; 0 for an address */
  int has_view;
  Py_buffer view;
  char location[24]; /* where an array object says it lives ("cuda:0"); "" otherwise */
} LocalArg;

int local_get(PyObject *obj, const char *writes, LocalArg *la);
void local_release(LocalArg *la);
int local_get_with_length(PyObject *obj, const char *writes, PyObject *length_obj, LocalArg *la,
                          size_t *len);

PyObject *to_bytes(PyObject *o);

/* ---- device.c: array objects (__cuda_array_interface__, __dlpack__) ---- */

/* 1 with la filled (a view owning obj) when obj is such an array; 0 when it
 * is not one; -1 with an exception (non-contiguous, unknown device, ...). */
int device_array_get(PyObject *obj, const char *writes, LocalArg *la);

/* ---- engine.c: the Engine object -------------------------------------- */

typedef struct {
  PyObject ob_base;
  ferry_engine *eng;
  int initialized; /* set once ferry_engine_create succeeded (stays set after close) */
  int closing;     /* close() began: new calls raise ECLOSED */
  long active;     /* methods that may be inside libferry (engine.c's top comment) */
  long views;      /* exported views of received messages: their pool memory must stay */
  PyObject *held;  /* dict: address -> capsule owning a registered Py_buffer */
} EngineObject;

extern PyTypeObject EngineType;

PyObject *raise_closed(void);
int eng_enter(EngineObject *self);
void eng_destroy_if_unused(EngineObject *self);
void eng_leave(EngineObject *self);

/* CALL_WITHOUT_GIL on an engine the caller entered with eng_enter(), which
 * it then leaves. */
#define ENGINE_CALL(self, res, call)                                                               \
  do {                                                                                             \
    CALL_WITHOUT_GIL(res, call);                                                                   \
    eng_leave(self);                                                                               \
  } while (0)

/* A PyMethodDef's function and flags for a method taking keywords. */
#define KW(fn) (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS

/* The Engine methods the files below define, for engine.c's method table. */
PyObject *engine_register(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_unregister(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_register_batch(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_unregister_batch(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_alloc(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_free(EngineObject *self, PyObject *args, PyObject *kwds);

PyObject *engine_write(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_read(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_transfer_batch(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_submit(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_transfer_arrays(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_submit_arrays(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_submit_on_stream(EngineObject *self, PyObject *args, PyObject *kwds);

PyObject *engine_stats(EngineObject *self, PyObject *Py_UNUSED(noargs));
PyObject *engine_stats_text(EngineObject *self, PyObject *Py_UNUSED(noargs));

PyObject *engine_create_pool(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_recv(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_send(EngineObject *self, PyObject *args, PyObject *kwds);
PyObject *engine_send_batch(EngineObject *self, PyObject *args, PyObject *kwds);

/* ---- batch.c: arguments and Batch objects that plan.c and file.c share -- */

int as_op(PyObject *o, ferry_op *out);

/* A parsed list of entries plus the buffer views their local sides point into. */
typedef struct {
  ferry_entry *e;
  size_t n;
  Py_buffer *views;
  size_t nviews;
} EntryList;

/* entries: a sequence of (op, local, remote, length); local an int address
 * or a buffer object (then length may be None for the whole buffer). */
int entries_parse(PyObject *entries, EntryList *l);
void entries_release(EntryList *l);

/* A notification argument: None, (name, data) or an object with .name and
 * .msg (or .data). name and data: str (UTF-8) or bytes-like. */
typedef struct {
  PyObject *name; /* bytes */
  PyObject *data; /* bytes */
  ferry_notification n;
  int present;
} NotifyArg;

int notify_get(PyObject *obj, NotifyArg *na);
void notify_release(NotifyArg *na);

/* A new, empty Batch object; batch_object_attach then gives it a submitted
 * batch (and takes na), so that nothing can fail once it was submitted. */
PyObject *batch_object_new(void);
void batch_object_attach(PyObject *batch, EngineObject *engine, ferry_batch *fb, NotifyArg *na);
/* The Batch keeps the buffer views of l (which the library's copy of the
 * entries points into) until it is freed; l->e is freed, l emptied. */
void batch_object_keep_entries(PyObject *batch, EntryList *l);

/* ---- plan.c: prepared transfer plans ----------------------------------- */

PyObject *engine_plan(EngineObject *self, PyObject *args, PyObject *kwds);

/* ---- file.c: FILE memory ------------------------------------------------- */

PyObject *engine_register_file(EngineObject *self, PyObject *args, PyObject *kwds);

/* ---- batch.c, pool.c, plan.c: the other types -------------------------- */

extern PyTypeObject BatchType;
extern PyTypeObject PoolType;
extern PyTypeObject MessageType;
extern PyTypeObject PlanType;
extern PyTypeObject FileType;
extern PyTypeObject StoreType;

/* ---- log.c: log levels and the log bridge ----------------------------- */

int parse_log_level(PyObject *o, ferry_log_level *out);

/* Module functions, for _ferry.c's method table. */
PyObject *mod_set_log_level(PyObject *Py_UNUSED(m), PyObject *arg);
PyObject *mod_get_log_level(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs));
PyObject *mod_log_route(PyObject *Py_UNUSED(m), PyObject *arg);
PyObject *mod_log_wait(PyObject *Py_UNUSED(m), PyObject *arg);
PyObject *mod_log_take(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs));

#pragma GCC visibility pop

#endif
