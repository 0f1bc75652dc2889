/* ir/ir.h — loom's intermediate representation.
 *
 * A Module holds the device mesh, the globals (parameters under their HF names, and
 * later optimizer state) and functions.  A function is a list of ops in SSA form; an
 * operand is a function argument, the result of an earlier op, or a global ($name).
 * Every value has a Type: dtype, static shape, and a sharding over the mesh axes.
 *
 * Files and what they provide:
 *   arena.c    Arena: bump allocator; one per module, freed in one call
 *   types.c    dtypes, shapes, shardings, type printing, bf16/f16/f8 rounding
 *   ops.c      the op table (from ops.def), attribute schemas and accessors
 *   module.c   building modules, functions, ops and values
 *   clone.c    deep copies of modules; dropping a function
 *   hash.c     a structural hash of a function
 *   infer.c    result-type inference: the shape rule of every op
 *   verify.c   the verifier: types, shapes, shardings, SSA order; names the bad op
 *   print.c    the text form
 *   parse.c    the text form back into a module; file:line:col errors
 *   interp.c   reference executor (interp_ops.c: the meaning of every op; interp_moe.c: the
 *              mixture-of-experts ops; interp_ops.h)
 *   schedule.c pipeline schedules as data (ir/schedule.h): the pass and the executors share them
 *   fmath.h    loom's exp and tanh, the definitions every backend's kernels follow
 *   ops.def    every op, defined once (runtime/builtins.def names the ops the runtime runs whole)
 *
 * Errors are values: functions that can fail return 0 on success, IR_EINPUT (2) for bad
 * input or IR_ERUN (1) for a run-time failure, and write a message into `err`.
 */
#ifndef LOOM_IR_H
#define LOOM_IR_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define IR_MAX_RANK 8
#define IR_MAX_RESULTS 64   /* results of one op (a call of a fused kernel) */
#define IR_ERR_LEN 2048
enum { IR_OK = 0, IR_ERUN = 1, IR_EINPUT = 2 };

/* ---------------------------------------------------------------- arena.c */
typedef struct Arena Arena;
Arena *arena_new(void);
void *arena_alloc(Arena *a, size_t n);            /* zeroed, 16-byte aligned */
void *arena_alloc_uninit(Arena *a, size_t n);     /* the same, not zeroed (the caller writes it all) */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void arena_free(Arena *a);
size_t arena_bytes(const Arena *a);

/* Growable array of pointers, allocated from an arena (old blocks are left to it). */
typedef struct { void **items; int n, cap; } PtrVec;
void ptrvec_push(Arena *a, PtrVec *v, void *p);

/* ---------------------------------------------------------------- types.c */
typedef enum {
  DT_F32, DT_BF16, DT_F16, DT_F8E4M3, DT_F8E5M2, DT_I32, DT_I64, DT_U16, DT_BOOL, DT_COUNT
} DType;
const char *dtype_name(DType t);
int dtype_size(DType t);
bool dtype_is_float(DType t);
int dtype_parse(const char *s, size_t n, DType *out);   /* 0 ok, -1 unknown */
float dtype_round(DType t, float x);   /* value as stored in dtype t (RNE), back as f32 */

/* The mesh: five named axes; all 1 unless a plan says otherwise. */
typedef enum { AX_DP, AX_TP, AX_CP, AX_PP, AX_EP, AX_COUNT } MeshAxis;
extern const char *const mesh_axis_names[AX_COUNT];
typedef struct { int64_t size[AX_COUNT]; } Mesh;
int64_t mesh_world(const Mesh *m);
/* The coordinates of a rank (0 <= rank < mesh_world): digits in the mixed radix pp, dp, ep,
   cp, tp from outer to inner, so a tensor-parallel group is consecutive (runtime/comm/comm.h). */
void mesh_rank_coords(const Mesh *m, int64_t rank, int64_t coord[AX_COUNT]);

/* Sharding of one value: for every mesh axis, replicated, split along a tensor
   dimension, or partial (each rank holds a summand; the value is the sum over the axis). */
enum { SH_R = 0, SH_S = 1, SH_P = 2 };
typedef struct { int8_t kind[AX_COUNT]; int8_t dim[AX_COUNT]; } Sharding;
bool sharding_is_replicated(const Sharding *s);
bool sharding_eq(const Sharding *a, const Sharding *b);

