/* fault.h - support code for the fault tests: test hosts made of network
 * namespaces, links between them (veth pairs, or a userspace link emulator
 * over TUN devices that adds delay, loss and reordering where the kernel has
 * no netem), `ferry serve` processes started inside them, a raw-socket ferry
 * client for hostile peers, a frame-aware proxy that corrupts data in flight,
 * and cleanup that runs however a test ends (teardown, atexit, signals, and a
 * sweep of namespaces left behind by killed runs).
 *
 * Hosts are named ferryt-<pid>-<n><letter>; link L joins two hosts with the
 * addresses 10.202.L.1 and 10.202.L.2, which exist only inside those
 * namespaces. Where namespaces are unavailable (not root, no `ip`), a net can
 * still be created in loopback mode: every host is 127.0.0.1 and links cannot
 * be cut, so only the tests that need real links skip. */
#ifndef FERRY_FAULT_H
#define FERRY_FAULT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cases.h"
#include "ferry.h"
#include "wire/wire.h"

#define FAULT_MAX_HOSTS 6
#define FAULT_MAX_LINKS 8
#define FAULT_UNSUPPORTED (-2) /* the kernel or host lacks what was asked */

/* ---- time and small helpers ------------------------------------------------ */
double fault_now(void); /* monotonic seconds */
void fault_sleep_ms(unsigned ms);
/* Fills buf with a pattern that depends on seed and on the position, so a
 * byte landing at the wrong offset is caught too. */
void fault_pattern(void *buf, size_t size, uint64_t seed);
/* Runs a command (no shell; the line is split on spaces), output into out
 * (may be NULL). Returns its exit status, or -1 when it could not run. */
