/* plan.c - prepared transfer plans (ferry_plan_*): Engine.plan(target,
 * local, remote) checks two descriptor lists once and returns a Plan, whose
 * transfer() and submit() move index pairs local_idx[i] <-> remote_idx[i].
 *
 * Index arrays are where the time goes for large transfers, so a 1-D buffer
 * of 8-byte integers (numpy int64, the default integer array; array('q'))
 * is handed to libferry in place, with no per-item work in Python; other
 * integer buffers are widened in one pass, and sequences of ints (and
 * strided arrays) read item by item. A Plan holds its Engine; libferry detaches a plan when its
 * engine shuts down, so a Plan may outlive close(). */
#include "_ferry.h"

#include <stdio.h>
#include <string.h>

/* ---- arguments ----------------------------------------------------------- */

/* The format of a 1- or 2-D buffer of native integers, without its byte
 * order prefix, or NULL for anything else. */
static const char *int_format(const Py_buffer *v) {
  const char *f = v->format ? v->format : "B";
  if (*f == '@' || *f == '=' || *f == '<')
    f++;
  return f[0] && !f[1] && strchr("bBhHiIlLqQnN", f[0]) ? f : NULL;
}

/* Item i of an integer buffer, widened to 64 bits (as signed: an unsigned
 * 8-byte value past INT64_MAX reads negative, an index out of range). */
static int64_t int_item(const Py_buffer *v, char format, Py_ssize_t i) {
  const char *p = (const char *)v->buf + i * v->itemsize;
  switch (format) {
  case 'b': return *(const int8_t *)p;
  case 'B': return *(const uint8_t *)p;
  case 'h': return *(const int16_t *)p;
  case 'H': return *(const uint16_t *)p;
  case 'i': return *(const int32_t *)p;
  case 'I': return *(const uint32_t *)p;
  default: { /* l L q Q n N: 8 bytes on the platforms ferry builds on */
    int64_t x;
    memcpy(&x, p, sizeof x);
    return x;
  }
  }
}

/* An index array: in place (8-byte integers) or a widened copy. */
typedef struct {
  const int64_t *v;
  int64_t *copy;
  Py_buffer view;
  int has_view;
  Py_ssize_t n;
} IndexArg;

static void index_release(IndexArg *ix) {
  if (ix->has_view)
    PyBuffer_Release(&ix->view);
  PyMem_Free(ix->copy);
  memset(ix, 0, sizeof *ix);
}

static int index_alloc(IndexArg *ix, Py_ssize_t n) {
  ix->copy = PyMem_Malloc((n ? (size_t)n : 1) * sizeof *ix->copy);
  if (!ix->copy) {
    PyErr_NoMemory();
    return -1;
  }
  ix->v = ix->copy;
  ix->n = n;
  return 0;
}

static int index_from_buffer(IndexArg *ix, const char *what) {
  const char *f = int_format(&ix->view);
  if (ix->view.ndim != 1 || !f) {
    PyErr_Format(PyExc_TypeError, "%s must be a 1-D array of integers (got format '%s', %d-D)",
                 what, ix->view.format ? ix->view.format : "B", ix->view.ndim);
    return -1;
  }
  ix->n = ix->view.shape[0];
  if (ix->view.itemsize == 8) {
    ix->v = ix->view.buf; /* numpy int64, array('q'): read in place */
    return 0;
  }
  Py_ssize_t n = ix->n;
  if (index_alloc(ix, n) < 0)
    return -1;
  for (Py_ssize_t i = 0; i < n; i++)
    ix->copy[i] = int_item(&ix->view, f[0], i);
  return 0;
}

static int index_from_sequence(PyObject *o, IndexArg *ix, const char *what) {
  char msg[96];
  snprintf(msg, sizeof msg, "%s must be a sequence or array of integers", what);
  PyObject *seq = PySequence_Fast(o, msg);
  if (!seq)
    return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int rc = index_alloc(ix, n);
  for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
    long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (x == -1 && PyErr_Occurred())
      rc = -1;
    ix->copy[i] = x;
  }
  Py_DECREF(seq);
  return rc;
}