typedef struct {
  DType dtype;
  int rank;
  int64_t dims[IR_MAX_RANK];
  Sharding sh;
} Type;
Type type_make(DType dt, int rank, const int64_t *dims);
Type type_scalar(DType dt);
int64_t type_numel(const Type *t);   /* INT64_MAX when the product overflows */
#define IR_MAX_NUMEL (INT64_C(1) << 48)  /* largest tensor the IR accepts (elements) */
bool type_eq(const Type *a, const Type *b);          /* dtype, shape and sharding */
bool type_shape_eq(const Type *a, const Type *b);    /* dtype and shape */
/* Writes "f32[4,64,768]<dp:s0>" into buf; returns buf. */
char *type_str(const Type *t, char *buf, size_t n);
void type_fprint(FILE *f, const Type *t);
char *shape_str(const Type *t, char *buf, size_t n);  /* "[4,64,768]" */

/* ---------------------------------------------------------------- ops.c */
typedef enum {
#define OP(e, name, nops, nres, cls, flags, schema) OP_##e,
#include "ops.def"
#undef OP
  OP_COUNT
} OpKind;

typedef enum {
  CLASS_ELEMENTWISE, CLASS_REDUCTION, CLASS_CONTRACTION, CLASS_DATA,
  CLASS_COMPOSITE, CLASS_COLLECTIVE, CLASS_OPTIMIZER, CLASS_CALL
} OpClass;

enum {
  OPF_COMMUTATIVE = 1 << 0,
  OPF_TYPED = 1 << 1,
  OPF_FLOAT_ONLY = 1 << 2,
  OPF_W1 = 1 << 3,           /* writes operand 0 (a global) */
  OPF_W3 = 1 << 4,           /* writes operands 0, 1 and 2 (globals) */
  OPF_SIDE = 1 << 5,         /* talks to another rank (send, recv): never removed, merged or moved */
  OPF_EFFECT = OPF_W1 | OPF_W3 | OPF_SIDE,
  /* the op's recomputation class (passes/recompute.c, --recompute selective's classes): an
     elementwise op without one is RC_ELTWISE, any other op none */
  OPF_RC_ACT = 1 << 6,       /* an activation */
  OPF_RC_NORM = 1 << 7,      /* a norm */
  OPF_RC_ROPE = 1 << 8,      /* rotary embeddings */
  OPF_RC_ATTN = 1 << 9,      /* attention */
};

typedef enum { ATTR_INT, ATTR_FLOAT, ATTR_BOOL, ATTR_INTS, ATTR_DTYPE, ATTR_STR, ATTR_FUNC } AttrKind;
typedef struct {      /* (fields ordered to pack: every op holds IR_MAX_ATTRS of them) */
  int64_t i;          /* int, bool, dtype */
  double f;           /* float */
  int64_t *ints;
  const char *s;      /* str; func: the function's name */
  int n;              /* ints */
  uint8_t kind;       /* AttrKind */
  bool set;           /* given (or defaulted); a required attribute left unset fails verify */
} Attr;

#define IR_MAX_ATTRS 10   /* rope: 6 + Llama 3.1 scaling's 4 */
typedef struct {
  const char *name;
  AttrKind kind;
  bool has_default;
  Attr def;
} AttrSpec;

typedef struct {
  const char *name;
  int n_operands;      /* -1 = variadic */
  int n_results;
  OpClass cls;
  unsigned flags;
  int n_attrs;
  AttrSpec attrs[IR_MAX_ATTRS];
} OpInfo;

const OpInfo *op_info(OpKind k);
int op_n_writes(OpKind k);      /* how many leading operands the op writes (0 if pure) */
int op_lookup(const char *name, size_t n, OpKind *out);   /* 0 ok, -1 unknown */
/* Async collectives (ops.def): the start of a collective kind (all_reduce, all_gather,
   reduce_scatter, all_to_all), or OP_COUNT when it has none; and back from a start to the
   collective it begins (any other kind: itself). */
OpKind op_start_of(OpKind k);
OpKind op_sync_of(OpKind k);
bool op_is_start(OpKind k);
int op_attr_index(OpKind k, const char *name);            /* -1 if the op has no such attr */

