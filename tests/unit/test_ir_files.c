/* tests/unit/test_ir_files.c — the IR test runner.
 *
 * Every file tests/ir/NAME.ir is one test:
 *
 *   # pipeline: canonicalize,dce          first line: the passes to run (may be empty)
 *   module @t { ... }                     the input IR
 *   # expect:                             then the exact text print_module gives after
 *   module @t { ... }                     the pipeline, byte for byte
 *
 * or, instead of "# expect:", a line "# expect-error: SUBSTRING": parsing, verifying or
 * running the pipeline must fail with a message containing SUBSTRING.  The input is
 * parsed with the file's own line numbers (the "# pipeline:" line is a comment to the
 * parser), so a substring such as "tests/ir/x.ir:5:14: error:" pins the location.
 *
 * Also checked for every file: the input round-trips (print(parse(text)) parses and
 * prints to the same text again), and the expected section is a fixpoint of
 * print(parse(.)).
 *
 * usage: test_ir_files [--update] [NAME-SUBSTRING]
 *   --update rewrites the expected section of the selected passing-pipeline files with
 *   the actual output (review the diff before committing it).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "passes/passes.h"

#define IR_DIR "tests/ir"

static int n_pass, n_fail;
static bool op_seen[OP_COUNT];   /* ops that appear in an input that verifies */

static void result(bool ok, const char *file, const char *what, const char *detail) {
  if (ok) n_pass++;
  else n_fail++;
  printf("%s %s: %s\n", ok ? "PASS" : "FAIL", file, what);
  if (!ok && detail && *detail) printf("    %s\n", detail);
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    fclose(f);
    return NULL;
  }
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* Describes the first difference of two texts: line number and both lines. */
static void first_diff(const char *want, const char *got, char *out, size_t n) {
  int line = 1;
  const char *w = want, *g = got;
  while (*w && *w == *g) {
    if (*w == '\n') line++;
    w++, g++;
  }
  while (w > want && w[-1] != '\n') w--;
  while (g > got && g[-1] != '\n') g--;
  int wl = (int)strcspn(w, "\n"), gl = (int)strcspn(g, "\n");
  snprintf(out, n, "first difference at line %d:\n      want: %.*s%s\n      got:  %.*s%s", line, wl > 300 ? 300 : wl, w,
           *w ? "" : "<end of text>", gl > 300 ? 300 : gl, g, *g ? "" : "<end of text>");
}

/* print(parse(text)), or NULL with the error in err. */
static char *reprint(const char *file, const char *text, char *err, size_t errlen) {
  Module *m;
  if (parse_module(file, text, &m, err, errlen)) return NULL;
  char *s = module_to_string(m);
  module_free(m);
  return s;
}

/* Round trip: p1 = print(parse(text)); print(parse(p1)) must equal p1. */
static void check_round_trip(const char *file, const char *section, const char *text) {
  char err[IR_ERR_LEN], what[128], detail[IR_ERR_LEN + 64];
  snprintf(what, sizeof what, "%s round-trips", section);
  char *p1 = reprint(file, text, err, sizeof err);
  if (!p1) {
    result(false, file, what, err);
    return;
  }
  char *p2 = reprint(file, p1, err, sizeof err);
  if (!p2) {
    snprintf(detail, sizeof detail, "the printed text does not parse: %s", err);
    result(false, file, what, detail);
  } else {
    bool same = !strcmp(p1, p2);
    if (!same) first_diff(p1, p2, detail, sizeof detail);
    result(same, file, what, same ? NULL : detail);
  }
  free(p1);
  free(p2);
}

/* Writes `head` (everything up to and including the "# expect:" line) and `body`. */
static int update_file(const char *path, const char *head, size_t head_len, const char *body) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  fwrite(head, 1, head_len, f);
  fputs(body, f);
  return fclose(f);
}

