/* runtime/exec/pipe_walk.h — the pipeline walker: a pipelined module's (pass "pipeline")
 * training step, optimizer step and validation, once for every backend, over a transport.
 *
 * The walker owns what the backends do the same way: the schedule (ir/schedule.h) and each
 * rank's walk of its action list — F runs @fwd.cK on the micro-batch and keeps its results
 * but the loss (the stash) in a slot, B runs @bwd.cK (or @bwd_b.cK, whose results W takes)
 * with the stash as arguments after tokens and targets, W runs @bwd_w.cK —; the
 * micro-batches' pieces; the stash slots; the losses (one rank of the last chunk's group
 * writes them); the optimizer step (@optimizer_step.sR of the rank's pp coordinate, the
 * first rank's norm); validation (one micro-batch's forward through every chunk, in chunk
 * order); and the measurements of the training steps: every action's start and end (the
 * timeline, --trace-out), the idle time per pp rank, the stash held (4 bytes a value).
 *
 * It runs the ranks of this process: every rank of an in-process world (LocalWorld) as
 * threads, whose transfers run inside the calls through a TagComm each (the micro-batch added
 * to the tags, the wait in recv counted as idle), or the one rank of this process (a CUDA
 * mesh: one process per GPU).  A transport (PipeOps) is how a call runs:
 *   exec_mesh_pipe.c  the ranks' devices (RtDevice): cpu, cuda and the reference interpreter
 *                     (ref_device.c, its program a description of the module): the
 *                     stash in device memory (a host block on the cpu) taken as device
 *                     arguments; on cuda with exec_cuda_pipe.c's hook, which issues the NCCL
 *                     groups it planned between the actions (`between`) and shares the
 *                     losses at the end
 * Errors as the executors': 0, 2 bad input, 1 run-time failure, with a message.
 */
#ifndef LOOM_RUNTIME_EXEC_PIPE_WALK_H
#define LOOM_RUNTIME_EXEC_PIPE_WALK_H

#include <stdbool.h>
#include <stdint.h>

#include "ir/schedule.h"
#include "runtime/comm/comm.h"
#include "runtime/program.h"

/* One call of a rank's function: an action's, or the optimizer step's (action -1). */
typedef struct {
  int rank;              /* the rank (an index of the walker's ranks: in-process, its world rank) */
  int action;            /* its index in the rank's action list; -1: the optimizer step */
  int mb, func;          /* the micro-batch; the function (the transport's find) */
  const int32_t *tok, *tgt;   /* the rank's piece of the micro-batch: arguments 0 and 1 */
  void *in;              /* the stash slot of arguments 2.. (B, W), or NULL */
  void *out;             /* the stash slot of the results after the first `skip` (F, split B), or NULL */
  int skip;              /* 1: results[0] is the loss, into *loss (the last chunk's F) */
  float *loss;
  float lr, t, *norm;    /* the optimizer step: @optimizer_step.sR(lr, t) -> *norm */
} PipeCall;

typedef struct {
  /* the function named `name` (without '@'), or -1 */
  int (*find)(void *ctx, const char *name);
  /* 0 when `from`'s results after the first `skip` are what `to` takes after tokens and
     targets (count, and sizes where the transport knows them), else 2 with a message */
  int (*takes)(void *ctx, int from, int skip, int to, char *err, size_t errlen);
  /* a slot for the results of func after the first skip; *bytes: the values it holds x 4 */
  int (*stash_alloc)(void *ctx, int rank, int func, int skip, void **slot, int64_t *bytes, char *err, size_t errlen);
  void (*stash_free)(void *ctx, int rank, void *slot);
  int (*call)(void *ctx, const PipeCall *c, char *err, size_t errlen);
  /* optional (NULL: nothing to do).  begin and end: around one walk of schedule s (training:
     the step's, else validation's), in the calling thread; end gets the walk's rc and returns
     the walk's result (the losses [n] may still be completed there).  between: in the rank's
     walk before its action i, and with i = its action count after the last. */
  int (*begin)(void *ctx, const Schedule *s, bool training, char *err, size_t errlen);
  int (*between)(void *ctx, const Schedule *s, int i, char *err, size_t errlen);
  int (*end)(void *ctx, int rc, float *losses, int64_t n, char *err, size_t errlen);
} PipeOps;

