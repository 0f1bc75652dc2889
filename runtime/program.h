/* runtime/program.h — the lowered program: what the runtime runs, with no IR in sight.
 *
 * A program is a set of functions (grad_step, optimizer_step, forward); each is a list of
 * steps over buffers.  A buffer is a region (the function's arena, or the parameters,
 * gradient accumulators or optimizer state) plus a byte offset.  Steps are JIT-compiled
 * kernels (codegen/cpu), GEMMs (a CPU BLAS), or builtins: the runtime's own kernels for
 * composite ops and data movement (runtime/cpu/cpu_kernels.c).  See docs/lowering.md.
 *
 * Storage on the CPU: every float tensor is held as f32 (a bf16 value is an f32 rounded to
 * bf16, as the reference executor holds it); integer tensors (token ids) as int32.
 */
#ifndef LOOM_RUNTIME_PROGRAM_H
#define LOOM_RUNTIME_PROGRAM_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { RT_REGION_ARENA, RT_REGION_PARAMS, RT_REGION_GRADS, RT_REGION_OPTIM, RT_REGION_COUNT } RtRegion;

/* Rounding applied to a float buffer when a step writes it (emulates narrow dtypes). */
typedef enum { RT_ROUND_NONE, RT_ROUND_BF16, RT_ROUND_F16, RT_ROUND_F8E4M3, RT_ROUND_F8E5M2 } RtRound;

/* How a buffer's elements are stored.  The CPU backend stores every float as f32 (and
   emulates narrow dtypes with RtBuf.round); the CUDA backend stores each dtype natively. */
typedef enum { RT_ST_F32, RT_ST_I32, RT_ST_BF16, RT_ST_F16, RT_ST_F8E4M3, RT_ST_F8E5M2, RT_ST_BOOL /* 1 byte, 0 or 1 */ } RtStorage;
int rt_storage_size(RtStorage s);          /* bytes per element; 0 for an unknown storage */
const char *rt_storage_name(RtStorage s);  /* "f32", "bf16", ... */

typedef struct {
  uint8_t region;      /* RtRegion */
  uint8_t is_int;      /* 1: int32 elements (token ids), 0: float */
  uint8_t round;       /* RtRound, for outputs */
  uint8_t storage;     /* RtStorage: f32/i32 on the CPU */
  int64_t offset;      /* bytes from the region's start (64-byte aligned) */
  int64_t n;           /* elements */
} RtBuf;

typedef enum { RT_STEP_KERNEL, RT_STEP_GEMM, RT_STEP_BUILTIN } RtStepKind;

/* Context parallelism: the global position of row t of the L rows rank c of n holds
   (contiguous chunks, or zigzag's half-chunks c and 2n-1-c); ir_seq_pos's copy. */
static inline int64_t rt_seq_pos(int64_t c, int64_t t, int64_t L, int64_t n, bool zigzag) {
  if (!zigzag) return c * L + t;
  int64_t h = L / 2;
  return t < h ? c * h + t : (2 * n - 1 - c) * h + (t - h);
}

/* RoPE's inverse frequency of pair j of Dh: theta^(-2j/Dh), f = {theta, factor, low_wl,
   high_wl}; factor > 0: Llama 3.1's scaling (transformers' rope_type "llama3"): a pair whose
   wavelength 2 pi / inv is under high_wl = original_max_pos / high_freq_factor keeps inv, one
   over low_wl = original_max_pos / low_freq_factor gets inv / factor, and one between mixes
   the two with s = (1/wl - 1/low_wl) / (1/high_wl - 1/low_wl), the same as transformers'
   (original_max_pos / wl - low_freq_factor) / (high_freq_factor - low_freq_factor).  Copies:
   ir_rope_inv_freq (ir/ir.h), loom_rope_inv_freq (codegen/cuda/kernels/data.cuh). */
static inline double rt_rope_inv_freq(const double *f, int64_t j, int64_t Dh) {
  double inv = pow(f[0], -2.0 * (double)j / (double)Dh);
  if (!(f[1] > 0.0)) return inv;
  double wl = 2.0 * 3.14159265358979323846 / inv;
  if (wl < f[3]) return inv;
  if (wl > f[2]) return inv / f[1];
  double sm = (1.0 / wl - 1.0 / f[2]) / (1.0 / f[3] - 1.0 / f[2]);
  return (1.0 - sm) * inv / f[1] + sm * inv;
}

