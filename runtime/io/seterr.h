/* runtime/io/seterr.h — the one-line error message every reader in runtime/io/ writes:
 * seterr(err, errlen, fmt, ...) formats into err (if err is not NULL and errlen > 0). */
#ifndef LOOM_RUNTIME_IO_SETERR_H
#define LOOM_RUNTIME_IO_SETERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4), unused));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

#endif
