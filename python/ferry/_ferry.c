/* _ferry.c - CPython extension module `ferry._ferry`, a thin binding over the
 * public C API of libferry (include/ferry.h).
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
 * the failing call, before the GIL is taken back.
 *
 * Lifetime rules: libferry lets calls on other threads race with the
 * engine's shutdown (they return FERRY_ECLOSED promptly) and keeps batch
 * handles valid after it. The binding only has to make sure no thread
 * enters the library after ferry_engine_destroy: a method counts itself in
 * Engine.active (under the GIL) from before it releases the GIL until it
 * has it back. close() calls ferry_engine_shutdown, which ends the calls in
 * progress, and whoever leaves last (close() itself or the last method)
 * then destroys the engine. Nobody waits or polls. A Batch holds a
 * reference to its Engine and the Py_buffers of the objects its entries
 * point into until it is freed. Buffer objects passed to register() are
 * held (their memory cannot be resized or freed) until unregister() or
 * close(). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "ferry.h"

#define ERRBUF_SIZE 1024
#define LOG_ENGINE_MAX 288 /* an engine name: host (255) and :port */

/* ======================================================================
 * Error type
 * ====================================================================== */

typedef struct {
  PyBaseExceptionObject base;
  int code;
  int mooncake_code;
  PyObject *detail;
} ErrorObject;

static PyTypeObject ErrorType;

static int error_init(ErrorObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"code", "message", "detail", NULL};
  int code = 0;
  PyObject *message = NULL, *detail = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "iU|O:Error", kwlist, &code, &message, &detail))
    return -1;
  PyObject *base_args = Py_BuildValue("(iO)", code, message);
  if (!base_args)
    return -1;
  int rc = ((PyTypeObject *)PyExc_RuntimeError)->tp_init((PyObject *)self, base_args, NULL);
  Py_DECREF(base_args);
  if (rc < 0)
    return -1;
  self->code = code;
  self->mooncake_code = ferry_status_to_mooncake((ferry_status)code);
  if (detail == Py_None)
    detail = message;
  Py_INCREF(detail);
  Py_XSETREF(self->detail, detail);
  return 0;
}

static int error_traverse(ErrorObject *self, visitproc visit, void *arg) {
  Py_VISIT(self->detail);
  return ((PyTypeObject *)PyExc_RuntimeError)->tp_traverse((PyObject *)self, visit, arg);
}

static int error_clear(ErrorObject *self) {
  Py_CLEAR(self->detail);
  return ((PyTypeObject *)PyExc_RuntimeError)->tp_clear((PyObject *)self);
}

