/* memory.c - the Engine methods for memory: register and unregister (one
 * region or a batch), alloc and free. A buffer object registered is held
 * (its view kept in Engine.held under its address), so its memory cannot be
 * resized or freed, until unregister() or close(). */
#include "_ferry.h"

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

PyObject *engine_register(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"buf_or_addr", "length", "location", NULL};
  PyObject *obj, *length_o = Py_None;
  const char *location = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|Oz:register", kwlist, &obj, &length_o, &location))
    return NULL;
  LocalArg la;
  size_t len;
  if (local_get_with_length(obj, REGION, length_o, &la, &len) < 0)
    return NULL;
  if (eng_enter(self) < 0) {
    local_release(&la);
    return NULL;
  }
  if (!location && la.location[0])
    location = la.location; /* where the array says it lives, checked */
  CallResult r;
  ENGINE_CALL(self, r, ferry_memory_register_at(self->eng, la.ptr, len, location));
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

PyObject *engine_unregister(EngineObject *self, PyObject *args, PyObject *kwds) {
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

/* register_batch's locations: None (all "*"), one str for every item, or a
 * sequence of n str. *held keeps the sequence (and so its strings) alive. */
static int locations_arg(PyObject *obj, Py_ssize_t n, const char **out, PyObject **held) {
  if (obj == Py_None)
    return 0;
  if (PyUnicode_Check(obj)) {
    const char *one = PyUnicode_AsUTF8(obj);
    for (Py_ssize_t i = 0; one && i < n; i++)
      out[i] = one;
    return one ? 0 : -1;
  }
  *held = PySequence_Fast(obj, "locations must be a str or a sequence of str");
  if (!*held)
    return -1;
  if (PySequence_Fast_GET_SIZE(*held) != n) {
    PyErr_Format(PyExc_ValueError, "%zd items but %zd locations", n,
                 PySequence_Fast_GET_SIZE(*held));
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++)
    if (!(out[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(*held, i))))
      return -1;
  return 0;
}

PyObject *engine_register_batch(EngineObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"items", "lengths", "locations", NULL};
  PyObject *items_o, *lengths_o = Py_None, *locations_o = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OO:register_batch", kwlist, &items_o, &lengths_o,
                                   &locations_o))
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
  const char **locations = PyMem_Calloc(cap, sizeof *locations);
  PyObject *locs = NULL, *result = NULL;
  Py_ssize_t got = 0;
  if (!addrs || !lengths || !las || !locations) {
    PyErr_NoMemory();
    goto out;
  }
  if (locations_arg(locations_o, n, locations, &locs) < 0)
    goto out;
  for (; got < n; got++) {
    if (local_get_with_length(PySequence_Fast_GET_ITEM(items, got), REGION,
                              lens ? PySequence_Fast_GET_ITEM(lens, got) : Py_None, &las[got],
                              &lengths[got]) < 0)
      goto out;
    addrs[got] = las[got].ptr;
    if (!locations[got] && las[got].location[0])
      locations[got] = las[got].location; /* where the array says it lives */
  }
  if (eng_enter(self) < 0)
    goto out;
  CallResult r;
  ENGINE_CALL(self, r,
              ferry_memory_register_batch_at(self->eng, addrs, lengths, locations, (size_t)n));
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
  PyMem_Free(locations);
  Py_DECREF(items);
  Py_XDECREF(lens);
  Py_XDECREF(locs);
  return result;
}

PyObject *engine_unregister_batch(EngineObject *self, PyObject *args, PyObject *kwds) {
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

PyObject *engine_alloc(EngineObject *self, PyObject *args, PyObject *kwds) {
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

PyObject *engine_free(EngineObject *self, PyObject *args, PyObject *kwds) {
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
