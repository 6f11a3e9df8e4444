/* device.c - array objects as local memory: anything exposing
 * __cuda_array_interface__ (torch CUDA tensors, CuPy, Numba) or __dlpack__
 * (torch tensors on CPU or CUDA, JAX, ...). They do not speak the buffer
 * protocol, and their memory may be device memory that Python cannot read,
 * so what ferry takes from them is the address, the length and the place
 * ("cuda:0", "cpu") that registration checks against the CUDA driver. A
 * non-contiguous array is refused: a registered region or a transfer is one
 * range of bytes.
 *
 * The result is a Py_buffer that owns a reference to the object
 * (PyBuffer_FillInfo) and whose buf is the array's address: the callers of
 * local_get hold and release it like any buffer's view, never reading it. */
#include "_ferry.h"

#include <stdio.h>
#include <string.h>

/* DLPack's C structures, as its public specification (dlpack.h, the
 * unversioned "dltensor" capsule) defines them. */
typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code, bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* NULL: compact row-major */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3, DL_CUDA_MANAGED = 13 };

static int refuse(PyObject *obj, const char *via, const char *why) {
  char detail[ERRBUF_SIZE];
  snprintf(detail, sizeof detail, "%s of a %.100s: %s", via, Py_TYPE(obj)->tp_name, why);
  raise_status(FERRY_EINVAL, detail);
  return -1;
}

/* Bytes of a row-major array of itemsize-byte items, or -1 (error set)
 * when strides (NULL: compact) leave holes or overlap. */
static Py_ssize_t contiguous_bytes(PyObject *obj, const char *via, Py_ssize_t ndim,
                                   const int64_t *shape, const int64_t *strides,
                                   Py_ssize_t itemsize, const char *unit) {
  int64_t expect = itemsize, bytes = itemsize;
  for (Py_ssize_t i = ndim - 1; i >= 0; i--) {
    if (shape[i] < 0)
      return refuse(obj, via, "a negative dimension");
    if (strides && shape[i] != 1 && strides[i] != expect) {
      char why[160];
      snprintf(why, sizeof why,
               "not contiguous (dimension %zd has stride %lld %s, %lld expected); pass "
               ".contiguous() or a contiguous copy",
               i, (long long)strides[i], unit, (long long)expect);
      return refuse(obj, via, why);
    }
    expect *= shape[i];
    bytes *= shape[i];
  }
  return (Py_ssize_t)bytes;
}

static int fill(PyObject *obj, void *ptr, Py_ssize_t len, int readonly, const char *writes,
                const char *location, LocalArg *la) {
  if (readonly && writes) {
    char why[256];
    snprintf(why, sizeof why, "it is read-only and cannot be %s", writes);
    return refuse(obj, "__cuda_array_interface__", why);
  }
  if (PyBuffer_FillInfo(&la->view, obj, ptr, len, readonly, PyBUF_SIMPLE) < 0)
    return -1;
  la->has_view = 1;
  la->ptr = ptr;
  la->len = (size_t)len;
  snprintf(la->location, sizeof la->location, "%s", location);
  return 1;
}

/* ---- __cuda_array_interface__ ----------------------------------------------- */

static int int_tuple(PyObject *t, int64_t *out, Py_ssize_t max, Py_ssize_t *n) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > max)
    return -1;
  *n = PyTuple_GET_SIZE(t);
  for (Py_ssize_t i = 0; i < *n; i++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
    if (v == -1 && PyErr_Occurred())
      return -1;
    out[i] = v;
  }
  return 0;
}

#define MAX_DIMS 64
static const char CAI[] = "__cuda_array_interface__";