static void error_dealloc(ErrorObject *self) {
  PyObject_GC_UnTrack(self);
  error_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *error_str(ErrorObject *self) {
  if (self->base.args && PyTuple_Check(self->base.args) && PyTuple_GET_SIZE(self->base.args) >= 2 &&
      PyUnicode_Check(PyTuple_GET_ITEM(self->base.args, 1))) {
    PyObject *msg = PyTuple_GET_ITEM(self->base.args, 1);
    Py_INCREF(msg);
    return msg;
  }
  return ((PyTypeObject *)PyExc_RuntimeError)->tp_str((PyObject *)self);
}

static PyMemberDef error_members[] = {
    {"code", T_INT, offsetof(ErrorObject, code), READONLY, "ferry_status code (negative)"},
    {"mooncake_code", T_INT, offsetof(ErrorObject, mooncake_code), READONLY,
     "the same cause in Mooncake's numbering"},
    {"detail", T_OBJECT, offsetof(ErrorObject, detail), READONLY,
     "ferry_last_error() text captured right after the failing call"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ErrorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Error",
    .tp_basicsize = sizeof(ErrorObject),
    .tp_dealloc = (destructor)error_dealloc,
    .tp_str = (reprfunc)error_str,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Error(code, message, detail=None)\n\n"
              "A failed ferry call. code is the ferry_status (negative), mooncake_code the\n"
              "equivalent Mooncake error number and detail the library's message naming the\n"
              "step, the peer and the cause.",
    .tp_traverse = (traverseproc)error_traverse,
    .tp_clear = (inquiry)error_clear,
    .tp_members = error_members,
    .tp_init = (initproc)error_init,
};

/* Raises ferry.Error for st; detail is the captured ferry_last_error() text. */
static PyObject *raise_status(ferry_status st, const char *detail) {
  char msg[ERRBUF_SIZE + 128];
  if (detail && detail[0])
    snprintf(msg, sizeof msg, "%s (%d): %s", ferry_strerror(st), (int)st, detail);
  else
    snprintf(msg, sizeof msg, "%s (%d)", ferry_strerror(st), (int)st);
  PyObject *exc = PyObject_CallFunction((PyObject *)&ErrorType, "iss", (int)st, msg,
                                        detail && detail[0] ? detail : ferry_strerror(st));
  if (!exc)
    return NULL;
  PyErr_SetObject((PyObject *)&ErrorType, exc);
  Py_DECREF(exc);
  return NULL;
}

static void capture_error(char *buf) { snprintf(buf, ERRBUF_SIZE, "%s", ferry_last_error()); }

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

/* Raises ferry.Error for a failed call. */
static PyObject *raise_result(const CallResult *r) { return raise_status(r->st, r->err); }

/* None when the call succeeded, else raises ferry.Error. */
static PyObject *none_or_raise(const CallResult *r) {
  if (r->st != FERRY_OK)
    return raise_result(r);
  Py_RETURN_NONE;
}

/* ======================================================================
 * Argument helpers
 * ====================================================================== */

/* Any int-like (int, numpy integer, IntEnum) as an unsigned 64-bit value. */
static int as_u64(PyObject *o, uint64_t *out) {
  PyObject *idx;
  if (PyLong_Check(o)) {
    idx = o;
    Py_INCREF(idx);
  } else {
    idx = PyNumber_Index(o);
    if (!idx)
      return -1;
  }
  unsigned long long v = PyLong_AsUnsignedLongLong(idx);
  Py_DECREF(idx);
  if (v == (unsigned long long)-1 && PyErr_Occurred())
    return -1;
  *out = (uint64_t)v;
  return 0;
}

static int as_size(PyObject *o, size_t *out) {
  uint64_t v;
  if (as_u64(o, &v) < 0)
    return -1;
  if (v > (uint64_t)SIZE_MAX) {
    PyErr_SetString(PyExc_OverflowError, "length too large");
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

static int as_op(PyObject *o, ferry_op *out) {
  uint64_t v;
  if (as_u64(o, &v) < 0)
    return -1;
  if (v != FERRY_OP_READ && v != FERRY_OP_WRITE) {
    PyErr_Format(PyExc_ValueError, "op must be OP_READ (0) or OP_WRITE (1), got %llu",
                 (unsigned long long)v);
    return -1;
  }
  *out = (ferry_op)v;
  return 0;
}

/* What writes a local buffer, for the refusal of a read-only one. */
#define READ_DESTINATION "the destination of a READ (the READ writes into it)"
#define REGION "registered: peers may WRITE into registered memory"

/* A local memory argument: an int address or a contiguous buffer object. */
typedef struct {
  void *ptr;
  size_t len; /* buffer length; 0 for an address */
  int has_view;
  Py_buffer view;
} LocalArg;

/* A read-only buffer (bytes) where the memory will be written: EINVAL
 * naming what would write it, instead of Python's bare BufferError. */
static int refuse_read_only(PyObject *obj, const char *writes) {
  Py_buffer probe;
  if (PyObject_GetBuffer(obj, &probe, PyBUF_ANY_CONTIGUOUS) < 0)
    return -1; /* not read-only: some other fault, already raised */
  PyBuffer_Release(&probe);
  PyErr_Clear();
  char detail[ERRBUF_SIZE];
  snprintf(detail, sizeof detail,
           "a read-only %.100s object cannot be %s; pass a writable buffer (bytearray, "
           "numpy array, torch tensor) or its address",
           Py_TYPE(obj)->tp_name, writes);
  raise_status(FERRY_EINVAL, detail);
  return -1;
}

/* Fills la from obj. writes: what will write the memory (a READ's
 * destination, a region peers may write), NULL if nothing will.
 * Ints (and 0-d integer buffers such as numpy scalars) are addresses. */
static int local_get(PyObject *obj, const char *writes, LocalArg *la) {
  la->has_view = 0;
  la->len = 0;
  if (!PyLong_Check(obj) && PyObject_CheckBuffer(obj)) {
    if (PyObject_GetBuffer(obj, &la->view, PyBUF_ANY_CONTIGUOUS | (writes ? PyBUF_WRITABLE : 0)) <
        0)
      return writes ? refuse_read_only(obj, writes) : -1;
    if (la->view.ndim == 0 && PyIndex_Check(obj)) {
      PyBuffer_Release(&la->view); /* a numpy integer scalar: an address */
    } else {
      la->has_view = 1;
      la->ptr = la->view.buf;
      la->len = (size_t)la->view.len;
      return 0;
    }
  }
  if (!PyLong_Check(obj) && !PyIndex_Check(obj)) {
    PyErr_Format(PyExc_TypeError,
                 "local memory must be an int address or a contiguous buffer object, not %.100s",
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  uint64_t a;
  if (as_u64(obj, &a) < 0)
    return -1;
  la->ptr = (void *)(uintptr_t)a;
  return 0;
}

/* Resolves the length of a transfer on la: explicit (length_obj not None) or
 * the whole buffer. */
static int local_length(LocalArg *la, PyObject *length_obj, size_t *out) {
  if (length_obj == NULL || length_obj == Py_None) {
    if (!la->has_view) {
      PyErr_SetString(PyExc_TypeError, "length is required when local memory is an int address");
      return -1;
    }
    *out = la->len;
    return 0;
  }
  if (as_size(length_obj, out) < 0)
    return -1;
  if (la->has_view && *out > la->len) {
    PyErr_Format(PyExc_ValueError, "length %zu exceeds the buffer's %zu bytes", *out, la->len);
    return -1;
  }
  return 0;
}

static void local_release(LocalArg *la) {
  if (la->has_view) {
    PyBuffer_Release(&la->view);
    la->has_view = 0;
  }
}

/* local_get() and local_length() together; on failure nothing is held. */
static int local_get_with_length(PyObject *obj, const char *writes, PyObject *length_obj,
                                 LocalArg *la, size_t *len) {
  if (local_get(obj, writes, la) < 0)
    return -1;
  if (local_length(la, length_obj, len) < 0) {
    local_release(la);
    return -1;
  }
  return 0;
}

/* A notification argument: None, (name, data) or an object with .name and
 * .msg (or .data). name and data: str (UTF-8) or bytes-like. */
typedef struct {
  PyObject *name; /* bytes */
  PyObject *data; /* bytes */
  ferry_notification n;
  int present;
} NotifyArg;

static PyObject *to_bytes(PyObject *o) {
  if (PyUnicode_Check(o))
    return PyUnicode_AsEncodedString(o, "utf-8", "surrogateescape");
  if (PyBytes_Check(o)) {
    Py_INCREF(o);
    return o;
  }
  return PyBytes_FromObject(o);
}

static int notify_get(PyObject *obj, NotifyArg *na) {
  memset(na, 0, sizeof *na);
  if (obj == NULL || obj == Py_None)
    return 0;
  PyObject *name = NULL, *data = NULL;
  if (PyTuple_Check(obj) || PyList_Check(obj)) {
    if (PySequence_Size(obj) != 2) {
      PyErr_SetString(PyExc_ValueError, "notify must be (name, data)");
      return -1;
    }
    name = PySequence_GetItem(obj, 0);
    data = PySequence_GetItem(obj, 1);
  } else {
    name = PyObject_GetAttrString(obj, "name");
    if (name) {
      data = PyObject_GetAttrString(obj, "msg");
      if (!data && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        data = PyObject_GetAttrString(obj, "data");
      }
    }
  }
  if (!name || !data) {
    Py_XDECREF(name);
    Py_XDECREF(data);
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear();
      PyErr_SetString(PyExc_TypeError,
                      "notify must be None, (name, data) or an object with .name and .msg");
    }
    return -1;
  }
  na->name = to_bytes(name);
  na->data = to_bytes(data);
  Py_DECREF(name);
  Py_DECREF(data);
  if (!na->name || !na->data) {
    Py_CLEAR(na->name);
    Py_CLEAR(na->data);
    return -1;
  }
  na->n.name = PyBytes_AS_STRING(na->name);
  na->n.data = PyBytes_AS_STRING(na->data);
  na->n.length = (size_t)PyBytes_GET_SIZE(na->data);
  na->present = 1;
  return 0;
}

static void notify_release(NotifyArg *na) {
  Py_CLEAR(na->name);
  Py_CLEAR(na->data);
  na->present = 0;
}

/* A parsed list of entries plus the buffer views their local sides point into. */
typedef struct {
  ferry_entry *e;
  size_t n;
  Py_buffer *views;
  size_t nviews;
} EntryList;

static void entries_release(EntryList *l) {
  for (size_t i = 0; i < l->nviews; i++)
    PyBuffer_Release(&l->views[i]);
  PyMem_Free(l->views);
  PyMem_Free(l->e);
  memset(l, 0, sizeof *l);
}

/* entries: sequence of (op, local, remote_addr, length); local an int address
 * or a buffer object (then length may be None for the whole buffer). */
static int entries_parse(PyObject *entries, EntryList *l) {
  memset(l, 0, sizeof *l);
  PyObject *seq =
      PySequence_Fast(entries, "entries must be a sequence of (op, local, remote, length)");
  if (!seq)
    return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject **items = PySequence_Fast_ITEMS(seq);
  l->e = PyMem_Calloc(n ? (size_t)n : 1, sizeof *l->e);
  if (!l->e) {
    Py_DECREF(seq);
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *it = items[i];
    PyObject *op_o, *loc_o, *rem_o, *len_o;
    if (PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 4) {
      op_o = PyTuple_GET_ITEM(it, 0);
      loc_o = PyTuple_GET_ITEM(it, 1);
      rem_o = PyTuple_GET_ITEM(it, 2);
      len_o = PyTuple_GET_ITEM(it, 3);
    } else if (PyList_Check(it) && PyList_GET_SIZE(it) == 4) {
      op_o = PyList_GET_ITEM(it, 0);
      loc_o = PyList_GET_ITEM(it, 1);
      rem_o = PyList_GET_ITEM(it, 2);
      len_o = PyList_GET_ITEM(it, 3);
    } else {
      PyErr_Format(PyExc_TypeError, "entry %zd must be a 4-tuple (op, local, remote, length)", i);
      goto fail;
    }
    ferry_entry *e = &l->e[l->n];
    if (as_op(op_o, &e->op) < 0 || as_u64(rem_o, &e->remote) < 0)
      goto fail;
    LocalArg la;
    if (local_get_with_length(loc_o, e->op == FERRY_OP_READ ? READ_DESTINATION : NULL, len_o, &la,
                              &e->length) < 0)
      goto fail;
    e->local = la.ptr;
    if (la.has_view) {
      Py_buffer *nv = PyMem_Realloc(l->views, (l->nviews + 1) * sizeof *nv);
      if (!nv) {
        local_release(&la);
        PyErr_NoMemory();
        goto fail;
      }
      l->views = nv;
      l->views[l->nviews++] = la.view;
    }
    l->n++;
  }
  Py_DECREF(seq);
  return 0;
fail:
  Py_DECREF(seq);
  entries_release(l);
  return -1;
}

/* A sequence of integers, read either from a buffer of 8-byte integers
 * (numpy uint64/int64, array('Q')) or item by item. */
typedef struct {
  PyObject *seq;  /* PySequence_Fast result, or NULL */
  Py_buffer view; /* when has_view */
  int has_view;
  Py_ssize_t n;
} IntSeq;

static int intseq_get(PyObject *o, const char *what, IntSeq *s) {
  memset(s, 0, sizeof *s);
  if (PyObject_CheckBuffer(o) && !PyBytes_Check(o) && !PyByteArray_Check(o)) {
    if (PyObject_GetBuffer(o, &s->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
      const char *f = s->view.format ? s->view.format : "B";
      if (*f == '<' || *f == '=' || *f == '@')
        f++;
      if (s->view.ndim == 1 && s->view.itemsize == 8 && f[0] && !f[1] && strchr("QqLlNn", f[0])) {
        s->has_view = 1;
        s->n = s->view.shape ? s->view.shape[0] : s->view.len / 8;
        return 0;
      }
      PyBuffer_Release(&s->view);
    } else {
      PyErr_Clear();
    }
  }
  char msg[96];
  snprintf(msg, sizeof msg, "%s must be a sequence of integers", what);
  s->seq = PySequence_Fast(o, msg);
  if (!s->seq)
    return -1;
  s->n = PySequence_Fast_GET_SIZE(s->seq);
  return 0;
}

static int intseq_at(IntSeq *s, Py_ssize_t i, uint64_t *out) {
  if (s->has_view) {
    memcpy(out, (const char *)s->view.buf + i * 8, 8);
    return 0;
  }
  return as_u64(PySequence_Fast_GET_ITEM(s->seq, i), out);
}

static void intseq_release(IntSeq *s) {
  if (s->has_view)
    PyBuffer_Release(&s->view);
  Py_CLEAR(s->seq);
  s->has_view = 0;
}

/* Three parallel sequences of int addresses/lengths, one op for all. */
static int arrays_parse(PyObject *op_o, PyObject *locals, PyObject *remotes, PyObject *lengths,
                        EntryList *l) {
  memset(l, 0, sizeof *l);
  ferry_op op;
  if (as_op(op_o, &op) < 0)
    return -1;
  IntSeq a, b, c;
  if (intseq_get(locals, "local_addrs", &a) < 0)
    return -1;
  if (intseq_get(remotes, "remote_addrs", &b) < 0) {
    intseq_release(&a);
    return -1;
  }
  if (intseq_get(lengths, "lengths", &c) < 0) {
    intseq_release(&a);
    intseq_release(&b);
    return -1;
  }
  int rc = -1;
  if (a.n != b.n || a.n != c.n) {
    PyErr_Format(PyExc_ValueError,
                 "local_addrs, remote_addrs and lengths differ in length (%zd, %zd, %zd)", a.n, b.n,
                 c.n);
    goto out;
  }
  l->e = PyMem_Calloc(a.n ? (size_t)a.n : 1, sizeof *l->e);
  if (!l->e) {
    PyErr_NoMemory();
    goto out;
  }
  for (Py_ssize_t i = 0; i < a.n; i++) {
    uint64_t loc, len;
    ferry_entry *e = &l->e[i];
    if (intseq_at(&a, i, &loc) < 0 || intseq_at(&b, i, &e->remote) < 0 ||
        intseq_at(&c, i, &len) < 0) {
      entries_release(l);
      goto out;
    }
    e->op = op;
    e->local = (void *)(uintptr_t)loc;
    e->length = (size_t)len;
  }
  l->n = (size_t)a.n;
  rc = 0;
out:
  intseq_release(&a);
  intseq_release(&b);
  intseq_release(&c);
  return rc;
}

/* ======================================================================
 * Engine and Batch objects
 * ====================================================================== */

typedef struct BatchObject BatchObject;

typedef struct {
  PyObject ob_base;
  ferry_engine *eng;
  int initialized; /* set once ferry_engine_create succeeded (stays set after close) */
  int closing;     /* close() began: new calls raise ECLOSED */
  long active;     /* methods that may be inside libferry (see the top comment) */
  PyObject *held;  /* dict: address -> capsule owning a registered Py_buffer */
} EngineObject;

struct BatchObject {
  PyObject ob_base;
  EngineObject *engine; /* strong reference */
  ferry_batch *b;
  EntryList entries; /* only the views are kept; entries.e is freed after submit */
  NotifyArg notify;
  long busy;        /* methods using b without the GIL */
  int free_pending; /* free() came while busy: the last of them frees */
  int state;
  int error;
  PyObject *detail;
};

static PyTypeObject EngineType;
static PyTypeObject BatchType;

static PyObject *raise_closed(void) {
  return raise_status(FERRY_ECLOSED, "the engine has been closed");
}

static int eng_enter(EngineObject *self) {
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

static void engine_close_impl(EngineObject *self);

/* Called with the GIL by whoever leaves last once close() began: the engine
 * is shut down, so destroying it only frees memory. */
static void eng_leave(EngineObject *self) {
  if (--self->active > 0 || !self->closing || !self->eng)
    return;
  ferry_engine *eng = self->eng;
  self->eng = NULL;
  ferry_engine_destroy(eng);
  Py_CLEAR(self->held);
}

/* CALL_WITHOUT_GIL on an engine the caller entered with eng_enter(), which
 * it then leaves. */
#define ENGINE_CALL(self, res, call)                                                               \
  do {                                                                                             \
    CALL_WITHOUT_GIL(res, call);                                                                   \
    eng_leave(self);                                                                               \
  } while (0)

static void batch_release_memory(BatchObject *b) {
  entries_release(&b->entries);
  notify_release(&b->notify);
}

/* How a batch ended, captured without the GIL. */
typedef struct {
  int state;
  ferry_status error;
  char detail[ERRBUF_SIZE];
} BatchOutcome;

/* Without the GIL: waits for fb (bounded by its own deadline), records how it
 * ended and frees it. */
static void batch_finish_nogil(ferry_batch *fb, BatchOutcome *out) {
  ferry_status cause = FERRY_OK;
  ferry_status st = ferry_batch_wait(fb, -1);
  out->detail[0] = 0;
  if (st != FERRY_OK)
    capture_error(out->detail);
  out->state = ferry_batch_status(fb, &cause);
  out->error = st != FERRY_OK ? st : cause;
  if (out->state == FERRY_BATCH_PENDING) {
    out->state = FERRY_BATCH_FAILED;
    if (out->error == FERRY_OK)
      out->error = FERRY_EINPROGRESS;
  } else if (out->state == FERRY_BATCH_DONE) {
    out->error = FERRY_OK;
  }
  ferry_batch_free(fb);
}

static void batch_record(BatchObject *self, int state, ferry_status st, const char *err);

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

static int parse_log_level(PyObject *o, ferry_log_level *out) {
  if (PyUnicode_Check(o)) {
    const char *s = PyUnicode_AsUTF8(o);
    if (!s)
      return -1;
    if (!strcasecmp(s, "debug"))
      *out = FERRY_LOG_DEBUG;
    else if (!strcasecmp(s, "info"))
      *out = FERRY_LOG_INFO;
    else if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning"))
      *out = FERRY_LOG_WARN;
    else if (!strcasecmp(s, "error"))
      *out = FERRY_LOG_ERROR;
    else if (!strcasecmp(s, "off") || !strcasecmp(s, "none"))
      *out = FERRY_LOG_OFF;
    else {
      PyErr_Format(PyExc_ValueError, "unknown log level '%s' (debug, info, warn, error, off)", s);
      return -1;
    }
    return 0;
  }
  uint64_t v;
  if (as_u64(o, &v) < 0)
    return -1;
  if (v > FERRY_LOG_OFF) {
    PyErr_SetString(PyExc_ValueError, "log level must be 0..4");
    return -1;
  }
  *out = (ferry_log_level)v;
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

/* ---- memory ---------------------------------------------------------- */

static void capsule_release_view(PyObject *cap) {
  Py_buffer *view = PyCapsule_GetPointer(cap, "ferry.view");
  if (view) {
    PyBuffer_Release(view);
    PyMem_Free(view);
  }
}

/* Keeps a registered buffer object's view alive under its address. Takes
 * ownership of *view (released here on failure or if already held). */
static int hold_view(EngineObject *self, Py_buffer *view) {
  PyObject *key = PyLong_FromVoidPtr(view->buf);
  if (!key) {
    PyBuffer_Release(view);
    return -1;
  }
  int has = PyDict_Contains(self->held, key);
  if (has != 0) {
    Py_DECREF(key);
    PyBuffer_Release(view);
    return has < 0 ? -1 : 0;
  }
  Py_buffer *copy = PyMem_Malloc(sizeof *copy);
  if (!copy) {
    Py_DECREF(key);
    PyBuffer_Release(view);
    PyErr_NoMemory();
    return -1;
  }
  *copy = *view;
  PyObject *cap = PyCapsule_New(copy, "ferry.view", capsule_release_view);
  if (!cap) {
    Py_DECREF(key);
    PyBuffer_Release(copy);
    PyMem_Free(copy);
    return -1;
  }
  int rc = PyDict_SetItem(self->held, key, cap);
  Py_DECREF(key);
  Py_DECREF(cap);
  return rc;
}

static void unhold(EngineObject *self, void *addr) {
  if (!self->held)
    return;
  PyObject *key = PyLong_FromVoidPtr(addr);
  if (!key) {
    PyErr_Clear();
    return;
  }
  if (PyDict_DelItem(self->held, key) < 0)
    PyErr_Clear();
  Py_DECREF(key);
}

static PyObject *engine_register(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"buf_or_addr", "length", NULL};
  PyObject *obj, *length_o = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:register", kwlist, &obj, &length_o))
    return NULL;
  LocalArg la;
  size_t len;
  if (local_get_with_length(obj, REGION, length_o, &la, &len) < 0)
    return NULL;
  if (eng_enter(self) < 0) {
    local_release(&la);
    return NULL;
  }
  CallResult r;
  ENGINE_CALL(self, r, ferry_memory_register(self->eng, la.ptr, len));
  if (r.st != FERRY_OK) {
    local_release(&la);
    return raise_result(&r);
  }
  if (la.has_view) {
    la.has_view = 0;
    if (hold_view(self, &la.view) < 0)
      return NULL;
  }
  return PyLong_FromVoidPtr(la.ptr);
}

/* An address argument that may also be given as a buffer object. */
static int addr_arg(PyObject *obj, void **out) {
  LocalArg la;
  if (local_get(obj, NULL, &la) < 0)
    return -1;
  *out = la.ptr;
  local_release(&la);
  return 0;
}

static PyObject *engine_unregister(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"addr", NULL};
  PyObject *obj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:unregister", kwlist, &obj))
    return NULL;
  void *addr;
  if (addr_arg(obj, &addr) < 0 || eng_enter(self) < 0)
    return NULL;
  CallResult r;
  ENGINE_CALL(self, r, ferry_memory_unregister(self->eng, addr));
  if (r.st != FERRY_OK)
    return raise_result(&r);
  unhold(self, addr);
  Py_RETURN_NONE;
}

static PyObject *engine_register_batch(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"items", "lengths", NULL};
  PyObject *items_o, *lengths_o = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:register_batch", kwlist, &items_o, &lengths_o))
    return NULL;
  PyObject *items = PySequence_Fast(items_o, "items must be a sequence of addresses or buffers");
  if (!items)
    return NULL;
  PyObject *lens = NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  if (lengths_o != Py_None) {
    lens = PySequence_Fast(lengths_o, "lengths must be a sequence");
    if (!lens) {
      Py_DECREF(items);
      return NULL;
    }
    if (PySequence_Fast_GET_SIZE(lens) != n) {
      PyErr_Format(PyExc_ValueError, "%zd items but %zd lengths", n,
                   PySequence_Fast_GET_SIZE(lens));
      Py_DECREF(items);
      Py_DECREF(lens);
      return NULL;
    }
  }
  size_t cap = n ? (size_t)n : 1;
  void **addrs = PyMem_Calloc(cap, sizeof *addrs);
  size_t *lengths = PyMem_Calloc(cap, sizeof *lengths);
  LocalArg *las = PyMem_Calloc(cap, sizeof *las);
  PyObject *result = NULL;
  Py_ssize_t got = 0;
  if (!addrs || !lengths || !las) {
    PyErr_NoMemory();
    goto out;
  }
  for (; got < n; got++) {
    if (local_get_with_length(PySequence_Fast_GET_ITEM(items, got), REGION,
                              lens ? PySequence_Fast_GET_ITEM(lens, got) : Py_None, &las[got],
                              &lengths[got]) < 0)
      goto out;
    addrs[got] = las[got].ptr;
  }
  if (eng_enter(self) < 0)
    goto out;
  CallResult r;
  ENGINE_CALL(self, r, ferry_memory_register_batch(self->eng, addrs, lengths, (size_t)n));
  if (r.st != FERRY_OK) {
    raise_result(&r);
    goto out;
  }
  result = PyList_New(n);
  for (Py_ssize_t i = 0; i < n; i++) {
    if (las[i].has_view) {
      las[i].has_view = 0;
      if (hold_view(self, &las[i].view) < 0)
        Py_CLEAR(result);
    }
    if (result) {
      PyObject *a = PyLong_FromVoidPtr(addrs[i]);
      if (!a)
        Py_CLEAR(result);
      else
        PyList_SET_ITEM(result, i, a);
    }
  }
out:
  for (Py_ssize_t i = 0; i < got; i++)
    local_release(&las[i]);
  PyMem_Free(addrs);
  PyMem_Free(lengths);
  PyMem_Free(las);
  Py_DECREF(items);
  Py_XDECREF(lens);
  return result;
}

static PyObject *engine_unregister_batch(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"addrs", NULL};
  PyObject *items_o;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:unregister_batch", kwlist, &items_o))
    return NULL;
  PyObject *items = PySequence_Fast(items_o, "addrs must be a sequence");
  if (!items)
    return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
  void **addrs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *addrs);
  PyObject *result = NULL;
  if (!addrs) {
    PyErr_NoMemory();
    goto out;
  }
  for (Py_ssize_t i = 0; i < n; i++)
    if (addr_arg(PySequence_Fast_GET_ITEM(items, i), &addrs[i]) < 0)
      goto out;
  if (eng_enter(self) < 0)
    goto out;
  CallResult r;
  ENGINE_CALL(self, r, ferry_memory_unregister_batch(self->eng, addrs, (size_t)n));
  if (r.st != FERRY_OK) {
    raise_result(&r);
    goto out;
  }
  for (Py_ssize_t i = 0; i < n; i++)
    unhold(self, addrs[i]);
  result = Py_None;
  Py_INCREF(result);
out:
  PyMem_Free(addrs);
  Py_DECREF(items);
  return result;
}

static PyObject *engine_alloc(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"length", NULL};
  PyObject *len_o;
  size_t len;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:alloc", kwlist, &len_o) ||
      as_size(len_o, &len) < 0 || eng_enter(self) < 0)
    return NULL;
  void *p = NULL;
  CallResult r;
  ENGINE_CALL(self, r, ferry_memory_alloc(self->eng, len, &p));
  if (r.st != FERRY_OK)
    return raise_result(&r);
  return PyLong_FromVoidPtr(p);
}

static PyObject *engine_free(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"addr", NULL};
  PyObject *a_o;
  uint64_t a;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O:free", kwlist, &a_o) || as_u64(a_o, &a) < 0 ||
      eng_enter(self) < 0)
    return NULL;
  CallResult r;
  ENGINE_CALL(self, r, ferry_memory_free(self->eng, (void *)(uintptr_t)a));
  return none_or_raise(&r);
}