/* Builtins: runtime/builtins.def lists them with their buffers, sizes and attributes. */
typedef enum {
#define RT_BUILTIN(e, name, n_in, n_out, ir_op) RT_B_##e,
#include "runtime/builtins.def"
#undef RT_BUILTIN
  RT_B_COUNT
} RtBuiltin;
/* Each builtin's name (as profiles and errors print it) and buffer counts, from
   runtime/builtins.def: n_in -1 variadic (concat); n_out -1 either 0 (in place) or 3 (adamw).
   The program validators of both backends check steps against it. */
typedef struct {
  const char *name;
  int n_in, n_out;
} RtBuiltinInfo;
extern const RtBuiltinInfo rt_builtins[RT_B_COUNT];
const char *rt_builtin_name(int b);   /* "?" past the table */

#define RT_MAX_BUFS 16
#define RT_MAX_HANDLES 65536   /* collective starts in one function, at most */
#define RT_MAX_INTS 40
typedef struct {
  RtStepKind kind;
  int which;                 /* RtBuiltin, or the kernel's index in RtProgram.kernel_names */
  int n_in, n_out;           /* bufs: n_in inputs then n_out outputs */
  RtBuf bufs[RT_MAX_BUFS];
  int64_t i[RT_MAX_INTS];
  double f[4];
  char label[96];            /* for messages and traces: "layernorm %h0.ln_1" */
  uint32_t grid[3], block[3], smem;   /* CUDA launch (codegen/cuda); unused on the CPU */
  /* CUDA: before the launch the runtime writes the rank's coordinate on mesh axis coord_axis
     into i[coord_at - 1] (0: nothing), so that one program serves every rank of a mesh (the
     CPU runtime hands its builtins the rank's Comm instead). */
  uint8_t coord_at, coord_axis;
  /* CUDA: the tensor maps the kernel takes (0: none; RT_TMAP_INT below) */
  uint8_t tmaps;
} RtStep;
/* On CUDA every step that is not a GEMM is RT_STEP_KERNEL (fused kernels and builtins
   alike): `which` names a kernel of the program's CUDA module, with the signature
     extern "C" __global__ void kernel(LoomArgs a)
     struct LoomArgs { void *buf[RT_MAX_BUFS]; long long i[RT_MAX_INTS]; double f[4]; };
   filled from the step (device addresses of bufs, then i[] and f[] as they are), launched
   with grid/block/smem.  Buffers hold their RtBuf.storage natively.
   RT_STEP_KERNEL on the CPU: kernels have the signature
     void kernel(char **args, int64_t begin, int64_t end)
   args[] are the buffers' addresses (inputs then outputs); the kernel computes the part
   [begin, end) of its parallel extent i[0], so the runtime can split it across threads.
   RT_STEP_GEMM: C[b] = op(A[b]) @ op(B[b]) for b < batch;
     bufs A B -> C;  i: batch, M, N, K, ta, tb, strideA, strideB, strideC (elements; 0 = shared);
     on CUDA also i[RT_GEMM_BETA_INT]: 1 adds C's old value (C += op(A) op(B): a gradient
     accumulated in the GEMM), 0 overwrites it (the CPU lowering never sets it), and
     i[RT_GEMM_EPI_INT], flags of a cuBLASLt epilogue (batch 1 only): RT_GEMM_EPI_BIAS adds a
     bias[N] to every row (an input after B), RT_GEMM_EPI_GELU then applies GELU (tanh form)
     and writes the pre-activation to an output after C (cuBLASLt's GELU_AUX_BIAS), and
     RT_GEMM_EPI_C adds another matrix (an input after the bias: a residual, beta = 1 with C
     apart from the result).  RT_GEMM_EPI_BGRAD (alone; beta 0 or 1; tb = 0) also writes the
     column sums of B, bgrad[n] = sum_k B[k][n], to an output after C: a bias gradient, the
     bias of a layer whose output gradient is B (cuBLASLt's BGRADA: Lt's A is our B).
     RT_GEMM_EPI_DGELU (alone or with RT_GEMM_EPI_BGRAD; beta 0) multiplies the product by
     GELU's derivative (tanh form) at the pre-activation, an input after B (cuBLASLt's DGELU);
     with RT_GEMM_EPI_BGRAD the output after C receives the column sums of that result
     instead (DGELU_BGRAD): GELU's backward and its bias gradient.
     Buffers: A B [bias | pre-activation] [residual] -> C [pre-activation] [bias gradient]. */