int fault_cmd(char *out, size_t out_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Kills the whole test after `seconds` (0 cancels) with a message naming
 * what was running; the cleanup handlers still remove the namespaces. */
void fault_watchdog(unsigned seconds, const char *what);

/* ---- test hosts -------------------------------------------------------------- */
typedef enum fault_link_kind {
  FAULT_LINK_VETH = 1, /* kernel veth pair: can be cut; netem where built in */
  FAULT_LINK_EMU = 2,  /* TUN devices joined by a userspace emulator thread */
} fault_link_kind;

typedef struct fault_net fault_net;

/* Nonzero when namespaces can be used here; why gets the reason if not. */
int fault_netns_available(char *why, size_t why_size);
/* nhosts namespaces (isolated = 1), or loopback mode (isolated = 0: every
 * host is 127.0.0.1). NULL with why filled when isolated mode fails. */
fault_net *fault_net_create(int nhosts, int isolated, char *why, size_t why_size);
/* A test's hosts in namespaces of their own, for a test whose point needs
 * them (no loopback mode): 0 with *net set; 0 with *net NULL and skip_why
 * filled where namespaces cannot be used here (the test skips); -1, with the
 * reason on stderr, when they could not be created. */
int fault_net_open_isolated(int nhosts, fault_net **net, char *skip_why, size_t skip_size);
/* A test's hosts: namespaces where they can be used, else loopback mode
 * (a note on stdout says why). NULL, with the reason on stderr, on failure. */
fault_net *fault_net_open(int nhosts);
/* Removes every namespace, link and emulator of the net (idempotent). The
 * calling thread is moved back to the namespace it started in. */
void fault_net_destroy(fault_net *net);
int fault_net_isolated(const fault_net *net);
/* port in isolated mode; 0 (any free port) in loopback mode, where a fixed
 * port could be taken by something else on the machine. */
uint16_t fault_port(const fault_net *net, uint16_t port);
/* Joins hosts a and b; returns the link id (>= 0) or -1. */
int fault_net_link(fault_net *net, int a, int b, fault_link_kind kind);
/* Address of side 0 (host a) or side 1 (host b) of a link. */
const char *fault_link_addr(const fault_net *net, int link, int side);
/* Namespace name of a host ("" in loopback mode). */
const char *fault_host_ns(const fault_net *net, int host);
/* Moves the calling thread into a host's namespace (threads it creates
 * afterwards, e.g. an engine's, stay there). 0 on success. */
int fault_net_enter(fault_net *net, int host);
int fault_net_leave(fault_net *net);
/* Cuts (up = 0) or restores a link, both ends. */
int fault_link_set_up(fault_net *net, int link, int up);
/* delay (ms, each direction), loss and reordering (percent, each
 * direction). veth: tc netem, FAULT_UNSUPPORTED when the kernel lacks it.
 * emu: applied by the emulator thread. All zero: a clean link again. */
int fault_link_impair(fault_net *net, int link, unsigned delay_ms, double loss_pct,
                      double reorder_pct);
/* Bytes the kernel of a link's side (0: host a, 1: host b) has received on
 * it so far, whether or not any process read them: shows that a transfer to
 * a stopped target is on the wire. 0, FAULT_UNSUPPORTED in loopback mode. */
int fault_link_rx_bytes(const fault_net *net, int link, int side, uint64_t *bytes);
/* Packets the emulator has dropped/forwarded on a link (emu links only). */
void fault_link_counters(const fault_net *net, int link, uint64_t *forwarded, uint64_t *dropped);

/* ---- ferry serve processes ------------------------------------------------------ */
typedef struct fault_proc {
  pid_t pid;
  char target[80]; /* "host:port" from its ready line */
  uint64_t addr;   /* its registered buffer */
  uint64_t size;
  char log[128]; /* its stderr, appended across restarts */
  /* how it was started, for fault_serve_restart */
  const fault_net *net;
  int host;
  char bind[64];
  uint16_t port;
  char size_arg[32];
  const char *extra[8];
  int fixed_layout;
  int stopped; /* by fault_proc_pause */
} fault_proc;

/* `$FERRY_TOOL serve --host BIND --port PORT --size SIZE [extra]` inside a
 * host (extra is NULL-terminated, at most 7 strings that must outlive the
 * proc). fixed_layout: run without address-space randomization, so a restart
 * registers the same addresses (as a target with a fixed memory layout
 * would). Waits 10 s at most for the ready line. 0 on success. */
int fault_serve_start(fault_proc *p, const fault_net *net, int host, const char *bind,
                      uint16_t port, const char *size, const char *const *extra, int fixed_layout);
/* Starts it again the same way, on the same port (after a kill). */
int fault_serve_restart(fault_proc *p);
void fault_proc_kill(fault_proc *p); /* SIGKILL (a stopped one too, without running it), reaped */
int fault_proc_term(fault_proc *p);  /* SIGTERM; the exit status (-1 on trouble) */
/* SIGSTOP, and returns once the process has stopped (waitpid WUNTRACED): from
 * then on it answers nothing, so a transfer to it provably stays in flight
 * until fault_proc_resume. 0, or -1 if it died instead. */
int fault_proc_pause(fault_proc *p);
void fault_proc_resume(fault_proc *p); /* SIGCONT */
/* Nonzero when the process's log contains needle. */
int fault_proc_log_has(const fault_proc *p, const char *needle);
/* Resident set of a process in KiB (0 if unknown). */
long fault_rss_kib(pid_t pid);

/* ---- raw ferry client (hostile peers) ---------------------------------------------- */
typedef struct fault_raw {
  int fd;
  uint64_t next_id;
  ferry_hello_reply info;
} fault_raw;

/* TCP connection to host:port with a timeout on every read and write. */
int fault_raw_connect(fault_raw *r, const char *target, unsigned timeout_ms);
void fault_raw_close(fault_raw *r);
int fault_raw_send(fault_raw *r, const void *buf, size_t len);
/* Sends one frame (header + optional body). */
int fault_raw_send_frame(fault_raw *r, const ferry_frame_header *h, const void *body);
/* Reads one header; FERRY_OK, or FERRY_ESOCKET on EOF/timeout (eof set to
 * 1 on a clean close), FERRY_EPROTO on a bad header. */
ferry_status fault_raw_recv_header(fault_raw *r, ferry_frame_header *h, int *eof);
int fault_raw_recv(fault_raw *r, void *buf, size_t len);
/* HELLO, HELLO_REPLY and, when the target asks, AUTH with secret (NULL:
 * send no AUTH). Returns the status the target answered (or ESOCKET). */
ferry_status fault_raw_handshake(fault_raw *r, const char *secret);
/* Nonzero when the target closed the connection (EOF or reset) within
 * timeout_ms. */
int fault_raw_closed_by_peer(fault_raw *r, unsigned timeout_ms);
/* One WRITE of len bytes at remote (crc: 0 none, 1 correct, 2 wrong); the
 * ack status, or FERRY_ESOCKET when the connection ended. */
ferry_status fault_raw_write(fault_raw *r, uint64_t remote, const void *data, size_t len, int crc);
/* One READ; data must hold len bytes. */
ferry_status fault_raw_read(fault_raw *r, uint64_t remote, void *data, size_t len, int checksum);

/* ---- corrupting proxy ------------------------------------------------------------------ */
typedef struct fault_proxy fault_proxy;
/* Listens on bind (port chosen), forwards every connection to upstream
 * ("host:port") and understands ferry frames in both directions. */
fault_proxy *fault_proxy_start(const char *bind, const char *upstream);
const char *fault_proxy_target(const fault_proxy *p); /* "bind:port" to aim at */
/* Flips one payload byte in each of the next n WRITE (to the target) or
 * READ_REPLY (from the target) frames that carry data. */
void fault_proxy_corrupt(fault_proxy *p, uint8_t frame_type, unsigned n);
unsigned fault_proxy_corrupted(const fault_proxy *p); /* frames corrupted so far */
/* Data frames (WRITE and READ_REPLY with payload) seen, and how many of them
 * carried the checksum flag. */
void fault_proxy_data_frames(const fault_proxy *p, unsigned *frames, unsigned *checksummed);
void fault_proxy_stop(fault_proxy *p);

/* ---- engines ------------------------------------------------------------------------------ */
/* The transports the fault tests run over: FERRY_TEST_TRANSPORTS as for
 * test_transfer (ctest: test_fault_*_fabric), default tcp, so that tests on
 * one machine exercise the network path. The first call also sets
 * FERRY_TRANSPORTS to it, which the `ferry serve` processes inherit; exits
 * the test when the variable names no transport. */
unsigned fault_transports(void);
/* An engine bound to bind (a host's address), with the given transfer
 * timeout (ms; 0 keeps the default) and checksum mode, on fault_transports()
 * only. Every libfabric endpoint it opens is pinned to bind too. */
ferry_engine *fault_engine(const char *bind, uint32_t timeout_ms, uint32_t connect_timeout_ms,
                           int checksum);
/* malloc'd, page-aligned buffer registered on e. */
void *fault_buffer(ferry_engine *e, size_t size);
void fault_buffer_free(ferry_engine *e, void *buf);
/* Writes len bytes of fault_pattern(seed) from local to remote, reads them
 * back into local + len (local must hold 2 * len registered bytes) and
 * compares crc32c of both. FERRY_OK, the failing call's status,
 * FERRY_ECHECKSUM when the bytes read back differ, or FERRY_ETRANSPORT when
 * they moved over a transport outside fault_transports() (a run forced onto
 * fabric that fell back to tcp proves nothing). */
ferry_status fault_roundtrip(ferry_engine *e, const char *target, uint8_t *local, uint64_t remote,
                             size_t len, uint64_t seed);

/* ---- a mix of verified transfers, for impaired links --------------------------------------- */
/* From a new engine bound to bind in host: round trips of 1 B to 1 MiB, a
 * batch of 64 WRITEs and one of 64 READs, and a notification, to t, each
 * checked end to end, with deadlines generous enough for any delay and loss
 * the tests add. FERRY_OK (and a line "label: N bytes moved and verified in
 * S s"), or the first failure's status (what failed on stderr). */
ferry_status fault_transfer_mix(fault_net *net, int host, const char *bind, const fault_proc *t,
                                const char *label);

/* ---- running a test program ---------------------------------------------------------------- */
/* cmocka_run_group_tests over the cases FERRY_TEST_EXCLUDE leaves in
 * (tests/support/cases.h); tests must be a non-const array. */
#define fault_run_tests(tests, setup, teardown)                                                    \
  _cmocka_run_group_tests(#tests, tests, test_keep_cases(tests, sizeof tests / sizeof *tests),     \
                          setup, teardown)

/* At the start of a case of a test set up by fault_net_open_isolated: when
 * it found no namespaces (net NULL), prints why and skips the case. */
#define fault_skip_without_net(net, skip_why)                                                      \
  do {                                                                                             \
    if (!(net)) {                                                                                  \
      printf("SKIP: %s\n", (skip_why));                                                            \
      skip();                                                                                      \
    }                                                                                              \
  } while (0)

#endif
