/* tools/tools.h — the `loom` command-line program.
 *
 *   main.c      subcommand dispatch, top-level help, exit codes
 *   args.c      option parsing shared by the subcommands
 *   cmd_ir.c    loom ir     print the IR of a spec or an .ir file after a pipeline
 *   cmd_eval.c  loom eval   forward + loss of a model on a token shard
 *   cmd_sample.c loom sample  text from a trained model (the decode graph, a KV cache)
 *   cmd_train.c loom train  train a model (or the built-in demo)
 *   cmd_compile.c loom compile  a standalone training executable (runner + payload)
 *   cmd_data.c  loom data   text to token shards (byte-level or tokenizer.json), --decode
 *   cmd_plot.c  loom plot   a --log FILE.jsonl's curves as SVG
 *   input.c     a model from a spec or an .ir file
 *   payload.c   the compiled program appended to the runner, and reading it back
 *   runner/runner.c  loom-train: the runner of compiled executables
 *   weights.c   load HF safetensors into a module's globals; write tensors out
 *   exec_ref.c  the training Executor over the reference executor
 *   train_common.c  parameters, executor, loop and --out, shared with compiled executables
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
#include "passes/timing.h"

enum { EXIT_OK = 0, EXIT_RUN = 1, EXIT_USAGE = 2 };

/* How a program runs on this machine: cpu (fused kernels JIT-compiled with LLVM, GEMMs in a
   CPU BLAS, the runtime's builtins) or ref (the reference executor, op by op). */
typedef enum { BACKEND_CPU, BACKEND_REF, BACKEND_CUDA } Backend;

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
int report(int rc, const char *msg);   /* prints "loom: error: msg" when rc != 0; returns rc */
bool ends_with(const char *s, const char *suffix);
/* Commands that run the CPU backend call this first.  It keeps freed memory in the heap
   (glibc's mallopt: blocks under 64 MiB never mmap'd, the heap trimmed only past 1 GiB of
   free top): the runtime's builtins take per-call scratch of a few MiB, which glibc
   otherwise unmaps and the kernel zero-fills again on the next call (~4,000 page faults,
   ~10 ms per step of bench-gpt2-small).  Not done when GLIBC_TUNABLES is set (the user's
   malloc settings win).  (Until 2026-11-24 it also re-executed loom with
   OPENBLAS_THREAD_TIMEOUT=4, so that OpenBLAS's workers would not spin after each GEMM;
   OpenBLAS no longer threads at all, runtime/cpu/cpu_gemm.h, and that is gone.) */
void cpu_run_setup(char **argv);
double seconds_now(void);
double peak_rss_mib(void);   /* this process's peak resident memory so far (MiB; -1 unknown) */

/* ---- weights.c ---- */
/* Loads every parameter of m from a safetensors file by its HF name (GPT-2 names also
   match with a "transformer." prefix), converting F32/BF16/F16 to the parameter dtype. */
int load_weights(const Module *m, GlobalStore *g, const char *path, char *err, size_t errlen);
/* The same for the CPU backend: into the runtime's parameter region, no IR needed. */
#include "runtime/cpu/cpu_exec.h"
int load_weights_rt(const RtProgram *p, CpuProgram *cp, const char *path, char *err, size_t errlen);
/* Into an executor's host copies (RtTensor: name, checkpoint shape, f32 data). */
int load_weights_views(RtTensor *ts, int n, const char *path, char *err, size_t errlen);
/* A rank's pieces of a partitioned program's parameters (RtGlobal's placement; mesh sizes and
   the rank's coordinates) from a safetensors file with HF names, memory-mapped: only the
   slices' pages are read.  pieces[g] (globals[g].n floats) for each parameter g whose
   pieces[g] is not NULL; rounded to the global's format. */
int load_weights_pieces(const RtProgram *prog, const int64_t mesh[5], const int coord[5], const char *path,
                        float **pieces, char *err, size_t errlen);
/* Writes tensors (f32) under the given names. */
int write_tensors(const char *path, const char *const *names, Tensor *const *tensors, int n, char *err, size_t errlen);

/* ---- hardware.c: a hardware description (models/hardware/NAME.json or a path) ---- */
int hardware_load(const char *hw_arg, Hardware *hw, char *err, size_t errlen);

