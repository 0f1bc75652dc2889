/* runtime/exec/exec_mesh.h — the mesh executor: the ranks of a partitioned program (the shard
 * pass's SPMD program, one lowered program that every rank runs on its own piece), each a
 * device (runtime/device.h), trained through one Executor (runtime/trainer.h).
 *
 * exec_mesh.c is the executor, written once: the functions it calls, the split of a whole
 * micro-batch into each rank's piece, the steps (grad, validation, optimizer), the whole
 * views of the parameters and optimizer state (checkpoints, --out) gathered from the ranks'
 * pieces and scattered back, --out streamed a tensor at a time, the ranks' starting pieces;
 * all by the lowered program's placements (RtGlobal; the token arguments' RtFunc.arg_place).
 * Below it a world says where the ranks are and how pieces travel between processes:
 *   mesh_threads.c  every rank a thread of this process on the cpu backend or the reference
 *                   interpreter (ref_device.h), the collectives runtime/comm's LocalWorld
 *                   (the gather reads the ranks' host storage)
 *   mesh_nccl.c     this process one rank on its GPU (cuda backend), the others processes,
 *                   NCCL between them; sharded checkpoints, the trainer's stop agreement
 * A pipelined program's steps are the pipeline walker's (pipe_walk.c), with the local ranks'
 * devices as its one transport (exec_mesh_pipe.c), plus, on cuda, the hook that issues its NCCL
 * groups between the actions (exec_cuda_pipe.c); they read the same struct (MeshCpu, CudaRank:
 * its names there). */
#ifndef LOOM_RUNTIME_EXEC_EXEC_MESH_H
#define LOOM_RUNTIME_EXEC_EXEC_MESH_H

#include "runtime/cuda/cuda_exec.h"
#include "runtime/device.h"
#include "runtime/exec/exec_cpu.h"
#include "runtime/exec/pipe_walk.h"

typedef struct MeshExec MeshExec;

/* One call of a function on one rank this process runs. */
typedef struct {
  MeshExec *mx;
  int rank, func;      /* rank: an index into dev[] */
  void *args[2];
  void *rets[2];       /* where the results go (the first rank), or NULL (the others: replicated) */
  int rc;
  char err[1024];
} MeshJob;

struct MeshExec {
  Executor ex;
  /* ---- the world (set by mesh_threads.c or mesh_nccl.c before mesh_exec_open) ---- */
  int world;           /* ranks of the mesh */
  int n_local;         /* ranks this process runs: all of them (threads) or its own */
  int rank;            /* the mesh rank of dev[0] */
  int64_t mesh[COMM_AXES];
  int (*coord)[COMM_AXES];   /* [n_local]: each local rank's mesh coordinates */
  RtDevice *dev;       /* [n_local]: the ranks' programs as devices */
  /* jobs[0 .. n_local) on the local ranks; 0, or the first failure's code and message */
  int (*run)(MeshExec *mx, MeshJob *jobs, char *err, size_t errlen);
  /* global k's piece of every rank of the mesh into piece_of[0 .. world), on every process
     (all) or on the one of mesh rank 0 at least (the others take part) */
  int (*gather)(MeshExec *mx, int k, bool all, char *err, size_t errlen);
  /* ---- the executor (exec_mesh.c) ---- */
  const RtProgram *p;
  int f_grad, f_opt, f_forward;   /* f_forward: @forward, for validation (-1: none) */
  RtGlobal tok_place;  /* the micro-batch piece's placement (@grad_step's token argument's) */
  int64_t whole_n;     /* tokens of a whole micro-batch */
  int32_t **tok32, **tgt32;       /* [n_local]: each rank's piece of the micro-batch */
  int *owner;          /* a pipeline: per global, the pp coordinate that updates it (RtGlobal.owner; -1: none); else NULL */
  struct PipeWalk *walk;   /* a pipelined program (RtProgram.pipe): its walker (pipe_walk.h), else NULL */
  struct PipeDev *pipe;    /* and the walker's transport over dev[] (exec_mesh_pipe.c), else NULL */
  float **whole;       /* per global: the whole tensor's host buffer (params, state), or NULL */
  float *scratch;      /* the largest piece */
  float **piece_of;    /* [world]: a gather's pieces */
  int *view_global;    /* per parameter view (ex.params): its global, and where in it the view starts */
  int64_t *view_off;
  float *stream;       /* --out streamed: the whole of one global (the largest parameter's size) */
  int stream_global;   /* the global stream holds, -1 */
  /* ---- threads (mesh_threads.c) and their pipeline transport (exec_mesh_pipe.c) ---- */
  LocalWorld *lw;      /* the ranks' collectives */
  CpuBackend b;        /* the cpu backend: the lowered program, its JIT'd kernels, rank 0's CpuProgram */
  CpuProgram *cpu;     /* [world]; cpu[0] is a copy of b.cp (NULL: the reference interpreter's ranks) */
  CommEngine **engines;           /* async collectives (the overlap pass): each rank's communication thread, or NULL */
  bool step_open;                 /* a training step has begun (its timeline is being recorded) */
  /* ---- a process per rank (mesh_nccl.c) and its pipeline transport (exec_cuda_pipe.c) ---- */
  Comm *comm;
  RtProgram prog;      /* this rank's program (threads of the reference interpreter: the module's description) */
  CudaProgram cp;
  bool have_cp;
  float *gather_buf;   /* world x the largest piece */
};
typedef MeshExec MeshCpu;    /* as the pipeline walkers name it */
typedef MeshExec CudaRank;

