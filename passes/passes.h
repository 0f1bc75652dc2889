/* passes/passes.h — the pass manager and the passes, one file each.
 *
 *   pass_manager.c  pipelines ("a,b,c"), hooks around every pass: print, dump, verify, time
 *   util.c          helpers shared by passes: replace uses, remove dead ops
 *   verify.c        pass "verify": runs the IR verifier
 *   dce.c           pass "dce": removes ops whose results are never used
 *   cse.c           pass "cse": merges identical ops
 *   canonicalize.c  pass "canonicalize": folds identities and chains of data movement
 */
#ifndef LOOM_PASSES_H
#define LOOM_PASSES_H

#include "ir/ir.h"

typedef struct PassContext PassContext;

typedef struct {
  const char *name;      /* kebab-case, as written in pipelines */
  const char *summary;   /* one line, shown by `loom ir --list-passes` */
  int (*run)(Module *m, PassContext *ctx, char *err, size_t errlen);
} Pass;

/* Options of one pipeline run. */
typedef struct {
  const char *print_after[64];  /* pass names: print the IR after each of them */
  int n_print_after;
  bool print_after_all;
  const char *dump_dir;         /* write NN-<pass>.ir files here */
  bool verify_each;             /* run the verifier after every pass */
  bool time_passes;             /* report the time of every pass */
  FILE *print_to;               /* where printed IR and timings go (default stderr) */
} PassOptions;

struct PassContext {
  const PassOptions *opt;
  /* counters a pass may report, e.g. "dce: removed 12 ops" in --time-passes output */
  int changed;
};

const Pass *pass_lookup(const char *name);
void pass_list(FILE *out);
/* Checks that every name in the comma-separated list is a known pass. */
int pipeline_check(const char *pipeline, char *err, size_t errlen);
/* Runs the passes in order with the hooks of `opt` (may be NULL). */
int pipeline_run(Module *m, const char *pipeline, const PassOptions *opt, char *err, size_t errlen);

/* The pipeline `loom ir` runs when none is given. */
#define DEFAULT_PIPELINE "verify,canonicalize,cse,dce,verify"

/* util.c */
/* Rewrites every use of values by their replacement: repl[v->id] (NULL = keep).  Ids
   must come from func_number() on f before the rewrite. */
void replace_uses(Func *f, Value **repl);
/* Removes ops without effects whose results are never used; returns how many. */
int remove_dead_ops(Func *f);

#endif
