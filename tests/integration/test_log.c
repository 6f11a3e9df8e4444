/* test_log.c - log lines reach the host's handler with their level, thread
 * and engine, from the caller's thread and from the engine's own; without
 * a handler they go to stderr in the documented format. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* cmocka needs the headers above first. */
#include <cmocka.h>

#include "base/log.h"
#include "ferry.h"
#include "harness.h"
#include "rawclient.h"

#define MAX_RECORDS 64

typedef struct seen {
  ferry_log_level level;
  uint64_t time_ns;
  long thread;
  char engine[96];
  char message[256];
  char line[400];
} seen;

static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static seen records[MAX_RECORDS];
static size_t record_count;

static void collect(const ferry_log_record *r, void *arg) {
  (void)arg;
  pthread_mutex_lock(&seen_lock);
  if (record_count < MAX_RECORDS) {
    seen *s = &records[record_count++];
    s->level = r->level;
    s->time_ns = r->time_ns;
    s->thread = r->thread;
    snprintf(s->engine, sizeof s->engine, "%s", r->engine);
    snprintf(s->message, sizeof s->message, "%s", r->message);
    snprintf(s->line, sizeof s->line, "%s", r->line);
  }
  pthread_mutex_unlock(&seen_lock);
}

/* The first record whose message holds needle, or NULL. */
static const seen *find(const char *needle) {
  const seen *found = NULL;
  pthread_mutex_lock(&seen_lock);
  for (size_t i = 0; i < record_count && !found; i++)
    if (strstr(records[i].message, needle))
      found = &records[i];
  pthread_mutex_unlock(&seen_lock);
  return found;
}

