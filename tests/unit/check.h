/* tests/unit/check.h — the pass/fail counter some unit tests share: check(ok, fmt, ...)
 * counts a pass, or prints "FAIL <message>" and counts a failure; a test ends with
 *     printf("%d passed, %d failed\n", n_pass, n_fail); return n_fail ? 1 : 0;
 * Include it once, in the test's one translation unit. */
#ifndef LOOM_TESTS_UNIT_CHECK_H
#define LOOM_TESTS_UNIT_CHECK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static int n_pass, n_fail;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static void check(bool ok, const char *fmt, ...) {
  if (ok) {
    n_pass++;
    return;
  }
  n_fail++;
  va_list ap;
  va_start(ap, fmt);
  printf("FAIL ");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
}

#endif