/* ---- transfers ------------------------------------------------------- */

static PyObject *engine_transfer_one(EngineObject *self, PyObject *args, PyObject *kwds,
                                     ferry_op op, const char *fmt) {
  static char *kwlist[] = {"target", "local", "remote_addr", "length", NULL};
  const char *target;
  PyObject *local_o, *remote_o, *len_o = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, fmt, kwlist, &target, &local_o, &remote_o, &len_o))
    return NULL;
  uint64_t remote;
  if (as_u64(remote_o, &remote) < 0)
    return NULL;
  LocalArg la;
  size_t len;
  if (local_get_with_length(local_o, op == FERRY_OP_READ ? READ_DESTINATION : NULL, len_o, &la,
                            &len) < 0)
    return NULL;
  if (eng_enter(self) < 0) {
    local_release(&la);
    return NULL;
  }
  CallResult r;
  ENGINE_CALL(self, r, ferry_transfer_sync(self->eng, target, op, la.ptr, remote, len));
  local_release(&la);
  return none_or_raise(&r);
}

static PyObject *engine_write(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_transfer_one(self, args, kwds, FERRY_OP_WRITE, "sOO|O:write");
}

static PyObject *engine_read(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_transfer_one(self, args, kwds, FERRY_OP_READ, "sOO|O:read");
}

