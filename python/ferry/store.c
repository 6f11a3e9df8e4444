/* store.c - the Store type: a client of a store master (ferry_store_*,
 * docs/store.md) over an Engine it holds. Single-key calls raise
 * ferry.Error; the batch calls answer per key (a status, or a size) and
 * never raise for one key's failure, returning the first failure's detail
 * beside the list, as Mooncake's batch calls answer per key. Blocking calls
 * release the GIL. Close the Store before its Engine: the store frees its
 * segment through the engine. */
#include "_ferry.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

typedef struct {
  PyObject ob_base;
  EngineObject *engine; /* held */
  ferry_store *store;
} StoreObject;

static int store_init(StoreObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {
      "engine",     "master",      "segment_size",      "local_buffer_size", "secret",
      "timeout_ms", "offload_dir", "offload_max_bytes", "cxl_path",          "cxl_size",
      NULL};
  PyObject *engine, *segment_o = NULL, *staging_o = NULL, *cap_o = NULL, *cxl_size_o = NULL;
  const char *master, *secret = NULL, *offload_dir = NULL, *cxl_path = NULL;
  unsigned int timeout_ms = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!s|OOzIzOzO:Store", kwlist, &EngineType, &engine,
                                   &master, &segment_o, &staging_o, &secret, &timeout_ms,
                                   &offload_dir, &cap_o, &cxl_path, &cxl_size_o))
    return -1;
  ferry_store_config cfg;
  ferry_store_config_init(&cfg);
  cfg.master = master;
  cfg.secret = secret;
  cfg.timeout_ms = timeout_ms;
  cfg.offload_dir = offload_dir;
  cfg.cxl_path = cxl_path;
  if ((segment_o && as_size(segment_o, &cfg.segment_size) < 0) ||
      (staging_o && as_size(staging_o, &cfg.local_buffer_size) < 0) ||
      (cap_o && as_size(cap_o, &cfg.offload_max_bytes) < 0) ||
      (cxl_size_o && as_size(cxl_size_o, &cfg.cxl_size) < 0))
    return -1;
  if (self->store) {
    PyErr_SetString(PyExc_RuntimeError, "Store is open already");
    return -1;
  }
  EngineObject *eng = (EngineObject *)engine;
  if (eng_enter(eng) < 0)
    return -1;
  CallResult r;
  ENGINE_CALL(eng, r, ferry_store_open(eng->eng, &cfg, &self->store));
  if (r.st != FERRY_OK) {
    raise_result(&r);
    return -1;
  }
  Py_INCREF(engine);
  self->engine = eng;
  return 0;
}

/* Enters the engine of an open store; -1 with an exception otherwise. */
static int store_enter(StoreObject *self) {
  if (!self->store) {
    raise_status(FERRY_ECLOSED, "the store was closed");
    return -1;
  }
  return eng_enter(self->engine);
}

#define STORE_CALL(self, res, call) ENGINE_CALL((self)->engine, res, call)

static void store_close_now(StoreObject *self) {
  if (!self->store)
    return;
  ferry_store *s = self->store;
  self->store = NULL;
  if (eng_enter(self->engine) < 0) {
    PyErr_Clear(); /* the engine is gone with the segment it freed */
    return;
  }
  CallResult r;
  ENGINE_CALL(self->engine, r, (ferry_store_close(s), FERRY_OK));
}

static PyObject *store_close(StoreObject *self, PyObject *Py_UNUSED(noargs)) {
  store_close_now(self);
  Py_RETURN_NONE;
}

