/* runtime/device.h — one rank's device: a lowered program (runtime/program.h) opened on a
 * backend, seen through four operations, and the one rank executor over it.
 *
 * A backend implements RtDevice once (runtime/cpu/cpu_exec.c: the JIT-compiled program on
 * the host; runtime/cuda/cuda_exec.c: a CudaProgram on one GPU; the reference interpreter,
 * below); what runs a program above
 * it (the rank executor below, validation, loom eval) calls the device, not the backend.
 *   call    runs function `func`: args[k] host buffers of RtFunc.args[k] (f32, or int32 for
 *           integer buffers), rets[k] caller buffers of RtFunc.rets[k] (NULL: not copied out)
 *   read    a global's values (RtGlobal.n floats, f32) into a host buffer
 *   write   a host buffer (f32) into a global (rounded to the global's storage)
 *   host    a global's live host storage when the device keeps it on the host (the cpu
 *           backend: read and write are then copies of it), else NULL
 *   close   frees what the device's open made (a device made over a backend's program it
 *           does not own frees nothing)
 * Errors as the backends': 0 ok, 2 bad input, 1 run-time failure, with a message.
 *
 * The reference interpreter implements it too (runtime/exec/ref_device.c, in the execution
 * layer because it runs the IR): its program is a description of the module without steps
 * (codegen's cg_describe_module: the functions' arguments and results, the globals and their
 * placements), and a call interprets the IR function.
 */
#ifndef LOOM_RUNTIME_DEVICE_H
#define LOOM_RUNTIME_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/program.h"
#include "runtime/trainer.h"

typedef struct RtDevice RtDevice;
struct RtDevice {
  const RtProgram *p;   /* the program it runs (borrowed from the backend) */
  const char *kind;     /* "cpu", "cuda", "ref" */
  void *impl;           /* the backend's program (CpuProgram, CudaProgram, RefRank) */
  int (*call)(RtDevice *d, int func, void *const *args, void **rets, char *err, size_t errlen);
  int (*read)(RtDevice *d, int g, float *out, char *err, size_t errlen);
  int (*write)(RtDevice *d, int g, const float *in, char *err, size_t errlen);
  float *(*host)(RtDevice *d, int g);
  void (*close)(RtDevice *d);
  /* optional (NULL: none): a whole training step, n micro-batches of f_grad (inputs, targets
     [n][tokens]) then f_opt(lr, t), their losses[n] and the norm as call would give them (the
     cuda backend: one CUDA graph a step, cuda_program_step); the rank executor's whole_step */
  int (*step)(RtDevice *d, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets, float lr,
              float t, float *losses, float *grad_norm, char *err, size_t errlen);
  /* optional (NULL: none): step in two halves, so that the host prepares step N+1 while step
     N runs.  step_issue queues a whole step as step does and returns without waiting (inputs
     and targets may be reused at once); step_wait waits for the oldest step issued and not
     yet waited for and gives its losses[n] and norm.  At most two steps in flight.  The cuda
     backend, unless LOOM_CUDA_SYNC_STEP=1 (cuda_program_step_issue); the rank executor's
     issue_step and finish_step */
  int (*step_issue)(RtDevice *d, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets,
                    float lr, float t, char *err, size_t errlen);
  int (*step_wait)(RtDevice *d, float *losses, float *grad_norm, char *err, size_t errlen);
  /* optional (NULL: the host's memory): buffers a caller keeps on the device between calls (a
     pipeline's stash, runtime/exec/exec_mesh_pipe.c), at device addresses: buf_alloc and
     buf_free (the cuda backend: device memory); call_dev is call with argument k read from
     address dargs[k] when that is not 0 (laid in its RtBuf's storage), else from host args[k],
     and result k written to drets[k] when not 0, else to rets[k].  Use them through
     rt_device_buf_alloc, _buf_free and _call_dev, which on a device without them (the cpu)
     give host blocks and pass their addresses to call. */
  int (*buf_alloc)(RtDevice *d, int64_t bytes, uint64_t *addr, char *err, size_t errlen);
  void (*buf_free)(RtDevice *d, uint64_t addr);
  int (*call_dev)(RtDevice *d, int func, void *const *args, const uint64_t *dargs, void **rets, const uint64_t *drets,
                  char *err, size_t errlen);
};

/* The function named `name` (without '@'), or -1. */
int rt_device_find(const RtDevice *d, const char *name);
static inline void rt_device_close(RtDevice *d) {
  if (d && d->close) d->close(d);
}
/* RtDevice.buf_alloc, buf_free and call_dev, or host blocks (malloc) and call where the
   device has none (0, 2 bad input, 1 out of memory or a run-time failure, with a message). */
int rt_device_buf_alloc(RtDevice *d, int64_t bytes, uint64_t *addr, char *err, size_t errlen);
void rt_device_buf_free(RtDevice *d, uint64_t addr);
int rt_device_call_dev(RtDevice *d, int func, void *const *args, const uint64_t *dargs, void **rets,
                       const uint64_t *drets, char *err, size_t errlen);

/* ------------------------------------------------------------ the rank executor */

/* runtime/trainer.h's Executor over a device whose program has @grad_step(tokens, targets:
   int32 [B*T]) -> loss and @optimizer_step(lr, step: f32 scalars) -> grad_norm, and, when it
   has @forward(tokens, targets) -> (logits, loss), the validation step (eval_step).
   Parameters (RT_REGION_PARAMS) and optimizer state (RT_REGION_OPTIM) are exposed as
   RtTensors, a stack of experts (RtGlobal.experts) as its E checkpoint tensors
   (rt_views_add).  On a device with host storage the tensors are views into it (live);
   otherwise they are host copies of the globals: sync_out copies the device's values into
   them (init does it once), sync_in writes them back, and whoever writes into them (loading
   weights, a resume) calls ex.sync_in afterwards.
   program.h does not record argument shapes: batch * seq must be @grad_step's token count
   (0, 0: 1 and that count). */
typedef struct {
  Executor ex;
  RtDevice *dev;        /* borrowed */
  int f_grad, f_opt, f_forward;
  int n_held;           /* globals with a host copy (a device without host storage) */
  int *held;            /* [n_held]: their indices */
  float **host;         /* [n_held]: their copies (f32, RtGlobal.n each); the tensors point into them */
} RtRankExec;

int rt_rank_exec_init(RtRankExec *re, RtDevice *dev, int64_t batch, int64_t seq, char *err, size_t errlen);
void rt_rank_exec_free(RtRankExec *re);

#endif