static int index_get(PyObject *o, const char *what, IndexArg *ix) {
  memset(ix, 0, sizeof *ix);
  int rc;
  if (PyObject_CheckBuffer(o) && !PyBytes_Check(o) && !PyByteArray_Check(o) &&
      PyObject_GetBuffer(o, &ix->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
    ix->has_view = 1;
    rc = index_from_buffer(ix, what);
  } else {
    PyErr_Clear(); /* a strided array: read item by item */
    rc = index_from_sequence(o, ix, what);
  }
  if (rc < 0)
    index_release(ix);
  return rc;
}

/* Descriptors: an N x 2 buffer of 8-byte integers (addr, length), or a
 * sequence of (addr, length) pairs. *out is PyMem-allocated. */
static int descs_from_buffer(PyObject *o, const char *what, ferry_region **out, size_t *n) {
  Py_buffer v;
  if (PyObject_GetBuffer(o, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
    return -1;
  int ok = v.ndim == 2 && v.shape[1] == 2 && v.itemsize == 8 && int_format(&v);
  if (!ok)
    PyErr_Format(PyExc_TypeError, "%s must be an N x 2 array of 8-byte integers (addr, length)",
                 what);
  else if ((*out = PyMem_Malloc((v.shape[0] ? (size_t)v.shape[0] : 1) * sizeof **out)) == NULL)
    ok = 0, PyErr_NoMemory();
  else {
    memcpy(*out, v.buf, (size_t)v.shape[0] * sizeof **out);
    *n = (size_t)v.shape[0];
  }
  PyBuffer_Release(&v);
  return ok ? 0 : -1;
}

static int descs_from_sequence(PyObject *o, const char *what, ferry_region **out, size_t *n) {
  char msg[96];
  snprintf(msg, sizeof msg, "%s must be a sequence of (addr, length) pairs", what);
  PyObject *seq = PySequence_Fast(o, msg);
  if (!seq)
    return -1;
  Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  ferry_region *d = PyMem_Malloc((count ? (size_t)count : 1) * sizeof *d);
  int rc = d ? 0 : -1;
  if (!d)
    PyErr_NoMemory();
  for (Py_ssize_t i = 0; rc == 0 && i < count; i++) {
    PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
    if (!PySequence_Check(pair) || PySequence_Size(pair) != 2) {
      PyErr_Format(PyExc_TypeError, "%s[%zd] must be an (addr, length) pair", what, i);
      rc = -1;
      break;
    }
    PyObject *addr = PySequence_GetItem(pair, 0), *len = PySequence_GetItem(pair, 1);
    rc = addr && len && as_u64(addr, &d[i].addr) == 0 && as_u64(len, &d[i].length) == 0 ? 0 : -1;
    Py_XDECREF(addr);
    Py_XDECREF(len);
  }
  Py_DECREF(seq);
  if (rc < 0) {
    PyMem_Free(d);
    return -1;
  }
  *out = d;
  *n = (size_t)count;
  return 0;
}

static int descs_get(PyObject *o, const char *what, ferry_region **out, size_t *n) {
  if (PyObject_CheckBuffer(o) && !PyBytes_Check(o) && !PyByteArray_Check(o))
    return descs_from_buffer(o, what, out, n);
  return descs_from_sequence(o, what, out, n);
}

/* ---- the Plan object ------------------------------------------------------- */

typedef struct {
  PyObject ob_base;
  EngineObject *engine; /* strong reference */
  ferry_plan *plan;
  PyObject *target; /* str */
  long busy;        /* transfers using plan without the GIL */
  int free_pending; /* free() came while busy: the last of them frees */
} PlanObject;

static void plan_free_now(PlanObject *self) {
  ferry_plan_free(self->plan); /* no library call in flight on it, nothing blocks */
  self->plan = NULL;
  self->free_pending = 0;
}

PyObject *engine_plan(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"target", "local", "remote", NULL};
  PyObject *target, *local_o, *remote_o;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "UOO:plan", kwlist, &target, &local_o, &remote_o))
    return NULL;
  const char *name = PyUnicode_AsUTF8(target);
  ferry_region *local = NULL, *remote = NULL;
  size_t nl = 0, nr = 0;
  if (!name || descs_get(local_o, "local", &local, &nl) < 0 ||
      descs_get(remote_o, "remote", &remote, &nr) < 0 || eng_enter(self) < 0) {
    PyMem_Free(local);
    PyMem_Free(remote);
    return NULL;
  }
  ferry_plan *fp = NULL;
  CallResult r;
  ENGINE_CALL(self, r, ferry_plan_create(self->eng, name, local, nl, remote, nr, &fp));
  PyMem_Free(local);
  PyMem_Free(remote);
  if (r.st != FERRY_OK)
    return raise_result(&r);
  PlanObject *p = PyObject_New(PlanObject, &PlanType);
  if (!p) {
    ferry_plan_free(fp);
    return NULL;
  }
  Py_INCREF(self);
  p->engine = self;
  p->plan = fp;
  Py_INCREF(target);
  p->target = target;
  p->busy = 0;
  p->free_pending = 0;
  return (PyObject *)p;
}

