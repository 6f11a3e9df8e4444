/* file.c - FILE memory (ferry_file_*): Engine.register_file(fd) returns a
 * File, whose transfer() and submit() move (op, local, offset, length)
 * entries between registered memory and the file (READ: file -> memory,
 * WRITE: memory -> file), as Engine.transfer_batch() and submit() do with
 * a peer; submit() returns a ferry.Batch. A File holds its Engine; every
 * call enters the engine first, so once the engine is closed (which
 * unregisters its files) a File's calls raise ECLOSED and never touch the
 * freed handle. */
#include "_ferry.h"

#include <string.h>

typedef struct {
  PyObject ob_base;
  EngineObject *engine; /* strong reference */
  ferry_file *file;     /* NULL once unregistered */
  int fd;
  int direct;
  size_t align;
  PyObject *path;
  PyObject *why; /* why not O_DIRECT ("" when it is used) */
} FileObject;

static PyObject *file_unregistered(void) {
  return raise_status(FERRY_ENOTFOUND, "the file was unregistered");
}

PyObject *engine_register_file(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"fd", "buffered", NULL};
  PyObject *fd_o;
  int buffered = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|p:register_file", kwlist, &fd_o, &buffered))
    return NULL;
  int fd = PyObject_AsFileDescriptor(fd_o); /* an int, or an object with fileno() */
  if (fd < 0)
    return NULL;
  FileObject *f = PyObject_New(FileObject, &FileType);
  if (!f)
    return NULL;
  f->engine = NULL;
  f->file = NULL;
  f->path = f->why = NULL;
  if (eng_enter(self) < 0) {
    Py_DECREF(f);
    return NULL;
  }
  CallResult r;
  ferry_file *handle = NULL;
  char why[160];
  ENGINE_CALL(self, r,
              ferry_file_register(self->eng, fd, buffered ? FERRY_FILE_BUFFERED : 0, &handle));
  if (r.st != FERRY_OK) {
    Py_DECREF(f);
    return raise_result(&r);
  }
  Py_INCREF(self);
  f->engine = self;
  f->file = handle;
  f->fd = fd;
  f->direct = ferry_file_direct(handle, &f->align, why, sizeof why);
  f->path = PyUnicode_DecodeFSDefault(ferry_file_path(handle));
  f->why = PyUnicode_FromString(why);
  if (!f->path || !f->why) {
    Py_DECREF(f); /* unregisters */
    return NULL;
  }
  return (PyObject *)f;
}

/* Enters the engine for a call on f's handle: -1 with an exception when
 * the file was unregistered or the engine is closed. */
static int file_enter(FileObject *f) {
  if (!f->file) {
    file_unregistered();
    return -1;
  }
  return eng_enter(f->engine);
}

static PyObject *file_unregister(FileObject *f, PyObject *Py_UNUSED(noargs)) {
  if (!f->file)
    Py_RETURN_NONE;
  if (f->engine->closing || !f->engine->eng) {
    f->file = NULL; /* the engine's close unregistered it */
    Py_RETURN_NONE;
  }
  if (file_enter(f) < 0)
    return NULL;
  ferry_file *handle = f->file;
  f->file = NULL;
  CallResult r;
  ENGINE_CALL(f->engine, r, ferry_file_unregister(f->engine->eng, handle));
  return none_or_raise(&r);
}

/* Parses entries and flags (sync: FERRY_FILE_SYNC). */
static int file_args(PyObject *args, PyObject *kwds, const char *fmt, EntryList *l,
                     unsigned *flags) {
  static char *kwlist[] = {"entries", "sync", NULL};
  PyObject *entries;
  int sync = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, fmt, kwlist, &entries, &sync))
    return -1;
  *flags = sync ? FERRY_FILE_SYNC : 0;
  return entries_parse(entries, l);
}

static PyObject *file_transfer(FileObject *f, PyObject *args, PyObject *kwds) {
  EntryList l;
  unsigned flags;
  if (file_args(args, kwds, "O|p:transfer", &l, &flags) < 0)
    return NULL;
  if (file_enter(f) < 0) {
    entries_release(&l);
    return NULL;
  }
  CallResult r;
  ENGINE_CALL(f->engine, r, ferry_file_transfer_sync(f->engine->eng, f->file, l.e, l.n, flags));
  entries_release(&l);
  return none_or_raise(&r);
}

