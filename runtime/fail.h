/* runtime/fail.h — the runtime's one error helper: errors are values (0, 1 run-time failure,
 * 2 bad input) with a message written into the caller's buffer; only main decides to exit. */
#ifndef LOOM_RUNTIME_FAIL_H
#define LOOM_RUNTIME_FAIL_H

#include <stddef.h>

/* Writes the message (printf-style) into err[errlen] and returns rc. */
int rt_fail(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
