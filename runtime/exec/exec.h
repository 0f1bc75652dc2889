/* runtime/exec/exec.h — the execution layer's index: what runs a program that the driver
 * built (or that a compiled executable carries), trains it and writes its results.
 *
 *   ref_device.c    the reference interpreter as a device (runtime/device.h) over the module's
 *                   description: trained and evaluated by the same executors as the cpu backend
 *   pipe_walk.c     the pipeline walker: a pipelined module's steps over ir/schedule.h's action
 *                   lists, once, over a transport (pipe_walk.h) that each backend implements
 *   exec_cpu.c      the cpu backend: a lowered program JIT-compiled; its Executor is the
 *                   rank executor over the program as a device (runtime/device.h)
 *   exec_mesh.c     the mesh executor (every rank a device): the micro-batch's split, the
 *                   steps, the whole views gathered and scattered by the RtGlobal placements,
 *                   the ranks' starting pieces, --out streamed; over a world of
 *   mesh_threads.c    ranks as threads on the cpu backend or the reference interpreter
 *                     (runtime/comm's LocalWorld; also the interpreter's training entry), or
 *   mesh_nccl.c       a process per rank on its GPU (NCCL; sharded checkpoints)
 *   exec_mesh_pipe.c  the local ranks' devices as the walker's transport (cpu, cuda and the
 *                     reference interpreter: the stash in device memory)
 *   exec_cuda.c     one GPU: a lowered program and its compiled image, trained by the rank
 *                   executor over it as a device
 *   exec_cuda_pipe.c  on an NCCL rank's GPU, the device transport's hook (NCCL groups)
 *   eval.c          loom eval: one eval step over a device (or a mesh), scoring a token shard
 *   train_common.c  the training entry point: parameters, executor, the loop (runtime/trainer.c), --out
 *   weights.c       safetensors parameters into a module's or a program's globals
 *   hf_export.c     a folder Hugging Face transformers loads (--out DIR/, loom export)
 *   host.c          the process: clocks, peak memory, malloc settings
 *
 * This library sits on runtime/ and ir/ (the reference interpreter's device runs the IR module;
 * the mesh executor reads a pipelined program's schedule and owners from it when it opens; the
 * other programs it runs from the RtProgram alone); nothing here includes
 * frontend/, passes/ or codegen/.  Exit codes: 0 success, 2 bad input or usage, 1 run-time
 * failure; library calls return those codes, so a command returns what failed.
 */
#ifndef LOOM_RUNTIME_EXEC_EXEC_H
#define LOOM_RUNTIME_EXEC_EXEC_H

#include <stdio.h>

#include "ir/ir.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/io/safetensors.h"
#include "runtime/trainer.h"

enum { EXIT_OK = 0, EXIT_RUN = 1, EXIT_USAGE = 2 };

/* How a program runs on this machine: cpu (fused kernels JIT-compiled with LLVM, GEMMs in a
   CPU BLAS, the runtime's builtins) or ref (the reference interpreter, op by op, as a device:
   ref_device.c). */
typedef enum { BACKEND_CPU, BACKEND_REF, BACKEND_CUDA } Backend;

/* ---- host.c ---- */
double seconds_now(void);
bool ends_with(const char *s, const char *suffix);
double peak_rss_mib(void);   /* this process's peak resident memory so far (MiB; -1 unknown) */
/* Commands that run the CPU backend call this first.  It keeps freed memory in the heap
   (glibc's mallopt: blocks under 64 MiB never mmap'd, the heap trimmed only past 1 GiB of
   free top): the runtime's builtins take per-call scratch of a few MiB, which glibc
   otherwise unmaps and the kernel zero-fills again on the next call (~4,000 page faults,
   ~10 ms per step of bench-gpt2-small).  Not done when GLIBC_TUNABLES is set (the user's
   malloc settings win).  (Until 2026-11-24 it also re-executed loom with
   OPENBLAS_THREAD_TIMEOUT=4, so that OpenBLAS's workers would not spin after each GEMM;
   OpenBLAS no longer threads at all, runtime/cpu/cpu_gemm.h, and that is gone.) */
void cpu_run_setup(char **argv);

/* ---- weights.c ---- */
/* Loads every parameter of m from a safetensors file by its HF name (GPT-2 names also
   match with a "transformer." prefix), converting F32/BF16/F16 to the parameter dtype. */
int load_weights(const Module *m, GlobalStore *g, const char *path, char *err, size_t errlen);
/* The same for the CPU backend: into the runtime's parameter region, no IR needed. */
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

/* ---- train_common.c ---- */
#include "runtime/trainer.h"
typedef struct {
  TrainOptions opt;
  const char *init;   /* parameters to start from (NULL: seeded GPT-2-style init) */
  const char *out;    /* final parameters + losses (NULL: none) */
  uint64_t seed;
  Backend backend;    /* cpu: fused kernels, JIT, BLAS (the module must be lowered); ref: the reference interpreter */
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
  bool verbose;       /* --verbose: also the planned and measured arena of each function */
} RunPlan;
/* mesh_threads.c: m (after the training pipeline) trained on the reference interpreter as a
   device (ref_device.c): one rank through the rank executor (runtime/device.h), a mesh
   (pipelined or not) through the mesh executor's threads; desc: m's description (codegen's
   cg_describe_module), taken over (freed here). */
int run_training_ref(Module *m, RtProgram *desc, const RunPlan *plan, char *err, size_t errlen);
/* mesh_threads.c: a partitioned program (prog, n, llvm: the lowered program's bytes and its
   kernels' LLVM IR) trained with every rank a thread; a pipelined one (RtProgram.pipe) on the
   pipeline walker.  No IR: what the executor reads is in the program. */