/* The arguments of transfer() and submit(). */
typedef struct {
  ferry_op op;
  IndexArg local, remote;
  NotifyArg notify;
  unsigned flags;
} PlanRequest;

static void request_release(PlanRequest *q) {
  index_release(&q->local);
  index_release(&q->remote);
  notify_release(&q->notify);
}

static int request_parse(PlanObject *self, PyObject *args, PyObject *kwds, const char *fmt,
                         PlanRequest *q) {
  static char *kwlist[] = {"op", "local_idx", "remote_idx", "notify", "merge", NULL};
  PyObject *op, *li, *ri, *notify = Py_None;
  int merge = 1;
  memset(q, 0, sizeof *q);
  if (!PyArg_ParseTupleAndKeywords(args, kwds, fmt, kwlist, &op, &li, &ri, &notify, &merge))
    return -1;
  if (!self->plan) {
    raise_status(FERRY_EINVAL, "the plan has been freed");
    return -1;
  }
  q->flags = merge ? 0 : FERRY_PLAN_NO_MERGE;
  if (as_op(op, &q->op) < 0 || index_get(li, "local_idx", &q->local) < 0 ||
      index_get(ri, "remote_idx", &q->remote) < 0 || notify_get(notify, &q->notify) < 0) {
    request_release(q);
    return -1;
  }
  if (q->local.n != q->remote.n) {
    PyErr_Format(PyExc_ValueError, "local_idx and remote_idx differ in length (%zd, %zd)",
                 q->local.n, q->remote.n);
    request_release(q);
    return -1;
  }
  return 0;
}

/* Runs the request (submit: as a batch, into *fb) without the GIL, with
 * the plan counted busy so that free() waits for it. */
static int plan_call(PlanObject *self, PlanRequest *q, ferry_batch **fb, CallResult *r) {
  EngineObject *e = self->engine;
  if (eng_enter(e) < 0)
    return -1;
  const ferry_notification *n = q->notify.present ? &q->notify.n : NULL;
  self->busy++;
  if (fb)
    ENGINE_CALL(e, *r,
                ferry_plan_submit(e->eng, self->plan, q->op, q->local.v, q->remote.v,
                                  (size_t)q->local.n, n, q->flags, fb));
  else
    ENGINE_CALL(e, *r,
                ferry_plan_transfer_sync(e->eng, self->plan, q->op, q->local.v, q->remote.v,
                                         (size_t)q->local.n, n, q->flags));
  if (--self->busy == 0 && self->free_pending)
    plan_free_now(self);
  return 0;
}