/* Drops a parsed request that will not be (or no longer needs to be) kept. */
static void request_release(EntryList *l, NotifyArg *na) {
  entries_release(l);
  notify_release(na);
}

/* Runs a parsed entry list synchronously; consumes l and na. */
static PyObject *run_sync(EngineObject *self, const char *target, EntryList *l, NotifyArg *na) {
  if (eng_enter(self) < 0) {
    request_release(l, na);
    return NULL;
  }
  CallResult r;
  ENGINE_CALL(
      self, r,
      ferry_transfer_sync_batch(self->eng, target, l->e, l->n, na->present ? &na->n : NULL));
  request_release(l, na);
  return none_or_raise(&r);
}

/* Submits a parsed entry list; the Batch takes l's views and na. */
static PyObject *run_submit(EngineObject *self, const char *target, EntryList *l, NotifyArg *na) {
  BatchObject *b = PyObject_New(BatchObject, &BatchType);
  if (!b) {
    request_release(l, na);
    return NULL;
  }
  b->engine = NULL;
  b->b = NULL;
  memset(&b->entries, 0, sizeof b->entries);
  memset(&b->notify, 0, sizeof b->notify);
  b->busy = 0;
  b->free_pending = 0;
  b->state = FERRY_BATCH_PENDING;
  b->error = 0;
  b->detail = NULL;
  if (eng_enter(self) < 0) {
    request_release(l, na);
    Py_DECREF(b);
    return NULL;
  }
  ferry_batch *fb = NULL;
  CallResult r;
  ENGINE_CALL(self, r,
              ferry_batch_submit(self->eng, target, l->e, l->n, na->present ? &na->n : NULL, &fb));
  /* The library copied the entries; keep only the buffer views. */
  PyMem_Free(l->e);
  l->e = NULL;
  if (r.st != FERRY_OK) {
    request_release(l, na);
    Py_DECREF(b);
    return raise_result(&r);
  }
  b->b = fb;
  b->entries = *l;
  memset(l, 0, sizeof *l);
  b->notify = *na;
  memset(na, 0, sizeof *na);
  Py_INCREF(self);
  b->engine = self;
  return (PyObject *)b;
}

/* How transfer_batch(), submit() and their *_arrays forms take entries and
 * what they do with them. */
enum { ENTRY_TUPLES, PARALLEL_ARRAYS };
enum { RUN_NOW, SUBMIT_BATCH };

/* Parses (target, entries | op + three integer sequences, notify), then runs
 * the transfer synchronously or submits it as a Batch. */
static PyObject *engine_request(EngineObject *self, PyObject *args, PyObject *kwds, const char *fmt,
                                int form, int mode) {
  static char *tuples_kwlist[] = {"target", "entries", "notify", NULL};
  static char *arrays_kwlist[] = {"target",  "op",     "local_addrs", "remote_addrs",
                                  "lengths", "notify", NULL};
  const char *target;
  PyObject *entries = NULL, *op = NULL, *locals = NULL, *remotes = NULL, *lengths = NULL;
  PyObject *notify = Py_None;
  int ok =
      form == PARALLEL_ARRAYS
          ? PyArg_ParseTupleAndKeywords(args, kwds, fmt, arrays_kwlist, &target, &op, &locals,
                                        &remotes, &lengths, &notify)
          : PyArg_ParseTupleAndKeywords(args, kwds, fmt, tuples_kwlist, &target, &entries, &notify);
  if (!ok)
    return NULL;
  NotifyArg na;
  if (notify_get(notify, &na) < 0)
    return NULL;
  EntryList l;
  int parsed = form == PARALLEL_ARRAYS ? arrays_parse(op, locals, remotes, lengths, &l)
                                       : entries_parse(entries, &l);
  if (parsed < 0) {
    notify_release(&na);
    return NULL;
  }
  return mode == SUBMIT_BATCH ? run_submit(self, target, &l, &na) : run_sync(self, target, &l, &na);
}

