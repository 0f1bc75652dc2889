/* tools/args.c — option parsing and error reporting shared by the subcommands. */
#include <stdarg.h>
#include <stdbool.h>
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

int pass_hook_arg(int argc, char **argv, int *i, PassOptions *o, const char *cmd) {
  static char buf[4096];   /* the --print-ir-after lists, split in place (they outlive the parse) */
  static size_t used;
  const char *a = argv[*i], *v;
  int r;
  if (arg_flag(a, "--print-ir-after-all")) { o->print_after_all = true; return 1; }
  if (arg_flag(a, "--verify-each")) { o->verify_each = true; return 1; }
  if (arg_flag(a, "--time-passes")) { o->time_passes = true; return 1; }
  if ((r = arg_value(argc, argv, i, "--dump-dir", &v))) {
    if (r < 0) return usage_error(cmd, "--dump-dir needs a directory"), -1;
    o->dump_dir = v;
    return 1;
  }
  if ((r = arg_value(argc, argv, i, "--print-ir-after", &v))) {
    if (r < 0) return usage_error(cmd, "--print-ir-after needs a pass name"), -1;
    /* "a,b" names several passes */
    size_t len = strlen(v);
    if (used + len + 1 > sizeof buf) return usage_error(cmd, "too many --print-ir-after passes"), -1;
    char *copy = memcpy(buf + used, v, len + 1);
    used += len + 1;
    for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
      if (!pass_lookup(tok)) return usage_error(cmd, "--print-ir-after=%s: unknown pass (see loom ir --list-passes)", tok), -1;
      if (o->n_print_after == 64) return usage_error(cmd, "too many --print-ir-after passes"), -1;
      o->print_after[o->n_print_after++] = tok;
    }
    return 1;
  }
  return 0;
}