/* exec_mesh.c: the executor over the world set in mx: the functions (training: @grad_step
   and @optimizer_step, or a pipeline's @fwd.c0 and @optimizer_step.s0; else @forward), the
   micro-batch's placement, the whole views (training), the Executor's steps and syncs; a
   pipelined program (training): its walker (mx->walk, from the program's RtProgram.pipe;
   the transport binds it) and its globals' stages (owner, RtGlobal.owner).  No IR. */
int mesh_exec_open(MeshExec *mx, bool training, char *err, size_t errlen);
/* The local ranks' starting pieces: the parameters' slices of `init` (safetensors, HF
   names), or the seeded initialization's values of their pieces. */
int mesh_exec_init(MeshExec *mx, const char *init, uint64_t seed, char *err, size_t errlen);
/* func on every local rank, each on its piece of a whole micro-batch; the first rank's
   (replicated) results into rets0, rets1. */
int mesh_exec_split(MeshExec *mx, int func, const int32_t *inputs, const int32_t *targets, void *rets0, void *rets1,
                    char *err, size_t errlen);
void mesh_exec_free(MeshExec *mx);

/* Global gl's whole tensor from every rank's piece (piece_of[q]: rank q's gl->n floats, rank
   q at mesh_coords_of(mesh, q)): replicated pieces are equal, rank order wins; owner >= 0 (a
   pipeline): only the ranks of that pp coordinate count. */
void mesh_assemble(const RtGlobal *gl, const int64_t mesh[5], int world, float *const *piece_of, int owner, float *whole);
/* pieces.c: the rank at coord's piece of a whole micro-batch (int32, [batch, seq] row-major) by the
   placement of the program's token arguments (an RtGlobal's ir_rank, split, piece_dims, n). */
void mesh_tokens_piece(const RtGlobal *place, const int64_t mesh[5], const int coord[5], const int32_t *whole,
                       int32_t *piece);
/* This rank's piece of a whole micro-batch in r->tok32[0], r->tgt32[0] (a process per rank). */
void cuda_rank_tokens(CudaRank *r, const int32_t *inputs, const int32_t *targets);

/* exec_mesh_pipe.c: a pipelined program on the pipeline walker (mx->walk, pipe_walk.h) with the
   local ranks' devices as its transport, for every backend: the stash in blocks of each rank's
   device memory (RtDevice.buf_alloc, reused by size), taken as device arguments
   (RtDevice.call_dev); the Executor's pipeline_step, optimizer_step and eval_step set to the
   walker's.  A backend whose transfers do not run inside the calls adds a hook (the cuda
   backend's NCCL groups, exec_cuda_pipe.c): PipeOps' begin, between and end, and around each
   action's call (action >= 0) before and after; free frees its ctx (with the transport). */
typedef struct {
  void *ctx;
  int (*begin)(void *ctx, const Schedule *s, bool training, char *err, size_t errlen);
  int (*between)(void *ctx, const Schedule *s, int i, char *err, size_t errlen);
  int (*end)(void *ctx, int rc, float *losses, int64_t n, char *err, size_t errlen);
  int (*before)(void *ctx, const PipeCall *c, char *err, size_t errlen);
  void (*after)(void *ctx, const PipeCall *c);
  void (*free)(void *ctx);
} PipeHook;
/* mx->pipe made with hook (NULL: none; its ctx is freed here on failure too), the walker bound
   to it (refused, 2, when the schedule's functions are missing or do not fit). */
int pipe_dev_setup(MeshExec *mx, const PipeHook *hook, char *err, size_t errlen);
void pipe_dev_free(MeshExec *mx);
/* A block of rank's pool (busy until put back: a hook's staging blocks share it with the
   stash) of at least `bytes`; its device address. */
int pipe_dev_block(MeshExec *mx, int rank, int64_t bytes, int *block, char *err, size_t errlen);
uint64_t pipe_dev_addr(const MeshExec *mx, int rank, int block);
void pipe_dev_put(MeshExec *mx, int rank, int *block);
/* exec_cuda_pipe.c: the device transport on this rank's GPU with the hook that issues the
   NCCL groups it planned between the actions and shares the losses at the end.  0, or 1/2
   with a message (a schedule whose transfers NCCL could not pair or run without deadlock is
   refused, 2).  pipe_dev_free frees it. */
int cuda_pipe_setup(CudaRank *r, char *err, size_t errlen);

/* mesh_threads.c, for loom eval --mesh (runtime/exec/eval.c): the mesh opened for @forward
   with the weights split to the ranks (*out is set even on failure: close it), on the cpu
   backend (prog, n, llvm) or, with desc (m's description, taken over), the reference
   interpreter; a step runs
   every rank on its piece of a whole batch, rank 0's logits [B*T*V] and loss come back. */
int eval_cpu_mesh_open(MeshCpu **out, const Module *m, RtProgram *desc, const unsigned char *prog, size_t n,
                       const char *llvm, const char *weights, char *err, size_t errlen);
int eval_cpu_mesh_step(MeshCpu *mc, const int32_t *inputs, const int32_t *targets, float *logits, float *loss, char *err,
                       size_t errlen);
void eval_cpu_mesh_close(MeshCpu *mc);

#endif