int run_training_cpu_mesh(const unsigned char *prog, size_t n, const char *llvm, const RunPlan *plan, char *err,
                          size_t errlen);
/* mesh_nccl.c: this process's rank of a partitioned program (taken over: freed here) and its
   CUDA module image.  Rank 0 alone logs and writes files: plan_for_rank clears a plan's
   outputs for the others. */
int cuda_rank_train(RtProgram *prog, const void *image, size_t n, const RunPlan *plan, char *err, size_t errlen);
void plan_for_rank(RunPlan *plan, int64_t rank);
/* train_common.c: after a pipelined run on walker w (pipe_walk.h), the measured idle per pp
   rank beside the predicted bubble and the stash peaks, predicted (predicted[q], pp rank q)
   and measured (to plan->opt.log), and the timeline (plan->trace_out). */
struct PipeWalk;
int pipe_walk_report(const struct PipeWalk *w, const int64_t *predicted, const RunPlan *plan, const char *backend,
                     char *err, size_t errlen);
/* The loop and --out for any executor. */
int train_and_write(Executor *ex, const RunPlan *plan, char *err, size_t errlen);

/* ---- eval.c: loom eval's execution (the driver, driver/eval.c, builds what runs) ---- */
/* Gradients of one batch's loss as views under the checkpoint's names (one per expert);
   host: buffers read back from a device (NULL when the views point into the program). */
typedef struct {
  RtTensor *views;
  int n;
  float **host;
  int n_host;
} EvalGrads;
void eval_grads_free(EvalGrads *g);
/* One backend and layout opened on its parameters: forward runs one whole batch [B,T]
   (logits [B*T*V] and the mean loss over its positions); grads (NULL where unsupported:
   a mesh) the gradient of that batch's loss.  Whatever an open returns, eval_close it. */
typedef struct Evaluator Evaluator;
struct Evaluator {
  int (*forward)(Evaluator *e, const int32_t *in, const int32_t *tg, float *logits, float *loss, char *err,
                 size_t errlen);
  int (*grads)(Evaluator *e, const int32_t *in, const int32_t *tg, EvalGrads *g, char *err, size_t errlen);
  void (*close)(Evaluator *e);
  void *impl;
  int world;          /* ranks */
  char where[256];    /* what ran it, for the closing line ("the cpu backend", a GPU's name) */
};
/* The cpu backend, one rank: a lowered program's bytes and its kernels' LLVM IR. */
int eval_open_cpu(Evaluator *e, const unsigned char *prog, size_t n, const char *llvm, const char *weights, char *err,
                  size_t errlen);
/* Every rank of a partitioned module m as a thread, on the cpu backend (its lowered bytes). */
int eval_open_cpu_mesh(Evaluator *e, Module *m, const unsigned char *prog, size_t n, const char *llvm,
                       const char *weights, char *err, size_t errlen);
/* GPU 0: a lowered CUDA program and its compiled image, both taken over (freed at close). */
int eval_open_cuda(Evaluator *e, RtProgram *prog, void *image, size_t n, const char *where, const char *weights,
                   char *err, size_t errlen);
/* The reference interpreter as a device over m (desc: m's description, cg_describe_module;
   taken over): one rank, or every rank of a mesh as threads (the mesh executor). */
int eval_open_ref(Evaluator *e, Module *m, RtProgram *desc, const char *weights, char *err, size_t errlen);
void eval_close(Evaluator *e);
typedef struct {
  const char *tokens;          /* an llm.c token shard */
  int64_t batch, seq, vocab;
  int64_t max_batches;         /* 0: every whole batch of the shard */
  const char *out;             /* logits, loss (and gradients) of one batch to a safetensors file, or NULL */
  bool grads;                  /* the gradients too (into out) */
  FILE *log;                   /* a progress line every 2 s of a long run, or NULL */
} EvalPlan;
typedef struct {
  double loss;                 /* the mean cross-entropy over every scored position */
  int64_t batches, available;  /* scored, and whole batches in the shard */
  int64_t tokens;              /* positions scored */
  double seconds;
} EvalResult;
/* Scores the shard's first min(max_batches, available) whole batches (batch k: inputs
   tokens[k*B*T : (k+1)*B*T], targets one further); with out or grads, the first batch only. */
int eval_run(Evaluator *e, const EvalPlan *p, EvalResult *res, char *err, size_t errlen);

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

/* ---- exec_cuda.c: a lowered CUDA program and its compiled image (cubin or PTX), trained
   on GPU 0 (loom train --backend cuda, and compiled executables that carry a cubin) ---- */
#include "runtime/cuda/cuda_exec.h"
/* The parameters of a safetensors file (HF names) into cp's device copies (rounded there). */
int cuda_load_params(CudaProgram *cp, const RtProgram *prog, const char *path, char *err, size_t errlen);
int cuda_train_program(const RtProgram *prog, const unsigned char *image, size_t n, const RunPlan *plan, char *err,
                       size_t errlen);
/* LOOM_PROFILE on the CUDA backend: after training, cuda_train_program hands the profiled
   program to this printer when set.  The loom binary sets it (driver/train_cuda.c: the table
   of codegen/cuda/cost.c, which compiled executables do not link; they print no table). */
extern void (*cuda_profile_printer)(const CudaProgram *cp, int64_t grad_accum, FILE *out);

#endif
