/* runtime/exec/exec_mesh.h — the cpu backend's mesh executor (exec_mesh.c) and its pipeline
   transport (exec_mesh_pipe.c): what the two files share.  Private to tools/. */
#ifndef LOOM_RUNTIME_EXEC_EXEC_MESH_H
#define LOOM_RUNTIME_EXEC_EXEC_MESH_H

#include "runtime/exec/exec_cpu.h"
#include "runtime/exec/exec_ref.h"

typedef struct {
  Executor ex;
  RefExec rx;          /* whole tensors, each rank's pieces, the LocalWorld; a pipeline's walker */
  CpuBackend b;        /* the lowered program, its JIT'd kernels, rank 0's CpuProgram */
  CpuProgram *cp;      /* [world]; cp[0] is &b.cp */
  RtDevice *dev;       /* [world]: cp[k] as a device (runtime/device.h) */
  float **piece_of;    /* [world]: sync_out's pieces of one global */
  int world, f_grad, f_opt, f_forward;   /* f_forward: @forward, for validation (-1: none) */
  int *gmap;           /* program global k -> module global index */
  RtGlobal tok_place;  /* the micro-batch piece's placement (piece_placement) */
  int64_t whole_n;     /* tokens of a whole micro-batch */
  int32_t **tok32, **tgt32;
  /* async collectives (the overlap pass): each rank's communication thread, or NULL */
  CommEngine **engines;           /* [world] */
  bool step_open;                 /* a training step has begun (its timeline is being recorded) */
} MeshCpu;

/* exec_mesh_pipe.c: a pipelined module on the pipeline walker (rx.walk, pipe_walk.h) with the
   ranks' programs as its transport: the Executor's pipeline_step, optimizer_step and
   eval_step, the ranks talking through the walker's tagging communicators (pipe_cpu_free
   gives them theirs back). */
int pipe_cpu_setup(MeshCpu *mc, char *err, size_t errlen);
void pipe_cpu_free(MeshCpu *mc);

/* exec_mesh.c, for loom eval --mesh (runtime/exec/eval.c): the mesh opened for @forward with
   the weights split to the ranks (*out is set even on failure: close it); a step runs every
   rank on its piece of a whole batch, rank 0's logits [B*T*V] and loss come back. */
int eval_cpu_mesh_open(MeshCpu **out, Module *m, const unsigned char *prog, size_t n, const char *llvm,
                       const char *weights, char *err, size_t errlen);
int eval_cpu_mesh_step(MeshCpu *mc, const int32_t *inputs, const int32_t *targets, float *logits, float *loss, char *err,
                       size_t errlen);
void eval_cpu_mesh_close(MeshCpu *mc);

#endif
