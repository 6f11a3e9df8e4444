/* fault_mix.c - the fixed mix of verified transfers that the tests of
 * impaired links (delay, loss, reordering; emulated or tc netem) all run,
 * so each of them checks the same things (see fault.h). */
#include <stdio.h>
#include <string.h>

#include "fault.h"

static ferry_status mix(ferry_engine *eng, const fault_proc *t, uint8_t *local, size_t *moved) {
  const size_t sizes[] = {1, 100, 4096, 65536, 300000, 1 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    ferry_status st =
        fault_roundtrip(eng, t->target, local, t->addr + i * 4096 * 7, sizes[i], i + 5);
    if (st) {
      fprintf(stderr, "fault: %zu-byte round trip to %s: %s: %s\n", sizes[i], t->target,
              ferry_strerror(st), ferry_last_error());
      return st;
    }
    *moved += 2 * sizes[i];
  }
  /* A batch of small entries each way, then a notification. */
  ferry_entry entries[64];
  fault_pattern(local, 64 * 4096, 99);
  for (int i = 0; i < 64; i++)
    entries[i] =
        (ferry_entry){FERRY_OP_WRITE, local + i * 4096, t->addr + (1 << 20) + i * 8192, 4096};
  ferry_status st = ferry_transfer_sync_batch(eng, t->target, entries, 64, NULL);
  for (int i = 0; i < 64; i++)
    entries[i] = (ferry_entry){FERRY_OP_READ, local + (1 << 20) + i * 4096,
                               t->addr + (1 << 20) + i * 8192, 4096};
  if (st == FERRY_OK)
    st = ferry_transfer_sync_batch(eng, t->target, entries, 64, NULL);
  if (st == FERRY_OK && memcmp(local, local + (1 << 20), 64 * 4096) != 0)
    st = FERRY_ECHECKSUM;
  if (st == FERRY_OK)
    st = ferry_notify_send(eng, t->target, "impaired", "ok", 2);
  if (st) {
    fprintf(stderr, "fault: 64-entry batches or notification to %s: %s: %s\n", t->target,
            ferry_strerror(st), st == FERRY_ECHECKSUM ? "bytes differ" : ferry_last_error());
    return st;
  }
  *moved += 2 * 64 * 4096;
  return FERRY_OK;
}

ferry_status fault_transfer_mix(fault_net *net, int host, const char *bind, const fault_proc *t,
                                const char *label) {
  if (fault_net_enter(net, host) != 0)
    return FERRY_ESOCKET;
  double t0 = fault_now();
  size_t moved = 0;
  /* Generous deadlines: the link is slow on purpose; only a hang fails. */
  ferry_engine *eng = fault_engine(bind, 60000, 20000, 0);
  uint8_t *local = eng ? fault_buffer(eng, 4 << 20) : NULL;
  ferry_status st = local ? mix(eng, t, local, &moved) : FERRY_ENOMEM;
  if (st == FERRY_OK)
    printf("%s: %zu bytes moved and verified in %.1f s\n", label, moved, fault_now() - t0);
  if (eng) {
    fault_buffer_free(eng, local);
    ferry_engine_destroy(eng);
  }
  fault_net_leave(net);
  return st;
}
