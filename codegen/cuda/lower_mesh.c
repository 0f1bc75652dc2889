/* codegen/cuda/lower_mesh.c — the ops of a partitioned program (the shard pass's output) for
 * the CUDA backend.  One program serves every rank, as on the CPU:
 *   - collectives (all_reduce, all_gather, reduce_scatter, all_to_all) are RT_STEP_BUILTIN
 *     steps with program.h's i[] layout (the CPU lowering's): the runtime runs them as NCCL
 *     calls on the communicator of their axis (runtime/cuda/cuda_exec.h, "collectives");
 *   - their async halves (the overlap pass) are RT_B_COLL_START (the collective with its
 *     handle in front) and RT_B_COLL_WAIT, as on the CPU;
 *   - shard_slice, shard_pad, target_pick and onehot are kernels of kernels/mesh.cuh whose
 *     i[] ends with the rank's coordinate on a mesh axis, written by the runtime before the
 *     launch (RtStep.coord_at; the lowering writes 0);
 *   - send and recv are RT_B_SEND / RT_B_RECV steps with program.h's i[] (n, axis, size,
 *     peer, tag, rel).  The runtime does not run them one by one.  On a ring (rel=1: context
 *     parallelism's ring attention) it plans each function's transfers as NCCL groups
 *     (runtime/cuda/cuda_exec.h, "point-to-point transfers") and refuses, at start, an order
 *     NCCL could not pair or run without deadlock.  To a fixed rank (rel=0: a pipeline's
 *     chunk functions, peer the pp coordinate) the step copies between its buffer and a
 *     staging slot, and the pipeline driver exchanges the slots between its calls
 *     (runtime/exec/exec_cuda_pipe.c).
 *   - all_to_allv (expert parallelism): RT_B_ALL_TO_ALLV, its counts read on the host.
 * Refused here: a ring transfer to the rank itself, a fixed peer outside the axis, and an
 * element type NCCL does not move. */
#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"

bool cl_mesh_op(const Op *op) {
  switch (op_sync_of(op->kind)) {
  case OP_ALL_REDUCE:
  case OP_ALL_GATHER:
  case OP_REDUCE_SCATTER:
  case OP_ALL_TO_ALL:
  case OP_WAIT:
  case OP_SHARD_SLICE:
  case OP_SHARD_PAD:
  case OP_TARGET_PICK:
  case OP_ONEHOT:
  case OP_SEND:
  case OP_RECV:
  case OP_ALL_TO_ALLV: return true;
  default: return false;
  }
}

/* The step reads the rank's coordinate on mesh axis `axis` at i[slot]. */
static void coord_at(RtStep *st, int slot, int64_t axis) {
  st->coord_at = (uint8_t)(slot + 1);
  st->coord_axis = (uint8_t)axis;
}

static int axis_of(Lower *L, const char *attr, int64_t *axis) {
  const Attr *a = op_attr(L->op, attr);
  *axis = a && a->s ? mesh_axis_parse(a->s) : -1;
  if (*axis < 0) return cl_fail(L, "%s '%s' is not a mesh axis", attr, a && a->s ? a->s : "");
  return 0;
}

/* A collective: x -> y, the same storage. */
static int collective(Lower *L, Steps *s, OpKind kind) {
  const Op *op = L->op;
  const Type *x = &op->operands[0]->type, *y = &op->results[0]->type;
  int64_t axis, n_ax = op_int(op, "n");
  if (axis_of(L, "axis", &axis)) return IR_EINPUT;
  RtStep *st = cl_new_step(L, s, RT_STEP_BUILTIN, 0, "");
  if (!st || cl_set_bufs(L, st, (const Value *const *)op->operands, 1, true)) return IR_EINPUT;
  st->n_out = 1;
  if (st->bufs[0].storage != st->bufs[1].storage)
    return cl_fail(L, "a collective between different dtypes is not supported by the CUDA backend");
  int n = 0;
#define INT(v)                                           \
  do {                                                   \
    if (cl_push_int(L, st, &n, (v))) return IR_EINPUT; \
  } while (0)
  switch (kind) {
  case OP_ALL_REDUCE:
    st->which = RT_B_ALL_REDUCE;
    INT(type_numel(y));
    INT(axis);
    INT(n_ax);
    INT(!strcmp(op_attr(op, "reduce")->s, "max"));
    return 0;
  case OP_ALL_GATHER:
  case OP_REDUCE_SCATTER: {
    const Type *piece = kind == OP_ALL_GATHER ? x : y;
    int dim = (int)op_int(op, "dim");
    st->which = kind == OP_ALL_GATHER ? RT_B_ALL_GATHER : RT_B_REDUCE_SCATTER;
    INT(axis);
    INT(n_ax);
    INT(cl_prod_dims(piece, 0, dim));
    INT(piece->dims[dim]);
    INT(cl_prod_dims(piece, dim + 1, piece->rank));
    return 0;
  }
  case OP_ALL_TO_ALL: {
    int sd = (int)op_int(op, "split"), cd = (int)op_int(op, "concat");
    st->which = RT_B_ALL_TO_ALL;
    INT(axis);
    INT(n_ax);
    INT(cl_prod_dims(x, 0, sd));
    INT(x->dims[sd] / n_ax);
    INT(cl_prod_dims(x, sd + 1, x->rank));
    INT(cl_prod_dims(y, 0, cd));
    INT(y->dims[cd] / n_ax);
    INT(cl_prod_dims(y, cd + 1, y->rank));
    return 0;
  }
  default: return cl_fail(L, "internal: not a collective");
  }
}

