/* driver/driver.h — the compiler driver: a run spec (or an .ir file) through the passes and
 * the lowering to a program the execution layer (runtime/exec/exec.h) runs, or to the bytes
 * of a compiled executable.  Commands (tools/) call it; it calls frontend/, passes/,
 * codegen/ and runtime/.
 *
 *   prepare.c      spec + overrides -> module after the training (and lowering) pipeline
 *   input.c        a model from a spec or an .ir file
 *   train_lower.c  the cpu backend: lowering to bytes, and training a lowered module
 *   train_cuda.c   the cuda backend: one GPU, or this process as one rank of a mesh
 *   eval.c         loom eval: the eval pipeline and lowering, an Evaluator opened to run it
 *   hardware.c     a hardware description (models/hardware/NAME.json)
 *   payload.c      a compiled executable's payload (the runner binary + the program)
 *   sample.c       generation with a KV cache (loom sample, compiled executables)
 *   plan*.c        the planner's search (loom plan; driver/plan.h)
 *   resources.c    does a run fit this machine (memory per rank against the host's or the GPU's)
 */
#ifndef LOOM_DRIVER_DRIVER_H
#define LOOM_DRIVER_DRIVER_H

#include "frontend/build.h"
#include "frontend/config.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "passes/timing.h"
#include "runtime/exec/exec.h"

/* ---- hardware.c: a hardware description (models/hardware/NAME.json or a path) ---- */
int hardware_load(const char *hw_arg, Hardware *hw, char *err, size_t errlen);
/* share.c: PREFIX/share/loom/REL beside an installed loom, else the source tree's REL; -1
   when neither is readable (out then holds the source tree's path, for messages). */
int loom_share_path(const char *rel, char *out, size_t n);

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
  bool verbose;   /* --verbose */
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
  PassOptions hooks;            /* --print-ir-after, --dump-dir, --verify-each, --time-passes */
  int argc;                     /* the command line, for a failing pass's reproducer */
  char **argv;
} TrainArgs;
/* Loads the spec with the flags' overrides and runs the training pipeline (and lowering
   for the cpu backend); *backend is what --backend chose or the default for the mesh. */
int train_prepare(TrainArgs *t, const char *spec, Input *in, Backend *backend, char *err, size_t errlen);
/* The `loom ir` command that rebuilds a pipeline's input from a command line: INPUT and the
   flags of argv that loom ir takes (--mesh, --zero, --batch, ...), then extra (may be NULL),
   quoted for a shell: a failing pass's reproducer (PassOptions.repro_cmd). */
void repro_command(const char *input, int argc, char **argv, const char *extra, char *out, size_t n);
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
#include "runtime/io/tokenizer.h"
typedef struct {
  double temperature, top_p;   /* 0: greedy; top_p 1: off */
  int64_t top_k, max_new;      /* top_k 0: off */
  uint64_t seed;
  bool ids;                    /* print token ids, not text */
  bool max_new_default;        /* max_new is the default (no --max-new-tokens): it shrinks to what
                                  the positions leave after the prompt, rather than refusing */
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

/* train_lower.c (loom only): m lowered too; runs it on the cpu backend. */
int run_training_cpu(Module *m, const RunPlan *plan, char *err, size_t errlen);
/* train_lower.c (loom only): m lowered by codegen/cpu, as bytes (rt_program_save) and the
   kernels' LLVM IR (both malloc'd). */
int lower_cpu_bytes(Module *m, unsigned char **prog, size_t *n, char **llvm, char *err, size_t errlen);
/* train_cuda.c (loom only): m fused and planned for the CUDA target; runs it on GPU 0. */
int run_training_cuda(Module *m, const RunPlan *plan, char *err, size_t errlen);
/* train_cuda.c (loom only): m partitioned over a mesh, this process one of its ranks (the
   launch environment names which; runtime/comm/comm_nccl.h): lowered, compiled by NVRTC for
   the rank's GPU and trained there over NCCL (cuda_rank_train). */
int run_training_cuda_rank(Module *m, const RunPlan *plan, char *err, size_t errlen);
/* train_cuda.c: what refuses a CUDA mesh before its processes start (a pipeline, an op the
   CUDA lowering refuses, no GPU here); 0 or 2 with the message. */
int cuda_mesh_precheck(Module *m, char *err, size_t errlen);
/* Whether the CUDA backend can run here (a driver and a device); why not otherwise. */
bool cuda_backend_available(char *why, size_t n);

/* prepare.c: the training entry point of a module train_prepare made (the backend's run_training_*;
   a CUDA mesh: this process's rank), and the model FLOPs of one rank's optimizer step (all its
   micro-batches; MFU's numerator). */
int driver_train(Module *m, Backend backend, const RunPlan *plan, char *err, size_t errlen);
double driver_step_flops(const Module *m, int64_t grad_accum);

/* ---- eval.c (loom only) ---- */
/* in->m through the eval pipeline (+ autodiff with grads, + shard on a mesh; + lowering but
   on ref) with the command's pass hooks and reproducer, then opened on backend with weights
   (a safetensors path): e runs it (runtime/exec/eval.c).  A cuda mesh and grads on a mesh
   are refused (2).  Whatever it returns, eval_close(e); in->m stays the caller's. */
int driver_eval_open(Input *in, Backend backend, bool grads, const PassOptions *hooks, const char *repro,
                     const char *weights, Evaluator *e, char *err, size_t errlen);

/* ---- resources.c: does the run fit this machine (see the file) ---- */
/* Bytes of memory this process may use, and *what limits it ("physical memory", a cgroup's, ulimit -v's). */
double machine_memory(const char **what);
/* 0 when the compiled, lowered run fits; else 2 with the figures and the key to change. */
int run_check_memory(const Module *m, const RunSpec *s, Backend backend, char *err, size_t errlen);

#endif
