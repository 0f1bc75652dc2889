/* passes/pass_manager.c — runs a pipeline ("a,b,c") with hooks around every pass:
   --print-ir-after=NAME, --print-ir-after-all, --dump-dir=DIR (NN-name.ir files that sort
   in pipeline order), --verify-each, --time-passes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "passes.h"

extern const Pass pass_verify, pass_dce, pass_cse, pass_canonicalize, pass_mixed_precision, pass_autodiff,
    pass_optimizer, pass_fuse, pass_memory_plan, pass_shard, pass_bucket, pass_pipeline, pass_verify_collectives, pass_overlap,
    pass_recompute;

/* Every pass, in the order `--list-passes` shows them. */
static const Pass *const all_passes[] = {
  &pass_verify, &pass_canonicalize, &pass_cse, &pass_dce, &pass_mixed_precision, &pass_autodiff, &pass_optimizer,
  &pass_shard, &pass_recompute, &pass_pipeline, &pass_bucket, &pass_overlap, &pass_fuse, &pass_memory_plan, &pass_verify_collectives,
};
#define N_PASSES (int)(sizeof all_passes / sizeof all_passes[0])

const Pass *pass_lookup(const char *name) {
  for (int i = 0; i < N_PASSES; i++)
    if (!strcmp(all_passes[i]->name, name)) return all_passes[i];
  return NULL;
}

void pass_list(FILE *out) {
  for (int i = 0; i < N_PASSES; i++) fprintf(out, "  %-16s %s\n", all_passes[i]->name, all_passes[i]->summary);
}

/* Splits "a,b,c" into names (at most 64, each under 64 chars), expanding the words
   "train" and "lower" into their pipelines. */
static int split_pipeline(const char *pipeline, char names[][64], int *n, char *err, size_t errlen) {
  *n = 0;
  char expanded[4096] = "";
  const char *p = pipeline;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *word = (len == 5 && !strncmp(p, "train", 5)) ? TRAIN_PIPELINE
                       : (len == 5 && !strncmp(p, "lower", 5)) ? LOWER_PIPELINE : NULL;
    size_t used = strlen(expanded);
    snprintf(expanded + used, sizeof expanded - used, "%s%.*s", used ? "," : "", word ? (int)strlen(word) : (int)len,
             word ? word : p);
    p += len + (end ? 1 : 0);
  }
  p = expanded;
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == 0 || len >= 64) {
      snprintf(err, errlen, "bad pipeline '%s': empty or overlong pass name", pipeline);
      return IR_EINPUT;
    }
    if (*n == 64) {
      snprintf(err, errlen, "pipeline has more than 64 passes");
      return IR_EINPUT;
    }
    memcpy(names[*n], p, len);
    names[*n][len] = 0;
    (*n)++;
    p += len + (end ? 1 : 0);
  }
  return 0;
}

