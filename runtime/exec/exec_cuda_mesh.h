/* runtime/exec/exec_cuda_mesh.h — one rank of a mesh on the CUDA backend (exec_cuda_mesh.c) and its
   pipeline driver (exec_cuda_pipe.c), which share the rank. */
#ifndef LOOM_RUNTIME_EXEC_EXEC_CUDA_MESH_H
#define LOOM_RUNTIME_EXEC_EXEC_CUDA_MESH_H

#include "runtime/cuda/cuda_exec.h"
#include "runtime/trainer.h"
#include "runtime/exec/exec_ref.h"

typedef struct CudaPipe CudaPipe;

typedef struct {
  Executor ex;
  const Module *m;       /* read at open only (the micro-batch's placement, a pipeline's schedule) */
  Comm *comm;
  int rank, world;
  int64_t mesh[COMM_AXES];
  RtProgram prog;
  CudaProgram cp;
  RtDevice dev;          /* cp as a device (runtime/device.h) */
  bool have_cp;
  int f_grad, f_opt, f_forward;
  float **whole;         /* per global: the whole tensor's host buffer (params, state), or NULL */
  float *piece;          /* the largest piece */
  float *gather;         /* world x the largest piece, for sync_out */
  float **piece_of;      /* [world]: rank q's piece in gather */
  RtGlobal tok_place;    /* the micro-batch piece's placement (piece_placement) */
  int64_t whole_n;       /* tokens of a whole micro-batch */
  int32_t *tok32, *tgt32;
  int *owner;            /* a pipeline: per global, the pp coordinate that updates it (-1: none); else NULL */
  int *view_global;      /* per parameter view (ex.params): its global, and where in it the view starts */
  int64_t *view_off;
  float *stream;         /* --out streamed: the whole of one global (the largest parameter's size) */
  int stream_global;     /* the global stream holds, -1 */
  CudaPipe *pipe;        /* a pipeline's driver (exec_cuda_pipe.c), or NULL */
} CudaRank;

/* This rank's piece of a whole micro-batch ([batch, seq] row-major) in r->tok32, r->tgt32. */
void cuda_rank_tokens(CudaRank *r, const int32_t *inputs, const int32_t *targets);

/* A pipelined module (pass "pipeline") on this rank: r->pipe made, r->ex's pipeline_step,
   optimizer_step and eval_step set to the driver's.  0, or 1/2 with a message (a schedule
   whose transfers NCCL could not pair or run without deadlock is refused, 2). */
int cuda_pipe_setup(CudaRank *r, char *err, size_t errlen);
void cuda_pipe_free(CudaRank *r);

#endif
