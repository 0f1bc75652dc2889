/* runtime/cuda/cuda_exec.h — runs a lowered program (runtime/program.h) on one NVIDIA GPU.
 *
 * The GPU twin of runtime/cpu/cpu_exec.h.  A CudaProgram owns, on one device: its primary
 * context (retained), the program's CUDA module (a cubin, fatbin or NUL-terminated PTX
 * image, from codegen/cuda + NVRTC), one CUfunction per RtProgram.kernel_names entry, one
 * device allocation per global region (parameters, gradient accumulators, optimizer state),
 * one arena per function (RtFunc.arena_bytes), a stream, a cuBLASLt handle and workspace,
 * and a cuBLASLt plan (descriptors, layouts, heuristic's algorithm) per GEMM step, made once
 * at init.  Memory starts zeroed.  Steps run in order on the stream:
 *   RT_STEP_KERNEL  cuLaunchKernel of kernel `which` with one parameter, a LoomArgs filled
 *                   from the step (cuda_pack_args), with the step's grid, block and smem
 *                   (and a second, its tensor maps, for a step with tmaps > 0:
 *                   encoded once at init, cuda_tmap.h);
 *   RT_STEP_GEMM    cublasLtMatmul, C[b] = op(A[b]) op(B[b]), row-major through the
 *                   transpose trick (cuda_gemm_layout), batched with strides (a stride of 0
 *                   shares the operand); operands in their storage: f32 x f32 -> f32
 *                   (CUBLAS_COMPUTE_32F, or 32F_FAST_TF32 when CudaOptions.tf32), bf16 x bf16
 *                   or f16 x f16 -> the same or f32 (f32 accumulate);
 *   RT_STEP_BUILTIN only the collectives of a partitioned program (RT_B_ALL_REDUCE ..
 *                   RT_B_ALL_TO_ALL, RT_B_COLL_START, RT_B_COLL_WAIT) and its ring transfers
 *                   (RT_B_SEND, RT_B_RECV): NCCL calls on the communicator of their axis, once
 *                   cuda_program_set_comm made the program a rank of a mesh
 *                   (runtime/cuda/cuda_mesh.c; the transfers as planned groups, see "point-to-
 *                   point transfers" below); every other builtin is a kernel.
 * A step with coord_at gets the rank's coordinate on its axis in i[coord_at - 1] (0 on one GPU).
 * Every buffer holds its RtBuf.storage natively (f32, i32, bf16, f16, f8e4m3, f8e5m2); the
 * host side of every call (args, rets, globals) is f32, or int32 for integer buffers, and
 * is converted (RNE, bitwise as rt_round) on the way.  A global's storage is that of the
 * buffers that name its first element, else the one its RtGlobal.round implies
 * (cuda_global_storage).
 *
 * Errors: 0 ok, 2 bad input (malformed program, unsupported GEMM types), 1 run-time failure.
 * Every driver / cuBLASLt failure names the call, its error string and the step ("@grad_step
 * step 12 (layernorm %h0.ln_1)").  Kernels fail asynchronously: a fault shows at the next
 * synchronization, the end of the call, unless CudaOptions.sync_each_step (or
 * LOOM_CUDA_SYNC=1) synchronizes after every step so that the message names the step.
 * A failed init frees everything it made.  After a failed call the program refuses further
 * calls (a kernel fault spoils the context): free it.  Freeing a program whose context a
 * fault spoiled resets the device's primary context (cuda_device_recover: everything else in
 * that context, in this process, is gone too), so the process can go on with a new program.
 */
#ifndef LOOM_RUNTIME_CUDA_EXEC_H
#define LOOM_RUNTIME_CUDA_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/cuda/cuda_api.h"
#include "runtime/device.h"
#include "runtime/program.h"
#include "runtime/trainer.h"

/* ------------------------------------------------------------------ pure helpers (no GPU) */

/* The one parameter of every CUDA kernel (program.h):
     struct LoomArgs { void *buf[RT_MAX_BUFS]; long long i[RT_MAX_INTS]; double f[4]; };
   480 bytes: buf at 0, i at 128, f at 448. */
typedef struct {
  void *buf[RT_MAX_BUFS];
  long long i[RT_MAX_INTS];
  double f[4];
} CudaLoomArgs;