static void store_dealloc(StoreObject *self) {
  store_close_now(self);
  Py_XDECREF(self->engine);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- arguments ------------------------------------------------------------------------------ */

/* A put's pin: FERRY_STORE_PIN_* or (pin, FERRY_STORE_SOFT_PIN_*, soft
 * pin TTL in ms or None). */
static int pin_get(PyObject *pin, ferry_store_replicate *out) {
  PyObject *ttl = Py_None;
  if (!pin)
    return 0;
  if (PyTuple_Check(pin)) {
    if (!PyArg_ParseTuple(pin, "iiO:pin", &out->pin, &out->soft_pin_action, &ttl))
      return -1;
  } else {
    long v = PyLong_AsLong(pin);
    if (v == -1 && PyErr_Occurred())
      return -1;
    out->pin = v < INT_MIN || v > INT_MAX ? -1 : (int)v; /* the call refuses it, naming it */
  }
  if (ttl == Py_None)
    return 0;
  out->soft_pin_ttl_set = 1;
  out->soft_pin_ttl_ms = PyLong_AsUnsignedLongLong(ttl);
  return out->soft_pin_ttl_ms == (unsigned long long)-1 && PyErr_Occurred() ? -1 : 0;
}

#define PREFERRED_MAX 9 /* the first preferred segment and 8 more (ferry.h) */

/* replicas, preferred_segment and pin as a put takes them. preferred: None,
 * a str, or a list or tuple of str (Mooncake's preferred_segments: the
 * first is preferred_segment, the rest preferred_segments, their UTF-8 in
 * names[], valid while preferred lives). */
static int replicate_get(PyObject *replicas, PyObject *preferred, PyObject *pin,
                         ferry_store_replicate *out, const char **names) {
  unsigned long n = replicas ? PyLong_AsUnsignedLong(replicas) : 1;
  if (n == (unsigned long)-1 && PyErr_Occurred())
    return -1;
  ferry_store_replicate_init(out);
  out->replicas = (unsigned)(n > 0xffff ? 0xffff : n);
  int list = preferred && (PyList_Check(preferred) || PyTuple_Check(preferred));
  Py_ssize_t count = !preferred || preferred == Py_None ? 0 : list ? PySequence_Size(preferred) : 1;
  if (count > PREFERRED_MAX) {
    PyErr_Format(PyExc_ValueError, "%zd preferred segments: at most %d", count, PREFERRED_MAX);
    return -1;
  }
  for (Py_ssize_t i = 0; i < count; i++) {
    PyObject *item = list ? PySequence_Fast_GET_ITEM(preferred, i) : preferred;
    if (!PyUnicode_Check(item)) {
      PyErr_SetString(PyExc_TypeError, "preferred_segment: a str, or a list of str");
      return -1;
    }
    if (!(names[i] = PyUnicode_AsUTF8(item)))
      return -1;
  }
  if (count) {
    out->preferred_segment = *names[0] ? names[0] : NULL;
    out->preferred_segments = names + 1;
    out->preferred_count = (size_t)count - 1;
  }
  return pin_get(pin, out);
}

/* items_get's and multi_items_get's failure: what they took given back,
 * an exception set (MemoryError when none was). */
static Py_ssize_t items_failed(PyObject **keys, void *items, void *buffers) {
  if (!PyErr_Occurred())
    PyErr_NoMemory();
  Py_CLEAR(*keys);
  PyMem_Free(items);
  PyMem_Free(buffers);
  return -1;
}

/* keys (a sequence of str), and for the buffer forms addrs and sizes of the
 * same length: items[i] (keys point into the list's str objects). */
static Py_ssize_t items_get(PyObject *keys_o, PyObject *addrs_o, PyObject *sizes_o, PyObject **keys,
                            ferry_store_item **items) {
  *keys = PySequence_Fast(keys_o, "keys must be a sequence of str");
  if (!*keys)
    return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(*keys);
  PyObject *addrs = addrs_o ? PySequence_Fast(addrs_o, "addresses must be a sequence") : NULL;
  PyObject *sizes = sizes_o ? PySequence_Fast(sizes_o, "sizes must be a sequence") : NULL;
  *items = PyMem_Calloc(n ? (size_t)n : 1, sizeof **items);
  int ok = *items && (!addrs_o || (addrs && sizes));
  if (ok && addrs_o &&
      (PySequence_Fast_GET_SIZE(addrs) != n || PySequence_Fast_GET_SIZE(sizes) != n)) {
    PyErr_Format(PyExc_ValueError, "%zd keys, %zd addresses, %zd sizes: one of each per key", n,
                 PySequence_Fast_GET_SIZE(addrs), PySequence_Fast_GET_SIZE(sizes));
    ok = 0;
  }
  for (Py_ssize_t i = 0; ok && i < n; i++) {
    uint64_t addr = 0;
    (*items)[i].key = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(*keys, i));
    ok = (*items)[i].key != NULL;
    if (ok && addrs_o)
      ok = as_u64(PySequence_Fast_GET_ITEM(addrs, i), &addr) == 0 &&
           as_size(PySequence_Fast_GET_ITEM(sizes, i), &(*items)[i].length) == 0;
    (*items)[i].buf = (void *)(uintptr_t)addr;
  }
  Py_XDECREF(addrs);
  Py_XDECREF(sizes);
  if (!ok)
    return items_failed(keys, *items, NULL);
  return n;
}

