/* codegen/text.h — growable text, shared by the LLVM IR emitter (codegen/cpu) and the CUDA C
   emitter (codegen/cuda).  An allocation failure sets oom and drops later appends; the
   caller checks oom once at the end. */
#ifndef LOOM_CODEGEN_TEXT_H
#define LOOM_CODEGEN_TEXT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char *s;
  size_t n, cap;
  bool oom;
} Str;

static inline void str_vadd(Str *b, const char *fmt, va_list ap) {
  if (b->oom) return;
  va_list ap2;
  va_copy(ap2, ap);
  int need = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (need < 0) return;
  if (b->n + (size_t)need + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->n + (size_t)need + 1 > cap) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->oom = true;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
  vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
  b->n += (size_t)need;
}

static inline void str_add(Str *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void str_add(Str *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  str_vadd(b, fmt, ap);
  va_end(ap);
}

static inline void str_free(Str *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

#endif