/* Fills a LoomArgs for step st: buf[k] = base[st->bufs[k].region] + st->bufs[k].offset for
   k < n_in + n_out (base[RT_REGION_ARENA] is the calling function's arena), NULL after;
   i[] and f[] copied as they are. */
void cuda_pack_args(const RtStep *st, const uint64_t base[RT_REGION_COUNT], CudaLoomArgs *out);

/* cuBLASLt is column-major.  A row-major C[M,N] = op(A) op(B) is computed as the
   column-major C^T[N,M] = op(B)^T op(A)^T: Lt's A is our B, Lt's B our A, and a row-major
   [R,C] matrix is read as a column-major [C,R] one with leading dimension C. */
typedef struct {
  int64_t m, n, k;           /* Lt's problem: m = N, n = M, k = K */
  int trans_a, trans_b;      /* 1: CUBLAS_OP_T on Lt's A (= our B, when tb) / Lt's B (= our A, when ta) */
  int64_t a_rows, a_cols, lda;   /* Lt's A as stored (column-major) */
  int64_t b_rows, b_cols, ldb;
  int64_t c_rows, c_cols, ldc;
} CudaGemmLayout;
CudaGemmLayout cuda_gemm_layout(int64_t M, int64_t N, int64_t K, int ta, int tb);

/* bytes per element and name of a storage: runtime/program.c's (the CPU backend's too) */
#define cuda_storage_size rt_storage_size
#define cuda_storage_name rt_storage_name
/* Host conversions.  To a narrow storage: rounded as rt_round (RNE; f8e4m3 saturates, f16
   and f8e5m2 overflow to inf); i32 is copied as int32.  From one: exact. */
void cuda_f32_to_storage(RtStorage s, const float *in, void *out, int64_t n);
void cuda_storage_to_f32(RtStorage s, const void *in, float *out, int64_t n);

/* The storage global g is held in (see the top of this file). */
RtStorage cuda_global_storage(const RtProgram *p, int g);

/* Checks a program for this backend with no device: buffers inside their regions at their
   storage's size and aligned to it, kernels named, launch dimensions set, GEMM operand
   storages supported and extents inside their buffers.  0 or 2 with a message. */
int cuda_program_check(const RtProgram *p, char *err, size_t errlen);

/* Device memory the program needs: what cuda_program_init allocates. */
typedef struct {
  int64_t arenas;      /* the arena the functions share: the largest arena_bytes */
  int64_t max_arena;   /* the same (kept for callers that name it) */
  int64_t regions;     /* params + grads + optimizer state */
  int64_t workspace;   /* cuBLASLt workspace */
  int64_t total;
} CudaMemory;
void cuda_program_memory_plan(const RtProgram *p, size_t workspace_bytes, CudaMemory *m);

/* ------------------------------------------------------------------ the program */

typedef struct {
  bool tf32;               /* f32 GEMMs on tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32) */
  bool sync_each_step;     /* synchronize after every step: faults name their step */
  size_t workspace_bytes;  /* cuBLASLt workspace (0: 32 MiB) */
  bool profile;            /* events around every step of every call (LOOM_PROFILE set): cuda_profile_ms */
  bool graphs;             /* a call's steps captured once into a CUDA graph and replayed (see below) */
  bool gemm_tune;          /* time the heuristic's GEMM candidates at start-up (LOOM_CUDA_GEMM_TUNE; cuda_gemm.c) */
  bool gemm_tune_verbose;  /* LOOM_CUDA_GEMM_TUNE=verbose: print each shape's times */
  bool sync_step;          /* LOOM_CUDA_SYNC_STEP=1 (or sync_each_step): the device offers no step_issue /
                              step_wait, so the training loop waits for every step before the next */
} CudaOptions;
#define CUDA_STEP_SLOTS 2        /* training steps in flight at most (CudaProgram.step_slot) */
#define LOOM_GEMM_CANDIDATES 8   /* the most heuristic results a GEMM shape times */

typedef struct CudaGemmPlan CudaGemmPlan;