/* Whether the call failed as a whole (arguments) rather than per item. */
static int failed_whole(const ferry_store_item *items, Py_ssize_t n, const CallResult *r) {
  for (Py_ssize_t i = 0; r->st != FERRY_OK && i < n; i++)
    if (items[i].status != FERRY_OK)
      return 0;
  return r->st != FERRY_OK;
}

/* [per item: size_or_zero when OK, else its negative status], detail or None. */
static PyObject *items_result(const ferry_store_item *items, Py_ssize_t n, int sizes,
                              const CallResult *r) {
  PyObject *list = PyList_New(n);
  for (Py_ssize_t i = 0; list && i < n; i++) {
    long long v = items[i].status ? items[i].status : (sizes ? (long long)items[i].length : 0);
    PyObject *x = PyLong_FromLongLong(v);
    if (!x) {
      Py_CLEAR(list);
      break;
    }
    PyList_SET_ITEM(list, i, x);
  }
  if (!list)
    return NULL;
  if (r->st == FERRY_OK)
    return Py_BuildValue("(NO)", list, Py_None);
  return Py_BuildValue("(Ns)", list, r->err);
}

/* ---- methods -------------------------------------------------------------------------------- */

static PyObject *store_put(StoreObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"key", "data", "replicas", "preferred_segment", "pin", "upsert", NULL};
  const char *key, *names[PREFERRED_MAX];
  Py_buffer data;
  PyObject *replicas = NULL, *preferred = NULL;
  PyObject *pin = NULL;
  int upsert = 0;
  ferry_store_replicate rep;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "sy*|OOOp:put", kwlist, &key, &data, &replicas,
                                   &preferred, &pin, &upsert))
    return NULL;
  if (replicate_get(replicas, preferred, pin, &rep, names) < 0 || store_enter(self) < 0) {
    PyBuffer_Release(&data);
    return NULL;
  }
  CallResult r;
  STORE_CALL(self, r,
             upsert ? ferry_store_upsert(self->store, key, data.buf, (size_t)data.len, &rep)
                    : ferry_store_put(self->store, key, data.buf, (size_t)data.len, &rep));
  PyBuffer_Release(&data);
  return none_or_raise(&r);
}

static PyObject *store_get(StoreObject *self, PyObject *args) {
  const char *key;
  if (!PyArg_ParseTuple(args, "s:get", &key) || store_enter(self) < 0)
    return NULL;
  void *data = NULL;
  size_t len = 0;
  CallResult r;
  STORE_CALL(self, r, ferry_store_get(self->store, key, &data, &len));
  if (r.st != FERRY_OK)
    return raise_result(&r);
  PyObject *out = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
  free(data);
  return out;
}