#define RT_GEMM_BETA_INT 10
#define RT_GEMM_EPI_INT 9
/* On CUDA, i[RT_GEMM_LDA_INT], i[RT_GEMM_LDB_INT], i[RT_GEMM_LDC_INT] (batch 1; 0: packed): the
   row stride of A, B and C as stored (row-major, elements), for a matrix that is a view of a
   wider one (a slice of one; codegen/cuda/lower_gemm.c "views" and "gradient trees"). */
#define RT_GEMM_LDA_INT 11
#define RT_GEMM_LDB_INT 12
#define RT_GEMM_LDC_INT 13   /* the same for C (and the residual), as written */
enum { RT_GEMM_EPI_BIAS = 1, RT_GEMM_EPI_GELU = 2, RT_GEMM_EPI_C = 4, RT_GEMM_EPI_BGRAD = 8, RT_GEMM_EPI_DGELU = 16 };

/* CUDA: a kernel that copies by tensor maps (sm_90's TMA: kernels/attention_sm90.cuh) has
   RtStep.tmaps = n (1..RT_TMAP_MAX) and takes, after its LoomArgs, `const __grid_constant__
   LoomTmaps` (RT_TMAP_MAX 128-byte CUtensorMaps, the unused ones zero), which the runtime
   encodes once when it loads the program (cuTensorMapEncodeTiled: the buffers' addresses
   are fixed from then on, so CUDA graphs replay them as they are).  Map m is described at
   i[RT_TMAP_INT + RT_TMAP_FIELDS m] (other kernels use those ints as their own): the
   buffer's index in bufs, then d0 d1 d2 d3
   (dims innermost first: the buffer holds a row-major [d3][d2][d1][d0] of its 16-bit
   storage, bf16 or f16), then the box's extent in d2: the box is {128 bytes of d0, 1, that,
   1}, copied with the 128-byte swizzle, elements past the tensor's ends filled with zeros. */
#define RT_TMAP_INT 14
#define RT_TMAP_MAX 4
#define RT_TMAP_FIELDS 6
_Static_assert(RT_TMAP_INT + RT_TMAP_MAX * RT_TMAP_FIELDS <= RT_MAX_INTS, "the tensor maps' fields fit in i[]");

/* CUDA: a program whose parameters have bf16 copies (codegen/cuda/lower_fuse.c: the steps
   read the copies, the in-place AdamW writes them) has a function of this name, with no
   arguments or results, that writes every copy from its f32 parameter.  The CUDA runtime runs
   it before the first call of another function after the host wrote a global. */
#define RT_FUNC_WEIGHT_COPIES "weight_copies"
/* CUDA: a single-device training program whose @optimizer_step leaves the gradients as they
   were (codegen/cuda/lower_grads.c dropped its zero fills) has @grad_step's variant of this
   name, for the first micro-batch of a step: it writes the gradients instead of adding to
   them.  The CUDA runtime runs it in @grad_step's place while the gradients are stale (after
   @optimizer_step), and zeroes them before anything else reads them then. */
#define RT_FUNC_FIRST_GRAD_STEP "grad_step.first"

/* The most arguments and results of a lowered function: a pipeline chunk's backward takes
   its forward's stash (every activation it keeps) as arguments. */
#define RT_MAX_FUNC_IO 256
/* A per-rank value's placement on a mesh, as RtGlobal's (below; all 0 when whole): the rank
   holds a piece of piece_dims (ir_rank dims) whose dim split[a] - 1 is split over mesh axis a. */
