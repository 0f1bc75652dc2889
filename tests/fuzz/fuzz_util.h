/* tests/fuzz/fuzz_util.h — what the harnesses share (each harness is one .c file that
 * includes this once).
 *
 * The readers under test take paths, as a user's file reaches them, so each input is first
 * written to a file in a private temporary folder (made once per process, removed at exit).
 * A harness that finds an input which breaks an invariant (not just a crash) calls
 * fuzz_fail, which prints why and aborts, so libFuzzer saves the input as a crash.
 */
#ifndef LOOM_TESTS_FUZZ_UTIL_H
#define LOOM_TESTS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Huge sizes read from a damaged file must get "out of memory", not an ASan abort; leaks
   are findings. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1:detect_leaks=1"; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir[256];

static void fuzz_cleanup(void) {
  if (!fuzz_dir[0]) return;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
  if (system(cmd)) fuzz_dir[0] = 0;
}

/* The private folder (created on first use). */
static const char *fuzz_tmp(void) {
  if (!fuzz_dir[0]) {
    const char *base = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/loom-fuzz.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(fuzz_dir)) {
      perror("mkdtemp");
      abort();
    }
    atexit(fuzz_cleanup);
  }
  return fuzz_dir;
}

/* Writes bytes to fuzz_tmp()/name and returns the path (a static buffer per call site is the
   caller's business: the result is malloc'd). */
__attribute__((unused)) static char *fuzz_write(const char *name, const uint8_t *data, size_t size) {
  size_t n = strlen(fuzz_tmp()) + strlen(name) + 2;
  char *path = malloc(n);
  if (!path) abort();
  snprintf(path, n, "%s/%s", fuzz_tmp(), name);
  FILE *f = fopen(path, "wb");
  if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) {
    perror(path);
    abort();
  }
  return path;
}

__attribute__((noreturn, format(printf, 1, 2))) static void fuzz_fail(const char *fmt, ...);
#include <stdarg.h>
static void fuzz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz invariant broken: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

/* A refusal must say why: an empty message is a finding. */
__attribute__((unused)) static void fuzz_check_message(const char *what, const char *err) {
  if (!err[0]) fuzz_fail("%s failed with an empty message", what);
  if (getenv("LOOM_FUZZ_VERBOSE")) fprintf(stderr, "%s: %s\n", what, err);
}

#endif