static PyObject *file_submit(FileObject *f, PyObject *args, PyObject *kwds) {
  EntryList l;
  unsigned flags;
  if (file_args(args, kwds, "O|p:submit", &l, &flags) < 0)
    return NULL;
  PyObject *batch = batch_object_new();
  if (!batch || file_enter(f) < 0) {
    Py_XDECREF(batch);
    entries_release(&l);
    return NULL;
  }
  ferry_batch *fb = NULL;
  CallResult r;
  ENGINE_CALL(f->engine, r, ferry_file_submit(f->engine->eng, f->file, l.e, l.n, flags, &fb));
  if (r.st != FERRY_OK) {
    entries_release(&l);
    Py_DECREF(batch);
    return raise_result(&r);
  }
  NotifyArg none;
  memset(&none, 0, sizeof none);
  batch_object_keep_entries(batch, &l);
  batch_object_attach(batch, f->engine, fb, &none);
  return batch;
}

static PyObject *file_enter_ctx(FileObject *f, PyObject *Py_UNUSED(noargs)) {
  Py_INCREF(f);
  return (PyObject *)f;
}

static PyObject *file_exit_ctx(FileObject *f, PyObject *Py_UNUSED(args)) {
  PyObject *r = file_unregister(f, NULL);
  if (!r)
    return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

static void file_dealloc(FileObject *f) {
  if (f->file && f->engine) {
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = file_unregister(f, NULL);
    if (!r)
      PyErr_Clear();
    Py_XDECREF(r);
    PyErr_Restore(et, ev, tb);
  }
  Py_CLEAR(f->path);
  Py_CLEAR(f->why);
  Py_CLEAR(f->engine);
  PyObject_Free(f);
}

static PyObject *file_get_fd(FileObject *f, void *Py_UNUSED(c)) { return PyLong_FromLong(f->fd); }

static PyObject *file_get_path(FileObject *f, void *Py_UNUSED(c)) {
  Py_INCREF(f->path);
  return f->path;
}

static PyObject *file_get_direct(FileObject *f, void *Py_UNUSED(c)) {
  return PyBool_FromLong(f->direct);
}

static PyObject *file_get_align(FileObject *f, void *Py_UNUSED(c)) {
  return PyLong_FromSize_t(f->align);
}

static PyObject *file_get_why(FileObject *f, void *Py_UNUSED(c)) {
  Py_INCREF(f->why);
  return f->why;
}

static PyObject *file_get_registered(FileObject *f, void *Py_UNUSED(c)) {
  return PyBool_FromLong(f->file != NULL && f->engine->eng && !f->engine->closing);
}

static PyMethodDef file_methods[] = {
    {"transfer", KW(file_transfer),
     "transfer(entries, sync=False)\n\nMoves (op, local, offset, length) entries: OP_READ file -> "
     "local, OP_WRITE local -> file; local is registered memory (an int address or a buffer). "
     "Returns once every byte moved (sync=True: and was fdatasync'ed); raises ferry.Error "
     "(EIO names the file, the range and errno; a READ past the end of the file is EIO)."},
    {"submit", KW(file_submit),
     "submit(entries, sync=False) -> Batch\n\nThe same, asynchronous: a ferry.Batch "
     "(wait, status, cancel, free)."},
    {"unregister", (PyCFunction)file_unregister, METH_NOARGS,
     "unregister(): a fence: on return no operation reads or writes the file any more; batches "
     "over it that still had work fail with ENOTREG"},
    {"__enter__", (PyCFunction)file_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)file_exit_ctx, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef file_getset[] = {
    {"fd", (getter)file_get_fd, NULL, "the descriptor registered (ferry holds a duplicate)", NULL},
    {"path", (getter)file_get_path, NULL, "the file's path, as /proc/self/fd showed it", NULL},
    {"direct", (getter)file_get_direct, NULL, "True when aligned operations use O_DIRECT", NULL},
    {"align", (getter)file_get_align, NULL, "alignment O_DIRECT needs (offset, length)", NULL},
    {"why", (getter)file_get_why, NULL, "why O_DIRECT is not used ('' when it is)", NULL},
    {"registered", (getter)file_get_registered, NULL, "False once unregistered or closed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject FileType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry.File",
    .tp_basicsize = sizeof(FileObject),
    .tp_dealloc = (destructor)file_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A registered file from Engine.register_file(fd): FILE memory.",
    .tp_methods = file_methods,
    .tp_getset = file_getset,
};