static PyObject *store_batch_put_from(StoreObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"keys", "addrs",  "sizes", "replicas", "preferred_segment",
                           "pin",  "upsert", NULL};
  PyObject *keys_o, *addrs_o, *sizes_o, *replicas = NULL, *keys;
  PyObject *preferred = NULL;
  const char *names[PREFERRED_MAX];
  PyObject *pin = NULL;
  int upsert = 0;
  ferry_store_replicate rep;
  ferry_store_item *items;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|OOOp:batch_put_from", kwlist, &keys_o, &addrs_o,
                                   &sizes_o, &replicas, &preferred, &pin, &upsert) ||
      replicate_get(replicas, preferred, pin, &rep, names) < 0)
    return NULL;
  Py_ssize_t n = items_get(keys_o, addrs_o, sizes_o, &keys, &items);
  if (n < 0)
    return NULL;
  PyObject *out = NULL;
  if (store_enter(self) == 0) {
    CallResult r;
    STORE_CALL(self, r,
               upsert ? ferry_store_upsert_from_batch(self->store, items, (size_t)n, &rep)
                      : ferry_store_put_from_batch(self->store, items, (size_t)n, &rep));
    out = failed_whole(items, n, &r) ? raise_result(&r) : items_result(items, n, 0, &r);
  }
  PyMem_Free(items);
  Py_DECREF(keys);
  return out;
}

/* batch_get_into (buffers), batch_exists (keys only) and batch_clear
 * (keys, and the segment: non-NULL). */
static PyObject *keys_call(StoreObject *self, PyObject *keys_o, PyObject *addrs_o,
                           PyObject *sizes_o, const char *segment) {
  PyObject *keys, *out = NULL;
  ferry_store_item *items;
  Py_ssize_t n = items_get(keys_o, addrs_o, sizes_o, &keys, &items);
  if (n < 0)
    return NULL;
  if (store_enter(self) == 0) {
    CallResult r;
    STORE_CALL(self, r,
               addrs_o   ? ferry_store_get_into_batch(self->store, items, (size_t)n)
               : segment ? ferry_store_clear_batch(self->store, items, (size_t)n, segment)
                         : ferry_store_exists_batch(self->store, items, (size_t)n));
    out = failed_whole(items, n, &r) ? raise_result(&r) : items_result(items, n, 1, &r);
  }
  PyMem_Free(items);
  Py_DECREF(keys);
  return out;
}

static PyObject *store_batch_get_into(StoreObject *self, PyObject *args) {
  PyObject *keys, *addrs, *sizes;
  if (!PyArg_ParseTuple(args, "OOO:batch_get_into", &keys, &addrs, &sizes))
    return NULL;
  return keys_call(self, keys, addrs, sizes, NULL);
}

static PyObject *store_batch_exists(StoreObject *self, PyObject *keys) {
  return keys_call(self, keys, NULL, NULL, NULL);
}

static PyObject *store_batch_clear(StoreObject *self, PyObject *args) {
  PyObject *keys;
  const char *segment = "";
  if (!PyArg_ParseTuple(args, "O|s:batch_clear", &keys, &segment))
    return NULL;
  return keys_call(self, keys, NULL, NULL, segment);
}

/* One key's answer: None (absent), else (size, [(kind, location, address)]). */
static PyObject *replica_list_result(const ferry_store_replica_list *it) {
  if (it->status == FERRY_ENOTFOUND)
    Py_RETURN_NONE;
  PyObject *reps = PyList_New((Py_ssize_t)it->count);
  for (size_t j = 0; reps && j < it->count; j++) {
    const ferry_store_replica *rp = &it->replicas[j];
    PyObject *x = Py_BuildValue("(isK)", rp->kind, rp->location, (unsigned long long)rp->address);
    if (!x)
      Py_CLEAR(reps);
    else
      PyList_SET_ITEM(reps, (Py_ssize_t)j, x);
  }
  return reps ? Py_BuildValue("(KN)", (unsigned long long)it->size, reps) : NULL;
}