typedef struct {
  const RtProgram *p;      /* borrowed: must outlive the CudaProgram */
  int device;
  CudaDeviceInfo info;
  CudaOptions opt;
  void *ctx;               /* CUcontext (the device's primary context) */
  void *modules[16];       /* CUmodule: one, or one per part of a bundle (nvrtc.h: NVRTC_MAX_PROGRAMS) */
  int n_modules;
  void *stream;            /* CUstream */
  void *lt;                /* cublasLtHandle_t */
  void **fns;              /* CUfunction per kernel [p->n_kernels] */
  uint64_t regions[RT_REGION_COUNT];   /* device bases; [RT_REGION_ARENA] unused */
  uint64_t arena;          /* the arena every function shares (their calls never overlap) */
  uint64_t workspace;
  CudaGemmPlan ***plans;   /* [func][step], NULL for non-GEMM steps */
  unsigned char ***tmaps;  /* [func][step]: a step's LoomTmaps (cuda_tmap.h), NULL where none */
  int gemm_shapes, gemm_timed, gemm_cached;   /* GEMM shapes with several candidates; timed now; read from the cache */
  RtStorage *gstorage;     /* [p->n_globals] */
  unsigned char *staging;  /* host bytes for args / rets conversions */
  size_t staging_bytes;
  CudaMemory mem;          /* what was actually allocated */
  /* one rank of a mesh (cuda_program_set_comm; NULL/0 on one GPU) */
  struct Comm *comm;
  int coord[5];            /* the rank's coordinates (dp, tp, cp, pp, ep) */
  void *axis_stream[5];    /* CUstream per mesh axis of size > 1 */
  void *ev_ready;          /* CUevent: the compute stream reached a collective */
  void **ev_done;          /* CUevent per start handle, and one for plain collectives */
  int n_events;
  struct CudaP2pPlan *p2p; /* [p->n_funcs]: each function's transfer groups (cuda_p2p_plan) */
  void **p2p_done;         /* CUevent per group (as many as the function with the most) */
  int n_p2p_events;
  uint64_t p2p_staging;    /* device staging slots (the largest function's CudaP2pPlan.staging) */
  struct NcclP2p *p2p_args;   /* host room for the largest group's NCCL calls */
  /* a pipeline's transfers (rel=0): before each call the driver (runtime/exec/exec_cuda_pipe.c)
     names a device slot for every one of the function's fixed-rank sends and receives, in
     step order; a send step copies its buffer into its slot, a receive step copies its slot
     into its buffer, both on the compute stream (the driver moves the slots over NCCL
     between calls: "a pipeline's transfers" below) */
  const uint64_t *pipe_slot;
  int n_pipe_slot;
  bool broken;             /* a call failed: only free is allowed */
  /* CudaOptions.profile: an event before every step of a call and one after its last, on the
     compute stream; after the call's synchronization each step's time (ms) of the last call
     of each function, prof_ms[func][step] (cuda_profile_ms) */
  void **prof_ev;          /* as many as the longest function's steps + 1 */
  int n_prof_ev;
  float **prof_ms;
  int64_t *prof_calls;     /* calls profiled, per function */
  /* CudaOptions.graphs: per function, the CUDA graph of its steps (CUgraphExec), captured at
     its first call and launched at every call, between the arguments' copies in and the
     results' copies out; NULL until then, and for the functions that run step by step: a
     rank of a mesh (NCCL calls on other streams), a pipeline's chunks, a profiled or
     synchronized-each-step program, or one whose capture the driver refused (graph_off) */
  void **graph;
  bool *graph_off;
  /* one CUDA graph a training step (cuda_program_step): the step's micro-batches' @grad_step
     and its @optimizer_step, captured at the first step and launched at every one; the
     micro-batches' tokens and targets, lr and t go in through step_io (copied there before the
     launch, moved into the functions' arguments by the graph), the losses and the gradient
     norm come out through it (one copy out after the launch, then the step's only
     synchronization).  NULL until captured, or when the calls go one by one (step_graph_off:
     refused, LOOM_CUDA_STEP_GRAPH=0, or no graphs at all) */
  void *step_graph;
  int64_t step_graph_n;    /* the micro-batches it was captured for */
  bool step_graph_off;
  uint64_t step_io;        /* device bytes: inputs (step_in bytes), then outputs */
  size_t step_in, step_bytes;
  /* Steps issued and not yet waited for (cuda_program_step_issue / _wait): at most
     CUDA_STEP_SLOTS, oldest first from step_head.  Each slot has its own host image of
     step_io (page-locked where the driver gives it, so that the copies are asynchronous), so
     that step N+1's inputs are written while step N's losses are still on their way into
     step N's image; an event after the step's copy out says when they are on the host.  One
     device step_io serves both: step N+1's copy in is queued on the stream after step N's
     graph, so it cannot overwrite what step N reads.  A step that went call by call (no
     graph) is complete when issued: its results wait in res. */
  struct {
    unsigned char *host;   /* step_bytes: inputs, then the outputs */
    bool pinned;           /* host from cuMemAllocHost (else malloc) */
    void *done;            /* CUevent recorded after the copy out */
    bool direct;           /* ran call by call: results in res */
    int64_t n;             /* its micro-batches */
    int fg, fo;            /* its @grad_step and @optimizer_step */
    float *res;            /* [n + 1]: losses, then the norm (direct steps) */
    int64_t res_cap;
  } step_slot[2];
  int step_head, step_count;
  /* the parameters' bf16 copies (RT_FUNC_WEIGHT_COPIES, runtime/program.h): that function
     (-1: none), run step by step before the next call of another function once the host has
     written a global (copies_stale) */
  int f_copies;
  bool copies_stale;
  /* the first micro-batch's @grad_step (RT_FUNC_FIRST_GRAD_STEP, runtime/program.h; -1: none),
     which writes the gradients: @optimizer_step then leaves them stale (grads_stale) and the
     next call of @grad_step (f_grad) runs it instead; anything else that reads the gradients
     first (another function, the host) has them zeroed */
  int f_first, f_grad, f_opt;
  bool grads_stale;
  bool grads_held;   /* they hold a sum being made (a micro-batch's call ran, the host wrote one):
                        a whole step's graph, whose first micro-batch writes them, waits for the
                        optimizer (the calls go one by one) */
} CudaProgram;

