/* tests/unit/check_each.h — the pass/fail counter of the unit tests that print every check,
 * passed or not (test_ir, test_codegen_cpu, test_cuda_codegen: their output lists what was
 * checked).  The others print failures only (check.h); a test includes one of the two, once.
 *
 *   check(ok, fmt, ...)   prints "PASS message" or "FAIL message", counts it, returns ok
 *
 * A test ends with
 *     printf("%d passed, %d failed\n", n_pass, n_fail); return n_fail ? 1 : 0;
 */
#ifndef LOOM_TESTS_UNIT_CHECK_EACH_H
#define LOOM_TESTS_UNIT_CHECK_EACH_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static int n_pass, n_fail;

static bool check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static bool check(bool ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  if (ok) n_pass++;
  else n_fail++;
  return ok;
}

#endif
