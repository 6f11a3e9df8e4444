/* stats.c - Engine.stats(), a snapshot of the engine's counters
 * (ferry_stats_snapshot) as nested dicts, and Engine.stats_text(), the same
 * snapshot in Prometheus' text format. */
#include "_ferry.h"

#include <stdlib.h>
#include <string.h>

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

/* {"tcp": n, "shm": n, "fabric": n}: peers' connections accepted as target. */
static PyObject *accepted_dict(const ferry_stats *s) {
  PyObject *d = PyDict_New();
  for (unsigned bit = 0; d && bit < 3; bit++)
    if (put(d, ferry_transport_name(1u << bit),
            PyLong_FromUnsignedLongLong(s->connections_accepted[bit])) < 0)
      Py_CLEAR(d);
  return d;
}

static PyObject *stats_dict(const ferry_stats *s) {
  uint64_t totals[4] = {0, 0, 0, 0};
  PyObject *d = PyDict_New();
  if (d &&
      (put(d, "links", links_list(s, totals)) < 0 || put(d, "bytes", by_op(totals)) < 0 ||
       put(d, "ops", by_op(totals + 2)) < 0 || put(d, "served_bytes", by_op(s->served_bytes)) < 0 ||
       put(d, "served_requests", by_op(s->served_requests)) < 0 ||
       put(d, "connections_accepted", accepted_dict(s)) < 0 ||
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

/* The engine's counters now, or NULL with the exception set. */
static ferry_stats *snapshot(EngineObject *self) {
  if (eng_enter(self) < 0)
    return NULL;
  ferry_stats *s = NULL;
  CallResult r;
  ENGINE_CALL(self, r, ferry_stats_snapshot(self->eng, &s));
  if (r.st != FERRY_OK) {
    raise_result(&r);
    return NULL;
  }
  return s;
}

PyObject *engine_stats(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  ferry_stats *s = snapshot(self);
  if (!s)
    return NULL;
  PyObject *d = stats_dict(s);
  ferry_stats_free(s);
  return d;
}

PyObject *engine_stats_text(EngineObject *self, PyObject *Py_UNUSED(noargs)) {
  ferry_stats *s = snapshot(self);
  if (!s)
    return NULL;
  char *text = NULL;
  ferry_status st = ferry_stats_prometheus(s, &text);
  ferry_stats_free(s);
  if (st != FERRY_OK)
    return raise_status(st, ferry_last_error());
  PyObject *o = PyUnicode_FromString(text);
  free(text);
  return o;
}