/* ---------------------------------------------------------------- module.c */
typedef struct Value Value;
typedef struct Op Op;
typedef struct Global Global;
typedef struct Func Func;
typedef struct Module Module;

typedef enum { VAL_ARG, VAL_RESULT, VAL_GLOBAL } ValueKind;
struct Value {
  Type type;
  const char *name;     /* optional readable name; printed as %name */
  ValueKind kind;
  Op *def;              /* VAL_RESULT: the op, and which of its results */
  int index;
  Global *global;       /* VAL_GLOBAL */
  int id;               /* scratch for passes and the executor; set by func_number() */
  int64_t offset;       /* memory-plan: byte offset in the function's arena, or -1 */
};

struct Op {
  OpKind kind;
  int n_operands;
  Value **operands;
  int n_results;
  Value **results;
  Attr attrs[IR_MAX_ATTRS];   /* in schema order (op_info(kind)->attrs) */
  int line;                   /* source line when parsed, else 0 */
  Func *callee;               /* call: the kernel function (its name is the callee attr) */
};

typedef enum { INIT_ZEROS, INIT_ONES, INIT_NORMAL, INIT_CONST } InitKind;
typedef struct { InitKind kind; double value; } Init;   /* normal: value = std */

/* Gradient and optimizer-state globals are named "<prefix><parameter name>".    The autodiff and optimizer passes make them; the executors and the lowering read them. */
#define GRAD_PREFIX "grad."
#define ADAM_M_PREFIX "adam_m."
#define ADAM_V_PREFIX "adam_v."
typedef enum { GLOBAL_PARAM, GLOBAL_STATE } GlobalKind;
struct Global {
  GlobalKind kind;
  const char *name;     /* parameters carry their HF tensor names */
  Value *value;         /* VAL_GLOBAL, its type */
  Init init;
  int index;            /* position in module->globals */
  /* The shape of the tensor in checkpoints when it differs from the IR's (same elements in
     the same order: GPT-2's c_attn is [D,3D] in files, [D,3,D] in the IR so that a split of
     the last dim keeps whole heads), or the IR type with fewer rows (a vocabulary padded
     for tensor parallelism: the extra rows are zero and not saved).  hf_rank 0: the same
     as the IR type. */
  int hf_rank;
  int64_t hf_dims[IR_MAX_RANK];
  /* A stack of experts (mixture of experts): the global `P.experts.X` [E,...] is, in
     checkpoints, E tensors `P.experts.<e>.X.weight` (Hugging Face's per-expert names; text
     form `as experts`).  ir_expert_name gives them. */
  bool hf_experts;
};
/* The checkpoint name of expert e of the stacked global `name` ("P.experts.X" ->
   "P.experts.<e>.X.weight"; any prefix before P, e.g. "adam_m.", is kept).  0, or -1 when
   the name has no ".experts." or buf is too small. */
int ir_expert_name(const char *name, int64_t e, char *buf, size_t n);

struct Func {
  const char *name;
  Module *module;
  bool is_kernel;       /* a fused kernel (docs/lowering.md), called by `call` */
  int64_t arena_bytes;  /* memory-plan: the arena this function needs, or -1 */
  PtrVec args;          /* Value* */
  PtrVec ops;           /* Op*, in execution order */
  PtrVec rets;          /* Value* */
};

/* Pipeline parallelism: set by the pipeline pass (passes/pipeline.c), printed as
   `pipeline "1f1b" virtual=1 micro=4 chunks=2`.  The per-chunk functions @fwd.cK, @bwd.cK
   (zero-bubble schedules: @bwd_b.cK and @bwd_w.cK) and @optimizer_step.sR were made for
   this schedule; the ordered actions of every pp rank follow from it (ir/schedule.h). */
