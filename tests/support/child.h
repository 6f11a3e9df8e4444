/* child.h - a part of a test that must run in a process of its own (a
 * second initiator, a target, a process of another user) runs in this same
 * test program started afresh with exec, never in a fork that goes on
 * running test code. By the time a case runs, the test process has threads:
 * its engines' and libfabric's, some of which outlive every engine. A child
 * forked from it may inherit a lock another thread held, POSIX allows it
 * only async-signal-safe calls, and ThreadSanitizer kills it when it starts
 * a thread (an engine does). A fork followed at once by exec is safe.
 *
 * A test program lists its roles and calls test_child_main() first thing in
 * main(); test_child_start() runs one of them as
 * `/proc/self/exe --ferry-test-child ROLE ARGS...`. */
#ifndef FERRY_TEST_CHILD_H
#define FERRY_TEST_CHILD_H

#include <stddef.h>
#include <sys/types.h>

/* Runs in the child with the arguments after the role's name; what it
 * returns is the child's exit status. No cmocka assertions: the child is
 * not inside a test case. */
typedef int (*test_child_fn)(int argc, char **argv);

typedef struct test_child_role {
  const char *name;
  test_child_fn run;
} test_child_role;

/* When argv asks for a role, runs it and exits with its status (127 for a
 * name not listed); otherwise returns at once. */
void test_child_main(int argc, char **argv, const test_child_role *roles, size_t count);

/* Starts role with args (NULL-terminated; NULL for none). With to_child,
 * the child's stdin is a pipe whose write end goes there; with from_child,
 * its stdout is a pipe whose read end goes there (both close-on-exec here).
 * stderr is this process's. The child is killed when this process dies.
 * Returns its pid, or -1. */
pid_t test_child_start(const char *role, const char *const *args, int *to_child, int *from_child);

#endif
