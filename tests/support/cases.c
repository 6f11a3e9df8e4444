/* cases.c - FERRY_TEST_EXCLUDE: the cases a run over another transport
 * leaves out (see cases.h). */
#include "cases.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nonzero when the comma-separated list names name exactly. */
static int listed(const char *list, const char *name) {
  size_t len = strlen(name);
  for (const char *at = list; (at = strstr(at, name)) != NULL; at += len)
    if ((at == list || at[-1] == ',') && (at[len] == ',' || !at[len]))
      return 1;
  return 0;
}

size_t test_keep_cases(struct CMUnitTest *cases, size_t count) {
  const char *exclude = getenv("FERRY_TEST_EXCLUDE");
  size_t kept = 0;
  for (size_t i = 0; i < count; i++) {
    if (exclude && listed(exclude, cases[i].name))
      printf("[ EXCLUDED ] %s (FERRY_TEST_EXCLUDE; reason in tests/CMakeLists.txt)\n",
             cases[i].name);
    else
      cases[kept++] = cases[i];
  }
  return kept;
}