static void run_file(const char *path, bool update) {
  char *text = read_text(path);
  if (!text) {
    result(false, path, "readable", "cannot read the file");
    return;
  }
  const char *file = path;
  /* First line: "# pipeline: a,b,c" */
  static const char pl[] = "# pipeline:";
  if (strncmp(text, pl, strlen(pl))) {
    result(false, file, "header", "the first line must be '# pipeline: pass,pass,...'");
    free(text);
    return;
  }
  char pipeline[1024];
  {
    const char *p = text + strlen(pl);
    size_t n = strcspn(p, "\n");
    while (n && (*p == ' ' || *p == '\t')) p++, n--;
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t' || p[n - 1] == '\r')) n--;
    snprintf(pipeline, sizeof pipeline, "%.*s", (int)n, p);
  }
  /* Find the "# expect:" or "# expect-error:" line (at the start of a line). */
  char *expect_line = NULL;
  bool want_error = false;
  for (char *p = text; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) {
    if (!strncmp(p, "# expect:", 9)) { expect_line = p; break; }
    if (!strncmp(p, "# expect-error:", 15)) { expect_line = p; want_error = true; break; }
  }
  if (!expect_line) {
    result(false, file, "header", "no '# expect:' or '# expect-error:' line");
    free(text);
    return;
  }
  char *after = strchr(expect_line, '\n');
  after = after ? after + 1 : expect_line + strlen(expect_line);
  char substring[512] = "";
  if (want_error) {
    const char *s = expect_line + 15;
    while (*s == ' ') s++;
    size_t n = strcspn(s, "\n");
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\r')) n--;
    snprintf(substring, sizeof substring, "%.*s", (int)n, s);
    if (!*substring) {
      result(false, file, "header", "'# expect-error:' needs a substring of the message");
      free(text);
      return;
    }
  }
  /* The input: the file up to the expect line (the header line is a comment). */
  size_t in_len = (size_t)(expect_line - text);
  char *input = malloc(in_len + 1);
  memcpy(input, text, in_len);
  input[in_len] = 0;
  const char *expected = after;

  char err[IR_ERR_LEN] = "", detail[4096];
  Module *m = NULL;
  int rc = parse_module(file, input, &m, err, sizeof err);
  const char *stage = "parse";
  if (!rc) {
    check_round_trip(file, "input", input);
    stage = "verify";
    rc = verify_module(m, err, sizeof err);
    if (!rc) {
      for (int i = 0; i < m->funcs.n; i++) {
        const Func *f = m->funcs.items[i];
        for (int k = 0; k < f->ops.n; k++) op_seen[((const Op *)f->ops.items[k])->kind] = true;
      }
      stage = "pipeline";
      rc = pipeline_run(m, pipeline, NULL, err, sizeof err);
    }
  }

  if (want_error) {
    char what[700];
    snprintf(what, sizeof what, "fails with \"%s\"", substring);
    if (!rc) {
      result(false, file, what, "no error: parse, verify and the pipeline all succeeded");
    } else {
      bool ok = strstr(err, substring) != NULL;
      snprintf(detail, sizeof detail, "%s error was: %s", stage, err);
      result(ok, file, what, ok ? NULL : detail);
    }
    /* An expect-error file may still carry text after the line; nothing to compare. */
  } else if (rc) {
    snprintf(detail, sizeof detail, "%s failed: %s", stage, err);
    result(false, file, "runs", detail);
  } else {
    char *got = module_to_string(m);
    /* The pipeline's output must itself verify. */
    char verr[IR_ERR_LEN];
    int vrc = verify_module(m, verr, sizeof verr);
    result(!vrc, file, "output verifies", vrc ? verr : NULL);
    bool same = !strcmp(got, expected);
    char what[1100];
    snprintf(what, sizeof what, "output after '%s' matches", pipeline);
    if (!same && update) {
      size_t head_len = (size_t)(after - text);
      if (update_file(path, text, head_len, got)) result(false, file, "updated", "cannot write the file");
      else printf("UPDATED %s\n", file);
    } else {
      if (!same) first_diff(expected, got, detail, sizeof detail);
      result(same, file, what, same ? NULL : detail);
      /* The expected text is exactly what the printer writes for it. */
      char *again = reprint(file, expected, err, sizeof err);
      if (!again) {
        snprintf(detail, sizeof detail, "the expected section does not parse: %s", err);
        result(false, file, "expected section is a print fixpoint", detail);
      } else {
        bool fix = !strcmp(again, expected);
        if (!fix) first_diff(expected, again, detail, sizeof detail);
        result(fix, file, "expected section is a print fixpoint", fix ? NULL : detail);
        free(again);
      }
      check_round_trip(file, "expected section", expected);
    }
    free(got);
  }
  module_free(m);
  free(input);
  free(text);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
  bool update = false;
  const char *filter = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--update")) update = true;
    else filter = argv[i];
  }
  DIR *d = opendir(IR_DIR);
  if (!d) {
    printf("FAIL cannot open %s (run from the repository root)\n0 passed, 1 failed\n", IR_DIR);
    return 1;
  }
  char **names = NULL;
  int n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t len = strlen(e->d_name);
    if (len < 4 || strcmp(e->d_name + len - 3, ".ir")) continue;
    if (filter && !strstr(e->d_name, filter)) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      names = realloc(names, sizeof *names * (size_t)cap);
    }
    names[n] = malloc(len + sizeof IR_DIR + 1);
    snprintf(names[n], len + sizeof IR_DIR + 1, "%s/%s", IR_DIR, e->d_name);
    n++;
  }
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, cmp_str);
  if (n == 0) result(false, IR_DIR, "has .ir files", filter ? "none match the filter" : "none found");
  for (int i = 0; i < n; i++) {
    run_file(names[i], update);
    free(names[i]);
  }
  free(names);
  if (!filter) {
    char missing[1024] = "";
    for (int k = 0; k < OP_COUNT; k++)
      if (!op_seen[k]) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s", op_info((OpKind)k)->name);
    result(!*missing, IR_DIR, "every op of ops.def appears in an input that verifies", missing);
  }
  printf("%d IR files\n%d passed, %d failed\n", n, n_pass, n_fail);
  return n_fail ? 1 : 0;
}
