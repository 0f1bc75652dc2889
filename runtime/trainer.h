/* runtime/trainer.h — the training loop, independent of how a step is computed.
 *
 * A backend hands the loop an Executor: a micro-batch step (forward, backward, gradients
 * accumulated), an optimizer step, and its parameters and optimizer state as named f32
 * buffers.  The loop owns everything else a run needs: the data loader, the learning-rate
 * schedule, gradient accumulation, logging, checkpoints and exact resume.
 */
#ifndef LOOM_RUNTIME_TRAINER_H
#define LOOM_RUNTIME_TRAINER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct Checkpoint;

/* A named f32 buffer owned by the executor (live: the loop reads and writes it). */
typedef struct {
  const char *name;
  int rank;
  int64_t shape[8];
  float *data;
  char *owned_name;     /* the name when the view made it (freed by rt_views_free) */
} RtTensor;

/* rt_expert_name (the checkpoint name of one expert of a stack): runtime/io/checkpoint.h. */
#include "runtime/io/checkpoint.h"
/* How many views a global gets: 1, or shape[0] for a stack of experts. */
static inline int rt_views_of(int rank, const int64_t *shape, bool experts) {
  return experts && rank >= 2 ? (int)shape[0] : 1;
}
/* Appends a global's views to out[*n]: the global itself, or for a stack of experts one
   view per expert (its checkpoint name and shape, data into the stack).  0, or -1 when out
   of memory. */
int rt_views_add(RtTensor *out, int *n, const char *name, int rank, const int64_t *shape, float *data, bool experts);
void rt_views_free(RtTensor *v, int n);   /* the names the views made (not the array) */

typedef struct {
  void *self;
  int64_t batch, seq;   /* the micro-batch the program was built for */
  /* One micro-batch: inputs and targets are [batch, seq] row-major. Returns its loss. */
  int (*grad_step)(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen);
  /* Instead of grad_step (a pipeline runs a step's micro-batches interleaved): all n of
     them, inputs and targets [n][batch*seq]; their losses into losses[n]. */
  int (*pipeline_step)(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses, char *err,
                       size_t errlen);
  /* The optimizer step at learning rate lr and 1-based step count t; returns the global
     gradient norm before clipping. */
  int (*optimizer_step)(void *self, float lr, float t, float *grad_norm, char *err, size_t errlen);
  /* Optional, instead of grad_step and optimizer_step: the whole step at once (the n
     micro-batches, inputs and targets [n][batch*seq], then the optimizer step), losses[n] and
     the norm as those two give them (one GPU: one CUDA graph a step, runtime/cuda/cuda_step.c). */
  int (*whole_step)(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float lr, float t, float *losses,
                    float *grad_norm, char *err, size_t errlen);
  /* Optional, with whole_step: the whole step in two halves, so that the host reads a loss,
     logs and loads the next batch while the device runs.  issue_step queues step s (as
     whole_step would run it; inputs and targets may be reused at once) and returns without
     waiting; finish_step waits for the oldest step issued and not yet finished and gives its
     losses[n] and norm.  At most two steps are in flight.  The loop issues step s+1 before it
     finishes step s, except before anything that reads the state after step s (a checkpoint,
     validation, the end, a stop); nothing else touches the executor while a step is in
     flight.  (One GPU: runtime/cuda/cuda_step.c; LOOM_CUDA_SYNC_STEP=1 leaves them NULL.) */
  int (*issue_step)(void *self, int64_t n, const int32_t *inputs, const int32_t *targets, float lr, float t, char *err,
                    size_t errlen);
  int (*finish_step)(void *self, float *losses, float *grad_norm, char *err, size_t errlen);
  int n_params;
  RtTensor *params;     /* under their Hugging Face names */
  int n_state;
  RtTensor *state;      /* optimizer moments etc., saved with checkpoints */
  /* Optional (NULL: the buffers above are the live ones).  A multi-rank executor holds
     whole copies: sync_out gathers the ranks' pieces into them (before a checkpoint or
     --out), sync_in splits them back to the ranks (after a resume). */
  int (*sync_out)(void *self, char *err, size_t errlen);
  int (*sync_in)(void *self, char *err, size_t errlen);
  /* Optional (NULL: this executor cannot validate): the loss of one micro-batch by the
     program's @forward, with no effect on parameters, gradients or optimizer state. */
  int (*eval_step)(void *self, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen);
  /* Optional (NULL: not measured): the exposed communication since the last call, the
     milliseconds ranks spent blocked on collectives and transfers (mean over ranks, and the
     most any rank spent).  The loop calls it after every step and prints it. */
  void (*comm_wait_ms)(void *self, double *mean, double *max);
  /* Optional (a multi-process mesh): checkpoints as one shard per rank (runtime/io/
     checkpoint.h, "sharded checkpoints").  save_shards writes this rank's pieces into step
     `step` of save_dir and, with rank 0's state_json, commits the folder once every rank has
     written; the loop calls it on every rank instead of sync_out + ckpt_save.  load_shards
     takes this rank's pieces from a sharded checkpoint (any writer's layout) instead of the
     whole views + sync_in; a whole checkpoint still goes through the views. */
  int (*save_shards)(void *self, const char *save_dir, int64_t step, const char *state_json, char *err, size_t errlen);
  int (*load_shards)(void *self, const struct Checkpoint *c, char *err, size_t errlen);
  /* Optional (a multi-process mesh): the final parameters one at a time instead of a
     sync_out of them all at the end.  Every rank calls it for i = 0 .. n_params-1 in order
     (it gathers over the ranks); on the writer (rank 0) *data is params[i]'s whole tensor,
     valid until the next call.  With it, the loop's last sync_out is skipped, and --out is
     written a tensor at a time (runtime/exec/train_common.c). */
  int (*stream_param)(void *self, int i, const float **data, char *err, size_t errlen);
  /* Optional (a multi-process mesh): the largest of every rank's `mine` into *agreed, a
     collective every rank calls after every step.  A stop signal (runtime/stop.h) reaches the
     ranks at different moments; through it they all stop after the same step. */
  int (*agree_stop)(void *self, int mine, int *agreed, char *err, size_t errlen);
} Executor;

