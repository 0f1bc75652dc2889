/* tools/tools.h — the `loom` command-line program.
 *
 *   main.c      subcommand dispatch, top-level help, exit codes
 *   args.c      option parsing shared by the subcommands
 *   cmd_ir.c    loom ir     print the IR of a spec or an .ir file after a pipeline
 *   cmd_eval.c  loom eval   forward + loss of a model on a token shard
 *   weights.c   load HF safetensors into a module's globals; write tensors out
 *
 * Exit codes: 0 success, 2 bad input or usage, 1 run-time failure.  Library calls return
 * those same codes, so a subcommand returns what failed.
 */
#ifndef LOOM_TOOLS_H
#define LOOM_TOOLS_H

#include "frontend/build.h"
#include "frontend/config.h"
#include "ir/ir.h"
#include "passes/passes.h"

enum { EXIT_OK = 0, EXIT_RUN = 1, EXIT_USAGE = 2 };

int cmd_ir(int argc, char **argv);
int cmd_eval(int argc, char **argv);

/* ---- args.c ---- */
/* Matches "--name=value" or "--name value" at argv[*i]; advances *i past what it used.
   Returns 1 matched (value set), 0 no match, -1 matched but the value is missing. */
int arg_value(int argc, char **argv, int *i, const char *name, const char **value);
bool arg_flag(const char *arg, const char *name);
int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int report(int rc, const char *msg);   /* prints "loom: error: msg" when rc != 0; returns rc */
bool ends_with(const char *s, const char *suffix);
double seconds_now(void);

/* ---- weights.c ---- */
/* Loads every parameter of m from a safetensors file by its HF name (GPT-2 names also
   match with a "transformer." prefix), converting F32/BF16/F16 to the parameter dtype. */
int load_weights(const Module *m, GlobalStore *g, const char *path, char *err, size_t errlen);
/* Writes tensors (f32) under the given names. */
int write_tensors(const char *path, const char *const *names, Tensor *const *tensors, int n, char *err, size_t errlen);

/* ---- a model: from a spec (built by the frontend) or an .ir file (parsed) ---- */
typedef struct {
  RunSpec spec;        /* valid when from_spec */
  bool from_spec;
  Module *m;
} Input;
/* Loads PATH; `overrides` are "key=value" settings applied to a spec (e.g. batch=8). */
int input_load(const char *path, const char *const *overrides, int n_overrides, Input *in, char *err, size_t errlen);

#endif