typedef struct {
  int8_t ir_rank;
  int8_t split[5];
  int64_t piece_dims[8];
} RtPlace;
typedef struct {
  char name[64];
  int n_steps;
  RtStep *steps;
  int64_t arena_bytes;
  int n_args, n_rets;
  RtBuf args[RT_MAX_FUNC_IO], rets[RT_MAX_FUNC_IO];
  /* each argument's placement: a mesh executor splits a whole micro-batch into every rank's
     piece of @grad_step's tokens by it (runtime/exec/exec_mesh.c).  Last: a saved program
     holds the first n_args (rt_program_save) */
  RtPlace arg_place[RT_MAX_FUNC_IO];
} RtFunc;

/* A global (parameter, gradient accumulator, optimizer state): its region and place. */
typedef enum { RT_INIT_ZEROS, RT_INIT_ONES, RT_INIT_NORMAL, RT_INIT_CONST } RtInitKind;
typedef struct {
  char name[256];
  RtRegion region;
  int64_t offset, n;
  int rank;
  int64_t shape[8];
  RtInitKind init;
  double init_value;         /* normal: std; const: the value */
  uint8_t round;             /* storage rounding of the global's dtype */
  uint8_t experts;           /* a stack of experts: [E,...] is E checkpoint tensors (rt_expert_name) */
  /* Placement on a mesh (the shard pass's; all 0 when whole): this rank holds a piece of
     piece_dims (ir_rank dims) of the whole tensor, whose dim split[a] - 1 is split over mesh
     axis a (dp tp cp pp ep; 0: not split), chunk = the rank's coordinate; along a dim split
     by several axes a larger axis index is the outer split.  Bit a of `partial`: each rank
     of axis a holds a summand (gradients).  The whole tensor's dims are piece_dims times the
     splitting axes' sizes; `shape` above is the whole one as checkpoints see it (its
     Hugging Face shape, which may be shorter: a padded vocabulary's extra rows are zero). */
  int8_t ir_rank;
  int8_t split[5];
  uint8_t partial;
  int64_t piece_dims[8];
  /* A pipelined program (RtProgram.pipe.kind): the pp coordinate whose optimizer step
     updates the global (its stage; the first when tied copies are kept on two), whose copy
     checkpoints and --out read; -1: none.  Unused when not pipelined. */
  int16_t owner;
} RtGlobal;

/* runtime/program.c: a rank's piece of a global (RtGlobal's placement) inside the whole
   tensor, for a mesh of sizes mesh[5] and the rank's coordinates coord[5]: fn(whole index,
   piece index, count) for each run of elements contiguous in both, in piece order.  The
   whole tensor's elements (rt_global_whole_numel) are row-major over its IR dims. */
void rt_piece_runs(const RtGlobal *gl, const int64_t mesh[5], const int coord[5],
                   void (*fn)(int64_t w, int64_t p, int64_t n, void *arg), void *arg);
int64_t rt_global_whole_numel(const RtGlobal *gl, const int64_t mesh[5]);
/* A rank's piece copied between the whole tensor and the piece (to_piece: whole -> piece,
   else piece -> whole), run by run (rt_piece_runs). */
void rt_piece_copy(const RtGlobal *gl, const int64_t mesh[5], const int coord[5], float *whole, float *piece, bool to_piece);
/* This rank's piece of the global's initial values (rt_global_init_values of the whole
   tensor, without making it): gl->n floats; zeros on a rank that holds a partial placement's
   non-first summand. */
void rt_global_init_piece(const RtGlobal *gl, const int64_t mesh[5], const int coord[5], uint64_t seed, float *out);

/* A pipelined program's schedule parameters (the pipeline pass's Module.pipe): the
   executors build the action lists from them with ir/schedule.c (schedule_build), over
   mesh[pp] ranks; the chunk functions are @fwd.cK, @bwd.cK (@bwd_b.cK, @bwd_w.cK) and
   @optimizer_step.sR. */
typedef struct {
  int32_t kind;      /* ir/ir.h's PipeKind (1 afab, 2 1f1b, 3 interleaved, 4 zb-h1, 5 dualpipev); 0: none */
  int32_t virt;      /* chunks per pp rank */
  int32_t micro;     /* micro-batches a step */
} RtPipe;