static PyObject *store_batch_replicas(StoreObject *self, PyObject *keys_o) {
  PyObject *keys = PySequence_Fast(keys_o, "keys must be a sequence of str"), *out = NULL;
  if (!keys)
    return NULL;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(keys);
  ferry_store_replica_list *items = PyMem_Calloc(n ? (size_t)n : 1, sizeof *items);
  int ok = items != NULL;
  if (!ok)
    PyErr_NoMemory();
  for (Py_ssize_t i = 0; ok && i < n; i++)
    ok = (items[i].key = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(keys, i))) != NULL;
  if (ok && store_enter(self) == 0) {
    CallResult r;
    STORE_CALL(self, r, ferry_store_replicas_batch(self->store, items, (size_t)n));
    out = r.st ? raise_result(&r) : PyList_New(n);
    for (Py_ssize_t i = 0; !r.st && out && i < n; i++) {
      PyObject *x = replica_list_result(&items[i]);
      if (!x)
        Py_CLEAR(out);
      else
        PyList_SET_ITEM(out, i, x);
    }
    ferry_store_replica_lists_free(items, (size_t)n);
  }
  PyMem_Free(items);
  Py_DECREF(keys);
  return out;
}

/* keys, and per key a sequence of addresses and one of sizes (the
 * _multi_buffers forms): items[i] with buffers from one array. */
static Py_ssize_t multi_items_get(PyObject *keys_o, PyObject *addrs_o, PyObject *sizes_o,
                                  PyObject **keys, ferry_store_multi_item **items,
                                  ferry_store_buffer **buffers) {
  PyObject *addrs = NULL, *sizes = NULL, *inner_a = NULL, *inner_s = NULL;
  *keys = PySequence_Fast(keys_o, "keys must be a sequence of str");
  *items = NULL;
  *buffers = NULL;
  Py_ssize_t n = *keys ? PySequence_Fast_GET_SIZE(*keys) : 0, total = 0, at = 0;
  int ok = *keys && (addrs = PySequence_Fast(addrs_o, "all_buffer_ptrs must be a sequence")) &&
           (sizes = PySequence_Fast(sizes_o, "all_sizes must be a sequence"));
  if (ok && (PySequence_Fast_GET_SIZE(addrs) != n || PySequence_Fast_GET_SIZE(sizes) != n)) {
    PyErr_Format(PyExc_ValueError,
                 "%zd keys, %zd address lists, %zd size lists: one of each per key", n,
                 PySequence_Fast_GET_SIZE(addrs), PySequence_Fast_GET_SIZE(sizes));
    ok = 0;
  }
  for (Py_ssize_t i = 0; ok && i < n; i++) {
    Py_ssize_t len = PyObject_Length(PySequence_Fast_GET_ITEM(addrs, i));
    ok = len >= 0;
    total += ok ? len : 0;
  }
  ok = ok && (*items = PyMem_Calloc(n ? (size_t)n : 1, sizeof **items)) &&
       (*buffers = PyMem_Calloc(total ? (size_t)total : 1, sizeof **buffers));
  for (Py_ssize_t i = 0; ok && i < n; i++) {
    (*items)[i].key = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(*keys, i));
    inner_a = PySequence_Fast(PySequence_Fast_GET_ITEM(addrs, i), "buffer_ptrs must be a sequence");
    inner_s = PySequence_Fast(PySequence_Fast_GET_ITEM(sizes, i), "sizes must be a sequence");
    ok = (*items)[i].key && inner_a && inner_s;
    Py_ssize_t m = ok ? PySequence_Fast_GET_SIZE(inner_a) : 0;
    if (ok && (PySequence_Fast_GET_SIZE(inner_s) != m || at + m > total)) {
      PyErr_Format(PyExc_ValueError, "key %zd (\"%s\"): %zd addresses, %zd sizes", i,
                   (*items)[i].key, m, PySequence_Fast_GET_SIZE(inner_s));
      ok = 0;
    }
    (*items)[i].buffers = *buffers + at;
    (*items)[i].count = (size_t)m;
    for (Py_ssize_t j = 0; ok && j < m; j++, at++) {
      uint64_t addr = 0;
      ok = as_u64(PySequence_Fast_GET_ITEM(inner_a, j), &addr) == 0 &&
           as_size(PySequence_Fast_GET_ITEM(inner_s, j), &(*buffers)[at].length) == 0;
      (*buffers)[at].buf = (void *)(uintptr_t)addr;
    }
    Py_CLEAR(inner_a);
    Py_CLEAR(inner_s);
  }
  Py_XDECREF(addrs);
  Py_XDECREF(sizes);
  if (!ok)
    return items_failed(keys, *items, *buffers);
  return n;
}