static PyObject *engine_transfer_batch(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_request(self, args, kwds, "sO|O:transfer_batch", ENTRY_TUPLES, RUN_NOW);
}

static PyObject *engine_submit(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_request(self, args, kwds, "sO|O:submit", ENTRY_TUPLES, SUBMIT_BATCH);
}

static PyObject *engine_transfer_arrays(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_request(self, args, kwds, "sOOOO|O:transfer_arrays", PARALLEL_ARRAYS, RUN_NOW);
}

static PyObject *engine_submit_arrays(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_request(self, args, kwds, "sOOOO|O:submit_arrays", PARALLEL_ARRAYS, SUBMIT_BATCH);
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

/* {"read": v[FERRY_OP_READ], "write": v[FERRY_OP_WRITE]} */
static PyObject *by_op(const uint64_t v[2]) {
  return Py_BuildValue("{sKsK}", "read", (unsigned long long)v[FERRY_OP_READ], "write",
                       (unsigned long long)v[FERRY_OP_WRITE]);
}

/* Sets d[key] = value, consuming value; -1 on error. */
static int put(PyObject *d, const char *key, PyObject *value) {
  int rc = value ? PyDict_SetItemString(d, key, value) : -1;
  Py_XDECREF(value);
  return rc;
}

static PyObject *link_dict(const ferry_stats_link *l) {
  PyObject *d = PyDict_New();
  if (d &&
      (put(d, "peer",
           PyUnicode_DecodeUTF8(l->peer, (Py_ssize_t)strlen(l->peer), "surrogateescape")) < 0 ||
       put(d, "transport", PyUnicode_FromString(l->transport)) < 0 ||
       put(d, "bytes", by_op(l->bytes)) < 0 || put(d, "ops", by_op(l->ops)) < 0 ||
       put(d, "connections_opened", PyLong_FromUnsignedLongLong(l->connections_opened)) < 0))
    Py_CLEAR(d);
  return d;
}

/* The links, and their bytes and ops summed into totals[0..1], [2..3]. */
static PyObject *links_list(const ferry_stats *s, uint64_t totals[4]) {
  PyObject *list = PyList_New((Py_ssize_t)s->link_count);
  for (size_t i = 0; list && i < s->link_count; i++) {
    PyObject *d = link_dict(&s->links[i]);
    if (!d)
      Py_CLEAR(list);
    else
      PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    for (int op = 0; op < 2; op++) {
      totals[op] += s->links[i].bytes[op];
      totals[2 + op] += s->links[i].ops[op];
    }
  }
  return list;
}

/* {code: count} for the codes that occurred (keys are ferry.E* values). */
static PyObject *errors_dict(const ferry_stats *s) {
  PyObject *d = PyDict_New();
  for (int i = 1; d && i < FERRY_STATS_CODES; i++) {
    if (!s->errors[i])
      continue;
    PyObject *k = PyLong_FromLong(-i), *v = PyLong_FromUnsignedLongLong(s->errors[i]);
    if (!k || !v || PyDict_SetItem(d, k, v) < 0)
      Py_CLEAR(d);
    Py_XDECREF(k);
    Py_XDECREF(v);
  }
  return d;
}

static PyObject *latency_dict(const ferry_stats *s) {
  PyObject *buckets = PyList_New(FERRY_STATS_LATENCY_BUCKETS);
  for (int i = 0; buckets && i < FERRY_STATS_LATENCY_BUCKETS; i++) {
    PyObject *t =
        Py_BuildValue("(dK)", s->latency_le[i], (unsigned long long)s->latency_buckets[i]);
    if (!t)
      Py_CLEAR(buckets);
    else
      PyList_SET_ITEM(buckets, i, t);
  }
  if (!buckets)
    return NULL;
  return Py_BuildValue("{sNsdsK}", "buckets", buckets, "sum_seconds", s->latency_sum_seconds,
                       "count", (unsigned long long)s->latency_count);
}

static PyObject *stats_dict(const ferry_stats *s) {
  uint64_t totals[4] = {0, 0, 0, 0};
  PyObject *d = PyDict_New();
  if (d &&
      (put(d, "links", links_list(s, totals)) < 0 || put(d, "bytes", by_op(totals)) < 0 ||
       put(d, "ops", by_op(totals + 2)) < 0 || put(d, "served_bytes", by_op(s->served_bytes)) < 0 ||
       put(d, "served_requests", by_op(s->served_requests)) < 0 ||
       put(d, "errors", errors_dict(s)) < 0 ||
       put(d, "batches_in_flight", PyLong_FromUnsignedLongLong(s->batches_in_flight)) < 0 ||
       put(d, "registered_bytes", PyLong_FromUnsignedLongLong(s->registered_bytes)) < 0 ||
       put(d, "registered_regions", PyLong_FromUnsignedLongLong(s->registered_regions)) < 0 ||
       put(d, "notifications_queued", PyLong_FromUnsignedLongLong(s->notifications_queued)) < 0 ||
       put(d, "control_connections_opened",
           PyLong_FromUnsignedLongLong(s->control_connections_opened)) < 0 ||
       put(d, "sync_latency", latency_dict(s)) < 0 ||
       put(d, "pool_messages_landed", PyLong_FromUnsignedLongLong(s->pool_messages_landed)) < 0 ||
       put(d, "pool_landed_inband", PyLong_FromUnsignedLongLong(s->pool_landed_inband)) < 0 ||
       put(d, "pool_senders_waiting", PyLong_FromUnsignedLongLong(s->pool_senders_waiting)) < 0 ||
       put(d, "pool_bytes_granted", PyLong_FromUnsignedLongLong(s->pool_bytes_granted)) < 0))
    Py_CLEAR(d);
  return d;
}

static PyObject *engine_stats(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  if (eng_enter(self) < 0)
    return NULL;
  ferry_stats *s = NULL;
  CallResult r;
  ENGINE_CALL(self, r, ferry_stats_snapshot(self->eng, &s));
  if (r.st != FERRY_OK)
    return raise_result(&r);
  PyObject *d = stats_dict(s);
  ferry_stats_free(s);
  return d;
}

static PyObject *engine_stats_text(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  if (eng_enter(self) < 0)
    return NULL;
  ferry_stats *s = NULL;
  CallResult r;
  ENGINE_CALL(self, r, ferry_stats_snapshot(self->eng, &s));
  if (r.st != FERRY_OK)
    return raise_result(&r);
  char *text = NULL;
  ferry_status st = ferry_stats_prometheus(s, &text);
  ferry_stats_free(s);
  if (st != FERRY_OK)
    return raise_status(st, ferry_last_error());
  PyObject *o = PyUnicode_FromString(text);
  free(text);
  return o;
}

static PyObject *engine_close(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  engine_close_impl(self);
  Py_RETURN_NONE;
}

static PyObject *engine_enter_ctx(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  if (!self->eng)
    return raise_closed();
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *engine_exit_ctx(EngineObject *self, PyObject *Py_UNUSED(args)) {
  engine_close_impl(self);
  Py_RETURN_FALSE;
}

#define KW(fn) (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS

/* ---- receive pools ---------------------------------------------------- */

/* A Pool holds its Engine; a Message holds its Pool. A message's slot goes
 * back to the pool on release() (or leaving its `with`) once no view of its
 * bytes remains (numpy/torch arrays made with frombuffer are views), so a
 * slot is never reused under a live array. A pool refuses close() while a
 * view of one of its messages lives. */
typedef struct {
  PyObject_HEAD EngineObject *engine;
  ferry_pool *pool;
  PyObject *name;
  size_t length;
  int has_view;
  Py_buffer view; /* user memory the pool lives in */
  long views;     /* exported views of its messages */
} PoolObject;

typedef struct {
  PyObject_HEAD PoolObject *pool;
  ferry_message m;
  long exports;
  int release_pending, released;
} MessageObject;

static PyTypeObject PoolType;
static PyTypeObject MessageType;

static int pool_alive(PoolObject *self) {
  if (!self->pool) {
    raise_status(FERRY_EINVAL, "the pool has been closed");
    return -1;
  }
  return eng_enter(self->engine);
}

static void pool_close_now(PoolObject *self) {
  ferry_pool *p = self->pool;
  self->pool = NULL;
  if (p && self->engine && self->engine->eng && !self->engine->closing) {
    CallResult r;
    self->engine->active++;
    ENGINE_CALL(self->engine, r, ferry_pool_destroy(self->engine->eng, p));
  }
  if (self->has_view) {
    PyBuffer_Release(&self->view);
    self->has_view = 0;
  }
}

static PyObject *pool_close(PoolObject *self, PyObject *Py_UNUSED(noargs)) {
  if (self->views) {
    PyErr_Format(PyExc_BufferError, "pool %S: %ld views of received messages are still alive",
                 self->name, self->views);
    return NULL;
  }
  pool_close_now(self);
  Py_RETURN_NONE;
}

static void pool_dealloc(PoolObject *self) {
  pool_close_now(self); /* no message refers to it any more: they hold it */
  Py_XDECREF(self->name);
  Py_XDECREF(self->engine);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pool_fileno(PoolObject *self, PyObject *Py_UNUSED(noargs)) {
  if (!self->pool)
    return raise_status(FERRY_EINVAL, "the pool has been closed");
  return PyLong_FromLong(ferry_pool_fd(self->pool));
}

static PyObject *pool_enter_ctx(PoolObject *self, PyObject *Py_UNUSED(noargs)) {
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *pool_exit_ctx(PoolObject *self, PyObject *Py_UNUSED(args)) {
  return pool_close(self, NULL);
}

static PyObject *pool_get_name(PoolObject *self, void *Py_UNUSED(c)) {
  Py_INCREF(self->name);
  return self->name;
}

static PyObject *pool_get_size(PoolObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromSize_t(self->length);
}

static PyMethodDef pool_methods[] = {
    {"fileno", (PyCFunction)pool_fileno, METH_NOARGS,
     "fileno() -> int: readable while a message waits (for loop.add_reader)"},
    {"close", (PyCFunction)pool_close, METH_NOARGS, "close(): destroys the pool"},
    {"__enter__", (PyCFunction)pool_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)pool_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef pool_getset[] = {
    {"name", (getter)pool_get_name, NULL, "the name senders pass", NULL},
    {"size", (getter)pool_get_size, NULL, "bytes in the pool", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Pool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A receive pool, from Engine.create_pool(name, buffer_or_size).",
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};

/* Gives the slot back now (views are gone). */
static void message_release_now(MessageObject *self) {
  self->released = 1;
  PoolObject *pool = self->pool;
  if (!pool->pool || !pool->engine->eng || pool->engine->closing)
    return;
  pool->engine->active++;
  CallResult r;
  ENGINE_CALL(pool->engine, r, ferry_pool_release(pool->engine->eng, pool->pool, self->m.slot));
}

static PyObject *message_release(MessageObject *self, PyObject *Py_UNUSED(noargs)) {
  if (self->released || self->release_pending)
    Py_RETURN_NONE;
  if (self->exports)
    self->release_pending = 1; /* the last view's release gives the slot back */
  else
    message_release_now(self);
  Py_RETURN_NONE;
}

static int message_getbuffer(MessageObject *self, Py_buffer *view, int flags) {
  if (self->released || self->release_pending || !self->pool->pool) {
    PyErr_SetString(PyExc_BufferError, "the message was released");
    view->obj = NULL;
    return -1;
  }
  if (PyBuffer_FillInfo(view, (PyObject *)self, self->m.addr, (Py_ssize_t)self->m.length, 0,
                        flags) < 0)
    return -1;
  self->exports++;
  self->pool->views++;
  return 0;
}

static void message_releasebuffer(MessageObject *self, Py_buffer *Py_UNUSED(view)) {
  self->pool->views--;
  if (--self->exports == 0 && self->release_pending)
    message_release_now(self);
}

static PyBufferProcs message_as_buffer = {(getbufferproc)message_getbuffer,
                                          (releasebufferproc)message_releasebuffer};

static void message_dealloc(MessageObject *self) {
  if (!self->released)
    message_release_now(self); /* no view can remain: each holds the message */
  Py_XDECREF(self->pool);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *message_get_tag(MessageObject *self, void *Py_UNUSED(c)) {
  return PyBytes_FromStringAndSize((const char *)self->m.tag, (Py_ssize_t)self->m.tag_len);
}

static PyObject *message_get_sender(MessageObject *self, void *Py_UNUSED(c)) {
  return PyUnicode_DecodeUTF8(self->m.sender, (Py_ssize_t)strlen(self->m.sender), "replace");
}

static PyObject *message_get_slot(MessageObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromUnsignedLongLong(self->m.slot);
}

static Py_ssize_t message_len(MessageObject *self) { return (Py_ssize_t)self->m.length; }

static PyObject *message_enter_ctx(MessageObject *self, PyObject *Py_UNUSED(noargs)) {
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *message_exit_ctx(MessageObject *self, PyObject *Py_UNUSED(args)) {
  return message_release(self, NULL);
}

static PyMethodDef message_methods[] = {
    {"release", (PyCFunction)message_release, METH_NOARGS,
     "release(): gives the slot back (once no view of the bytes remains)"},
    {"__enter__", (PyCFunction)message_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)message_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef message_getset[] = {
    {"tag", (getter)message_get_tag, NULL, "the tag it was sent under (bytes)", NULL},
    {"sender", (getter)message_get_sender, NULL, "the sending engine's name", NULL},
    {"slot", (getter)message_get_slot, NULL, "its slot in the pool", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods message_as_sequence = {.sq_length = (lenfunc)message_len};

static PyTypeObject MessageType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Message",
    .tp_basicsize = sizeof(MessageObject),
    .tp_dealloc = (destructor)message_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A received message: its bytes in place (buffer protocol), .tag, .sender,\n"
              ".release(), and a context manager that releases it.",
    .tp_methods = message_methods,
    .tp_getset = message_getset,
    .tp_as_buffer = &message_as_buffer,
    .tp_as_sequence = &message_as_sequence,
};

static PyObject *engine_create_pool(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"name", "buffer_or_size", NULL};
  PyObject *name, *what;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "UO:create_pool", kwlist, &name, &what))
    return NULL;
  PoolObject *pool = PyObject_New(PoolObject, &PoolType);
  if (!pool)
    return NULL;
  pool->engine = NULL;
  pool->pool = NULL;
  pool->has_view = 0;
  pool->views = 0;
  Py_INCREF(name);
  pool->name = name;
  void *addr = NULL;
  if (PyLong_Check(what)) {
    if (as_size(what, &pool->length) < 0)
      goto fail;
  } else {
    if (PyObject_GetBuffer(what, &pool->view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE) < 0)
      goto fail;
    pool->has_view = 1;
    addr = pool->view.buf;
    pool->length = (size_t)pool->view.len;
  }
  if (eng_enter(self) < 0)
    goto fail;
  Py_INCREF(self);
  pool->engine = self;
  const char *cname = PyUnicode_AsUTF8(name);
  CallResult r;
  if (!cname) {
    eng_leave(self);
    goto fail;
  }
  ENGINE_CALL(self, r, ferry_pool_create(self->eng, cname, addr, pool->length, &pool->pool));
  if (r.st == FERRY_OK)
    return (PyObject *)pool;
  raise_result(&r);
fail:
  Py_DECREF(pool);
  return NULL;
}

/* timeout in seconds (None: no bound) as ferry milliseconds. */
static int timeout_ms_arg(PyObject *o, int64_t *ms) {
  if (!o || o == Py_None) {
    *ms = -1;
    return 0;
  }
  double s = PyFloat_AsDouble(o);
  if (s == -1.0 && PyErr_Occurred())
    return -1;
  *ms = s <= 0 ? 0 : (int64_t)(s * 1000.0 + 0.5);
  return 0;
}

static PyObject *engine_recv(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"pool", "tag", "timeout", NULL};
  PoolObject *pool;
  PyObject *tag_o = Py_None, *timeout_o = Py_None;
  int64_t ms;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|OO:recv", kwlist, &PoolType, &pool, &tag_o,
                                   &timeout_o) ||
      timeout_ms_arg(timeout_o, &ms) < 0)
    return NULL;
  PyObject *tag = tag_o == Py_None ? NULL : to_bytes(tag_o);
  if (tag_o != Py_None && !tag)
    return NULL;
  MessageObject *msg = PyObject_New(MessageObject, &MessageType);
  if (msg) {
    Py_INCREF(pool);
    msg->pool = pool;
    msg->exports = 0;
    msg->release_pending = 0;
    msg->released = 1; /* until recv succeeds */
  }
  if (!msg || pool_alive(pool) < 0) {
    Py_XDECREF(tag);
    Py_XDECREF(msg);
    return NULL;
  }
  const void *tp = tag ? PyBytes_AS_STRING(tag) : NULL;
  size_t tl = tag ? (size_t)PyBytes_GET_SIZE(tag) : 0;
  CallResult r;
  ENGINE_CALL(pool->engine, r, ferry_recv(pool->engine->eng, pool->pool, tp, tl, ms, &msg->m));
  Py_XDECREF(tag);
  if (r.st != FERRY_OK) {
    Py_DECREF(msg);
    return raise_result(&r);
  }
  msg->released = 0;
  return (PyObject *)msg;
}

/* send's bytes must be registered: a buffer that is not gets registered for
 * the call (EOVERLAP: it lies inside a registered region already). */
static PyObject *engine_send(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"target", "pool", "tag", "data", "length", "timeout", "nowait", NULL};
  const char *target, *pool;
  PyObject *tag_o, *data_o, *length_o = Py_None, *timeout_o = Py_None;
  int nowait = 0;
  int64_t ms;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "ssOO|OOp:send", kwlist, &target, &pool, &tag_o,
                                   &data_o, &length_o, &timeout_o, &nowait) ||
      timeout_ms_arg(timeout_o, &ms) < 0)
    return NULL;
  PyObject *tag = to_bytes(tag_o);
  if (!tag)
    return NULL;
  LocalArg la;
  size_t len;
  if (local_get_with_length(data_o, 0, length_o, &la, &len) < 0) {
    Py_DECREF(tag);
    return NULL;
  }
  if (eng_enter(self) < 0) {
    local_release(&la);
    Py_DECREF(tag);
    return NULL;
  }
  const char *tp = PyBytes_AS_STRING(tag);
  size_t tl = (size_t)PyBytes_GET_SIZE(tag);
  unsigned flags = nowait ? FERRY_SEND_NOWAIT : 0;
  CallResult r;
  PyThreadState *ts = PyEval_SaveThread();
  int registered = la.has_view && ferry_memory_register(self->eng, la.ptr, len) == FERRY_OK;
  r.st = ferry_send(self->eng, target, pool, tp, tl, la.ptr, len, ms, flags);
  if (r.st != FERRY_OK)
    capture_error(r.err);
  if (registered)
    ferry_memory_unregister(self->eng, la.ptr);
  PyEval_RestoreThread(ts);
  eng_leave(self);
  local_release(&la);
  Py_DECREF(tag);
  return none_or_raise(&r);
}

/* The messages of send_batch: tags, buffers (registered for the call
 * when ferry does not know them yet) and the C items. */
typedef struct {
  Py_ssize_t count;
  PyObject **tags;
  LocalArg *locals;
  int *registered;
  ferry_send_item *items;
} SendItems;

static void send_items_free(SendItems *si) {
  for (Py_ssize_t i = 0; i < si->count; i++) {
    local_release(&si->locals[i]);
    Py_XDECREF(si->tags[i]);
  }
  PyMem_Free(si->tags);
  PyMem_Free(si->locals);
  PyMem_Free(si->registered);
  PyMem_Free(si->items);
}

/* items: a sequence of (tag, data) pairs; si starts zeroed, and is freed
 * by the caller either way. */
static int send_items_get(PyObject *items, SendItems *si) {
  PyObject *seq = PySequence_Fast(items, "send_batch: items must be a sequence of (tag, data)");
  if (!seq)
    return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  si->tags = PyMem_Calloc(n ? n : 1, sizeof *si->tags);
  si->locals = PyMem_Calloc(n ? n : 1, sizeof *si->locals);
  si->registered = PyMem_Calloc(n ? n : 1, sizeof *si->registered);
  si->items = PyMem_Calloc(n ? n : 1, sizeof *si->items);
  int rc = 0;
  if (!si->tags || !si->locals || !si->registered || !si->items) {
    PyErr_NoMemory();
    rc = -1;
  }
  for (Py_ssize_t i = 0; i < n && rc == 0; i++, si->count++) {
    PyObject *pair = PySequence_Fast_GET_ITEM(seq, i), *tag_o, *data_o;
    size_t len;
    if (!PyTuple_Check(pair)) {
      PyErr_Format(PyExc_TypeError, "send_batch: item %zd is not a (tag, data) tuple", i);
      rc = -1;
      break;
    }
    if (!PyArg_ParseTuple(pair, "OO:send_batch item", &tag_o, &data_o) ||
        !(si->tags[i] = to_bytes(tag_o)) ||
        local_get_with_length(data_o, 0, NULL, &si->locals[i], &len) < 0) {
      rc = -1;
      break;
    }
    si->items[i] =
        (ferry_send_item){PyBytes_AS_STRING(si->tags[i]), (size_t)PyBytes_GET_SIZE(si->tags[i]),
                          si->locals[i].ptr, len, FERRY_OK};
  }
  Py_DECREF(seq);
  return rc;
}

static PyObject *engine_send_batch(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"target", "pool", "items", "timeout", "nowait", NULL};
  const char *target, *pool;
  PyObject *items_o, *timeout_o = Py_None;
  int nowait = 0;
  int64_t ms;
  SendItems si = {0};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "ssO|Op:send_batch", kwlist, &target, &pool,
                                   &items_o, &timeout_o, &nowait) ||
      timeout_ms_arg(timeout_o, &ms) < 0)
    return NULL;
  if (send_items_get(items_o, &si) < 0 || eng_enter(self) < 0) {
    send_items_free(&si);
    return NULL;
  }
  CallResult r;
  PyThreadState *ts = PyEval_SaveThread();
  for (Py_ssize_t i = 0; i < si.count; i++)
    si.registered[i] =
        si.locals[i].has_view &&
        ferry_memory_register(self->eng, si.items[i].local, si.items[i].length) == FERRY_OK;
  r.st = ferry_send_batch(self->eng, target, pool, si.items, (size_t)si.count, ms,
                          nowait ? FERRY_SEND_NOWAIT : 0);
  if (r.st != FERRY_OK)
    capture_error(r.err);
  for (Py_ssize_t i = 0; i < si.count; i++)
    if (si.registered[i])
      ferry_memory_unregister(self->eng, si.items[i].local);
  PyEval_RestoreThread(ts);
  eng_leave(self);
  send_items_free(&si);
  return none_or_raise(&r);
}

