/* runtime/fail.c — see fail.h. */
#include "runtime/fail.h"

#include <stdarg.h>
#include <stdio.h>

int rt_fail(char *err, size_t errlen, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && errlen) vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return rc;
}