/* batch_put_from_multi (replicate given) and batch_get_into_multi. */
static PyObject *multi_call(StoreObject *self, PyObject *keys_o, PyObject *addrs_o,
                            PyObject *sizes_o, const ferry_store_replicate *rep) {
  PyObject *keys, *out = NULL;
  ferry_store_multi_item *items;
  ferry_store_buffer *buffers;
  Py_ssize_t n = multi_items_get(keys_o, addrs_o, sizes_o, &keys, &items, &buffers);
  if (n < 0)
    return NULL;
  ferry_store_item *flat = PyMem_Calloc(n ? (size_t)n : 1, sizeof *flat);
  if (!flat)
    PyErr_NoMemory();
  else if (store_enter(self) == 0) {
    CallResult r;
    STORE_CALL(self, r,
               rep ? ferry_store_put_from_multi_buffers(self->store, items, (size_t)n, rep)
                   : ferry_store_get_into_multi_buffers(self->store, items, (size_t)n));
    for (Py_ssize_t i = 0; i < n; i++) /* as the single-buffer forms answer */
      flat[i] = (ferry_store_item){items[i].key, NULL, items[i].length, items[i].status};
    out = failed_whole(flat, n, &r) ? raise_result(&r) : items_result(flat, n, !rep, &r);
  }
  PyMem_Free(flat);
  PyMem_Free(buffers);
  PyMem_Free(items);
  Py_DECREF(keys);
  return out;
}

static PyObject *store_batch_put_from_multi(StoreObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"keys", "all_addrs", "all_sizes", "replicas", "preferred_segment",
                           "pin",  NULL};
  PyObject *keys, *addrs, *sizes, *replicas = NULL;
  PyObject *preferred = NULL;
  const char *names[PREFERRED_MAX];
  PyObject *pin = NULL;
  ferry_store_replicate rep;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|OOO:batch_put_from_multi", kwlist, &keys,
                                   &addrs, &sizes, &replicas, &preferred, &pin) ||
      replicate_get(replicas, preferred, pin, &rep, names) < 0)
    return NULL;
  return multi_call(self, keys, addrs, sizes, &rep);
}

static PyObject *store_batch_get_into_multi(StoreObject *self, PyObject *args) {
  PyObject *keys, *addrs, *sizes;
  if (!PyArg_ParseTuple(args, "OOO:batch_get_into_multi", &keys, &addrs, &sizes))
    return NULL;
  return multi_call(self, keys, addrs, sizes, NULL);
}

static PyObject *store_remove(StoreObject *self, PyObject *args) {
  const char *key;
  if (!PyArg_ParseTuple(args, "s:remove", &key) || store_enter(self) < 0)
    return NULL;
  CallResult r;
  STORE_CALL(self, r, ferry_store_remove(self->store, key));
  return none_or_raise(&r);
}

static PyObject *store_remove_all(StoreObject *self, PyObject *Py_UNUSED(noargs)) {
  if (store_enter(self) < 0)
    return NULL;
  uint64_t removed = 0;
  CallResult r;
  STORE_CALL(self, r, ferry_store_remove_all(self->store, &removed));
  return r.st ? raise_result(&r) : PyLong_FromUnsignedLongLong(removed);
}

static PyObject *store_segment(StoreObject *self, void *Py_UNUSED(closure)) {
  if (!self->store)
    return raise_status(FERRY_ECLOSED, "the store was closed");
  return PyUnicode_FromString(ferry_store_segment(self->store));
}

