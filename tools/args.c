/* tools/args.c — option parsing and error reporting shared by the subcommands. */
#include <malloc.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tools/tools.h"

int arg_value(int argc, char **argv, int *i, const char *name, const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n)) return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (a[n] != 0) return 0;
  if (*i + 1 >= argc) return -1;
  *value = argv[++*i];
  return 1;
}

bool arg_flag(const char *arg, const char *name) { return !strcmp(arg, name); }

int usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "loom %s: error: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(run 'loom %s --help' for usage)\n", cmd);
  va_end(ap);
  return EXIT_USAGE;
}

int report(int rc, const char *msg) {
  if (rc) fprintf(stderr, "loom: error: %s\n", msg);
  return rc;
}

bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}


void cpu_run_setup(char **argv) {
  (void)argv;
#ifdef M_MMAP_THRESHOLD
  if (!getenv("GLIBC_TUNABLES")) {
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
#endif
}