int pipeline_check(const char *pipeline, char *err, size_t errlen) {
  char names[64][64];
  int n;
  if (split_pipeline(pipeline, names, &n, err, errlen)) return IR_EINPUT;
  for (int i = 0; i < n; i++)
    if (!pass_lookup(names[i])) {
      char known[512] = "";
      for (int k = 0; k < N_PASSES; k++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", all_passes[k]->name);
      snprintf(err, errlen, "unknown pass '%s' in --passes=%s (known passes: %s)", names[i], pipeline, known);
      return IR_EINPUT;
    }
  return 0;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* NN-name.ir; once the module is partitioned, one file per rank (NN-name.rankR.ir, up to
   64 ranks), each headed by the rank's coordinates: every rank runs the same program
   (SPMD) on its own piece, so the files differ in that header only. */
#define DUMP_MAX_RANKS 64
static int dump(const Module *m, const char *dir, int index, const char *name, char *err, size_t errlen) {
  int64_t world = m->local ? mesh_world(&m->mesh) : 1, files = world > 1 && world <= DUMP_MAX_RANKS ? world : 1;
  for (int64_t r = 0; r < files; r++) {
    char path[4096];
    if (files > 1) snprintf(path, sizeof path, "%s/%02d-%s.rank%lld.ir", dir, index, name, (long long)r);
    else snprintf(path, sizeof path, "%s/%02d-%s.ir", dir, index, name);
    FILE *f = fopen(path, "w");
    if (!f) {
      snprintf(err, errlen, "cannot write IR dump %s: %s", path, strerror(errno));
      return IR_ERUN;
    }
    fprintf(f, "# loom IR %s %s\n", index ? "after pass" : "before the pipeline:", name);
    if (files > 1) {
      int64_t c[AX_COUNT];
      mesh_rank_coords(&m->mesh, r, c);
      fprintf(f, "# rank %lld of %lld: dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld; every rank runs this program (SPMD) on "
              "its own piece of each value\n", (long long)r, (long long)world, (long long)c[AX_DP], (long long)c[AX_TP],
              (long long)c[AX_CP], (long long)c[AX_PP], (long long)c[AX_EP]);
    } else if (world > 1) {
      fprintf(f, "# %lld ranks (more than %d: one file for all; every rank runs this program on its own piece)\n",
              (long long)world, DUMP_MAX_RANKS);
    }
    print_module(f, m);
    if (fclose(f)) {
      snprintf(err, errlen, "cannot write IR dump %s: %s", path, strerror(errno));
      return IR_ERUN;
    }
  }
  return 0;
}

/* The reproducer of pass i of names[] failing on a module whose input was `input`: the passes
   before it replayed on input, the result written as before-<pass>.ir, and rerun.sh.  The
   message in err gets where they are (or why none was written). */
static void write_reproducer(Module *input, char names[][64], int i, const PassOptions *opt, int rc, char *err,
                             size_t errlen) {
  char dir[4096];
  if (opt->dump_dir) {
    snprintf(dir, sizeof dir, "%s", opt->dump_dir);
  } else {
    if (rc == IR_EINPUT) return;   /* a refusal of the input says what to fix; no reproducer */
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/loom-repro-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return;
  }
  char prefix[64 * 65] = "", msg[IR_ERR_LEN];
  PassOptions quiet = {.train = opt->train, .target = opt->target};
  int prc = 0;
  for (int k = 0; k <= i; k++) {
    if (k < i && !prc) {
      char perr[IR_ERR_LEN];
      prc = pipeline_run(input, names[k], &quiet, perr, sizeof perr);
    }
    snprintf(prefix + strlen(prefix), sizeof prefix - strlen(prefix), "%s%s", k ? "," : "", names[k]);
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/before-%s.ir", dir, names[i]);
  FILE *f = prc ? NULL : fopen(path, "w");
  if (f) {
    fprintf(f, "# loom IR before pass %s (pass %d of the pipeline %s), where it failed\n", names[i], i + 1, prefix);
    print_module(f, input);
    if (fclose(f)) f = NULL;
  }
  snprintf(path, sizeof path, "%s/rerun.sh", dir);
  FILE *sh = fopen(path, "w");
  if (sh) {
    fprintf(sh, "#!/bin/sh\n# pass %s failed: ", names[i]);
    for (const char *c = err; *c; c++) fputc(*c == '\n' ? ' ' : *c, sh);   /* one comment line */
    fputc('\n', sh);
    if (opt->repro_cmd) fprintf(sh, "# the pipeline up to the failing pass, from the command's input:\n%s --passes=%s --verify-each\n",
                                opt->repro_cmd, prefix);
    fprintf(sh, "# the failing pass alone, on the IR before it (a pass that reads the run's training settings\n"
                "# runs here with the defaults; the line above keeps them):\n# loom ir %s/before-%s.ir --passes=%s\n",
            dir, names[i], names[i]);
    if (fclose(sh)) sh = NULL;
  }
  snprintf(msg, sizeof msg, "%s", err);
  if (f && sh)
    snprintf(err, errlen, "%s\n(reproducer: %s/before-%s.ir, the IR before the pass, and %s/rerun.sh)", msg, dir, names[i], dir);
}

int pipeline_run(Module *m, const char *pipeline, const PassOptions *opt, char *err, size_t errlen) {
  static const PassOptions none;
  if (!opt) opt = &none;
  FILE *out = opt->print_to ? opt->print_to : stderr;
  char names[64][64];
  int n;
  if (pipeline_check(pipeline, err, errlen)) return IR_EINPUT;
  split_pipeline(pipeline, names, &n, err, errlen);
  if (opt->dump_dir) {
    if (mkdir(opt->dump_dir, 0777) && errno != EEXIST) {
      snprintf(err, errlen, "cannot create dump directory %s: %s", opt->dump_dir, strerror(errno));
      return IR_ERUN;
    }
    int rc = dump(m, opt->dump_dir, 0, "input", err, errlen);
    if (rc) return rc;
  }
  double total = 0;
  /* the input, kept for a reproducer (the passes before a failing one are replayed on it) */
  Module *input = opt->repro_cmd ? module_clone(m, false) : NULL;
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    const Pass *p = pass_lookup(names[i]);
    PassContext ctx = {opt, 0, pipeline_run};
    double t0 = now_ms();
    rc = p->run(m, &ctx, err, errlen);
    double dt = now_ms() - t0;
    total += dt;
    if (rc) {
      /* Prefix the pass name so the user knows which step failed. */
      char msg[IR_ERR_LEN];
      snprintf(msg, sizeof msg, "%s", err);
      snprintf(err, errlen, "in pass '%s': %s", p->name, msg);
      if (input) write_reproducer(input, names, i, opt, rc, err, errlen);
      break;
    }
    if (opt->time_passes) fprintf(out, "# pass %-16s %9.3f ms  (%d changes)\n", p->name, dt, ctx.changed);
    if (opt->verify_each && strcmp(p->name, "verify")) {
      rc = verify_module(m, err, errlen);
      if (rc) {
        char msg[IR_ERR_LEN];
        snprintf(msg, sizeof msg, "%s", err);
        snprintf(err, errlen, "the IR is invalid after pass '%s' (a bug in that pass; please report it with this "
                 "input): %s", p->name, msg);
        if (input) write_reproducer(input, names, i, opt, IR_ERUN, err, errlen);
        break;
      }
    }
    bool print = opt->print_after_all;
    for (int k = 0; k < opt->n_print_after && !print; k++) print = !strcmp(opt->print_after[k], p->name);
    if (print) {
      fprintf(out, "# ----- IR after %s (pass %d of %d) -----\n", p->name, i + 1, n);
      print_module(out, m);
    }
    if (opt->dump_dir) rc = dump(m, opt->dump_dir, i + 1, p->name, err, errlen);
  }
  if (input) module_free(input);
  if (!rc && opt->time_passes) fprintf(out, "# total            %9.3f ms\n", total);
  return rc;
}
