/* fault_emu.c - see fault_emu.h. One thread reads packets from both TUN
 * devices, decides each packet's fate (drop, deliver now, deliver after the
 * delay) and writes it to the other device when due. Pending packets sit in
 * a min-heap ordered by due time, then arrival order, so equal delays keep
 * their order and only "reordered" packets overtake. The queue is bounded
 * like netem's (1000 packets per direction by default): beyond it packets
 * are dropped, as a full router queue would. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fault_emu.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EMU_MTU 65536
#define EMU_QUEUE_LIMIT 4000

typedef struct emu_packet {
  uint64_t due_ns;
  uint64_t seq;
  int to; /* 0: write to fd a, 1: write to fd b */
  size_t len;
  uint8_t data[];
} emu_packet;

struct fault_emu {
  int fd[2];
  int wake[2];
  pthread_t thread;
  pthread_mutex_t lock; /* the parameters below */
  uint64_t delay_ns;
  uint32_t loss_ppm, reorder_ppm;
  uint64_t forwarded, dropped; /* atomics */
  emu_packet **heap;
  size_t heap_len, heap_cap;
  uint64_t seq;
  uint64_t rng;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t rand_ppm(fault_emu *e) {
  e->rng ^= e->rng << 13;
  e->rng ^= e->rng >> 7;
  e->rng ^= e->rng << 17;
  return (uint32_t)(e->rng % 1000000u);
}

static int before(const emu_packet *x, const emu_packet *y) {
  return x->due_ns < y->due_ns || (x->due_ns == y->due_ns && x->seq < y->seq);
}

static int heap_push(fault_emu *e, emu_packet *p) {
  if (e->heap_len == e->heap_cap) {
    size_t cap = e->heap_cap ? e->heap_cap * 2 : 256;
    emu_packet **grown = realloc(e->heap, cap * sizeof *grown);
    if (!grown)
      return -1;
    e->heap = grown;
    e->heap_cap = cap;
  }
  size_t i = e->heap_len++;
  while (i > 0 && before(p, e->heap[(i - 1) / 2])) {
    e->heap[i] = e->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  e->heap[i] = p;
  return 0;
}

static emu_packet *heap_pop(fault_emu *e) {
  emu_packet *top = e->heap[0];
  emu_packet *last = e->heap[--e->heap_len];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= e->heap_len)
      break;
    if (c + 1 < e->heap_len && before(e->heap[c + 1], e->heap[c]))
      c++;
    if (!before(e->heap[c], last))
      break;
    e->heap[i] = e->heap[c];
    i = c;
  }
  if (e->heap_len)
    e->heap[i] = last;
  return top;
}

/* Reads every packet waiting on fd[from] and queues or drops each. */
static void take_packets(fault_emu *e, int from, uint8_t *buf) {
  for (;;) {
    ssize_t n = read(e->fd[from], buf, EMU_MTU);
    if (n <= 0)
      return;
    pthread_mutex_lock(&e->lock);
    uint64_t delay = e->delay_ns;
    uint32_t loss = e->loss_ppm, reorder = e->reorder_ppm;
    pthread_mutex_unlock(&e->lock);
    if ((loss && rand_ppm(e) < loss) || e->heap_len >= EMU_QUEUE_LIMIT) {
      __atomic_add_fetch(&e->dropped, 1, __ATOMIC_RELAXED);
      continue;
    }
    emu_packet *p = malloc(sizeof *p + (size_t)n);
    if (!p)
      continue;
    p->len = (size_t)n;
    memcpy(p->data, buf, (size_t)n);
    p->to = !from;
    p->seq = e->seq++;
    p->due_ns = now_ns() + ((reorder && rand_ppm(e) < reorder) ? 0 : delay);
    if (heap_push(e, p) != 0)
      free(p);
  }
}

static void deliver_due(fault_emu *e) {
  uint64_t now = now_ns();
  while (e->heap_len && e->heap[0]->due_ns <= now) {
    emu_packet *p = heap_pop(e);
    if (write(e->fd[p->to], p->data, p->len) == (ssize_t)p->len)
      __atomic_add_fetch(&e->forwarded, 1, __ATOMIC_RELAXED);
    else
      __atomic_add_fetch(&e->dropped, 1, __ATOMIC_RELAXED);
    free(p);
  }
}

static void *emu_loop(void *arg) {
  fault_emu *e = arg;
  uint8_t *buf = malloc(EMU_MTU);
  for (;;) {
    int timeout = 100;
    if (e->heap_len) {
      uint64_t now = now_ns(), due = e->heap[0]->due_ns;
      timeout = due <= now ? 0 : (int)((due - now + 999999) / 1000000);
    }
    struct pollfd fds[3] = {{e->fd[0], POLLIN, 0}, {e->fd[1], POLLIN, 0}, {e->wake[0], POLLIN, 0}};
    if (poll(fds, 3, timeout) < 0 && errno != EINTR)
      break;
    if (fds[2].revents)
      break;
    for (int i = 0; i < 2; i++)
      if (fds[i].revents & POLLIN)
        take_packets(e, i, buf);
    deliver_due(e);
  }
  free(buf);
  return NULL;
}

fault_emu *fault_emu_start(int fd_a, int fd_b) {
  fault_emu *e = calloc(1, sizeof *e);
  if (!e)
    return NULL;
  e->fd[0] = fd_a;
  e->fd[1] = fd_b;
  e->rng = 0x2545F4914F6CDD1Dull ^ (uint64_t)getpid();
  pthread_mutex_init(&e->lock, NULL);
  if (pipe2(e->wake, O_CLOEXEC) < 0 || pthread_create(&e->thread, NULL, emu_loop, e) != 0) {
    close(fd_a);
    close(fd_b);
    free(e);
    return NULL;
  }
  return e;
}

void fault_emu_set(fault_emu *e, unsigned delay_ms, double loss_pct, double reorder_pct) {
  pthread_mutex_lock(&e->lock);
  e->delay_ns = (uint64_t)delay_ms * 1000000ull;
  e->loss_ppm = (uint32_t)(loss_pct * 10000.0);
  e->reorder_ppm = (uint32_t)(reorder_pct * 10000.0);
  pthread_mutex_unlock(&e->lock);
}

void fault_emu_counters(fault_emu *e, uint64_t *forwarded, uint64_t *dropped) {
  *forwarded = __atomic_load_n(&e->forwarded, __ATOMIC_RELAXED);
  *dropped = __atomic_load_n(&e->dropped, __ATOMIC_RELAXED);
}

void fault_emu_stop(fault_emu *e) {
  if (!e)
    return;
  ssize_t unused = write(e->wake[1], "x", 1);
  (void)unused;
  pthread_join(e->thread, NULL);
  while (e->heap_len)
    free(heap_pop(e));
  free(e->heap);
  close(e->fd[0]);
  close(e->fd[1]);
  close(e->wake[0]);
  close(e->wake[1]);
  pthread_mutex_destroy(&e->lock);
  free(e);
}
