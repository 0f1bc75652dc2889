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

/* The program's name in messages: "loom", or a compiled executable's own (tools_set_program). */
static const char *program = "loom";
void tools_set_program(const char *name) {
  if (name && *name) program = name;
}
const char *tools_program(void) { return program; }

int usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const char *sep = cmd ? " " : "";
  if (!cmd) cmd = "";
  fprintf(stderr, "%s%s%s: error: ", program, sep, cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(run '%s%s%s --help' for usage)\n", program, sep, cmd);
  va_end(ap);
  return EXIT_USAGE;
}

int report(int rc, const char *msg) {
  /* a failure without a message has been reported where it happened: no empty line */
  if (rc && msg && msg[0]) fprintf(stderr, "%s: error: %s\n", program, msg);
  return rc;
}

/* Edit distance with adjacent transpositions counted once ("--stpes", "trian"). */
static size_t edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 64 || m > 64) return 64;
  size_t d[65][65];
  for (size_t i = 0; i <= n; i++) d[i][0] = i;
  for (size_t j = 0; j <= m; j++) d[0][j] = j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      size_t best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[n][m];
}

const char *closest_word(const char *word, const char *const *words, int n) {
  const char *best = NULL;
  size_t bd = (size_t)-1, len = strlen(word);
  for (int i = 0; i < n; i++) {
    size_t d = edit_distance(word, words[i]);
    if (d < bd) bd = d, best = words[i];
  }
  /* close enough to be a typo: at most 2 edits, and fewer than a third of the word */
  return best && bd > 0 && bd <= 2 && bd * 3 <= len ? best : NULL;
}

int unknown_option(const char *cmd, const char *arg, const char *help) {
  /* the candidates: every --flag the command's help names */
  char flags[128][40], given[64];
  const char *ptrs[128];
  int n = 0;
  snprintf(given, sizeof given, "%.*s", (int)strcspn(arg, "="), arg);
  for (const char *p = help ? strstr(help, "--") : NULL; p && n < 128; p = strstr(p + 2, "--")) {
    if (p > help && p[-1] != ' ' && p[-1] != '[' && p[-1] != '(' && p[-1] != '\n' && p[-1] != ',') continue;
    size_t k = 2;
    while ((p[k] >= 'a' && p[k] <= 'z') || (p[k] >= '0' && p[k] <= '9') || p[k] == '-') k++;
    if (k < 4 || k >= sizeof flags[0]) continue;
    memcpy(flags[n], p, k);
    flags[n][k] = 0;
    ptrs[n] = flags[n];
    n++;
  }
  const char *near = closest_word(given, ptrs, n);
  if (near) return usage_error(cmd, "unknown option '%s'; did you mean '%s'?", arg, near);
  return usage_error(cmd, "unknown option '%s'", arg);
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
