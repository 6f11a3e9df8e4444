/* cases.h - which cmocka cases a run leaves out: a suite run a second time
 * over another transport (tests/CMakeLists.txt) names, in FERRY_TEST_EXCLUDE,
 * the cases that transport's provider cannot pass, each with its reason
 * where the run is declared. Shared by test_transfer and the fault tests. */
#ifndef FERRY_TEST_CASES_H
#define FERRY_TEST_CASES_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

/* Drops the cases FERRY_TEST_EXCLUDE names (comma separated, exact names)
 * and prints one line for each dropped; returns how many are left. */
size_t test_keep_cases(struct CMUnitTest *cases, size_t count);

#endif
