/* log.c - libferry's log level from Python (a number or a name, for
 * set_log_level() and Engine(log_level=)), and libferry's log lines handed
 * to Python's `logging` through a bounded queue (below). */
#include "_ferry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>

#define LOG_ENGINE_MAX 288 /* an engine name: host (255) and :port */

int parse_log_level(PyObject *o, ferry_log_level *out) {
  if (PyUnicode_Check(o)) {
    const char *s = PyUnicode_AsUTF8(o);
    if (!s)
      return -1;
    if (!strcasecmp(s, "debug"))
      *out = FERRY_LOG_DEBUG;
    else if (!strcasecmp(s, "info"))
      *out = FERRY_LOG_INFO;
    else if (!strcasecmp(s, "warn") || !strcasecmp(s, "warning"))
      *out = FERRY_LOG_WARN;
    else if (!strcasecmp(s, "error"))
      *out = FERRY_LOG_ERROR;
    else if (!strcasecmp(s, "off") || !strcasecmp(s, "none"))
      *out = FERRY_LOG_OFF;
    else {
      PyErr_Format(PyExc_ValueError, "unknown log level '%s' (debug, info, warn, error, off)", s);
      return -1;
    }
    return 0;
  }
  uint64_t v;
  if (as_u64(o, &v) < 0)
    return -1;
  if (v > FERRY_LOG_OFF) {
    PyErr_SetString(PyExc_ValueError, "log level must be 0..4");
    return -1;
  }
  *out = (ferry_log_level)v;
  return 0;
}

PyObject *mod_set_log_level(PyObject *Py_UNUSED(m), PyObject *arg) {
  ferry_log_level lv;
  if (parse_log_level(arg, &lv) < 0)
    return NULL;
  ferry_log_set_level(lv);
  Py_RETURN_NONE;
}

PyObject *mod_get_log_level(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs)) {
  return PyLong_FromLong(ferry_log_get_level());
}

/* ---- libferry's log lines into Python's `logging` ----------------------
 *
 * The handler runs on whatever thread emits the line, often one of
 * libferry's own, possibly with engine locks held. It never takes the GIL
 * or runs Python: it copies the line into a bounded queue and wakes the
 * package's drain thread (ferry/__init__.py), which hands the lines to the
 * logger "ferry" with no libferry lock held. A full queue drops lines and
 * says how many in the next one. */

#define LOG_QUEUE_MAX 1024

typedef struct queued_line {
  int level;
  uint64_t time_ns;
  long thread;
  char engine[LOG_ENGINE_MAX];
  char message[1024];
} queued_line;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t log_ready = PTHREAD_COND_INITIALIZER;
static queued_line *log_queue; /* LOG_QUEUE_MAX slots, allocated on first use */
static size_t log_head, log_count;
static unsigned long log_dropped;

static void queue_log_line(const ferry_log_record *r, void *arg) {
  (void)arg;
  pthread_mutex_lock(&log_lock);
  if (log_count == LOG_QUEUE_MAX) {
    log_dropped++;
  } else {
    queued_line *q = &log_queue[(log_head + log_count++) % LOG_QUEUE_MAX];
    q->level = r->level;
    q->time_ns = r->time_ns;
    q->thread = r->thread;
    snprintf(q->engine, sizeof q->engine, "%s", r->engine);
    snprintf(q->message, sizeof q->message, "%s", r->message);
    pthread_cond_signal(&log_ready);
  }
  pthread_mutex_unlock(&log_lock);
}

/* A fork while another thread queues a line must not leave the child's
 * queue locked forever. */
static void log_lock_take(void) { pthread_mutex_lock(&log_lock); }
static void log_lock_give(void) { pthread_mutex_unlock(&log_lock); }

/* _log_route(on): libferry's lines to the queue (True) or to stderr. */
PyObject *mod_log_route(PyObject *Py_UNUSED(m), PyObject *arg) {
  int on = PyObject_IsTrue(arg);
  if (on < 0)
    return NULL;
  if (on && !log_queue) {
    if (!(log_queue = calloc(LOG_QUEUE_MAX, sizeof *log_queue)))
      return PyErr_NoMemory();
    pthread_atfork(log_lock_take, log_lock_give, log_lock_give);
  }
  PyThreadState *ts_ = PyEval_SaveThread(); /* a line being queued may finish */
  ferry_log_set_handler(on ? queue_log_line : NULL, NULL);
  PyEval_RestoreThread(ts_);
  Py_RETURN_NONE;
}

/* _log_wait(timeout_s): waits (without the GIL) until a line is queued or
 * the time is up; True if one is. */
PyObject *mod_log_wait(PyObject *Py_UNUSED(m), PyObject *arg) {
  double timeout = PyFloat_AsDouble(arg);
  if (timeout == -1.0 && PyErr_Occurred())
    return NULL;
  int ready;
  PyThreadState *ts_ = PyEval_SaveThread();
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)timeout;
  until.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&log_lock);
  while (!log_count && !log_dropped)
    if (pthread_cond_timedwait(&log_ready, &log_lock, &until) != 0)
      break;
  ready = log_count || log_dropped;
  pthread_mutex_unlock(&log_lock);
  PyEval_RestoreThread(ts_);
  return PyBool_FromLong(ready);
}

/* _log_take() -> [(level, time_ns, thread, engine, message)], emptying the
 * queue. A drop is reported as a WARN line of its own. */
PyObject *mod_log_take(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(noargs)) {
  PyObject *list = PyList_New(0);
  if (!list)
    return NULL;
  pthread_mutex_lock(&log_lock);
  unsigned long dropped = log_dropped;
  log_dropped = 0;
  for (; log_count; log_count--, log_head = (log_head + 1) % LOG_QUEUE_MAX) {
    const queued_line *q = &log_queue[log_head];
    PyObject *t = Py_BuildValue("(iKlss)", q->level, (unsigned long long)q->time_ns, q->thread,
                                q->engine, q->message);
    if (!t || PyList_Append(list, t) < 0) {
      Py_XDECREF(t);
      PyErr_Clear(); /* the line is lost, not the queue */
      continue;
    }
    Py_DECREF(t);
  }
  pthread_mutex_unlock(&log_lock);
  if (dropped) {
    char msg[128];
    snprintf(msg, sizeof msg, "%lu log lines dropped: the queue to Python's logging was full",
             dropped);
    PyObject *t = Py_BuildValue("(iKlss)", FERRY_LOG_WARN, 0ULL, 0L, "", msg);
    if (!t || PyList_Append(list, t) < 0)
      PyErr_Clear();
    Py_XDECREF(t);
  }
  return list;
}
