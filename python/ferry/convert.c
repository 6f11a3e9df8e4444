/* convert.c - Python arguments as libferry's: any int-like as a 64-bit
 * value or a length; local memory given as an int address, an array object
 * (device.c: torch tensors, CuPy, DLPack) or a contiguous buffer object (the
 * buffer protocol; a read-only buffer is refused, naming
 * what would write it, where the memory will be written); str or bytes-like
 * as bytes. Shared by the memory, transfer and pool methods, so each kind of
 * argument is accepted and refused the same way everywhere. */
#include "_ferry.h"

#include <stdio.h>

/* Any int-like (int, numpy integer, IntEnum) as an unsigned 64-bit value. */
int as_u64(PyObject *o, uint64_t *out) {
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

int as_size(PyObject *o, size_t *out) {
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
int local_get(PyObject *obj, const char *writes, LocalArg *la) {
  la->has_view = 0;
  la->len = 0;
  la->location[0] = 0;
  int scalar = 0;
  if (!PyLong_Check(obj) && PyObject_CheckBuffer(obj)) {
    if (PyObject_GetBuffer(obj, &la->view, PyBUF_ANY_CONTIGUOUS | (writes ? PyBUF_WRITABLE : 0)) <
        0)
      return writes ? refuse_read_only(obj, writes) : -1;
    if (la->view.ndim == 0 && PyIndex_Check(obj)) {
      PyBuffer_Release(&la->view); /* a numpy integer scalar: an address */
      scalar = 1;
    } else {
      la->has_view = 1;
      la->ptr = la->view.buf;
      la->len = (size_t)la->view.len;
      return 0;
    }
  }
  if (!PyLong_Check(obj) && !scalar) {
    /* before the int check: a torch tensor has __index__ too */
    int array = device_array_get(obj, writes, la);
    if (array)
      return array < 0 ? -1 : 0;
  }
  if (!PyLong_Check(obj) && !PyIndex_Check(obj)) {
    PyErr_Format(PyExc_TypeError,
                 "local memory must be an int address, a contiguous buffer object or an array "
                 "with __cuda_array_interface__ or __dlpack__, not %.100s",
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

void local_release(LocalArg *la) {
  if (la->has_view) {
    PyBuffer_Release(&la->view);
    la->has_view = 0;
  }
}

/* local_get() and local_length() together; on failure nothing is held. */
int local_get_with_length(PyObject *obj, const char *writes, PyObject *length_obj, LocalArg *la,
                          size_t *len) {
  if (local_get(obj, writes, la) < 0)
    return -1;
  if (local_length(la, length_obj, len) < 0) {
    local_release(la);
    return -1;
  }
  return 0;
}

PyObject *to_bytes(PyObject *o) {
  if (PyUnicode_Check(o))
    return PyUnicode_AsEncodedString(o, "utf-8", "surrogateescape");
  if (PyBytes_Check(o)) {
    Py_INCREF(o);
    return o;
  }
  return PyBytes_FromObject(o);
}