typedef struct {
  int64_t steps, grad_accum, warmup;
  double lr, min_lr;
  const char *const *data;   /* token shards */
  int n_data;
  int64_t vocab;
  const char *save_dir;      /* checkpoints every save_every steps and at the end (NULL: none) */
  int64_t save_every;
  const char *resume;        /* a save dir or a step folder to continue from (NULL: fresh) */
  const char *settings_json; /* the run's settings, stored in each checkpoint's state.json */
  uint64_t seed;
  FILE *log;                 /* one line per step and a summary (NULL: silent) */
  /* Validation (n_val > 0): every val_every steps and after the last, the mean loss of the
     first val_tokens tokens of the val shards (whole micro-batch windows, at least one, the
     same ones every time) by ex->eval_step.  val_every 0: every tenth of the run. */
  const char *const *val_data;
  int n_val;
  int64_t val_every, val_tokens;
  /* Metrics (NULL: none): one JSON object per step appended to this file (JSON Lines); a
     resumed run first drops the lines of steps after its checkpoint. */
  const char *metrics_path;
  /* MFU (both > 0): model FLOPs of one optimizer step on one rank (all its micro-batches) and
     the device's peak FLOP/s; the step line and the log get flops / step time / peak. */
  double flops_per_step, peak_flops;
  /* Mixture of experts: every step, the tokens each expert was chosen for, per layer (the
     executor's state views moe_load.l<N>): the step line shows the worst layer's max/mean
     load; log_experts adds a line per layer and the metrics "expert_load".  Executors whose
     views are copies (meshes, cuda: sync_out) report them with log_experts only (each step
     then syncs the state out and back). */
  bool log_experts;
  /* A rank other than 0 of a multi-process run: every step, validation and sync_out as rank
     0 does them (they are collective), but no checkpoint is written (rank 0 writes it). */
  bool not_writer;
  /* Resume: go on although the run's settings (steps, batch, lr, seed, ...) differ from the
     checkpoint's (each change printed); without it such a resume is refused. */
  bool allow_changes;
} TrainOptions;

typedef struct {
  int64_t first_step;        /* 0, or the step a resumed run continued from */
  int64_t n;                 /* steps recorded: all of them, including before a resume */
  float *losses, *grad_norms, *lrs;
  float *val_losses;         /* NAN where no validation ran (NULL without validation) */
  double seconds;            /* wall time of this run's steps */
} TrainResult;

/* The learning rate at 0-based step s: linear warmup to lr over `warmup` steps, then a
   cosine from lr down to min_lr over the remaining steps. */
double train_lr_at(const TrainOptions *o, int64_t s);

/* Returns 0, an error code with a message, or 128 + the signal when SIGINT or SIGTERM stopped
   the run after a step (runtime/stop.h): res then holds the steps run, the checkpoint of the
   last one is written when there is a save dir (o->save_dir, or the folder a resume came
   from), and err says where and how to continue. */
int train_run(Executor *ex, const TrainOptions *o, TrainResult *res, char *err, size_t errlen);
static inline int train_stopped(int rc) { return rc == 130 || rc == 143; }   /* SIGINT, SIGTERM */
void train_result_free(TrainResult *r);

#endif
