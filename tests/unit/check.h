/* tests/unit/check.h — the pass/fail counter the unit tests share.  Include it once, in the
 * test's one translation unit.
 *
 *   CHECK(cond)  or  CHECK(cond, fmt, ...)   counts a pass, or prints
 *                "FAIL file:line: cond: message" and counts a failure
 *   CHECK_ERR(rc, want, err, sub)            rc == want and the message err contains sub
 *   check(ok, fmt, ...)                      the same as a function (no file and line)
 *
 * A test ends with
 *     printf("%d passed, %d failed\n", n_pass, n_fail); return n_fail ? 1 : 0;
 */
#ifndef LOOM_TESTS_UNIT_CHECK_H
#define LOOM_TESTS_UNIT_CHECK_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

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

/* CHECK's function: fmt starts with the space CHECK puts before it (a bare CHECK(cond) has
   only that). */
static void check_at(const char *file, int line, bool ok, const char *expr, const char *fmt, ...)
    __attribute__((format(printf, 5, 6), unused));
static void check_at(const char *file, int line, bool ok, const char *expr, const char *fmt, ...) {
  if (ok) {
    n_pass++;
    return;
  }
  n_fail++;
  printf("FAIL %s:%d: %s", file, line, expr);
  if (fmt[0] && fmt[1]) {
    va_list ap;
    va_start(ap, fmt);
    printf(":");
    vprintf(fmt, ap);
    va_end(ap);
  }
  printf("\n");
  fflush(stdout);
}
#define CHECK(cond, ...) check_at(__FILE__, __LINE__, (cond) ? true : false, #cond, " " __VA_ARGS__)

#define CHECK_ERR(rc, want, err, sub)                                                                   \
  do {                                                                                                  \
    int rc_ = (rc);                                                                                     \
    const char *err_ = (err);                                                                           \
    check_at(__FILE__, __LINE__, rc_ == (want) && strstr(err_, (sub)), #rc, " want rc %d with \"%s\", got rc %d: %s", \
             (want), (sub), rc_, err_);                                                                 \
  } while (0)

#endif