static int from_cai(PyObject *obj, PyObject *cai, const char *writes, LocalArg *la) {
  PyObject *data = PyDict_Check(cai) ? PyDict_GetItemString(cai, "data") : NULL;
  PyObject *shape = PyDict_Check(cai) ? PyDict_GetItemString(cai, "shape") : NULL;
  PyObject *typestr = PyDict_Check(cai) ? PyDict_GetItemString(cai, "typestr") : NULL;
  PyObject *strides = PyDict_Check(cai) ? PyDict_GetItemString(cai, "strides") : NULL;
  if (!data || !PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 || !shape || !typestr ||
      !PyUnicode_Check(typestr))
    return refuse(obj, CAI, "not a dict with data (ptr, readonly), shape and typestr");
  const char *ts = PyUnicode_AsUTF8(typestr);
  long itemsize = ts && strlen(ts) > 2 ? strtol(ts + 2, NULL, 10) : 0;
  int64_t dims[MAX_DIMS], steps[MAX_DIMS];
  Py_ssize_t ndim = 0, nsteps = 0;
  if (itemsize <= 0)
    return refuse(obj, CAI, "its typestr gives no item size");
  if (int_tuple(shape, dims, MAX_DIMS, &ndim) < 0 ||
      (strides && strides != Py_None &&
       (int_tuple(strides, steps, MAX_DIMS, &nsteps) < 0 || nsteps != ndim))) {
    PyErr_Clear();
    return refuse(obj, CAI, "shape or strides is not a tuple of ints of the same length");
  }
  Py_ssize_t len = contiguous_bytes(obj, CAI, ndim, dims, nsteps ? steps : NULL, itemsize, "bytes");
  uint64_t ptr;
  if (len < 0 || as_u64(PyTuple_GET_ITEM(data, 0), &ptr) < 0)
    return -1;
  int readonly = PyObject_IsTrue(PyTuple_GET_ITEM(data, 1));
  if (readonly < 0)
    return -1;
  /* The driver names the device at registration; "cuda" checks it is one. */
  return fill(obj, (void *)(uintptr_t)ptr, len, readonly, writes, "cuda", la);
}

/* ---- __dlpack__ ---------------------------------------------------------------- */

static const char DLPACK[] = "__dlpack__";

static int dl_location(PyObject *obj, const DLDevice *d, char *out, size_t size) {
  switch (d->device_type) {
  case DL_CPU: snprintf(out, size, "cpu"); return 0;
  case DL_CUDA: snprintf(out, size, "cuda:%d", d->device_id); return 0;
  case DL_CUDA_HOST: /* pinned host memory: the driver says which device */
  case DL_CUDA_MANAGED: snprintf(out, size, "cuda"); return 0;
  }
  char why[160];
  snprintf(why, sizeof why,
           "device type %d is not memory ferry moves (CPU 1, CUDA 2, CUDA host 3, CUDA "
           "managed 13)",
           d->device_type);
  return refuse(obj, DLPACK, why);
}

static int from_dlpack(PyObject *obj, PyObject *capsule, const char *writes, LocalArg *la) {
  DLManagedTensor *m = PyCapsule_GetPointer(capsule, "dltensor");
  if (!m) {
    PyErr_Clear();
    return refuse(obj, DLPACK, "it did not return a \"dltensor\" capsule");
  }
  const DLTensor *t = &m->dl_tensor;
  char location[24];
  if (dl_location(obj, &t->device, location, sizeof location) < 0)
    return -1;
  if (t->dtype.bits % 8 || t->ndim < 0)
    return refuse(obj, DLPACK, "items are not whole bytes");
  Py_ssize_t len = contiguous_bytes(obj, DLPACK, t->ndim, t->shape, t->strides, 1, "items");
  if (len < 0)
    return -1;
  Py_ssize_t itemsize = (Py_ssize_t)t->dtype.bits / 8 * (t->dtype.lanes ? t->dtype.lanes : 1);
  /* strides count items, not bytes: checked above with itemsize 1 */
  return fill(obj, (uint8_t *)t->data + t->byte_offset, len * itemsize, 0, writes, location, la);
}

/* ---- either -------------------------------------------------------------------- */

/* The attribute, or NULL without an error when obj has none. */
static PyObject *optional_attr(PyObject *obj, const char *name) {
  PyObject *v = PyObject_GetAttrString(obj, name);
  if (!v && PyErr_ExceptionMatches(PyExc_AttributeError))
    PyErr_Clear();
  return v;
}

int device_array_get(PyObject *obj, const char *writes, LocalArg *la) {
  PyObject *cai = optional_attr(obj, CAI);
  if (cai) {
    int rc = from_cai(obj, cai, writes, la);
    Py_DECREF(cai);
    return rc;
  }
  if (PyErr_Occurred())
    return -1; /* e.g. torch: a tensor that requires grad */
  PyObject *export = optional_attr(obj, DLPACK);
  if (!export)
    return PyErr_Occurred() ? -1 : 0;
  PyObject *capsule = PyObject_CallNoArgs(export);
  Py_DECREF(export);
  if (!capsule)
    return -1;
  int rc = from_dlpack(obj, capsule, writes, la);
  Py_DECREF(capsule); /* not consumed: its destructor lets the array's export go */
  return rc;
}
