/* tools/args.c — option parsing and error reporting shared by the subcommands. */
#include <stdarg.h>
#include <string.h>

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