static int setup(void **state) {
  (void)state;
  record_count = 0;
  ferry_log_set_level(FERRY_LOG_INFO);
  ferry_log_set_handler(collect, NULL);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  ferry_log_set_handler(NULL, NULL);
  return 0;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The listening line comes from the creating thread, at INFO, naming the
 * engine in the record and in the formatted line. */
static void test_listening_line_to_handler(void **state) {
  (void)state;
  uint64_t before = now_ns();
  ferry_engine *e = test_engine(NULL);
  assert_non_null(e);
  const seen *s = find("listening on");
  assert_non_null(s);
  assert_int_equal(s->level, FERRY_LOG_INFO);
  assert_string_equal(s->engine, ferry_engine_name(e));
  assert_int_equal(s->thread, (long)syscall(SYS_gettid));
  assert_true(s->time_ns >= before - 1000000000ull && s->time_ns <= now_ns());
  char expect[160];
  snprintf(expect, sizeof expect, " INFO ferry[%d:%ld] %s: ", (int)getpid(), s->thread, s->engine);
  assert_non_null(strstr(s->line, expect));
  assert_non_null(strstr(s->line, s->message));
  assert_true(s->line[4] == '-' && s->line[10] == 'T' && s->line[23] == 'Z');
  ferry_engine_destroy(e);
}

/* A later call's lines name the engine called (set by the call gate). */
static void test_call_names_its_engine(void **state) {
  (void)state;
  ferry_engine *target = test_engine(NULL);
  ferry_engine *initiator = test_engine(NULL);
  assert_non_null(target);
  assert_non_null(initiator);
  unsigned used;
  assert_int_equal(ferry_peer_transport(initiator, ferry_engine_name(target), &used), FERRY_OK);
  const seen *s = find(": using ");
  assert_non_null(s);
  assert_string_equal(s->engine, ferry_engine_name(initiator));
  assert_int_equal(s->thread, (long)syscall(SYS_gettid));
  ferry_engine_destroy(initiator);
  ferry_engine_destroy(target);
}

/* A line of the target's connection thread names the target engine and
 * that thread, not the caller's: the refusal is logged before the refusal
 * is sent, so it is there when the probe returns. */
static void test_server_thread_names_its_engine(void **state) {
  (void)state;
  ferry_engine *target = test_engine("s3cret");
  ferry_engine *initiator = test_engine("not-the-secret");
  assert_non_null(target);
  assert_non_null(initiator);
  assert_int_equal(ferry_probe(initiator, ferry_engine_name(target)), FERRY_EAUTH);
  const seen *s = find("refused connection from");
  assert_non_null(s);
  assert_int_equal(s->level, FERRY_LOG_WARN);
  assert_string_equal(s->engine, ferry_engine_name(target));
  assert_int_not_equal(s->thread, (long)syscall(SYS_gettid));
  assert_non_null(strstr(s->line, " WARN "));
  ferry_engine_destroy(initiator);
  ferry_engine_destroy(target);
}

/* Below the level nothing reaches the handler; a line about no engine says
 * "-"; once the handler is removed lines go to stderr again. */
static void test_level_and_removal(void **state) {
  (void)state;
  ferry_log_set_level(FERRY_LOG_WARN);
  FERRY_INFO("below the level");
  ferry_log_set_level(FERRY_LOG_INFO);
  assert_null(find("below the level"));
  FERRY_INFO("about no engine");
  const seen *s = find("about no engine");
  assert_non_null(s);
  assert_string_equal(s->engine, "");
  assert_non_null(strstr(s->line, "] -: about no engine"));

  ferry_log_set_handler(NULL, NULL);
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  int saved = dup(STDERR_FILENO);
  dup2(pipefd[1], STDERR_FILENO);
  FERRY_WARN("after removal");
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(pipefd[1]);
  char out[512] = "";
  ssize_t n = read(pipefd[0], out, sizeof out - 1);
  close(pipefd[0]);
  assert_true(n > 0);
  out[n] = '\0';
  assert_null(find("after removal"));
  assert_non_null(strstr(out, " WARN ferry["));
  assert_non_null(strstr(out, "] -: after removal\n"));
}

/* ---- text from the wire cannot forge a line ---------------------------- */

/* What a hostile peer puts in a name or a reason: a newline, then a whole
 * line of its own making. */
#define FORGED_LINE "2026-01-01T00:00:00.000Z ERROR ferry[1:1] x: FORGED"
#define FORGED "evil\n" FORGED_LINE

static int has_control(const char *text) {
  for (const unsigned char *p = (const unsigned char *)text; *p; p++)
    if (*p < 0x20 || *p == 0x7f)
      return 1;
  return 0;
}

/* Whatever a caller passes, a record is one line: control characters in a
 * message reach neither the handler nor stderr. */
static void test_a_message_is_one_line(void **state) {
  (void)state;
  FERRY_WARN("name %s\tend", FORGED);
  const seen *s = find("name evil");
  assert_non_null(s);
  print_message("logged: %s\n", s->line);
  assert_false(has_control(s->message));
  assert_false(has_control(s->line));
  assert_non_null(strstr(s->message, "evil\\x0a2026-01-01T"));
  assert_non_null(strstr(s->message, "\\x09end"));
}

/* A peer's HELLO name is escaped as it comes in, before any proof: here a
 * target with a secret refuses the HELLO (no common version) and says why,
 * naming the peer; the reason the peer gets back, and the target's line on
 * stderr, hold the name escaped, and no forged line. */
static void test_a_hello_name_cannot_forge_a_line(void **state) {
  (void)state;
  ferry_log_set_handler(NULL, NULL); /* to stderr, as a target in a terminal or a journal */
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  int saved = dup(STDERR_FILENO);
  dup2(pipefd[1], STDERR_FILENO);
  ferry_engine *target = test_engine("s3cret");
  assert_non_null(target);
  int fd = raw_connect(ferry_engine_port(target));
  char reason[FERRY_WIRE_MAX_REASON + 1] = "";
  int st = raw_hello_called(fd, FORGED, 90, 91, reason, sizeof reason);
  close(fd);
  ferry_engine_destroy(target);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(pipefd[1]);
  static char out[65536];
  ssize_t n = read(pipefd[0], out, sizeof out - 1);
  close(pipefd[0]);
  out[n > 0 ? n : 0] = '\0';
  print_message("refused with %d: %s\nthe target logged:\n%s", st, reason, out);
  assert_int_equal(st, FERRY_EVERSION);
  assert_non_null(strstr(reason, "peer evil\\x0a2026-01-01T"));
  assert_false(has_control(reason));
  assert_non_null(strstr(out, "peer evil\\x0a2026-01-01T"));
  assert_null(strstr(out, "\n" FORGED_LINE));
}

/* A fake target that answers any HELLO with a refusal whose reason is
 * text: the initiator's error detail must hold it escaped. */
typedef struct fake_target {
  int listen_fd;
  uint16_t port;
  const char *reason;
} fake_target;

static void *refuse_one(void *arg) {
  fake_target *f = arg;
  int fd = accept(f->listen_fd, NULL, NULL);
  uint8_t raw[FERRY_WIRE_HEADER_SIZE], body[FERRY_WIRE_HELLO_MAX];
  ferry_frame_header h;
  if (fd >= 0 && raw_recv(fd, raw, sizeof raw) == 0 &&
      ferry_wire_header_decode(raw, &h) == FERRY_OK && raw_recv(fd, body, h.body_len) == 0) {
    ferry_frame_header r = {
        .type = FERRY_FRAME_HELLO_REPLY, .status = FERRY_EVERSION, .body_len = strlen(f->reason)};
    ferry_wire_header_encode(raw, &r);
    raw_send(fd, raw, sizeof raw);
    raw_send(fd, f->reason, strlen(f->reason));
  }
  if (fd >= 0)
    close(fd);
  return NULL;
}

static void test_a_refusal_reason_cannot_forge_a_line(void **state) {
  (void)state;
  fake_target f = {.reason = "no\n" FORGED_LINE};
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  f.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_int_equal(bind(f.listen_fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(f.listen_fd, 1), 0);
  assert_int_equal(getsockname(f.listen_fd, (struct sockaddr *)&a, &len), 0);
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, refuse_one, &f), 0);
  ferry_engine *initiator = test_engine(NULL);
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%u", ntohs(a.sin_port));
  ferry_status st = ferry_probe(initiator, target);
  char detail[1024];
  snprintf(detail, sizeof detail, "%s", ferry_last_error());
  print_message("probe: %d: %s\n", st, detail);
  pthread_join(thread, NULL);
  close(f.listen_fd);
  ferry_engine_destroy(initiator);
  assert_int_equal(st, FERRY_EVERSION);
  assert_non_null(strstr(detail, "no\\x0a2026-01-01T"));
  assert_false(has_control(detail));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_listening_line_to_handler, setup, teardown),
      cmocka_unit_test_setup_teardown(test_call_names_its_engine, setup, teardown),
      cmocka_unit_test_setup_teardown(test_server_thread_names_its_engine, setup, teardown),
      cmocka_unit_test_setup_teardown(test_level_and_removal, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_message_is_one_line, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_hello_name_cannot_forge_a_line, setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_refusal_reason_cannot_forge_a_line, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