/* A rank's communicator in an in-process world: the LocalWorld's, with the micro-batch added
   to every point-to-point tag and the time spent waiting in recv counted (idle, not work). */
typedef struct {
  Comm c;
  Comm *inner;
  int64_t mb;            /* the current micro-batch (-1: the optimizer step) */
  double waited_us;
} TagComm;

typedef struct PipeWalk {
  Schedule sched;        /* the training step's action lists */
  const PipeOps *ops;
  void *ctx;
  int n_local;           /* the ranks this process runs */
  LocalWorld *lw;        /* their world (borrowed), or NULL: one rank of a mesh of processes */
  TagComm *tc;           /* [n_local] with lw: what the transport's programs talk through */
  int64_t mesh[COMM_AXES];
  int (*coord)[COMM_AXES];        /* [n_local] */
  int *f_fwd, *f_bwd, *f_bww;     /* per chunk: @fwd.cK, @bwd.cK (@bwd_b.cK), @bwd_w.cK (-1: none) */
  int *f_opt;                     /* per pp rank: @optimizer_step.sR */
  RtGlobal place;        /* the micro-batch piece's placement (the first function's token argument's) */
  int64_t whole_n;       /* tokens of a whole micro-batch */
  int32_t **tok, **tgt;  /* [n_local]: every micro-batch's piece, [m][place.n] */
  double **act_start, **act_end;  /* [n_local][actions + 1]: the last training step's, microseconds */
  int64_t *stash_peak;            /* [n_local]: the most stash bytes held at once */
  double busy_us[64], span_us[64];   /* per pp rank (its first rank), summed over steps */
  int64_t steps;
} PipeWalk;

/* The schedule kind, pp ranks, chunks per rank and micro-batches (a module's Module.pipe, a
   lowered program's RtProgram.pipe: the action lists are built here, by ir/schedule.c); lw:
   every rank of its world in this process, or NULL and `coord`: this process's rank. */
int pipe_walk_new(PipeWalk **out, int kind, int p, int v, int m, LocalWorld *lw, const int64_t mesh[COMM_AXES],
                  const int coord[COMM_AXES], const RtGlobal *place, int64_t whole_n, char *err, size_t errlen);
/* Sets the transport and finds its functions (refused, 2, when the schedule's are missing or a
   chunk's backward does not take what its forward leaves).  Binding again replaces it. */
int pipe_walk_bind(PipeWalk *w, const PipeOps *ops, void *ctx, char *err, size_t errlen);
void pipe_walk_free(PipeWalk *w);

/* runtime/trainer.h's Executor.pipeline_step, optimizer_step and eval_step */
int pipe_walk_step(PipeWalk *w, int64_t n, const int32_t *inputs, const int32_t *targets, float *losses, char *err,
                   size_t errlen);
int pipe_walk_optimizer(PipeWalk *w, float lr, float t, float *grad_norm, char *err, size_t errlen);
int pipe_walk_eval(PipeWalk *w, const int32_t *inputs, const int32_t *targets, float *loss, char *err, size_t errlen);

/* The function of action a. */
int pipe_walk_func(const PipeWalk *w, const Action *a);
/* The walker's rank that speaks for pp rank q (coordinate 0 on the other axes), or -1. */
int pipe_walk_speaker(const PipeWalk *w, int q);
/* The last training step's timeline of every pp rank as a Chrome trace (schedule_write_trace). */
int pipe_walk_trace(const PipeWalk *w, const char *path, const char *backend, char *err, size_t errlen);
/* Validation's schedule: one micro-batch's forward actions, every chunk in order on its rank
   (free it with schedule_free, also on failure). */
int pipe_forward_schedule(const Schedule *train, Schedule *ev);
/* The predicted stash of a lowered program's pipeline, as pipe_stash_peaks gives a module's
   (4 bytes a value): each pp rank's peak under w's training schedule (peak[0 .. p), at most
   64).  After pipe_walk_bind. */
void pipe_rt_stash_peaks(const PipeWalk *w, const RtProgram *p, int64_t *peak);
/* PipeOps.takes for a lowered program: counts, element counts and storage. */
int pipe_rt_takes(const RtProgram *p, int from, int skip, int to, char *err, size_t errlen);

#endif