typedef enum { PIPE_NONE, PIPE_AFAB, PIPE_1F1B, PIPE_INTERLEAVED, PIPE_ZBH1, PIPE_DUALPIPEV, PIPE_COUNT } PipeKind;
extern const char *const pipe_kind_names[PIPE_COUNT];   /* "", "afab", "1f1b", "interleaved", "zb-h1", "dualpipev" */
int pipe_kind_parse(const char *s);                      /* PIPE_* or -1 */
/* Recomputation (passes/recompute.c; `--recompute`, spec "recompute"): none, selective (the
   op classes below; "selective:norm,act" names them), full (each layer's input saved, the
   layer run again in the backward), auto (what fits `--memory-budget` at the least work). */
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL, RECOMPUTE_AUTO, RECOMPUTE_COUNT } RecomputeMode;
enum { RC_NORM = 1, RC_ACT = 2, RC_ELTWISE = 4, RC_ROPE = 8, RC_ATTN = 16, RC_N_CLASSES = 5 };
#define RC_DEFAULT_CLASSES (RC_NORM | RC_ACT | RC_ELTWISE)
extern const char *const recompute_mode_names[RECOMPUTE_COUNT];   /* "none", "selective", "full", "auto" */
extern const char *const recompute_class_names[RC_N_CLASSES];     /* "norm", "act", "eltwise", "rope", "attn" */
/* "none" | "selective[:class,...]" | "full" | "auto": 0, or -1 with the reason in why. */
int recompute_parse(const char *s, int *mode, unsigned *classes, char *why, size_t n);
/* "40GiB", "512MB", "1.5e9", "123B": bytes (KB/MB/GB/TB powers of 1000, KiB/MiB/GiB/TiB of
   1024); 0, or -1 when it is not a size. */
int bytes_parse(const char *s, int64_t *out);
typedef struct {
  int kind;             /* PipeKind; PIPE_NONE: not pipelined */
  int64_t virt;         /* chunks per pp rank */
  int64_t micro;        /* micro-batches per step (grad_accum) */
  int64_t chunks;       /* pp x virt */
} PipeInfo;

struct Module {
  Arena *arena;
  const char *name;
  bool local;           /* partitioned by the shard pass: shapes are per rank */
  const char *source;   /* file it was parsed from, for messages; NULL if built */
  Mesh mesh;
  PipeInfo pipe;
  PtrVec globals;       /* Global* */
  PtrVec funcs;         /* Func* */
  int *gslot;           /* globals by name: an open-addressing table of index + 1 (0: empty) */
  int gcap;             /* its size (a power of two; more than twice the globals) */
};

Module *module_new(const char *name);
void module_free(Module *m);
Global *module_add_global(Module *m, GlobalKind kind, const char *name, Type t, Init init);
Global *module_find_global(const Module *m, const char *name);
Func *module_add_func(Module *m, const char *name);
Func *module_find_func(const Module *m, const char *name);
/* A deep copy in its own arena (NULL when out of memory); src is only read, so threads may
   copy one module at once.  share_strings: the copy's names and attribute strings and
   arrays are src's (src must then outlive it; no pass writes into them). */
Module *module_clone(const Module *src, bool share_strings);
/* Removes every function of that name from m->funcs (what it allocated stays in the arena). */
void module_drop_func(Module *m, const char *name);

Value *func_add_arg(Func *f, const char *name, Type t);
void func_add_ret(Func *f, Value *v);
/* Creates an op with default attributes and results of the given types (appended to f). */
Op *func_add_op(Func *f, OpKind k, Value **operands, int n_operands, const Type *result_types);
/* Same, but not appended: for passes that rebuild op lists. */
Op *op_new(Module *m, OpKind k, Value **operands, int n_operands, const Type *result_types);
/* For ops with a variadic result count (call): n_results given. */
Op *op_new_n(Module *m, OpKind k, Value **operands, int n_operands, const Type *result_types, int n_results);
void value_set_name(Module *m, Value *v, const char *name);
/* Numbers args, then op results in order (Value.id), returns the count. */
int func_number(Func *f);
/* `%p2, %m2, %v2 = adamw $p, $m, $v, ...` (op i of f) whose results are only `assign`ed
   back to $p, $m and $v, with nothing between that reads or writes those globals: the
   adamw may update the globals in place.  assigns[] gets the three assigns' indices. */
bool adamw_assigned_back(const Func *f, int i, int assigns[3]);
/* The parameters a CUDA program keeps a 2-byte copy of (codegen/cuda/lower_fuse.c; the memory
   plan counts them): an f32 parameter every cast of which, in calls of one-cast kernels, is to
   one 2-byte float dtype, and which nothing writes but its in-place AdamW.  copy[g] = that
   dtype, or DT_F32 for a global without a copy; returns how many have one (-1: out of memory). */
