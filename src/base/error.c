/* error.c - status names, Mooncake code mapping and the per-thread detail. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[FERRY_ERROR_MAX];

/* Every text names where the code is explained, for the reader of a log. */
#define DOC(anchor) " (docs/errors.md#" anchor ")"

const char *ferry_strerror(ferry_status status) {
  switch (status) {
  case FERRY_OK: return "success";
  case FERRY_EINVAL: return "invalid argument" DOC("ferry_einval");
  case FERRY_ENOTREG: return "address not registered" DOC("ferry_enotreg");
  case FERRY_EOVERLAP: return "region overlaps a registered region" DOC("ferry_eoverlap");
  case FERRY_ENOMEM: return "out of memory" DOC("ferry_enomem");
  case FERRY_ESOCKET: return "socket error" DOC("ferry_esocket");
  case FERRY_EDNS: return "host name not resolved" DOC("ferry_edns");
  case FERRY_EHANDSHAKE: return "handshake rejected" DOC("ferry_ehandshake");
  case FERRY_EVERSION: return "incompatible protocol version" DOC("ferry_eversion");
  case FERRY_EAUTH: return "authentication failed" DOC("ferry_eauth");
  case FERRY_ETIMEDOUT: return "timed out" DOC("ferry_etimedout");
  case FERRY_EPROTO: return "malformed frame" DOC("ferry_eproto");
  case FERRY_EMETADATA: return "metadata service error" DOC("ferry_emetadata");
  case FERRY_EJSON: return "malformed JSON" DOC("ferry_ejson");
  case FERRY_ENOTIMPL: return "not implemented" DOC("ferry_enotimpl");
  case FERRY_EBUSY: return "busy" DOC("ferry_ebusy");
  case FERRY_ECHECKSUM: return "checksum mismatch" DOC("ferry_echecksum");
  case FERRY_ETRANSPORT: return "no usable transport" DOC("ferry_etransport");
  case FERRY_ECLOSED: return "engine closed" DOC("ferry_eclosed");
  case FERRY_ENOTFOUND: return "not found" DOC("ferry_enotfound");
  case FERRY_EREMOTE: return "remote failure" DOC("ferry_eremote");
  case FERRY_EINPROGRESS: return "in progress" DOC("ferry_einprogress");
  case FERRY_EFAULT: return "memory not accessible" DOC("ferry_efault");
  case FERRY_ECANCELED: return "cancelled" DOC("ferry_ecanceled");
  case FERRY_EIO: return "file I/O failed" DOC("ferry_eio");
  }
  return "unknown error" DOC("unknown-codes");
}

int ferry_status_to_mooncake(ferry_status status) {
  switch (status) {
  case FERRY_OK: return 0;
  case FERRY_EINVAL:
  case FERRY_EIO:
  case FERRY_EFAULT: return -1;
  case FERRY_EBUSY: return -4;
  case FERRY_ENOTREG: return -3;
  case FERRY_EOVERLAP: return -7;
  case FERRY_ENOMEM: return -302;
  case FERRY_EDNS: return -101;
  case FERRY_ESOCKET:
  case FERRY_EPROTO:
  case FERRY_ETIMEDOUT:
  case FERRY_ECHECKSUM:
  case FERRY_EREMOTE:
  case FERRY_ECLOSED:
  case FERRY_ECANCELED: return -102;
  case FERRY_EJSON: return -103;
  case FERRY_EHANDSHAKE:
  case FERRY_EVERSION:
  case FERRY_EAUTH: return -104;
  case FERRY_EMETADATA:
  case FERRY_ENOTFOUND: return -200;
  case FERRY_ETRANSPORT: return -201;
  case FERRY_ENOTIMPL: return -303;
  case FERRY_EINPROGRESS: return -4;
  }
  return -1;
}

const char *ferry_last_error(void) { return last_error; }

void ferry_error_set_detail(const char *detail) {
  snprintf(last_error, sizeof last_error, "%s", detail ? detail : "");
}

static void set_detail(const char *fmt, va_list ap, int err) {
  char msg[FERRY_ERROR_MAX - 64];
  vsnprintf(msg, sizeof msg, fmt, ap);
  if (err)
    snprintf(last_error, sizeof last_error, "%s: %s", msg, strerror(err));
  else
    snprintf(last_error, sizeof last_error, "%s", msg);
}

ferry_status ferry_fail(ferry_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_detail(fmt, ap, 0);
  va_end(ap);
  return code;
}

ferry_status ferry_fail_errno(ferry_status code, int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_detail(fmt, ap, err);
  va_end(ap);
  return code;
}