/* The time of each step of the last call of function f that was profiled (CudaOptions.profile),
   in ms, or NULL when none was (a collective's step is the compute stream's time to issue it
   and wait where the step waits). */
const float *cuda_profile_ms(const CudaProgram *cp, int f);

/* Options from the environment: LOOM_TF32=1, LOOM_CUDA_SYNC=1, LOOM_CUDA_SYNC_STEP=1, LOOM_PROFILE (set and not 0:
   profile), LOOM_CUDA_GRAPH=0 (no graphs: every step launched at every call). */
void cuda_options_default(CudaOptions *o);
/* image: the CUDA module (cubin / fatbin / PTX text, n bytes; PTX needs no terminating NUL).
   device: the CUDA device index. */
int cuda_program_init(CudaProgram *cp, const RtProgram *p, const void *image, size_t n, int device, char *err,
                      size_t errlen);
int cuda_program_init_opts(CudaProgram *cp, const RtProgram *p, const void *image, size_t n, int device,
                           const CudaOptions *opt, char *err, size_t errlen);
void cuda_program_free(CudaProgram *cp);
int cuda_find_func(const CudaProgram *cp, const char *name);   /* -1 if absent */

/* As cpu_program_call: args[k] host buffers of RtFunc.args[k] (n elements, f32 or int32),
   rets[k] caller buffers (f32 or int32; NULL: not wanted).  Returns once the results are
   on the host. */
int cuda_program_call(CudaProgram *cp, int func, void *const *args, void **rets, char *err, size_t errlen);
/* One training step: n micro-batches of function f_grad (@grad_step(tokens, targets) -> loss,
   inputs and targets [n][tokens]) and function f_opt (@optimizer_step(lr, t) -> grad_norm) as
   one CUDA graph (CudaProgram.step_graph), or call by call where graphs are off; the same
   results either way (the same launches): losses[n], *grad_norm.  Returns once they are on
   the host. */
int cuda_program_step(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs, const int32_t *targets,
                      float lr, float t, float *losses, float *grad_norm, char *err, size_t errlen);
/* The same in two halves, so that the host prepares and issues step N+1 while step N runs:
   _issue copies the inputs into a free slot's host image and queues the step's copy in, graph
   and copy out on the stream, and returns without waiting (inputs and targets may be reused at
   once); _wait waits for the oldest step issued and not yet waited for (its event) and gives its
   losses[n] and norm.  At most CUDA_STEP_SLOTS steps are in flight (a third _issue is refused,
   2); anything else on the stream (a call, a global's read or write) comes after them in
   stream order.  A step that cannot be a graph runs call by call inside _issue. */
