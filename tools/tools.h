/* tools/tools.h — the `loom` command-line program: commands only (parse flags, call the
 * driver, print).  What they call is driver/driver.h (spec -> passes -> lowering) and
 * runtime/exec/exec.h (running and training a program).
 *
 *   main.c         subcommand dispatch, top-level help, exit codes
 *   args.c         option parsing and error reporting shared by the subcommands
 *   train_args.c   the options loom train and loom compile share
 *   sample_args.c  the options loom sample and a compiled executable's sample share
 *   cmd_ir.c       loom ir         the IR of a spec or an .ir file after a pipeline
 *   cmd_eval.c     loom eval       forward + loss of a model on a token shard
 *   cmd_sample.c   loom sample     text from a trained model (the decode graph, a KV cache)
 *   cmd_train.c    loom train      train a model (or the built-in demo)
 *   cmd_compile.c  loom compile    a standalone training executable (runner + payload)
 *   cmd_data.c     loom data       text to token shards (byte-level or tokenizer.json), --decode
 *   cmd_plot.c     loom plot       a --log FILE.jsonl's curves as SVG
 *   cmd_diff.c     loom diff       two safetensors files compared tensor by tensor
 *   cmd_export.c   loom export     a checkpoint as a Hugging Face folder
 *   cmd_check.c    loom check      a spec's refusals and estimates, without running it
 *   cmd_calibrate.c loom calibrate the hardware description's figures, measured
 *   cmd_plan.c     loom plan       the mesh and settings search
 *   cmd_make_golden.c loom make-golden  PyTorch reference results (tools/make_golden.py)
 *   demo_text.c    the built-in demo's text (.incbin)
 *   runner/runner.c  loom-train: the runner of compiled executables
 *
 * Exit codes (runtime/exec/exec.h): 0 success, 2 bad input or usage, 1 run-time failure.
 */
#ifndef LOOM_TOOLS_H
#define LOOM_TOOLS_H

#include "driver/driver.h"

int cmd_ir(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_make_golden(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_plan(int argc, char **argv);
/* cmd_diff.c: max|a-b| / max|b| of two tensors (F32, F64, BF16, F16; B the reference);
   INFINITY where one holds a NaN the other does not; -1 with a message when the shapes or
   dtypes cannot be compared.  max_abs, max_ref (may be NULL): max|a-b| and max|b|. */
#include "runtime/io/safetensors.h"
double diff_rel_err(const StTensor *a, const StTensor *b, double *max_abs, double *max_ref, char *err, size_t errlen);

/* ---- args.c ---- */
/* Matches "--name=value" or "--name value" at argv[*i]; advances *i past what it used.
   Returns 1 matched (value set), 0 no match, -1 matched but the value is missing. */
int arg_value(int argc, char **argv, int *i, const char *name, const char **value);
bool arg_flag(const char *arg, const char *name);
int usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int report(int rc, const char *msg);   /* prints "loom: error: msg" when rc != 0 and msg is not empty; returns rc */
/* Messages name this program instead of "loom" (a compiled executable: its argv[0]); a
   usage_error with cmd NULL then names the program alone. */
void tools_set_program(const char *name);
const char *tools_program(void);   /* that name: what every message of this process starts with */
/* "unknown option 'ARG'", with "did you mean" the closest --flag that HELP names. */
int unknown_option(const char *cmd, const char *arg, const char *help);
/* The word of words[0..n) within a typo of word (two edits), or NULL. */
const char *closest_word(const char *word, const char *const *words, int n);
/* The pass manager's hooks, the same on ir, train, eval and compile: --print-ir-after=A[,B],
   --print-ir-after-all, --dump-dir=DIR, --verify-each, --time-passes at argv[*i] into o.
   1: matched (its value consumed), 0: not one of them, -1: a usage error (printed). */
int pass_hook_arg(int argc, char **argv, int *i, PassOptions *o, const char *cmd);
#define PASS_HOOKS_HELP                                                                                   \
  "  --print-ir-after=NAME  print the IR after each run of pass NAME (repeatable; A,B allowed)\n"          \
  "  --print-ir-after-all   print the IR after every pass\n"                                               \
  "  --dump-dir=DIR         write DIR/00-input.ir, DIR/01-<pass>.ir, ... (and a failing pass's\n"         \
  "                         reproducer: before-<pass>.ir and rerun.sh)\n"                                 \
  "  --verify-each          run the verifier after every pass\n"                                          \
  "  --time-passes          print the time each pass took\n"
/* Returns -1 to go on, else the exit code (0 after --help). -o is accepted too. */
int train_args_parse(const char *cmd, int argc, char **argv, TrainArgs *t, const char *help);
/* "dp=2,tp=2" -> {"dp":2,"tp":2} (the run spec's "mesh"); -1 if malformed. */
int mesh_flag_json(const char *text, char *out, size_t n);
/* ---- sample_args.c ---- */
void sample_args_init(SampleArgs *a);
/* 1: argv[*i] was one of them (and its value consumed); 0: not one; -1: a bad value (the
   usage error is printed). */
int sample_arg(int argc, char **argv, int *i, SampleArgs *sa, const char *cmd);
/* cmd_sample.c (loom only): the eos_token_id of a spec's model config. */
int sample_read_eos(const char *spec_path, int64_t *eos, int max);
int cmd_export(int argc, char **argv);

#endif