static PyMethodDef engine_methods[] = {
    {"register", KW(engine_register),
     "register(buf_or_addr, length=None) -> int\n\nRegisters memory (an int address with a "
     "length, or a buffer object, held until unregistered) and returns its address. A read-only "
     "buffer (bytes) may be registered to serve as a WRITE source, but peers can write into any "
     "registered memory: register read-only objects only with trusted peers."},
    {"unregister", KW(engine_unregister), "unregister(addr)"},
    {"register_batch", KW(engine_register_batch),
     "register_batch(items, lengths=None) -> list of addresses"},
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

static PyTypeObject EngineType = {
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

/* ---- Batch ------------------------------------------------------------ */

static void batch_free_now(BatchObject *self);

/* A batch handle stays valid after its engine is closed (libferry keeps
 * it), so only a freed batch is refused. */
static int batch_enter(BatchObject *self) {
  if (!self->b) {
    raise_status(FERRY_EINVAL, "the batch has been freed");
    return -1;
  }
  self->busy++;
  return 0;
}

static void batch_leave(BatchObject *self) {
  if (--self->busy == 0 && self->free_pending)
    batch_free_now(self);
}

static void batch_record(BatchObject *self, int state, ferry_status st, const char *err) {
  self->state = state;
  if (state == FERRY_BATCH_FAILED || state == FERRY_BATCH_TIMEDOUT) {
    self->error = st;
    PyObject *d = PyUnicode_DecodeUTF8(err, (Py_ssize_t)strlen(err), "replace");
    if (!d)
      PyErr_Clear();
    Py_XSETREF(self->detail, d);
  }
}

static PyObject *batch_status(BatchObject *self, PyObject *Py_UNUSED(noargs)) {
  if (self->state != FERRY_BATCH_PENDING)
    return PyLong_FromLong(self->state);
  if (batch_enter(self) < 0)
    return NULL;
  ferry_batch_state state;
  ferry_status st = FERRY_OK;
  char err[ERRBUF_SIZE];
  err[0] = 0;
  ferry_batch *fb = self->b;
  PyThreadState *ts_ = PyEval_SaveThread();
  state = ferry_batch_status(fb, &st);
  if (state == FERRY_BATCH_FAILED || state == FERRY_BATCH_TIMEDOUT)
    capture_error(err);
  PyEval_RestoreThread(ts_);
  batch_leave(self);
  batch_record(self, state, st, err);
  return PyLong_FromLong(state);
}

static PyObject *batch_wait(BatchObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"timeout_ms", NULL};
  long long timeout = -1;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|L:wait", kwlist, &timeout))
    return NULL;
  if (self->state == FERRY_BATCH_DONE)
    Py_RETURN_TRUE;
  if (self->state != FERRY_BATCH_PENDING)
    return raise_status((ferry_status)self->error,
                        self->detail ? PyUnicode_AsUTF8(self->detail) : "");
  if (batch_enter(self) < 0)
    return NULL;
  ferry_batch *fb = self->b;
  ferry_status st;
  ferry_status cause = FERRY_OK;
  ferry_batch_state state = FERRY_BATCH_PENDING;
  char err[ERRBUF_SIZE];
  err[0] = 0;
  PyThreadState *ts_ = PyEval_SaveThread();
  st = ferry_batch_wait(fb, (int64_t)timeout);
  if (st != FERRY_OK && st != FERRY_EINPROGRESS) {
    capture_error(err);
    state = ferry_batch_status(fb, &cause);
    if (state == FERRY_BATCH_PENDING)
      state = st == FERRY_ETIMEDOUT ? FERRY_BATCH_TIMEDOUT : FERRY_BATCH_FAILED;
  } else if (st == FERRY_OK) {
    state = FERRY_BATCH_DONE;
  }
  PyEval_RestoreThread(ts_);
  batch_leave(self);
  if (st == FERRY_EINPROGRESS)
    Py_RETURN_FALSE;
  batch_record(self, state, st, err);
  if (st != FERRY_OK)
    return raise_status(st, err);
  Py_RETURN_TRUE;
}

/* Frees the ferry batch (waiting for it if pending, bounded by its deadline)
 * and drops the memory it held; its final state stays readable. */
static void batch_free_now(BatchObject *self) {
  ferry_batch *fb = self->b;
  int known = self->state != FERRY_BATCH_PENDING;
  BatchOutcome out;
  self->b = NULL;
  self->free_pending = 0;
  PyThreadState *ts_ = PyEval_SaveThread();
  if (known)
    ferry_batch_free(fb);
  else
    batch_finish_nogil(fb, &out);
  PyEval_RestoreThread(ts_);
  if (!known)
    batch_record(self, out.state, out.error, out.detail);
  batch_release_memory(self);
}

/* A batch another thread is waiting on is freed when that thread is done. */
static void batch_free_impl(BatchObject *self) {
  if (!self->b)
    batch_release_memory(self);
  else if (self->busy)
    self->free_pending = 1;
  else
    batch_free_now(self);
}

static PyObject *batch_free(BatchObject *self, PyObject *Py_UNUSED(noargs)) {
  batch_free_impl(self);
  Py_RETURN_NONE;
}

static PyObject *batch_enter_ctx(BatchObject *self, PyObject *Py_UNUSED(noargs)) {
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *batch_exit_ctx(BatchObject *self, PyObject *Py_UNUSED(args)) {
  batch_free_impl(self);
  Py_RETURN_FALSE;
}

static void batch_dealloc(BatchObject *self) {
  if (self->engine) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    batch_free_impl(self);
    PyErr_Restore(et, ev, tb);
  } else {
    batch_release_memory(self);
  }
  Py_CLEAR(self->detail);
  Py_CLEAR(self->engine);
  PyObject_Free(self);
}

static PyObject *batch_get_error(BatchObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromLong(self->error);
}

static PyObject *batch_get_detail(BatchObject *self, void *Py_UNUSED(c)) {
  if (self->detail) {
    Py_INCREF(self->detail);
    return self->detail;
  }
  Py_RETURN_NONE;
}

static PyObject *batch_get_state(BatchObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromLong(self->state);
}

static PyObject *batch_get_freed(BatchObject *self, void *Py_UNUSED(c)) {
  return PyBool_FromLong(self->b == NULL);
}

static PyMethodDef batch_methods[] = {
    {"status", (PyCFunction)batch_status, METH_NOARGS,
     "status() -> BATCH_PENDING, BATCH_DONE, BATCH_FAILED or BATCH_TIMEDOUT (never blocks)"},
    {"wait", KW(batch_wait),
     "wait(timeout_ms=-1) -> bool\n\nTrue when done, False if still pending after timeout_ms; "
     "raises ferry.Error if the batch failed. -1 waits up to the batch's own deadline."},
    {"free", (PyCFunction)batch_free, METH_NOARGS,
     "free(): releases the batch (a pending one is waited for, bounded by its deadline)"},
    {"__enter__", (PyCFunction)batch_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)batch_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef batch_getset[] = {
    {"error", (getter)batch_get_error, NULL, "ferry_status of a failed batch, else 0", NULL},
    {"detail", (getter)batch_get_detail, NULL, "error detail of a failed batch, else None", NULL},
    {"state", (getter)batch_get_state, NULL, "last state seen by status() or wait()", NULL},
    {"freed", (getter)batch_get_freed, NULL, "True once freed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An asynchronous batch from Engine.submit(); free it (or use `with`).",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
};

/* ======================================================================
 * Module
 * ====================================================================== */

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

static PyObject *mod_set_log_level(PyObject *Py_UNUSED(m), PyObject *arg) {
  ferry_log_level lv;
  if (parse_log_level(arg, &lv) < 0)
    return NULL;
  ferry_log_set_level(lv);
  Py_RETURN_NONE;
}

static PyObject *mod_get_log_level(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs)) {
  return PyLong_FromLong(ferry_log_get_level());
}

/* ---- libferry's log lines into Python's `logging` ----------------------
 *
 * The handler runs on whatever thread emits the line, often one of
 * libferry's own, possibly with engine locks held. It never takes the GIL
 * or runs Python: it copies the line into a bounded queue and wakes the
 * package's drain thread (ferry/__init__.py), which hands the lines to the
 * logger "ferry" with no libferry lock held. A full queue drops lines and
 * says how many in the next one. */

#define LOG_QUEUE_MAX 1024

typedef struct queued_line {
  int level;
  uint64_t time_ns;
  long thread;
  char engine[LOG_ENGINE_MAX];
  char message[1024];
} queued_line;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t log_ready = PTHREAD_COND_INITIALIZER;
static queued_line *log_queue; /* LOG_QUEUE_MAX slots, allocated on first use */
static size_t log_head, log_count;
static unsigned long log_dropped;

static void queue_log_line(const ferry_log_record *r, void *arg) {
  (void)arg;
  pthread_mutex_lock(&log_lock);
  if (log_count == LOG_QUEUE_MAX) {
    log_dropped++;
  } else {
    queued_line *q = &log_queue[(log_head + log_count++) % LOG_QUEUE_MAX];
    q->level = r->level;
    q->time_ns = r->time_ns;
    q->thread = r->thread;
    snprintf(q->engine, sizeof q->engine, "%s", r->engine);
    snprintf(q->message, sizeof q->message, "%s", r->message);
    pthread_cond_signal(&log_ready);
  }
  pthread_mutex_unlock(&log_lock);
}

/* A fork while another thread queues a line must not leave the child's
 * queue locked forever. */
static void log_lock_take(void) { pthread_mutex_lock(&log_lock); }
static void log_lock_give(void) { pthread_mutex_unlock(&log_lock); }

/* _log_route(on): libferry's lines to the queue (True) or to stderr. */
static PyObject *mod_log_route(PyObject *Py_UNUSED(m), PyObject *arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0)
    return NULL;
  if (on && !log_queue) {
    if (!(log_queue = calloc(LOG_QUEUE_MAX, sizeof *log_queue)))
      return PyErr_NoMemory();
    pthread_atfork(log_lock_take, log_lock_give, log_lock_give);
  }
  PyThreadState *ts_ = PyEval_SaveThread(); /* a line being queued may finish */
  ferry_log_set_handler(on ? queue_log_line : NULL, NULL);
  PyEval_RestoreThread(ts_);
  Py_RETURN_NONE;
}

/* _log_wait(timeout_s): waits (without the GIL) until a line is queued or
 * the time is up; True if one is. */
static PyObject *mod_log_wait(PyObject *Py_UNUSED(m), PyObject *arg) {
  double timeout = PyFloat_AsDouble(arg);
  if (timeout == -1.0 && PyErr_Occurred())
    return NULL;
  int ready;
  PyThreadState *ts_ = PyEval_SaveThread();
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)timeout;
  until.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&log_lock);
  while (!log_count && !log_dropped)
    if (pthread_cond_timedwait(&log_ready, &log_lock, &until) != 0)
      break;
  ready = log_count || log_dropped;
  pthread_mutex_unlock(&log_lock);
  PyEval_RestoreThread(ts_);
  return PyBool_FromLong(ready);
}