static PyObject *store_owner_disk_reads(StoreObject *self, void *Py_UNUSED(closure)) {
  if (!self->store)
    return raise_status(FERRY_ECLOSED, "the store was closed");
  return PyLong_FromUnsignedLongLong(ferry_store_owner_disk_reads(self->store));
}

/* put_batch(keys, values, ...): values any bytes-like objects, staged in C. */
static PyObject *store_put_batch(StoreObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"keys", "values", "replicas", "preferred_segment", "pin", NULL};
  PyObject *keys_o, *values_o, *replicas = NULL, *keys, *values = NULL, *out = NULL;
  PyObject *preferred = NULL;
  const char *names[PREFERRED_MAX];
  PyObject *pin = NULL;
  ferry_store_replicate rep;
  ferry_store_item *items;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OOO:put_batch", kwlist, &keys_o, &values_o,
                                   &replicas, &preferred, &pin) ||
      replicate_get(replicas, preferred, pin, &rep, names) < 0)
    return NULL;
  Py_ssize_t n = items_get(keys_o, NULL, NULL, &keys, &items);
  if (n < 0)
    return NULL;
  Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof *views);
  Py_ssize_t held = 0;
  values = PySequence_Fast(values_o, "values must be a sequence of bytes-like objects");
  if (!views)
    PyErr_NoMemory();
  else if (values && PySequence_Fast_GET_SIZE(values) != n)
    PyErr_Format(PyExc_ValueError, "%zd keys, %zd values: one value per key", n,
                 PySequence_Fast_GET_SIZE(values));
  else if (values)
    for (; held < n; held++) {
      if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(values, held), &views[held], PyBUF_SIMPLE) <
          0)
        break;
      items[held].buf = views[held].buf;
      items[held].length = (size_t)views[held].len;
    }
  if (held == n && values && store_enter(self) == 0) {
    CallResult r;
    STORE_CALL(self, r, ferry_store_put_batch(self->store, items, (size_t)n, &rep));
    out = failed_whole(items, n, &r) ? raise_result(&r) : items_result(items, n, 0, &r);
  }
  for (Py_ssize_t i = 0; i < held; i++)
    PyBuffer_Release(&views[i]);
  PyMem_Free(views);
  Py_XDECREF(values);
  PyMem_Free(items);
  Py_DECREF(keys);
  return out;
}

/* get_ranges(keys, addrs, offsets, lengths): one range per index, flat. */
static PyObject *store_get_ranges(StoreObject *self, PyObject *args) {
  PyObject *keys_o, *addrs_o, *offsets_o, *lengths_o, *keys, *offsets, *out = NULL;
  ferry_store_item *items;
  if (!PyArg_ParseTuple(args, "OOOO:get_ranges", &keys_o, &addrs_o, &offsets_o, &lengths_o))
    return NULL;
  Py_ssize_t n = items_get(keys_o, addrs_o, lengths_o, &keys, &items);
  if (n < 0)
    return NULL;
  ferry_store_range *rg = PyMem_Calloc(n ? (size_t)n : 1, sizeof *rg);
  offsets = PySequence_Fast(offsets_o, "offsets must be a sequence");
  int ok = rg && offsets;
  if (!rg)
    PyErr_NoMemory();
  if (ok && PySequence_Fast_GET_SIZE(offsets) != n) {
    PyErr_Format(PyExc_ValueError, "%zd keys, %zd offsets: one of each per range", n,
                 PySequence_Fast_GET_SIZE(offsets));
    ok = 0;
  }
  for (Py_ssize_t i = 0; ok && i < n; i++) {
    ok = as_u64(PySequence_Fast_GET_ITEM(offsets, i), &rg[i].offset) == 0;
    rg[i].key = items[i].key;
    rg[i].buf = items[i].buf;
    rg[i].length = items[i].length;
  }
  if (ok && store_enter(self) == 0) {
    CallResult r;
    STORE_CALL(self, r, ferry_store_get_ranges(self->store, rg, (size_t)n));
    for (Py_ssize_t i = 0; i < n; i++)
      items[i].status = rg[i].status;
    out = failed_whole(items, n, &r) ? raise_result(&r) : items_result(items, n, 1, &r);
  }
  Py_XDECREF(offsets);
  PyMem_Free(rg);
  PyMem_Free(items);
  Py_DECREF(keys);
  return out;
}