int weight_copy_dtypes(const Module *m, DType *copy);
/* The same where the functions with before_fuse[i] set are not lowered yet (the planner's
   memo): their bare `cast $p` ops count as the one-cast kernel calls fuse will make of them. */
int weight_copy_dtypes_before_fuse(const Module *m, DType *copy, const bool *before_fuse);
/* A call of a kernel func that only casts an f32 parameter global to a 2-byte float of its
   size: the global's index, else -1. */
int weight_cast_of_param(const Op *op);

/* Attribute setters/getters by name; getters return the default when unset. */
void op_set_int(Op *op, const char *name, int64_t v);
void op_set_float(Op *op, const char *name, double v);
void op_set_bool(Op *op, const char *name, bool v);
void op_set_ints(Module *m, Op *op, const char *name, const int64_t *v, int n);
int64_t op_int(const Op *op, const char *name);
double op_float(const Op *op, const char *name);
bool op_bool(const Op *op, const char *name);
const Attr *op_attr(const Op *op, const char *name);
bool attr_eq(const Attr *a, const Attr *b);

/* ---------------------------------------------------------------- hash.c */
/* A 128-bit structural hash of f: its name, arguments, ops (kinds, attributes, operands,
   result types and names), results and the globals it reads (global_hash: name, type,
   kind; gh[i] the hash of the module's global i, or NULL); names up to the numbers in them,
   send/recv peers and tags up to a renaming (ir/hash.c says why).  It numbers f's values
   (func_number).  When globals is not NULL it receives f's distinct global operands in
   first-use order (their count in *n_globals); seen[] has one flag per module global, all
   false, and is left so. */
uint64_t global_hash(const Global *g);
void func_hash(Func *f, const uint64_t *gh, uint64_t out[2], const Global **globals, int *n_globals, bool *seen);

/* ---------------------------------------------------------------- infer.c */
/* Infers the result types of `op` from its operands and attributes into out[].
   TYPED ops check their declared result type instead (out = declared).  On error
   writes a message without location and returns IR_EINPUT. */
int infer_types(const Op *op, Type *out, char *err, size_t errlen);

/* Builder helpers: create an op, infer its result type, append it.  Ops with attributes
   are built in two steps: build_begin, set attributes, build_end.  On a shape error the
   first message is kept in b->err and the value is typed like the first operand, so a
   builder checks once at the end. */
typedef struct {
  Func *f;
  char err[IR_ERR_LEN];
} Builder;
Value *build(Builder *b, OpKind k, Value **operands, int n, const char *name);
Value *build1(Builder *b, OpKind k, Value *x, const char *name);
Value *build2(Builder *b, OpKind k, Value *x, Value *y, const char *name);
/* TYPED ops (reshape, broadcast, cast, constant, iota): the result type is given. */
Value *build_typed(Builder *b, OpKind k, Value *x, Type t, const char *name);
Op *build_begin(Builder *b, OpKind k, Value **operands, int n);
Value *build_end(Builder *b, const char *name);

/* ---------------------------------------------------------------- verify.c */
/* Checks SSA order, operand/attribute counts and kinds, inferred vs declared types,
   shardings against the mesh.  The message names the function, the op (text form)
   and its source line when known. */
int verify_module(const Module *m, char *err, size_t errlen);
int verify_func(const Func *f, char *err, size_t errlen);

/* ---------------------------------------------------------------- print.c */
void print_module(FILE *out, const Module *m);
void print_func(FILE *out, const Func *f);
void print_op(FILE *out, const Op *op);     /* one line; values by name, else by id */
char *op_to_string(const Op *op, char *buf, size_t n);
char *module_to_string(const Module *m);    /* malloc'd */
/* Shortest decimal text that reads back as the same double. */
void format_double(char *buf, size_t n, double x);

/* ---------------------------------------------------------------- parse.c */
/* Parses the text form.  `filename` is used in messages: "file:line:col: error: ...". */
int parse_module(const char *filename, const char *text, Module **out, char *err, size_t errlen);
int parse_module_file(const char *path, Module **out, char *err, size_t errlen);

/* ---------------------------------------------------------------- interp.c */
/* A tensor of the reference executor: floats are held as f32 values already rounded to
   the dtype (bf16 emulation); integers and bools as int64. */