typedef struct {
  int n_funcs;
  RtFunc *funcs;
  int n_globals;
  RtGlobal *globals;
  int64_t region_bytes[RT_REGION_COUNT];   /* sizes of the global regions (the arena is per function) */
  int n_kernels;
  char (*kernel_names)[32];                /* symbol of kernel k in the JIT'd code */
  int64_t mesh[5];   /* the mesh it was partitioned for (dp tp cp pp ep); 0 counts as 1 */
  RtPipe pipe;       /* its pipeline schedule (the pipeline pass's); kind 0: not pipelined */
} RtProgram;

/* runtime/cpu/jit.c: frees what a program owns (steps, globals, kernel names). */
void rt_program_free(RtProgram *p);

/* runtime/program.c: the values global gl starts with, as the reference executor's
   globals_init gives them (ir/interp.c): a splitmix64 stream seeded from `seed` and the
   global's name, normal values by Box-Muller, rounded to the global's format; rows past
   the checkpoint shape (a padded vocabulary) zero.  out holds gl->n floats. */
void rt_global_init_values(const RtGlobal *gl, uint64_t seed, float *out);

/* runtime/program.c: a program as bytes, for compiled executables.  The reader checks
   every count and size and refuses a damaged or foreign blob (returns 2). */
int rt_program_save(const RtProgram *p, unsigned char **bytes, size_t *n, char *err, size_t errlen);
int rt_program_load(const unsigned char *bytes, size_t n, RtProgram *out, char *err, size_t errlen);

/* Sizes read from a program file, combined without overflow by the checks of both runtimes:
   they saturate at INT64_MAX (or INT64_MIN), which no buffer's element count matches, so the
   check refuses. */
static inline int64_t rt_smul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? ((a < 0) != (b < 0) ? INT64_MIN : INT64_MAX) : r;
}
static inline int64_t rt_sadd(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (a < 0 ? INT64_MIN : INT64_MAX) : r;
}
/* The ranks of the program's mesh (saturating). */
static inline int64_t rt_program_world(const RtProgram *p) {
  int64_t w = 1;
  for (int a = 0; a < 5; a++) w = rt_smul(w, p->mesh[a] > 1 ? p->mesh[a] : 1);
  return w;
}
static inline int64_t rt_ssub(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_sub_overflow(a, b, &r) ? (a < 0 ? INT64_MIN : INT64_MAX) : r;
}

/* offset + sz * n <= size without overflow (all from a program file; sz > 0): a buffer of n
   elements of sz bytes at offset lies inside a region of size bytes. */
static inline bool rt_fits(int64_t offset, int64_t n, int64_t sz, int64_t size) {
  return offset >= 0 && n >= 0 && size >= 0 && offset <= size && n <= (size - offset) / sz;
}

/* ---- checking a program before running it (both backends; the bytes may be damaged) ----
   The walk is shared: the counts, the regions, every global, every function's header,
   arguments, results and steps (their buffer counts and kinds).  What a backend requires of
   a global, a buffer and a step's own fields (its element sizes, launch dimensions, GEMM
   types, the builtins it runs) it checks in its hooks, which return 0, or 2 with the reason
   written into the buffer they get. */
typedef struct {
  void *ctx;
  int (*global)(void *ctx, const RtProgram *p, int g, char *err, size_t errlen);
  int (*buf)(void *ctx, const RtProgram *p, int func, const RtBuf *b, const char *what, char *err, size_t errlen);
  int (*step)(void *ctx, const RtProgram *p, const RtStep *st, char *msg, size_t n);
} RtChecker;
/* 0, or 2 with a message naming the function, the step and its label. */
int rt_program_check(const RtProgram *p, const RtChecker *c, char *err, size_t errlen);
/* A buffer's size in a region of function func: the arena's or the region's. */
static inline int64_t rt_region_size(const RtProgram *p, int func, int region) {
  return region == RT_REGION_ARENA ? p->funcs[func].arena_bytes : p->region_bytes[region];
}

#endif