/* A wait: RT_B_COLL_WAIT over its start's operand and result (the collective reads and
   writes them until here). */
static int wait_step(Lower *L, Steps *s) {
  const Op *op = L->op, *start = op->operands[0]->def;
  if (op->operands[0]->kind != VAL_RESULT || !op_is_start(start->kind)) return cl_fail(L, "waits for no collective start");
  if (op->operands[0]->offset != op->results[0]->offset)
    return cl_fail(L, "the wait's result must share its start's buffer (run the memory-plan pass)");
  RtStep *st = cl_new_step(L, s, RT_STEP_BUILTIN, RT_B_COLL_WAIT, "");
  if (!st) return IR_EINPUT;
  st->n_in = st->n_out = 1;
  if (cl_buf_of(L, start->operands[0], &st->bufs[0]) || cl_buf_of(L, op->results[0], &st->bufs[1])) return IR_EINPUT;
  st->i[0] = L->handle[op->operands[0]->id];
  return 0;
}

/* A send (x ->) or recv (-> y): RT_B_SEND / RT_B_RECV, i: n, axis, size, peer, tag, rel. */
static int transfer(Lower *L, Steps *s, bool send) {
  const Op *op = L->op;
  const Value *v = send ? op->operands[0] : op->results[0];
  int64_t axis, n_ax = op_int(op, "n"), peer = op_int(op, "peer");
  if (axis_of(L, "axis", &axis)) return IR_EINPUT;
  bool rel = op_bool(op, "rel");
  if (!rel && (n_ax < 2 || peer < 0 || peer >= n_ax))
    return cl_fail(L, "goes to rank %lld of %s=%lld: no such rank", (long long)peer, op_attr(op, "axis")->s, (long long)n_ax);
  if (rel && (n_ax < 2 || peer % n_ax == 0))
    return cl_fail(L, "goes to the rank itself (peer %+lld on %s=%lld): nothing to transfer", (long long)peer,
                   op_attr(op, "axis")->s, (long long)n_ax);
  RtStep *st = cl_new_step(L, s, RT_STEP_BUILTIN, send ? RT_B_SEND : RT_B_RECV, "");
  if (!st || cl_set_operand_bufs(L, st)) return IR_EINPUT;
  if (st->n_in + st->n_out != 1) return cl_fail(L, "internal: a transfer moves one buffer");
  int storage = st->bufs[0].storage;
  if (storage != RT_ST_F32 && storage != RT_ST_BF16 && storage != RT_ST_F16 && storage != RT_ST_I32)
    return cl_fail(L, "moves %s values: NCCL moves f32, bf16, f16 and i32", dtype_name(v->type.dtype));
  int n = 0;
#define PUSH(x)                                        \
  do {                                                 \
    if (cl_push_int(L, st, &n, (x))) return IR_EINPUT; \
  } while (0)
  PUSH(type_numel(&v->type));
  PUSH(axis);
  PUSH(n_ax);
  PUSH(peer);
  PUSH(op_int(op, "tag"));
  PUSH(rel);
#undef PUSH
  return 0;
}

/* all_to_allv (expert parallelism): x send recv -> y, RT_B_ALL_TO_ALLV; i: axis, size, S, D,
   rows, El (program.h).  The runtime reads the counts to the host and moves each peer's rows
   with grouped NCCL sends and receives. */
