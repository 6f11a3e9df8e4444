/* async_batch.c - many entries in one asynchronous batch, with a
 * notification that reaches the target only after all of the batch's data
 * landed (how a prefill server tells a decode server "your KV pages are
 * in"). The initiator is free while the batch runs; it waits at the end.
 *
 *   cc async_batch.c $(pkg-config --cflags --libs ferry) -o async_batch */
#include <ferry.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGES 256
#define PAGE 4096

static int check(ferry_status st, const char *what) {
  if (st != FERRY_OK)
    fprintf(stderr, "async_batch: %s: %s: %s\n", what, ferry_strerror(st), ferry_last_error());
  return st != FERRY_OK;
}

/* The target's side: its queue holds the notification once the data is in. */
static int notification_arrived(ferry_engine *target, const char *pages) {
  ferry_notification *list = NULL;
  size_t count = 0;
  if (check(ferry_notify_drain(target, &list, &count), "drain notifications"))
    return 0;
  int ok = count == 1 && strcmp(list[0].name, "kv-ready") == 0 &&
           strcmp(list[0].data, "request 42") == 0 && pages[PAGES * PAGE - 1] == (char)0x42;
  ferry_notify_free(list, count);
  return ok;
}

int main(void) {
  ferry_config cfg;
  ferry_config_init(&cfg);
  cfg.bind_host = cfg.advertise_host = "127.0.0.1";
  cfg.log_level = FERRY_LOG_WARN;
  cfg.log_level_set = 1;

  ferry_engine *target = NULL, *initiator = NULL;
  void *dst = NULL, *src = NULL;
  int failed = check(ferry_engine_create(&cfg, &target), "create the target") ||
               check(ferry_engine_create(&cfg, &initiator), "create the initiator") ||
               /* Registered, zero-filled buffers the engine allocates. */
               check(ferry_memory_alloc(target, PAGES * PAGE, &dst), "alloc on the target") ||
               check(ferry_memory_alloc(initiator, PAGES * PAGE, &src), "alloc on the initiator");
  ferry_batch *batch = NULL;
  if (!failed) {
    memset(src, 0x42, PAGES * PAGE);
    ferry_entry entries[PAGES];
    for (size_t i = 0; i < PAGES; i++) { /* scattered: page i goes to slot PAGES-1-i */
      entries[i].op = FERRY_OP_WRITE;
      entries[i].local = (char *)src + i * PAGE;
      entries[i].remote = (uint64_t)(uintptr_t)dst + (PAGES - 1 - i) * PAGE;
      entries[i].length = PAGE;
    }
    ferry_notification note = {"kv-ready", "request 42", strlen("request 42")};
    failed = check(
        ferry_batch_submit(initiator, ferry_engine_name(target), entries, PAGES, &note, &batch),
        "submit");
  }
  /* ... other work here; ferry_batch_status(batch, NULL) polls ... */
  if (!failed)
    failed = check(ferry_batch_wait(batch, -1), "wait for the batch");
  ferry_batch_free(batch);
  if (!failed && !notification_arrived(target, dst)) {
    fprintf(stderr, "async_batch: no notification, or the data is not all there\n");
    failed = 1;
  }
  if (!failed)
    printf("async_batch: %d pages in one batch, notification after the data, verified\n", PAGES);
  ferry_engine_destroy(initiator); /* frees the buffers it allocated */
  ferry_engine_destroy(target);
  return failed;
}
