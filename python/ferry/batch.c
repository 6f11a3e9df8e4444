/* batch.c - transfers: write() and read() of one range, transfer_batch() and
 * submit() of (op, local, remote, length) entries, their *_arrays forms of
 * three integer sequences (a buffer of 8-byte integers is read in place),
 * each with an optional notification delivered after the data; and the Batch
 * type submit() returns, which holds its Engine and the buffer views its
 * entries point into until it is freed. */
#include "_ferry.h"

#include <stdio.h>
#include <string.h>

/* ---- arguments: op, notification, entries, arrays ---------------------- */

int as_op(PyObject *o, ferry_op *out) {
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

int notify_get(PyObject *obj, NotifyArg *na) {
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

void notify_release(NotifyArg *na) {
  Py_CLEAR(na->name);
  Py_CLEAR(na->data);
  na->present = 0;
}

void entries_release(EntryList *l) {
  for (size_t i = 0; i < l->nviews; i++)
    PyBuffer_Release(&l->views[i]);
  PyMem_Free(l->views);
  PyMem_Free(l->e);
  memset(l, 0, sizeof *l);
}

/* entries: sequence of (op, local, remote_addr, length); local an int address
 * or a buffer object (then length may be None for the whole buffer). */
int entries_parse(PyObject *entries, EntryList *l) {
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

/* ---- the Batch object, and how a batch ended ------------------------- */

typedef struct BatchObject BatchObject;

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

PyObject *engine_write(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_transfer_one(self, args, kwds, FERRY_OP_WRITE, "sOO|O:write");
}

PyObject *engine_read(EngineObject *self, PyObject *args, PyObject *kwds) {
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

PyObject *batch_object_new(void) {
  BatchObject *b = PyObject_New(BatchObject, &BatchType);
  if (!b)
    return NULL;
  b->engine = NULL;
  b->b = NULL;
  memset(&b->entries, 0, sizeof b->entries);
  memset(&b->notify, 0, sizeof b->notify);
  b->busy = 0;
  b->free_pending = 0;
  b->state = FERRY_BATCH_PENDING;
  b->error = 0;
  b->detail = NULL;
  return (PyObject *)b;
}

void batch_object_attach(PyObject *batch, EngineObject *engine, ferry_batch *fb, NotifyArg *na) {
  BatchObject *b = (BatchObject *)batch;
  b->b = fb;
  b->notify = *na;
  memset(na, 0, sizeof *na);
  Py_INCREF(engine);
  b->engine = engine;
}

void batch_object_keep_entries(PyObject *batch, EntryList *l) {
  BatchObject *b = (BatchObject *)batch;
  PyMem_Free(l->e);
  l->e = NULL;
  b->entries = *l;
  memset(l, 0, sizeof *l);
}

/* How a batch is submitted: ferry_batch_submit, or ordered on a CUDA
 * stream (ferry_batch_submit_on_stream), with a handle or none. */
typedef struct {
  int on_stream;
  uint64_t stream;
  int watch; /* 0: no Batch (the library logs a failure) */
} SubmitMode;

static const SubmitMode PLAIN_SUBMIT = {0, 0, 1};

/* Submits a parsed entry list; the Batch takes l's views and na. */
static PyObject *run_submit(EngineObject *self, const char *target, EntryList *l, NotifyArg *na,
                            const SubmitMode *how) {
  PyObject *b = batch_object_new();
  if (!b) {
    request_release(l, na);
    return NULL;
  }
  if (eng_enter(self) < 0) {
    request_release(l, na);
    Py_DECREF(b);
    return NULL;
  }
  ferry_batch *fb = NULL;
  CallResult r;
  const ferry_notification *note = na->present ? &na->n : NULL;
  if (how->on_stream)
    ENGINE_CALL(self, r,
                ferry_batch_submit_on_stream(self->eng, target, l->e, l->n, note,
                                             (void *)(uintptr_t)how->stream,
                                             how->watch ? &fb : NULL));
  else
    ENGINE_CALL(self, r, ferry_batch_submit(self->eng, target, l->e, l->n, note, &fb));
  /* The library copied the entries; keep only the buffer views. */
  PyMem_Free(l->e);
  l->e = NULL;
  if (r.st != FERRY_OK || !how->watch) {
    /* unwatched: the views go now; the memory must outlive the transfer,
     * as an address's must (the caller's arrays are the memory) */
    request_release(l, na);
    Py_DECREF(b);
    if (r.st != FERRY_OK)
      return raise_result(&r);
    Py_RETURN_NONE;
  }
  ((BatchObject *)b)->entries = *l;
  memset(l, 0, sizeof *l);
  batch_object_attach(b, self, fb, na);
  return b;
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
  return mode == SUBMIT_BATCH ? run_submit(self, target, &l, &na, &PLAIN_SUBMIT)
                              : run_sync(self, target, &l, &na);
}

PyObject *engine_transfer_batch(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_request(self, args, kwds, "sO|O:transfer_batch", ENTRY_TUPLES, RUN_NOW);
}

PyObject *engine_submit(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_request(self, args, kwds, "sO|O:submit", ENTRY_TUPLES, SUBMIT_BATCH);
}

PyObject *engine_transfer_arrays(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_request(self, args, kwds, "sOOOO|O:transfer_arrays", PARALLEL_ARRAYS, RUN_NOW);
}

PyObject *engine_submit_arrays(EngineObject *self, PyObject *args, PyObject *kwds) {
  return engine_request(self, args, kwds, "sOOOO|O:submit_arrays", PARALLEL_ARRAYS, SUBMIT_BATCH);
}

PyObject *engine_submit_on_stream(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"target", "op",    "local_addrs", "remote_addrs", "lengths", "stream",
                           "notify", "watch", NULL};
  const char *target;
  PyObject *op, *locals, *remotes, *lengths, *stream_o = Py_None, *notify = Py_None;
  int watch = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "sOOOO|OOp:submit_on_stream", kwlist, &target, &op,
                                   &locals, &remotes, &lengths, &stream_o, &notify, &watch))
    return NULL;
  SubmitMode how = {1, 0, watch};
  if (stream_o != Py_None) { /* an int handle, or an object with .cuda_stream (torch) */
    PyObject *handle = PyObject_HasAttrString(stream_o, "cuda_stream")
                           ? PyObject_GetAttrString(stream_o, "cuda_stream")
                           : (Py_INCREF(stream_o), stream_o);
    int bad = !handle || as_u64(handle, &how.stream) < 0;
    Py_XDECREF(handle);
    if (bad)
      return NULL;
  }
  NotifyArg na;
  if (notify_get(notify, &na) < 0)
    return NULL;
  EntryList l;
  if (arrays_parse(op, locals, remotes, lengths, &l) < 0) {
    notify_release(&na);
    return NULL;
  }
  return run_submit(self, target, &l, &na, &how);
}

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

static PyObject *batch_cancel(BatchObject *self, PyObject *Py_UNUSED(noargs)) {
  if (self->state != FERRY_BATCH_PENDING)
    Py_RETURN_FALSE; /* seen final already */
  if (batch_enter(self) < 0)
    return NULL;
  ferry_status st = ferry_batch_cancel(self->b); /* returns at once: no GIL to drop */
  batch_leave(self);
  return PyBool_FromLong(st == FERRY_OK);
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
    {"cancel", (PyCFunction)batch_cancel, METH_NOARGS,
     "cancel() -> bool\n\nStops a pending batch: what has not started does not start, and the "
     "batch then fails with ECANCELED once the parts in flight end (wait() raises it). False "
     "when it had already ended, or all its data landed (it ends as it would have)."},
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

PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An asynchronous batch from Engine.submit(); free it (or use `with`).",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
};