/* _log_take() -> [(level, time_ns, thread, engine, message)], emptying the
 * queue. A drop is reported as a WARN line of its own. */
static PyObject *mod_log_take(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs)) {
  PyObject *list = PyList_New(0);
  if (!list)
    return NULL;
  pthread_mutex_lock(&log_lock);
  unsigned long dropped = log_dropped;
  log_dropped = 0;
  for (; log_count; log_count--, log_head = (log_head + 1) % LOG_QUEUE_MAX) {
    const queued_line *q = &log_queue[log_head];
    PyObject *t = Py_BuildValue("(iKlss)", q->level, (unsigned long long)q->time_ns, q->thread,
                                q->engine, q->message);
    if (!t || PyList_Append(list, t) < 0) {
      Py_XDECREF(t);
      PyErr_Clear(); /* the line is lost, not the queue */
      continue;
    }
    Py_DECREF(t);
  }
  pthread_mutex_unlock(&log_lock);
  if (dropped) {
    char msg[128];
    snprintf(msg, sizeof msg, "%lu log lines dropped: the queue to Python's logging was full",
             dropped);
    PyObject *t = Py_BuildValue("(iKlss)", FERRY_LOG_WARN, 0ULL, 0L, "", msg);
    if (!t || PyList_Append(list, t) < 0)
      PyErr_Clear();
    Py_XDECREF(t);
  }
  return list;
}

static PyMethodDef module_methods[] = {
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
      PyType_Ready(&BatchType) < 0 || PyType_Ready(&PoolType) < 0 || PyType_Ready(&MessageType) < 0)
    return NULL;
  PyObject *m = PyModule_Create(&ferry_module);
  if (!m)
    return NULL;
  Py_INCREF(&ErrorType);
  Py_INCREF(&EngineType);
  Py_INCREF(&BatchType);
  Py_INCREF(&PoolType);
  Py_INCREF(&MessageType);
  if (PyModule_AddObject(m, "Error", (PyObject *)&ErrorType) < 0 ||
      PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0 ||
      PyModule_AddObject(m, "Batch", (PyObject *)&BatchType) < 0 ||
      PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0 ||
      PyModule_AddObject(m, "Message", (PyObject *)&MessageType) < 0) {
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
      {"OP_READ", FERRY_OP_READ},
      {"OP_WRITE", FERRY_OP_WRITE},
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
