/* runtime/exec/exec_ref.h — an Executor (runtime/trainer.h) that runs a trained module's
   @grad_step and @optimizer_step on the reference executor: one rank, or every rank of a
   partitioned module as threads of this process, talking through runtime/comm_local. */
#ifndef LOOM_RUNTIME_EXEC_EXEC_REF_H
#define LOOM_RUNTIME_EXEC_EXEC_REF_H

#include "ir/ir.h"
#include "runtime/comm/comm.h"
#include "ir/schedule.h"
#include "runtime/trainer.h"
#include "runtime/exec/exec.h"

typedef struct {
  Executor ex;
  const Module *m;
  int world;
  GlobalStore **g;         /* per rank: the rank's pieces of every global */
  Tensor **full;           /* per global: the whole tensor (multi-rank: a copy for the trainer) */
  LocalWorld *lw;
  Func *grad_step, *optimizer_step;
  Tensor *inputs, *targets, *lr, *step;   /* whole batch (the ranks take their part) */
  float last_loss, last_norm;
  /* a pipelined module (runtime/exec/exec_pipe.c) */
  struct PipeWalk *walk;  /* the pipeline walker (pipe_walk.h): the schedule, the measured timeline and stash */
  Schedule *sched;        /* walk's action lists */
  int *owner;             /* per global: the pp coordinate whose copy is the truth, or -1 */
} RefExec;

/* The module holds @grad_step(tokens, targets) -> loss and @optimizer_step(lr, step) ->
   grad_norm (passes autodiff and optimizer; shard for a mesh).  Parameters start from
   `init` (safetensors, HF names) or, when NULL, from the seeded initialization: whole, as
   a single-rank run has them, then split to the ranks.  Parameters and the adam_* state
   are exposed whole by name; $grad.* accumulators are not (they are zero between steps). */
int ref_exec_init(RefExec *r, const Module *m, uint64_t seed, const char *init, char *err, size_t errlen);
void ref_exec_free(RefExec *r);
/* The same without needing the training functions (training false): for eval. */
int ref_exec_open(RefExec *r, const Module *m, uint64_t seed, const char *init, bool training, char *err,
                  size_t errlen);
/* For an executor whose ranks hold their own pieces (the mesh executor's threads, for a
   pipeline: mesh_threads.c): the local world, the pipeline schedule and its measured times,
   and whole views of the parameters and optimizer state (zeros, untouched: the executor has
   its own); no initialization and no rank stores, and no sync_out / sync_in. */
int ref_exec_open_views(RefExec *r, const Module *m, bool training, char *err, size_t errlen);
/* Runs f on every rank with whole arguments; rets[] receive the (replicated) results. */
int ref_exec_run(RefExec *r, Func *f, Tensor **whole_args, Tensor **rets, char *err, size_t errlen);

/* exec_pipe.c: a pipelined module (m->pipe.kind) on the pipeline walker with the interpreter
   as its transport: the schedule, the pipeline step, the per-rank optimizer steps. */
int pipe_exec_setup(RefExec *r, char *err, size_t errlen);
void pipe_exec_free(RefExec *r);
/* The interpreter's communicator over a runtime one (a's lifetime). */
typedef struct {
  IrComm ir;
  Comm *comm;
} RefComm;
IrComm *ref_comm(RefComm *a, Comm *c);
/* pipe_stash_peaks, pipe_func_rank and pipe_owner_of: ir/schedule.h. */

/* train_common.c: after a pipelined run, the measured idle per pp rank beside the predicted
   bubble and the stash peaks (to plan->opt.log), and the timeline (plan->trace_out). */
int pipe_run_report(RefExec *r, const RunPlan *plan, const char *backend, char *err, size_t errlen);

/* Copies between a whole tensor and the piece of it that the rank at coord holds (the
   piece's type says how it is split): to_piece whole -> piece, else piece -> whole. */
void move_piece(const Mesh *mesh, Tensor *whole, Tensor *piece, const int coord[AX_COUNT], bool to_piece);
/* pieces.c: the placement of a per-rank value of type `local` as an RtGlobal's (ir_rank,
   split, piece_dims, n; the rest zero), for the reference interpreter's pipeline (exec_pipe.c),
   which splits the micro-batch as the lowered programs' RtFunc.arg_place does. */
void piece_placement(const Type *local, RtGlobal *out);

/* The whole (global) type of a per-rank value's type, on module m's mesh. */
Type whole_type(const Module *m, const Type *local);

#endif