/* ---- a model: from a spec (built by the frontend) or an .ir file (parsed) ---- */
typedef struct {
  RunSpec spec;        /* valid when from_spec */
  bool from_spec;
  Module *m;
} Input;
/* Loads PATH; `overrides` are "key=value" settings applied to a spec (e.g. batch=8). */
int input_load(const char *path, const char *const *overrides, int n_overrides, Input *in, char *err, size_t errlen);

/* ---- train_args.c ---- */
typedef struct {
  const char *spec, *resume, *output, *backend;
  const char *arch;             /* --arch (loom compile --backend cuda): the GPU to compile for */
  bool quiet;
  int threads;
  char data_json[16384];        /* --data as a JSON array, "" if not given */
  char ovbuf[64][16400];         /* "key=value" run-spec overrides from flags */
  const char *ov[64];
  int n_ov;
  const char *trace_out;   /* --trace-out FILE.json: the measured pipeline timeline */
  const char *val_data[64];     /* --val-data: validation shards */
  int n_val;
  int64_t val_every, val_tokens;
  const char *log_path;         /* --log FILE.jsonl */
  double peak_tflops;           /* --peak-tflops: one device's peak, for MFU (0: none) */
  bool log_experts;             /* --log-experts: tokens per expert, per layer, every step */
  const char *tokenizer;        /* --tokenizer T.json: copied into a Hugging Face --out DIR/ */
  bool out_bf16;                /* --dtype bf16: a Hugging Face --out DIR/'s weights in bf16 */
  const char *nccl_timeout;     /* --nccl-timeout SECONDS (a multi-process CUDA mesh) */
  bool allow_changes;           /* --allow-changes: resume although settings differ from the checkpoint's */
} TrainArgs;
/* Returns -1 to go on, else the exit code (0 after --help). -o is accepted too. */
int train_args_parse(const char *cmd, int argc, char **argv, TrainArgs *t, const char *help);
/* "dp=2,tp=2" -> {"dp":2,"tp":2} (the run spec's "mesh"); -1 if malformed. */
int mesh_flag_json(const char *text, char *out, size_t n);
/* Loads the spec with the flags' overrides and runs the training pipeline (and lowering
   for the cpu backend); *backend is what --backend chose or the default for the mesh. */
int train_prepare(TrainArgs *t, const char *spec, Input *in, Backend *backend, char *err, size_t errlen);
/* The settings a run records in checkpoints and compiled executables (malloc'd JSON). */
char *spec_settings_json(const RunSpec *s);
/* The training passes' settings from a run spec (train_args.c). */
TrainSettings spec_train_settings(const RunSpec *s);

/* ---- payload.c ---- */
/* A compiled executable is the runner binary followed by a payload and a 24-byte trailer:
   "LOOMPAY1", u64 payload offset, u64 payload size (little-endian).  The payload is u64
   part count, then each part as u64 size + bytes: part 0 is the settings (JSON text), then
   the program: the IR text (backend ref) or the lowered program and the LLVM IR (cpu); a
   cpu executable ends with its decode program, its LLVM IR and "sample" (EXE sample). */
#define PAYLOAD_MAX_PARTS 8
typedef struct {
  uint8_t *file;                       /* the whole executable, read (owned) */
  size_t file_size;
  int n_parts;
  const uint8_t *parts[PAYLOAD_MAX_PARTS];
  size_t sizes[PAYLOAD_MAX_PARTS];
} Payload;
int payload_write(const char *runner, const char *out, const void *const *parts, const size_t *sizes, int n_parts,
                  char *err, size_t errlen);
int payload_read_self(Payload *p, char *err, size_t errlen);
/* The parts of an executable's bytes bin[0, n) (borrowed: parts point into bin); p->file is
   left as it is.  payload_read_self is this over /proc/self/exe. */
int payload_parse(Payload *p, const uint8_t *bin, size_t n, char *err, size_t errlen);

/* ---- sample.c: generation with a KV cache (loom sample, compiled executables) ---- */
#include "runtime/cpu/cpu_exec.h"
#include "runtime/io/tokenizer.h"
typedef struct {
  double temperature, top_p;   /* 0: greedy; top_p 1: off */
  int64_t top_k, max_new;      /* top_k 0: off */
  uint64_t seed;
  bool ids;                    /* print token ids, not text */
  int64_t eos[8];              /* end-of-sequence ids (the config's eos_token_id) */
  int n_eos;
} SampleOpts;
/* The options loom sample and a compiled executable's `sample` share (--weights, --prompt,
   --tokenizer, --max-new-tokens, --temperature, --top-k, --top-p, --seed, --ids, --threads). */