static PyMethodDef store_methods[] = {
    {"put", KW(store_put),
     "put(key, data, replicas=1, preferred_segment=None, pin=0, upsert=False): upsert replaces "
     "a stored value; pin (every put form): STORE_PIN_* or (STORE_PIN_*, STORE_SOFT_PIN_*, "
     "soft pin TTL ms or None)"},
    {"get", (PyCFunction)store_get, METH_VARARGS, "get(key) -> bytes"},
    {"batch_put_from", KW(store_batch_put_from),
     "batch_put_from(keys, addrs, sizes, replicas=1, preferred_segment=None, pin=0, "
     "upsert=False) -> ([0 or -status per key], first failure's detail or None); addrs "
     "registered on the engine"},
    {"batch_put_from_multi", KW(store_batch_put_from_multi),
     "batch_put_from_multi(keys, all_addrs, all_sizes, replicas=1, preferred_segment=None, "
     "pin=0) -> ([0 or -status per key], detail or None): a key's value is its buffers "
     "concatenated"},
    {"batch_get_into_multi", (PyCFunction)store_batch_get_into_multi, METH_VARARGS,
     "batch_get_into_multi(keys, all_addrs, all_sizes) -> ([bytes read or -status per key], "
     "detail or None): the value fills a key's buffers in order"},
    {"batch_get_into", (PyCFunction)store_batch_get_into, METH_VARARGS,
     "batch_get_into(keys, addrs, sizes) -> ([bytes read or -status per key], detail or None)"},
    {"batch_exists", (PyCFunction)store_batch_exists, METH_O,
     "batch_exists(keys) -> ([size, or -status (ENOTFOUND: absent) per key], detail or None)"},
    {"batch_replicas", (PyCFunction)store_batch_replicas, METH_O,
     "batch_replicas(keys) -> [None (absent) or (size, [(kind, location, address)]) per key]"},
    {"batch_clear", (PyCFunction)store_batch_clear, METH_VARARGS,
     "batch_clear(keys, segment='') -> ([0 or -status per key], detail or None): each key's "
     "replicas in segment ('': all) given back once no lease holds them"},
    {"put_batch", KW(store_put_batch),
     "put_batch(keys, values, replicas=1, preferred_segment=None, pin=0) -> ([0 or -status "
     "per key], detail or None); values any bytes-like objects"},
    {"get_ranges", (PyCFunction)store_get_ranges, METH_VARARGS,
     "get_ranges(keys, addrs, offsets, lengths) -> ([bytes read or -status per range], detail "
     "or None); addrs registered on the engine"},
    {"remove", (PyCFunction)store_remove, METH_VARARGS, "remove(key)"},
    {"remove_all", (PyCFunction)store_remove_all, METH_NOARGS, "remove_all() -> count removed"},
    {"close", (PyCFunction)store_close, METH_NOARGS,
     "close(): leave the store (before the engine)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef store_getset[] = {
    {"segment", (getter)store_segment, NULL, "the name of this client's segment", NULL},
    {"owner_disk_reads", (getter)store_owner_disk_reads, NULL,
     "gets answered with a copy loaded back from its owner's offload disk", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject StoreType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ferry._ferry.Store",
    .tp_basicsize = sizeof(StoreObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Store(engine, master, segment_size=0, local_buffer_size=0, secret=None, "
              "timeout_ms=0, offload_dir=None, offload_max_bytes=0, cxl_path=None, cxl_size=0): "
              "a client of a store master (docs/store.md; offload_dir: client-owned SSD offload; "
              "cxl_path: the CXL device of a master run with --enable_cxl)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)store_init,
    .tp_dealloc = (destructor)store_dealloc,
    .tp_methods = store_methods,
    .tp_getset = store_getset,
};
