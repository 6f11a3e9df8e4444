/* pool.c - receive pools: the Pool and Message types (a message's bytes are
 * read in place through the buffer protocol) and the Engine methods that use
 * them: create_pool(), recv(), send() and send_batch(). */
#include "_ferry.h"

#include <string.h>

/* A Pool holds its Engine; a Message holds its Pool. A message's slot goes
 * back to the pool on release() (or leaving its `with`) once no view of its
 * bytes remains (numpy/torch arrays made with frombuffer are views), so a
 * slot is never reused under a live array. A pool refuses close() while a
 * view of one of its messages lives; Engine.close() does not refuse (it
 * runs from __exit__ and finally blocks) but leaves the memory mapped
 * until the last view goes (eng_destroy_if_unused), and no new view is
 * made once the engine or the pool closed. */
typedef struct {
  PyObject_HEAD EngineObject *engine;
  ferry_pool *pool;
  PyObject *name;
  size_t length;
  int has_view;
  Py_buffer view;    /* user memory the pool lives in */
  long views;        /* exported views of its messages */
  char location[24]; /* an array's place ("cuda:0"): "cuda..." is not read by the CPU */
} PoolObject;

typedef struct {
  PyObject_HEAD PoolObject *pool;
  ferry_message m;
  long exports;
  int release_pending, released;
} MessageObject;

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
  if (self->engine->closing) /* the fd goes with the engine */
    return raise_closed();
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

PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.Pool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A receive pool, from Engine.create_pool(name, buffer_or_size).",
    .tp_methods = pool_methods,
    .tp_getset = pool_getset,
};

/* The message leaves this object now (no view of it remains): its slot
 * goes back to the pool (release), or the message waits there again for
 * the next receiver (requeue). Nothing to do once the pool or the engine
 * closed: the message went with them. */
static void message_give_back(MessageObject *self, int requeue, CallResult *r) {
  self->released = 1;
  r->st = FERRY_OK;
  PoolObject *pool = self->pool;
  if (!pool->pool || !pool->engine->eng || pool->engine->closing)
    return;
  ferry_engine *eng = pool->engine->eng;
  uint64_t slot = self->m.slot;
  pool->engine->active++;
  ENGINE_CALL(pool->engine, *r,
              requeue ? ferry_pool_requeue(eng, pool->pool, slot)
                      : ferry_pool_release(eng, pool->pool, slot));
}

static void message_release_now(MessageObject *self) {
  CallResult r;
  message_give_back(self, 0, &r);
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

/* _requeue(): for ferry's asyncio receive, whose task was cancelled after
 * its wait took this message: puts it back in the pool for the next
 * receiver (ferry_pool_requeue) and releases this object. */
static PyObject *message_requeue(MessageObject *self, PyObject *Py_UNUSED(noargs)) {
  if (self->released || self->release_pending || self->exports) {
    PyErr_SetString(PyExc_BufferError, "only a message not released and with no view is requeued");
    return NULL;
  }
  CallResult r;
  message_give_back(self, 1, &r);
  return none_or_raise(&r);
}

static const char *message_unreadable(MessageObject *self) {
  if (self->released || self->release_pending)
    return "the message was released";
  if (!self->pool->pool)
    return "the message's pool has been closed";
  if (self->pool->engine->closing)
    return "the message's engine has been closed";
  if (!strncmp(self->pool->location, "cuda", 4))
    return "the message lies in CUDA memory, which the CPU may not read: use its .addr and "
           "len() with the array library of that memory (e.g. a torch tensor over it)";
  return NULL;
}

/* A view counts in its pool (close() refuses while it lives) and in the
 * engine (which is destroyed, and the pool memory freed, only after it). */
static int message_getbuffer(MessageObject *self, Py_buffer *view, int flags) {
  const char *why = message_unreadable(self);
  if (why) {
    PyErr_SetString(PyExc_BufferError, why);
    view->obj = NULL;
    return -1;
  }
  if (PyBuffer_FillInfo(view, (PyObject *)self, self->m.addr, (Py_ssize_t)self->m.length, 0,
                        flags) < 0)
    return -1;
  self->exports++;
  self->pool->views++;
  self->pool->engine->views++;
  return 0;
}

static void message_releasebuffer(MessageObject *self, Py_buffer *Py_UNUSED(view)) {
  EngineObject *engine = self->pool->engine;
  self->pool->views--;
  if (--self->exports == 0 && self->release_pending)
    message_release_now(self);
  engine->views--;
  eng_destroy_if_unused(engine); /* the last view of a closed engine frees its memory */
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

static PyObject *message_get_addr(MessageObject *self, void *Py_UNUSED(c)) {
  return PyLong_FromVoidPtr(self->m.addr);
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
    {"_requeue", (PyCFunction)message_requeue, METH_NOARGS,
     "_requeue(): puts the message back in its pool for the next receiver (no view may exist)"},
    {"__enter__", (PyCFunction)message_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)message_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef message_getset[] = {
    {"tag", (getter)message_get_tag, NULL, "the tag it was sent under (bytes)", NULL},
    {"sender", (getter)message_get_sender, NULL, "the sending engine's name", NULL},
    {"slot", (getter)message_get_slot, NULL, "its slot in the pool", NULL},
    {"addr", (getter)message_get_addr, NULL,
     "the address of its bytes in the pool (device memory for a pool in CUDA memory)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods message_as_sequence = {.sq_length = (lenfunc)message_len};

PyTypeObject MessageType = {
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

PyObject *engine_create_pool(EngineObject *self, PyObject *args, PyObject *kwds) {
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
  pool->location[0] = 0;
  Py_INCREF(name);
  pool->name = name;
  void *addr = NULL;
  if (PyLong_Check(what)) {
    if (as_size(what, &pool->length) < 0)
      goto fail;
  } else { /* a writable buffer, or an array object (device.c) */
    LocalArg la;
    if (local_get(what, REGION, &la) < 0)
      goto fail;
    if (!la.has_view) {
      PyErr_SetString(PyExc_TypeError, "create_pool: buffer_or_size must be an int size, a "
                                       "writable buffer or an array object");
      goto fail;
    }
    pool->view = la.view;
    pool->has_view = 1;
    memcpy(pool->location, la.location, sizeof pool->location);
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

PyObject *engine_recv(EngineObject *self, PyObject *args, PyObject *kwds) {
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
PyObject *engine_send(EngineObject *self, PyObject *args, PyObject *kwds) {
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

PyObject *engine_send_batch(EngineObject *self, PyObject *args, PyObject *kwds) {
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