typedef struct {
  const char *weights, *prompt, *tokenizer;
  int threads;
  SampleOpts o;
} SampleArgs;
void sample_args_init(SampleArgs *a);
/* 1: argv[*i] was one of them (and its value consumed); 0: not one; -1: a bad value (the
   usage error is printed). */
int sample_arg(int argc, char **argv, int *i, SampleArgs *sa, const char *cmd);
/* cmd_sample.c (loom only): the eos_token_id of a spec's model config. */
int sample_read_eos(const char *spec_path, int64_t *eos, int max);
/* --weights W as a safetensors path: the file, W/model.safetensors, or the newest step's of a
   --save-dir. */
int sample_weights_path(const char *w, char *out, size_t n, char *err, size_t errlen);
/* The prompt's ids: by the tokenizer, or as bytes when there is none (V must be 256). */
int sample_prompt_ids(Tokenizer *tok, int64_t V, const char *prompt, TokIds *out, char *err, size_t errlen);
/* One call of a program's @decode(tokens[1,1], positions[1,1]) -> logits[1,1,V]. */
typedef int (*SampleDecodeFn)(void *ctx, int32_t token, int32_t pos, float *logits, char *err, size_t errlen);
/* Runs @decode over the prompt, then generates (to stdout as it goes); tmax: the cache's rows;
   `where` names the backend in the closing line. */
int sample_generate_with(SampleDecodeFn call, void *ctx, const char *where, Tokenizer *tok, int64_t V,
                         const TokIds *prompt, const char *prompt_text, int64_t tmax, const SampleOpts *o, char *err,
                         size_t errlen);
/* The same on the cpu backend's program (its @decode). */
int sample_generate(CpuProgram *cp, Tokenizer *tok, int64_t V, const TokIds *prompt, const char *prompt_text,
                    int64_t tmax, const SampleOpts *o, char *err, size_t errlen);

/* ---- train_common.c ---- */
#include "runtime/trainer.h"
typedef struct {
  TrainOptions opt;
  const char *init;   /* parameters to start from (NULL: seeded GPT-2-style init) */
  const char *out;    /* final parameters + losses (NULL: none) */
  uint64_t seed;
  Backend backend;    /* cpu: fused kernels, JIT, BLAS (the module must be lowered); ref: the reference executor */
  int threads;        /* cpu backend threads (0: LOOM_THREADS or all cores) */
  int64_t batch, seq;
  const char *trace_out;   /* a pipeline's measured timeline (Chrome trace JSON), or NULL */
  /* --out DIR/ (a Hugging Face folder, hf_export.c): the spec the config comes from (NULL:
     unknown, refused), the tokenizer to copy, bf16 weights */
  const char *spec_path, *tokenizer;
  bool out_bf16;
  /* a mesh rank that is not the writer: the --out rank 0 writes (every rank takes part in
     gathering it), else NULL */
  const char *out_elsewhere;
} RunPlan;
/* m must have passed the training pipeline; runs it on the reference executor. */
int run_training(Module *m, const RunPlan *plan, char *err, size_t errlen);
/* train_lower.c (loom only): m lowered too; runs it on the cpu backend. */
int run_training_cpu(Module *m, const RunPlan *plan, char *err, size_t errlen);
/* train_lower.c (loom only): m lowered by codegen/cpu, as bytes (rt_program_save) and the
   kernels' LLVM IR (both malloc'd). */
int lower_cpu_bytes(Module *m, unsigned char **prog, size_t *n, char **llvm, char *err, size_t errlen);
/* exec_mesh.c: a partitioned module m (the bookkeeping of whole and per-rank tensors) and
   its lowered program (prog, n, llvm) trained with every rank a thread. */
int run_training_cpu_mesh(Module *m, const unsigned char *prog, size_t n, const char *llvm, const RunPlan *plan,
                          char *err, size_t errlen);
