/* errors.c - ferry.Error, a RuntimeError with .code (the ferry_status),
 * .mooncake_code and .detail, and raising it for a ferry_status: directly,
 * or for a call made without the GIL (CallResult, CALL_WITHOUT_GIL in
 * _ferry.h) whose detail was captured in its own thread. One place, so
 * every method raises the same way. */
#include "_ferry.h"

#include <stdio.h>
#include <structmember.h>

typedef struct {
  PyBaseExceptionObject base;
  int code;
  int mooncake_code;
  PyObject *detail;
} ErrorObject;

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

PyTypeObject ErrorType = {
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
PyObject *raise_status(ferry_status st, const char *detail) {
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

void capture_error(char *buf) { snprintf(buf, ERRBUF_SIZE, "%s", ferry_last_error()); }

/* Raises ferry.Error for a failed call. */
PyObject *raise_result(const CallResult *r) { return raise_status(r->st, r->err); }

/* None when the call succeeded, else raises ferry.Error. */
PyObject *none_or_raise(const CallResult *r) {
  if (r->st != FERRY_OK)
    return raise_result(r);
  Py_RETURN_NONE;
}