typedef struct {
  Type type;
  int64_t n;
  float *f;
  int64_t *i;
} Tensor;
Tensor *tensor_new(const Type *t);            /* zero-filled, malloc'd */
void tensor_free(Tensor *t);
Tensor *tensor_clone(const Tensor *t);

/* Storage for a module's globals, indexed like module->globals. */
typedef struct {
  int n;
  Tensor **t;
} GlobalStore;
GlobalStore *globals_new(const Module *m);    /* every tensor allocated, filled from init (seeded) */
void globals_init(const Module *m, GlobalStore *g, uint64_t seed);
void globals_free(GlobalStore *g);

/* Runs f: args[i] for f->args, results into rets[] (new tensors, caller frees).
   Ops with effects update the store. */
int interp_run(const Func *f, GlobalStore *g, Tensor **args, Tensor **rets, char *err, size_t errlen);

/* A rank of a partitioned program: its mesh coordinates and flat collectives among the
   ranks that differ only in `axis` (in coordinate order).  Implemented outside ir/ (the
   runtime's in-process communicator); buffers are f32. */
typedef struct IrComm IrComm;
struct IrComm {
  void *self;
  int coord[AX_COUNT];
  int (*all_reduce)(IrComm *c, int axis, float *buf, int64_t n, bool max);        /* in place */
  int (*all_gather)(IrComm *c, int axis, const float *in, float *out, int64_t n); /* out: size*n, rank order */
  int (*reduce_scatter)(IrComm *c, int axis, const float *in, float *out, int64_t n_out); /* in: size*n_out */
  int (*all_to_all)(IrComm *c, int axis, const float *in, float *out, int64_t n_chunk);   /* size chunks each way */
  /* Point-to-point with the rank at coordinate `peer` on `axis` (NULL where no program sends). */
  int (*send)(IrComm *c, int axis, int peer, int64_t tag, const float *buf, int64_t n);
  int (*recv)(IrComm *c, int axis, int peer, int64_t tag, float *buf, int64_t n);
};
/* interp_run for one rank; comm may be NULL when every collective axis has size 1. */
int interp_run_comm(const Func *f, GlobalStore *g, Tensor **args, Tensor **rets, IrComm *comm, char *err,
                    size_t errlen);
int mesh_axis_parse(const char *name);   /* AX_* or -1 */

/* Context parallelism: the global position of row t of the L rows that rank c of n holds
   of a sequence of n*L positions.  Contiguous: chunk c.  Zigzag: the sequence in 2n
   half-chunks of L/2, rank c holding half-chunks c and 2n-1-c, so every rank has as much
   causal work.  (runtime/program.h has the runtime's copy, rt_seq_pos.) */
static inline int64_t ir_seq_pos(int64_t c, int64_t t, int64_t L, int64_t n, bool zigzag) {
  if (!zigzag) return c * L + t;
  int64_t h = L / 2;
  return t < h ? c * h + t : (2 * n - 1 - c) * h + (t - h);
}

/* RoPE's inverse frequency of pair j of Dh (rope and rope_at, ops.def): theta^(-2j/Dh), and
   with factor > 0 Llama 3.1's scaling as transformers' rope_type "llama3" computes it: a pair
   whose wavelength wl = 2 pi / inv is under orig / high_freq_factor keeps inv, one over
   orig / low_freq_factor gets inv / factor, one between (1 - s) inv / factor + s inv with
   s = (orig / wl - low_freq_factor) / (high_freq_factor - low_freq_factor).
   (runtime/program.h has the runtime's copy, rt_rope_inv_freq.) */
static inline double ir_rope_inv_freq(const Op *op, int64_t j, int64_t Dh) {
  double inv = pow(op_float(op, "theta"), -2.0 * (double)j / (double)Dh);
  double factor = op_float(op, "factor");
  if (!(factor > 0.0)) return inv;
  double lo = op_float(op, "low_freq_factor"), hi = op_float(op, "high_freq_factor");
  double orig = (double)op_int(op, "original_max_pos"), wl = 2.0 * 3.14159265358979323846 / inv;
  if (wl < orig / hi) return inv;
  if (wl > orig / lo) return inv / factor;
  double s = (orig / wl - lo) / (hi - lo);
  return (1.0 - s) * inv / factor + s * inv;
}

#endif