static PyObject *plan_transfer(PlanObject *self, PyObject *args, PyObject *kwds) {
  PlanRequest q;
  if (request_parse(self, args, kwds, "OOO|Op:transfer", &q) < 0)
    return NULL;
  CallResult r;
  int entered = plan_call(self, &q, NULL, &r);
  request_release(&q);
  return entered < 0 ? NULL : none_or_raise(&r);
}

static PyObject *plan_submit(PlanObject *self, PyObject *args, PyObject *kwds) {
  PlanRequest q;
  if (request_parse(self, args, kwds, "OOO|Op:submit", &q) < 0)
    return NULL;
  PyObject *b = batch_object_new();
  ferry_batch *fb = NULL;
  CallResult r;
  if (!b || plan_call(self, &q, &fb, &r) < 0) {
    Py_XDECREF(b);
    request_release(&q);
    return NULL;
  }
  if (r.st != FERRY_OK) {
    Py_DECREF(b);
    request_release(&q);
    return raise_result(&r);
  }
  batch_object_attach(b, self->engine, fb, &q.notify);
  request_release(&q);
  return b;
}

static void plan_free_impl(PlanObject *self) {
  if (self->busy)
    self->free_pending = 1;
  else if (self->plan)
    plan_free_now(self);
}

static PyObject *plan_free(PlanObject *self, PyObject *Py_UNUSED(noargs)) {
  plan_free_impl(self);
  Py_RETURN_NONE;
}

static PyObject *plan_enter_ctx(PlanObject *self, PyObject *Py_UNUSED(noargs)) {
  Py_INCREF(self);
  return (PyObject *)self;
}

static PyObject *plan_exit_ctx(PlanObject *self, PyObject *Py_UNUSED(args)) {
  plan_free_impl(self);
  Py_RETURN_FALSE;
}

static void plan_dealloc(PlanObject *self) {
  plan_free_impl(self); /* nothing is busy: a method in flight holds a reference */
  Py_CLEAR(self->target);
  Py_CLEAR(self->engine);
  PyObject_Free(self);
}

static PyObject *plan_get_local_count(PlanObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromSize_t(ferry_plan_local_count(self->plan));
}

static PyObject *plan_get_remote_count(PlanObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromSize_t(ferry_plan_remote_count(self->plan));
}

static PyObject *plan_get_target(PlanObject *self, void *Py_UNUSED(c)) {
  Py_INCREF(self->target);
  return self->target;
}

static PyObject *plan_get_freed(PlanObject *self, void *Py_UNUSED(c)) {
  return PyBool_FromLong(self->plan == NULL);
}

static PyMethodDef plan_methods[] = {
    {"transfer", KW(plan_transfer),
     "transfer(op, local_idx, remote_idx, notify=None, merge=True)\n\nMoves descriptor pairs "
     "local_idx[i] <-> remote_idx[i] (numpy int64 arrays are read in place) with one op, "
     "synchronously. merge=False: one operation per pair (NIXL's skip_desc_merge)."},
    {"submit", KW(plan_submit),
     "submit(op, local_idx, remote_idx, notify=None, merge=True) -> Batch"},
    {"free", (PyCFunction)plan_free, METH_NOARGS, "free(): releases the plan"},
    {"__enter__", (PyCFunction)plan_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)plan_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"local_count", (getter)plan_get_local_count, NULL, "local descriptors (0 once freed)", NULL},
    {"remote_count", (getter)plan_get_remote_count, NULL, "remote descriptors (0 once freed)",
     NULL},
    {"target", (getter)plan_get_target, NULL, "the target the plan was made for", NULL},
    {"freed", (getter)plan_get_freed, NULL, "True once freed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Descriptor lists checked once, transferred by index: from Engine.plan().",
    .tp_methods = plan_methods,
    .tp_getset = plan_getset,
};