int cuda_program_step_issue(CudaProgram *cp, int f_grad, int f_opt, int64_t n, const int32_t *inputs,
                            const int32_t *targets, float lr, float t, char *err, size_t errlen);
int cuda_program_step_wait(CudaProgram *cp, float *losses, float *grad_norm, char *err, size_t errlen);
/* The same with some arguments and results on the device: dargs[k] / drets[k] nonzero is a
   device address holding (receiving) argument (result) k in its RtBuf's storage, copied on
   the device; the others go through the host as above (dargs, drets may be NULL). */
int cuda_program_call_dev(CudaProgram *cp, int func, void *const *args, const uint64_t *dargs, void **rets,
                          const uint64_t *drets, char *err, size_t errlen);
/* Device memory of cp's context (zeroed), named in an out-of-memory message; and its free. */
int cuda_dev_alloc(CudaProgram *cp, uint64_t *addr, int64_t bytes, const char *what, char *err, size_t errlen);
void cuda_dev_free(CudaProgram *cp, uint64_t addr);

/* Globals and buffers as f32 (int32 for integer buffers) on the host, converted from and to
   their storage (writing rounds to it). */
int cuda_global_read(CudaProgram *cp, int g, float *out, char *err, size_t errlen);
int cuda_global_write(CudaProgram *cp, int g, const float *in, char *err, size_t errlen);
int cuda_buf_read(CudaProgram *cp, int func, const RtBuf *b, void *out, char *err, size_t errlen);
int cuda_buf_write(CudaProgram *cp, int func, const RtBuf *b, const void *in, char *err, size_t errlen);
/* Every global as cpu_globals_init sets it (same values, bitwise, in the global's format). */
int cuda_globals_init(CudaProgram *cp, uint64_t seed, char *err, size_t errlen);
/* A device address (tests, NCCL): base of the buffer's region + offset. */
uint64_t cuda_buf_addr(const CudaProgram *cp, int func, const RtBuf *b);

/* ------------------------------------------------------------------ a rank of a mesh (cuda_mesh.c) */

/* Makes cp one rank of a mesh: its collective steps become NCCL calls on comm (runtime/comm/
   comm_nccl.h: this process's rank; it must outlive cp), each on a communication stream of
   its axis ordered against the compute stream by events, so a started collective overlaps
   the kernels up to its wait; kernels get the rank's coordinates; every function's ring
   transfers are planned (cuda_p2p_plan below: refused, 2, in an order NCCL cannot run) and
   get their events and staging slots; every call ends with nccl_sync (the timeout and the
   communicators' errors watched).  0, or 1/2 with a message. */
struct Comm;
int cuda_program_set_comm(CudaProgram *cp, struct Comm *comm, char *err, size_t errlen);
/* For cuda_check.c, cuda_call.c and cuda_exec.c: a collective or transfer step is well
   formed (else false and why); run step s of function f; wait for the end of a call; free the
   streams, events and plans. */
bool cuda_mesh_step_ok(const RtStep *st, char *msg, size_t n);
int cuda_mesh_step(CudaProgram *cp, int f, int s, const char *where, char *err, size_t errlen);
int cuda_mesh_sync(CudaProgram *cp, const char *where, char *err, size_t errlen);
void cuda_mesh_free(CudaProgram *cp);

/* A pipeline's transfers (RT_B_SEND / RT_B_RECV to a fixed rank, rel=0: the pipeline pass's
   chunk functions).  Their partner is in another rank's function, run at another time, so
   they cannot be planned within a function as ring transfers are: the pipeline driver
   (runtime/exec/exec_cuda_pipe.c) runs them between its calls.  cp->pipe_slot must name a slot for
   each (cuda_pipe_transfers counts and describes them); the step copies between its buffer
   and its slot. */
typedef struct {
  int step;
  bool send;
  int peer;                /* the peer's coordinate on the axis */
  int axis;
  int64_t count, bytes, tag;
  int storage;
} CudaPipeXfer;
/* The fixed-rank transfers of function f, in step order: n of them in *out (malloc'd, NULL
   when none).  0, or 1 (out of memory). */
