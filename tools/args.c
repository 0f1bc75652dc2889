/* tools/args.c — option parsing and error reporting shared by the subcommands. */
#include <stdarg.h>
#include <string.h>
#include <time.h>

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

int input_load(const char *path, const char *const *overrides, int n_overrides, Input *in, char *err, size_t errlen) {
  memset(in, 0, sizeof *in);
  if (ends_with(path, ".ir")) {
    if (n_overrides) {
      snprintf(err, errlen, "%s: --%.*s applies to model specs, not to IR files (their shapes are fixed in the text)",
               path, (int)strcspn(overrides[0], "="), overrides[0]);
      return EXIT_USAGE;
    }
    return parse_module_file(path, &in->m, err, errlen);
  }
  int rc = spec_load(path, &in->spec, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < n_overrides; i++) {
    char key[64], flag[80];
    size_t k = strcspn(overrides[i], "=");
    snprintf(key, sizeof key, "%.*s", (int)(k < 63 ? k : 63), overrides[i]);
    snprintf(flag, sizeof flag, "--%s", key);
    rc = spec_set(&in->spec, key, overrides[i] + k + 1, flag, err, errlen);
    if (rc) return rc;
  }
  rc = spec_validate(&in->spec, err, errlen);
  if (rc) return rc;
  char name[256];
  frontend_module_name(path, name, sizeof name);
  in->from_spec = true;
  return frontend_build(&in->spec, name, &in->m, err, errlen);
}