/* exec_mesh.c: @forward on every rank, weights from safetensors (whole, split to the
   ranks); rank 0's logits [B*T*V] and loss. */
int eval_cpu_mesh(Module *m, const unsigned char *prog, size_t n, const char *llvm, const char *weights,
                  const int32_t *inputs, const int32_t *targets, float *logits, float *loss, char *err, size_t errlen);
/* train_cuda.c (loom only): m fused and planned for the CUDA target; runs it on GPU 0. */
int run_training_cuda(Module *m, const RunPlan *plan, char *err, size_t errlen);
/* train_cuda.c (loom only): m partitioned over a mesh, this process one of its ranks (the
   launch environment names which; runtime/comm/comm_nccl.h): lowered, compiled by NVRTC for
   the rank's GPU and trained there over NCCL (cuda_rank_train). */
int run_training_cuda_rank(Module *m, const RunPlan *plan, char *err, size_t errlen);
/* exec_cuda_mesh.c: a rank of m's mesh from its lowered program (taken over: freed here) and
   CUDA module image; the module only splits the micro-batch.  Rank 0 alone logs and writes
   files: plan_for_rank clears a plan's outputs for the others. */
int cuda_rank_train(Module *m, RtProgram *prog, const void *image, size_t n, const RunPlan *plan, char *err,
                    size_t errlen);
void plan_for_rank(RunPlan *plan, int64_t rank);
/* train_cuda.c: what refuses a CUDA mesh before its processes start (a pipeline, an op the
   CUDA lowering refuses, no GPU here); 0 or 2 with the message. */
int cuda_mesh_precheck(Module *m, char *err, size_t errlen);
/* Whether the CUDA backend can run here (a driver and a device); why not otherwise. */
bool cuda_backend_available(char *why, size_t n);
/* ---- hf_export.c: a folder transformers loads (loom train --out DIR/, loom export) ---- */
typedef struct {
  int64_t n;
  const float *losses, *grad_norms, *lrs, *val_losses;   /* val_losses may be NULL */
} HfMetrics;
/* Writes config.json, model.safetensors (params: f32 tensors under HF names; bf16 converts),
   generation_config.json, tokenizer.json (a copy of tokenizer, or none) and metrics.json
   (metrics may be NULL) into dir, created if needed. */
int hf_export_dir(const char *dir, const char *spec_path, const StTensor *params, int n, bool bf16,
                  const char *tokenizer, const HfMetrics *metrics, FILE *log, char *err, size_t errlen);
/* The same from the model's config object itself (a checkpoint's settings carry it). */
#include <jansson.h>
int hf_export_dir_config(const char *dir, const json_t *model, const StTensor *params, int n, bool bf16,
                         const char *tokenizer, const HfMetrics *metrics, FILE *log, char *err, size_t errlen);
/* The model's Hugging Face config object (a new reference) from a run spec or a config.json. */
int hf_model_config(const char *spec_path, json_t **out, char *err, size_t errlen);
/* --out names a folder: it ends with '/' or is an existing directory. */
bool hf_export_wanted(const char *out);
int cmd_export(int argc, char **argv);

/* The loop and --out for any executor. */
int train_and_write(Executor *ex, const RunPlan *plan, char *err, size_t errlen);

/* ---- exec_cuda.c: a lowered CUDA program and its compiled image (cubin or PTX), trained
   on GPU 0 (loom train --backend cuda, and compiled executables that carry a cubin) ---- */
#include "runtime/cuda/cuda_exec.h"
/* The parameters of a safetensors file (HF names) into cp's device copies (rounded there). */
int cuda_load_params(CudaProgram *cp, const RtProgram *prog, const char *path, char *err, size_t errlen);
int cuda_train_program(const RtProgram *prog, const unsigned char *image, size_t n, const RunPlan *plan, char *err,
                       size_t errlen);
/* LOOM_PROFILE on the CUDA backend: after training, cuda_train_program hands the profiled
   program to this printer when set.  The loom binary sets it (train_cuda.c: the table of
   codegen/cuda/cost.c, which compiled executables do not link; they print no table). */
extern void (*cuda_profile_printer)(const CudaProgram *cp, int64_t grad_accum, FILE *out);
void cuda_profile_print(const CudaProgram *cp, int64_t grad_accum, FILE *out);   /* train_cuda.c */

#endif