int cuda_pipe_transfers(const RtProgram *p, int f, CudaPipeXfer **out, int *n);
/* ops[0..n) as ONE NCCL group on the communicator and stream of mesh axis `axis`, after the
   compute stream's work so far; the compute stream waits for it.  0, or 1/2 with a message. */
struct NcclP2p;
int cuda_pipe_exchange(CudaProgram *cp, int axis, int n, const struct NcclP2p *ops, const char *label, char *err,
                       size_t errlen);

/* Point-to-point transfers (RT_B_SEND / RT_B_RECV on a ring, rel=1: context parallelism).
   The CPU's sends are buffered and its receives pick a message by tag, in any order; NCCL's
   are neither: a send completes only once the peer posts the matching receive, a rank's
   sends to a peer pair with that peer's receives from it in issue order, and a ring of
   ranks each waiting for its neighbour deadlocks.  So a function's transfers are planned
   once, identically on every rank (the program is the same), before anything runs:
     - messages: on each axis the k-th send to +p pairs with the k-th receive from -p, in
       step order (NCCL's pairing); each pair must carry the same tag (the CPU's pairing),
       size and storage, the receive must come after the send, and every send must have its
       receive in the same function; otherwise the plan is refused with the steps named;
     - groups: the messages of a run of consecutive send steps on one axis form ONE NCCL group
       (ncclGroupStart/End) holding both ends of each, so every rank's group g sends exactly
       what its peers' group g receives; groups are issued in step order on the axis's
       stream.  A group is issued at its last send (`issue`: the axis stream waits for the
       compute stream there) and the compute stream waits for it at its first receive
       (`wait`), so it runs beside the steps in between (ring attention's block);
     - staging: NCCL reads a send's buffer and writes a receive's while the group runs, i.e.
       somewhere between `issue` and `wait`, not at the send's or receive's own step.  A send
       whose buffer something may write after its step and before `wait`, or a receive whose
       buffer something may read or write between `issue` and its step (steps' outputs and
       inputs, in-place kernels, started collectives until their wait, other transfers'
       whole possible spans), goes through a staging slot instead: the send copies its buffer
       there at its step (on the compute stream), the receive copies it out at its step.
       Slots are reused once the previous user is done.
   The shard pass's cp programs plan (ring and all-gather attention, zigzag and contiguous,
   with dp, tp and recomputation); a refusal names the steps of an order NCCL cannot run. */
typedef struct {
  int step;                /* the RT_B_SEND / RT_B_RECV step */
  int group;
  bool send;
  int64_t off;             /* the sender's offset (1 <= off < size): a send goes to coordinate + off, a
                              receive comes from coordinate - off, mod the axis size */
  int64_t bytes;
  int64_t stage;           /* byte offset of its staging slot; -1: NCCL uses the step's buffer */
} CudaP2pOp;
typedef struct {
  int axis;
  int issue, wait;         /* steps (see above) */
  int first, n;            /* ops[first .. first + n): message by message, the send then its receive */
  int64_t bytes;           /* sent (and received) */
} CudaP2pGroup;
typedef struct CudaP2pPlan {
  int n_ops, n_groups;
  CudaP2pOp *ops;
  CudaP2pGroup *groups;
  int *op_of_step;         /* [n_steps]: the step's op, -1; NULL when the function has no transfer */
  int64_t staging;         /* bytes of staging slots the function needs */
  int max_group;           /* ops in its largest group */
} CudaP2pPlan;
/* Plans function fn's transfers (no device needed; cuda_program_set_comm runs it for every
   function).  0 (an empty plan without transfers), or 2 with a message naming the steps (1:
   out of memory). */
int cuda_p2p_plan(const RtFunc *fn, CudaP2pPlan *out, char *err, size_t errlen);
void cuda_p2p_plan_free(CudaP2pPlan *pl);

/* ------------------------------------------------------------------ the device */

/* The program as an RtDevice (runtime/device.h: the one rank executor runs it): no host
   storage; read and write copy a global (f32 on the host, its storage on the device).  d
   borrows cp (its close frees nothing). */
void cuda_device(RtDevice *d, CudaProgram *cp);

#endif