static int all_to_allv(Lower *L, Steps *s) {
  const Op *op = L->op;
  const Type *x = &op->operands[0]->type, *y = &op->results[0]->type;
  int64_t axis, n_ax = op_int(op, "n");
  if (axis_of(L, "axis", &axis)) return IR_EINPUT;
  RtStep *st = cl_new_step(L, s, RT_STEP_BUILTIN, RT_B_ALL_TO_ALLV, "");
  if (!st || cl_set_operand_bufs(L, st)) return IR_EINPUT;
  if (st->n_in != 3 || st->n_out != 1 || x->rank != 2 || y->rank != 2 || n_ax < 1)
    return cl_fail(L, "internal: all_to_allv takes x[S,D], send and recv counts -> y[rows,D]");
  if (st->bufs[0].storage != st->bufs[3].storage || st->bufs[1].storage != RT_ST_I32 || st->bufs[2].storage != RT_ST_I32)
    return cl_fail(L, "all_to_allv wants x and y of one dtype and i32 counts");
  const int64_t ints[6] = {axis, n_ax, x->dims[0], x->dims[1], y->dims[0], op->operands[1]->type.dims[0] / n_ax};
  memcpy(st->i, ints, sizeof ints);
  return 0;
}

int cl_lower_mesh_op(Lower *L, Steps *s) {
  const Op *op = L->op;
  OpKind kind = op_sync_of(op->kind);
  if (op->kind == OP_WAIT) return wait_step(L, s);
  if (op->kind == OP_ALL_TO_ALLV) return all_to_allv(L, s);
  if (op->kind == OP_SEND || op->kind == OP_RECV) return transfer(L, s, op->kind == OP_SEND);
  if (kind == OP_ALL_REDUCE || kind == OP_ALL_GATHER || kind == OP_REDUCE_SCATTER || kind == OP_ALL_TO_ALL) {
    if (collective(L, s, kind)) return IR_EINPUT;
    if (!op_is_start(op->kind)) return 0;
    if (L->n_handles >= RT_MAX_HANDLES) return cl_fail(L, "starts more than %d collectives in one function", RT_MAX_HANDLES);
    int h = L->n_handles++;
    L->handle[op->results[0]->id] = h;
    if (cg_wrap_start(&s->items[s->n - 1], h)) return cl_fail(L, "internal: no room for the start's handle");
    return 0;
  }
  RtStep *st = cl_new_step(L, s, RT_STEP_KERNEL, 0, "");
  if (!st || cl_set_operand_bufs(L, st)) return IR_EINPUT;
  const Type *x = &op->operands[0]->type, *y = &op->results[0]->type;
  int n = 0;
  switch (kind) {
  case OP_SHARD_SLICE:
  case OP_SHARD_PAD: {
    bool slice = kind == OP_SHARD_SLICE;
    const Type *piece = slice ? y : x;
    int dim = (int)op_int(op, "dim");
    int64_t axis;
    if (axis_of(L, "axis", &axis)) return IR_EINPUT;
    if (cl_st_size(st->bufs[0].storage) != cl_st_size(st->bufs[1].storage))
      return cl_fail(L, "x and y of different element sizes");
    INT(axis);
    INT(op_int(op, "n"));
    INT(op_int(op, "parts"));
    INT(cl_prod_dims(piece, 0, dim));
    INT(piece->dims[dim]);
    INT(cl_prod_dims(piece, dim + 1, piece->rank));
    INT(0);   /* the coordinate */
    coord_at(st, 6, axis);
    cl_launch_ew(st, type_numel(y));
    char name[64], call[96];
    int size = cl_st_size(st->bufs[0].storage);
    snprintf(name, sizeof name, "loom_shard_%s_%d", slice ? "slice" : "pad", size);
    snprintf(call, sizeof call, "loom_shard_move<loom_sraw%d, %s>", size, slice ? "true" : "false");
    st->which = cl_builtin_symbol(L, name, 1024, call);
    return st->which < 0 ? IR_EINPUT : 0;
  }
  case OP_TARGET_PICK:
  case OP_ONEHOT: {
    bool pick = kind == OP_TARGET_PICK;
    const Type *wide = pick ? x : y;
    int64_t V = wide->rank ? wide->dims[wide->rank - 1] : 1, axis1 = 0;
    const Attr *a = op_attr(op, "vocab_axis");
    if (a && a->s && a->s[0] && axis_of(L, "vocab_axis", &axis1)) return IR_EINPUT;
    if (a && a->s && a->s[0]) axis1++;
    if (st->bufs[pick ? 1 : 0].storage != RT_ST_I32) return cl_fail(L, "targets must be i32");
    INT(V ? type_numel(wide) / V : 0);
    INT(V);
    INT(axis1);
    INT(0);   /* the coordinate */
    if (axis1) coord_at(st, 3, axis1 - 1);
    cl_launch_ew(st, pick ? st->i[0] : type_numel(y));
    if (pick) return cl_instantiate(L, st, "target_pick", "loom_target_pick", (const int[]){0, 2, -1}, NULL, "", 1024);
    return cl_instantiate(L, st, "onehot", "loom_onehot", (const int[]){1, -1}, NULL, "", 1024);
  }
  default: return cl_fail(L, "internal: not an op of a partitioned program");
  }
#undef INT
}
