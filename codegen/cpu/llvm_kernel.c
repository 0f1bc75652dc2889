/* codegen/cpu/llvm_kernel.c — a `kernel func` becomes one LLVM function (docs/lowering.md).
 *
 * The iteration space (llvm_space.c).  A kernel computes N elements (its largest value).
 * Shapes that index the space differently — a broadcast's result, an iota, a reduction's
 * operand — each cut the flat index range [0, N) at their "boundaries": the suffix products
 * of their dims (only where the broadcast or reduced status changes).  The space is the
 * common refinement: the sorted union of the boundaries of every shape that fits (each
 * boundary divides the next), one loop dimension between two boundaries.  In that space every
 * coordinate a kernel needs is a linear combination of loop variables, so a broadcast
 * operand is read with stride 0 or 1 in the innermost loop and the loop vectorizer can
 * widen it.  A shape that does not fit (say [6,4] next to [4,6]) is still correct: its
 * coordinates are computed from the flat index with udiv/urem by constants.
 *
 * The loop nest, for a chunk [begin, end) of the parallel extent (cpu.h): the parallel
 * dims are those every reduction keeps (all dims without reductions).  The chunk walks
 * the flat index of the parallel dims: an outer loop over the parallel dims but the last
 * one (coordinates by udiv/urem by constants, once per row), then loops over all other
 * dims in memory order, the last parallel dim running over the chunk's part of its row.
 * Kernels with reductions run three nests: set the chunk's reduction outputs to 0 / -inf,
 * accumulate, finish (mean: divide by the count; narrow dtypes: round).  A reduction
 * whose reduced dims are innermost accumulates in a register (a phi) across the innermost
 * loop: its `fadd` carries `reassoc` — the only fast-math flag emitted, so that the loop
 * vectorizer may reorder the sum (results differ from the sequential sum in the last
 * bits).  A reduction over outer dims accumulates in its output buffer, innermost loop
 * over kept elements: no reordering, vectorized like an elementwise loop.
 *
 * Arithmetic is that of ir/interp_ops.c, operation for operation (no contraction into
 * FMAs): floats in f32, integers in i64 (stored as i32), bools as 0/1, except exp and tanh:
 * log and pow use the llvm intrinsics (libm calls once lowered), exp and tanh (and sigmoid,
 * silu, gelu built on them) are loom's own vectorizable formulas (llvm_module.c), within
 * 2 ulp of the exact function where the reference executor calls libm.
 * Narrow float dtypes are f32 values rounded after every op: bf16 by round-to-nearest-even
 * on the bit pattern, f16 and f8 as ir/types.c rounds them.
 *
 * Values are evaluated at the current point (memoized per point), all of them before any
 * result is stored.  Each kernel is an entry point `@name(i8** args, i64 begin, i64 end)`
 * that loads the buffer addresses and calls `@name.body`, whose buffer parameters are
 * `noalias` (the O2 pipeline inlines it; the noalias scopes stay).  Where a call writes a
 * result over an argument (the memory plan reuses dying inputs) the buffers are not
 * distinct, so the kernel also gets a body per such pattern, `@name.body.inplaceN`, in
 * which the shared buffers are one pointer; the entry point compares the addresses and
 * calls the body that matches (no runtime alias checks, still vectorized).
 *
 * The IR is written as text (LLVM 14's C API cannot set fast-math flags on an
 * instruction) and checked by parsing and verifying it with the C API.
 */
#include "codegen/cpu/llvm_internal.h"

/* ---------------------------------------------------------------- emission helpers */

static Name tmp(KernelGen *k) { return name_f("%%t%d", k->tmp++); }

/* Emits "%tN = <instruction>" and returns %tN. */
static Name ins(KernelGen *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static Name ins(KernelGen *k, const char *fmt, ...) {
  Name n = tmp(k);
  str_add(k->o, "  %s = ", n.s);
  va_list ap;
  va_start(ap, fmt);
  str_vadd(k->o, fmt, ap);
  va_end(ap);
  str_add(k->o, "\n");
  return n;
}

static void line(KernelGen *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(KernelGen *k, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  str_vadd(k->o, fmt, ap);
  va_end(ap);
  str_add(k->o, "\n");
}

static void block(KernelGen *k, const char *label) {
  line(k, "%s:", label);
  snprintf(k->block, sizeof k->block, "%s", label);
}

/* i64 arithmetic that folds constants (indices are non-negative and below 2^48). */
static Name imul(KernelGen *k, Name a, int64_t c) {
  if (is_zero(a) || c == 0) return iconst(0);
  if (c == 1) return a;
  if (a.s[0] != '%') return iconst(strtoll(a.s, NULL, 10) * c);
  return ins(k, "mul nuw nsw i64 %s, %lld", a.s, (long long)c);
}
static Name iadd(KernelGen *k, Name a, Name b) {
  if (is_zero(a)) return b;
  if (is_zero(b)) return a;
  if (a.s[0] != '%' && b.s[0] != '%') return iconst(strtoll(a.s, NULL, 10) + strtoll(b.s, NULL, 10));
  return ins(k, "add nuw nsw i64 %s, %s", a.s, b.s);
}
static Name iudiv(KernelGen *k, Name a, int64_t c) {
  if (c == 1 || is_zero(a)) return a;
  return ins(k, "udiv i64 %s, %lld", a.s, (long long)c);
}
static Name iurem(KernelGen *k, Name a, int64_t c) {
  if (c == 1) return iconst(0);
  return ins(k, "urem i64 %s, %lld", a.s, (long long)c);
}

/* (flat / lo) % (hi / lo) at the current point: linear in the loop variables when lo and
   hi are boundaries of the space, else by division of the flat index. */
static Name coord_range(KernelGen *k, int64_t lo, int64_t hi) {
  if (lo >= hi) return iconst(0);
  if (cpu_space_is_boundary(k, lo) && cpu_space_is_boundary(k, hi)) {
    Name s = iconst(0);
    for (int j = 0; j < k->nd; j++)
      if (k->P[j] >= lo && k->P[j] < hi) s = iadd(k, s, imul(k, k->coord[j], k->P[j] / lo));
    return s;
  }
  if (!k->flat.s[0]) {   /* only the accumulating nest has a flat index */
    kfail(k, NULL, "internal error: coordinate without a flat index");
    return iconst(0);
  }
  Name q = iudiv(k, k->flat, lo);
  return hi == k->N ? q : iurem(k, q, hi / lo);
}

/* ---------------------------------------------------------------- positions */

/* Where a value is evaluated: the current point of the space (values of N elements), or
   coordinates / a flat index in the value's own shape (values feeding broadcasts). */
typedef struct {
  const Type *t;
  bool space;
  Name flat;
  Name coord[IR_MAX_RANK];
  bool have_flat, have_coord[IR_MAX_RANK];
} Pos;

static Pos space_pos(KernelGen *k, const Type *t) {
  Pos p;
  memset(&p, 0, sizeof p);
  p.t = t;
  p.space = true;
  p.flat = k->flat;
  p.have_flat = true;
  return p;
}

static Name pos_flat(KernelGen *k, Pos *p) {
  if (p->have_flat) return p->flat;
  Name s = iconst(0);
  for (int e = 0; e < p->t->rank; e++) {
    if (!p->have_coord[e]) {
      kfail(k, NULL, "internal error: position without coordinates");
      return iconst(0);
    }
    s = iadd(k, s, imul(k, p->coord[e], prod(p->t, e + 1, p->t->rank)));
  }
  p->flat = s;
  p->have_flat = true;
  return s;
}

static Name pos_coord(KernelGen *k, Pos *p, int e) {
  if (p->have_coord[e]) return p->coord[e];
  int64_t lo = prod(p->t, e + 1, p->t->rank), hi = lo * p->t->dims[e];
  Name c;
  if (p->t->dims[e] == 1) c = iconst(0);
  else if (p->space) c = coord_range(k, lo, hi);
  else {
    Name q = iudiv(k, pos_flat(k, p), lo);
    c = e == 0 ? q : iurem(k, q, p->t->dims[e]);
  }
  p->coord[e] = c;
  p->have_coord[e] = true;
  return c;
}

/* ---------------------------------------------------------------- values */

static const char *round_fn(DType dt) {
  switch (dt) {
  case DT_BF16: return "loom_round_bf16";
  case DT_F16: return "loom_round_f16";
  case DT_F8E4M3: return "loom_round_f8e4m3";
  case DT_F8E5M2: return "loom_round_f8e5m2";
  default: return NULL;
  }
}

/* A float value as stored in dtype dt. */
static Name round_to(KernelGen *k, DType dt, Name x) {
  const char *fn = round_fn(dt);
  if (!fn) return x;
  return ins(k, "call float @%s(float %s)", fn, x.s);
}

static Name fcall1(KernelGen *k, const char *fn, Name x) { return ins(k, "call float @%s(float %s)", fn, x.s); }

static Name load_arg(KernelGen *k, const Value *v, Name idx) {
  const char *ty = is_float_t(&v->type) ? "float" : "i32";
  Name p = ins(k, "getelementptr inbounds %s, %s* %s, i64 %s", ty, ty, k->buf[v->index].s, idx.s);
  Name x = ins(k, "load %s, %s* %s, align 4", ty, ty, p.s);
  if (is_float_t(&v->type)) return x;
  return ins(k, "sext i32 %s to i64", x.s);
}

static Name eval(KernelGen *k, const Value *v, Pos *p);

static Name eval_elementwise(KernelGen *k, const Op *op, Pos *p) {
  bool fl = is_float_t(&op->results[0]->type);
  Name a = eval(k, op->operands[0], p);
  Name b = op->n_operands == 2 ? eval(k, op->operands[1], p) : a;
  Name c;
  switch (op->kind) {
  case OP_NEG: return fl ? ins(k, "fneg float %s", a.s) : ins(k, "sub i64 0, %s", a.s);
  case OP_EXP: return fcall1(k, "loom_exp", a);
  case OP_LOG: return fcall1(k, "llvm.log.f32", a);
  case OP_SQRT: return fcall1(k, "llvm.sqrt.f32", a);
  case OP_RSQRT: return ins(k, "fdiv float %s, %s", fconst(1).s, fcall1(k, "llvm.sqrt.f32", a).s);
  case OP_RECIP: return ins(k, "fdiv float %s, %s", fconst(1).s, a.s);
  case OP_TANH: return fcall1(k, "loom_tanh", a);
  case OP_SIGMOID: return fcall1(k, "loom_sigmoid", a);
  case OP_GELU_TANH: return fcall1(k, "loom_gelu_tanh", a);
  case OP_SILU: return fcall1(k, "loom_silu", a);
  case OP_RELU:
    if (fl) {
      c = ins(k, "fcmp ogt float %s, 0.0", a.s);
      return ins(k, "select i1 %s, float %s, float 0.0", c.s, a.s);
    }
    c = ins(k, "icmp sgt i64 %s, 0", a.s);
    return ins(k, "select i1 %s, i64 %s, i64 0", c.s, a.s);
  case OP_ABS:
    if (fl) return fcall1(k, "llvm.fabs.f32", a);
    c = ins(k, "icmp slt i64 %s, 0", a.s);
    return ins(k, "select i1 %s, i64 %s, i64 %s", c.s, ins(k, "sub i64 0, %s", a.s).s, a.s);
  case OP_SQUARE: return fl ? ins(k, "fmul float %s, %s", a.s, a.s) : ins(k, "mul i64 %s, %s", a.s, a.s);
  case OP_SCALE: return ins(k, "fmul float %s, %s", a.s, fconst((float)op_float(op, "by")).s);
  case OP_ADD_SCALAR: return ins(k, "fadd float %s, %s", a.s, fconst((float)op_float(op, "value")).s);
  case OP_SIGN:
    if (fl) {
      Name gt = ins(k, "fcmp ogt float %s, 0.0", a.s), lt = ins(k, "fcmp olt float %s, 0.0", a.s);
      Name neg = ins(k, "select i1 %s, float %s, float 0.0", lt.s, fconst(-1).s);
      return ins(k, "select i1 %s, float %s, float %s", gt.s, fconst(1).s, neg.s);
    } else {
      Name gt = ins(k, "icmp sgt i64 %s, 0", a.s), lt = ins(k, "icmp slt i64 %s, 0", a.s);
      Name neg = ins(k, "select i1 %s, i64 -1, i64 0", lt.s);
      return ins(k, "select i1 %s, i64 1, i64 %s", gt.s, neg.s);
    }
  case OP_ADD: return ins(k, fl ? "fadd float %s, %s" : "add i64 %s, %s", a.s, b.s);
  case OP_SUB: return ins(k, fl ? "fsub float %s, %s" : "sub i64 %s, %s", a.s, b.s);
  case OP_MUL: return ins(k, fl ? "fmul float %s, %s" : "mul i64 %s, %s", a.s, b.s);
  case OP_DIV:
    if (fl) return ins(k, "fdiv float %s, %s", a.s, b.s);
    else {
      /* b ? a / b : 0, and no trap on INT64_MIN / -1 */
      Name z = ins(k, "icmp eq i64 %s, 0", b.s), m1 = ins(k, "icmp eq i64 %s, -1", b.s);
      Name bad = ins(k, "or i1 %s, %s", z.s, m1.s);
      Name d = ins(k, "select i1 %s, i64 1, i64 %s", bad.s, b.s);
      Name q = ins(k, "sdiv i64 %s, %s", a.s, d.s);
      Name q2 = ins(k, "select i1 %s, i64 %s, i64 %s", m1.s, ins(k, "sub i64 0, %s", a.s).s, q.s);
      return ins(k, "select i1 %s, i64 0, i64 %s", z.s, q2.s);
    }
  case OP_MAX:
  case OP_MIN: {
    bool mx = op->kind == OP_MAX;
    c = fl ? ins(k, "fcmp %s float %s, %s", mx ? "ogt" : "olt", a.s, b.s)
           : ins(k, "icmp %s i64 %s, %s", mx ? "sgt" : "slt", a.s, b.s);
    return ins(k, "select i1 %s, %s %s, %s %s", c.s, fl ? "float" : "i64", a.s, fl ? "float" : "i64", b.s);
  }
  case OP_POW: return ins(k, "call float @llvm.pow.f32(float %s, float %s)", a.s, b.s);
  case OP_GELU_TANH_GRAD:
    return ins(k, "call float @loom_gelu_tanh_grad(float %s, float %s)", a.s, b.s);
  case OP_SILU_GRAD: return ins(k, "call float @loom_silu_grad(float %s, float %s)", a.s, b.s);
  case OP_RELU_GRAD:
    if (fl) {
      c = ins(k, "fcmp ogt float %s, 0.0", a.s);
      return ins(k, "select i1 %s, float %s, float 0.0", c.s, b.s);
    }
    c = ins(k, "icmp sgt i64 %s, 0", a.s);
    return ins(k, "select i1 %s, i64 %s, i64 0", c.s, b.s);
  case OP_EQ:
  case OP_GE: {
    bool in_fl = is_float_t(&op->operands[0]->type), eq = op->kind == OP_EQ;
    c = in_fl ? ins(k, "fcmp %s float %s, %s", eq ? "oeq" : "oge", a.s, b.s)
              : ins(k, "icmp %s i64 %s, %s", eq ? "eq" : "sge", a.s, b.s);
    return ins(k, "zext i1 %s to i64", c.s);
  }
  case OP_WHERE: {
    Name x = eval(k, op->operands[1], p), y = eval(k, op->operands[2], p);
    c = ins(k, "icmp ne i64 %s, 0", a.s);
    return ins(k, "select i1 %s, %s %s, %s %s", c.s, fl ? "float" : "i64", x.s, fl ? "float" : "i64", y.s);
  }
  default: break;
  }
  kfail(k, op, "has no CPU kernel code");
  return iconst(0);
}

static Name eval_cast(KernelGen *k, const Op *op, Pos *p) {
  const Type *from = &op->operands[0]->type, *to = &op->results[0]->type;
  Name x = eval(k, op->operands[0], p);
  if (is_float_t(from) && is_float_t(to)) return x;
  if (!is_float_t(from) && is_float_t(to)) return ins(k, "sitofp i64 %s to float", x.s);
  if (to->dtype == DT_BOOL) {
    Name c = is_float_t(from) ? ins(k, "fcmp une float %s, 0.0", x.s) : ins(k, "icmp ne i64 %s, 0", x.s);
    return ins(k, "zext i1 %s to i64", c.s);
  }
  if (is_float_t(from)) return ins(k, "fptosi float %s to i64", x.s);
  return x;
}

/* Broadcast of a kernel argument to the whole space: its offset is a sum of linear runs. */
static Name eval_broadcast_arg(KernelGen *k, const Op *op) {
  const Type *t = &op->results[0]->type;
  const Value *x = op->operands[0];
  int off = t->rank - x->type.rank;
  bool bc[IR_MAX_RANK];
  for (int d = 0; d < t->rank; d++) bc[d] = d < off || x->type.dims[d - off] == 1;
  Run runs[IR_MAX_RANK];
  int nr = runs_of(t, bc, runs);
  Name idx = iconst(0);
  for (int j = 0; j < nr; j++)
    if (!runs[j].flag) {
      int64_t xstride = prod(&x->type, runs[j].last - off + 1, x->type.rank);
      idx = iadd(k, idx, imul(k, coord_range(k, runs[j].lo, runs[j].hi), xstride));
    }
  return load_arg(k, x, idx);
}

static Name eval(KernelGen *k, const Value *v, Pos *p) {
  if (k->rc) return iconst(0);
  bool memo = p->space && v->id >= 0 && v->id < k->n_ids;
  if (memo && k->memo[v->id].s[0]) return k->memo[v->id];
  Name r;
  if (v->kind == VAL_ARG) {
    r = load_arg(k, v, pos_flat(k, p));
  } else {
    const Op *op = v->def;
    const Type *t = &v->type;
    const OpInfo *info = op_info(op->kind);
    bool narrow = is_float_t(t) && t->dtype != DT_F32;
    if (info->cls == CLASS_ELEMENTWISE) {
      r = eval_elementwise(k, op, p);
      if (narrow) r = round_to(k, t->dtype, r);
    } else {
      const Value *x = op->n_operands ? op->operands[0] : NULL;
      switch (op->kind) {
      case OP_RESHAPE:
        if (p->space) {
          Pos q = space_pos(k, &x->type);
          r = eval(k, x, &q);
        } else {
          Pos q;
          memset(&q, 0, sizeof q);
          q.t = &x->type;
          q.flat = pos_flat(k, p);
          q.have_flat = true;
          r = eval(k, x, &q);
        }
        break;
      case OP_BROADCAST:
        if (p->space && x->kind == VAL_ARG) {
          r = eval_broadcast_arg(k, op);
        } else {
          Pos q;
          memset(&q, 0, sizeof q);
          q.t = &x->type;
          int off = t->rank - x->type.rank;
          for (int e = 0; e < x->type.rank; e++) {
            q.coord[e] = x->type.dims[e] == 1 ? iconst(0) : pos_coord(k, p, e + off);
            q.have_coord[e] = true;
          }
          r = eval(k, x, &q);
        }
        break;
      case OP_CONSTANT: {
        double c = op_float(op, "value");
        r = is_float_t(t) ? fconst(dtype_round(t->dtype, (float)c)) : iconst((int64_t)c);
        break;
      }
      case OP_IOTA: {
        Name c = pos_coord(k, p, (int)op_int(op, "dim"));
        r = c;
        if (is_float_t(t)) r = round_to(k, t->dtype, ins(k, "sitofp i64 %s to float", c.s));
        break;
      }
      case OP_CAST:
        r = eval_cast(k, op, p);
        if (narrow) r = round_to(k, t->dtype, r);
        break;
      default:
        kfail(k, op, "cannot be evaluated inside a kernel");
        return iconst(0);
      }
    }
  }
  if (memo) k->memo[v->id] = r;
  return r;
}

/* ---------------------------------------------------------------- loops */

/* Register accumulators carried by a loop. */
typedef struct {
  Red *r[IR_MAX_RESULTS];
  int n;
} Accs;

static Name emit_accum(KernelGen *k, const Red *r, Name acc, Name v, const char *result) {
  Name out = result ? name_f("%s", result) : tmp(k);
  if (r->is_float) {
    if (r->is_max) line(k, "  %s = call float @llvm.maxnum.f32(float %s, float %s)", out.s, acc.s, v.s);
    else line(k, "  %s = fadd reassoc float %s, %s", out.s, acc.s, v.s);
  } else if (r->is_max) {
    Name c = ins(k, "icmp sgt i64 %s, %s", acc.s, v.s);
    line(k, "  %s = select i1 %s, i64 %s, i64 %s", out.s, c.s, acc.s, v.s);
  } else {
    line(k, "  %s = add i64 %s, %s", out.s, acc.s, v.s);
  }
  return out;
}

/* Opens a loop i in [lo, hi) at the current block; returns its id; *iv is i. */
static int loop_open(KernelGen *k, Name lo, Name hi, Name *iv, Accs *accs) {
  int id = k->label++;
  char pre[NAME_LEN];
  snprintf(pre, sizeof pre, "%s", k->block);
  Name c = ins(k, "icmp slt i64 %s, %s", lo.s, hi.s);
  line(k, "  br i1 %s, label %%L%d.body, label %%L%d.exit", c.s, id, id);
  char body[NAME_LEN];
  snprintf(body, sizeof body, "L%d.body", id);
  block(k, body);
  *iv = name_f("%%i%d", id);
  line(k, "  %s = phi i64 [ %s, %%%s ], [ %%i%d.next, %%L%d.latch ]", iv->s, lo.s, pre, id, id);
  for (int a = 0; accs && a < accs->n; a++) {
    Red *r = accs->r[a];
    const char *ty = r->is_float ? "float" : "i64";
    r->acc = name_f("%%acc%d.%d", id, a);
    r->next = name_f("%%acc%d.%d.next", id, a);
    r->out = name_f("%%acc%d.%d.out", id, a);
    line(k, "  %s = phi %s [ %s, %%%s ], [ %s, %%L%d.latch ]", r->acc.s, ty, r->init.s, pre, r->next.s, id);
  }
  return id;
}

static void loop_close(KernelGen *k, int id, Name hi, const char *pre, Accs *accs) {
  line(k, "  br label %%L%d.latch", id);
  char latch[NAME_LEN];
  snprintf(latch, sizeof latch, "L%d.latch", id);
  block(k, latch);
  for (int a = 0; accs && a < accs->n; a++) emit_accum(k, accs->r[a], accs->r[a]->acc, accs->r[a]->val, accs->r[a]->next.s);
  line(k, "  %%i%d.next = add nuw nsw i64 %%i%d, 1", id, id);
  Name c = ins(k, "icmp slt i64 %%i%d.next, %s", id, hi.s);
  line(k, "  br i1 %s, label %%L%d.body, label %%L%d.exit", c.s, id, id);
  char exit_[NAME_LEN];
  snprintf(exit_, sizeof exit_, "L%d.exit", id);
  block(k, exit_);
  for (int a = 0; accs && a < accs->n; a++) {
    Red *r = accs->r[a];
    const char *ty = r->is_float ? "float" : "i64";
    line(k, "  %s = phi %s [ %s, %%%s ], [ %s, %%%s ]", r->out.s, ty, r->init.s, pre, r->next.s, latch);
  }
}

/* The output index of reduction r at the current point (its kept coordinates). */
static Name red_index(KernelGen *k, const Red *r) {
  Name idx = iconst(0);
  for (int q = 0; q < r->n_kept; q++)
    idx = iadd(k, idx, imul(k, coord_range(k, r->kept[q].lo, r->kept[q].hi), r->kept[q].ystride));
  return idx;
}

static Name out_ptr(KernelGen *k, int slot, bool fl, Name idx) {
  const char *ty = fl ? "float" : "i32";
  return ins(k, "getelementptr inbounds %s, %s* %s, i64 %s", ty, ty, k->buf[k->f->args.n + slot].s, idx.s);
}

static Name load_out(KernelGen *k, bool fl, Name ptr) {
  if (fl) return ins(k, "load float, float* %s, align 4", ptr.s);
  return ins(k, "sext i32 %s to i64", ins(k, "load i32, i32* %s, align 4", ptr.s).s);
}

static void store_out(KernelGen *k, bool fl, Name ptr, Name v) {
  if (fl) line(k, "  store float %s, float* %s, align 4", v.s, ptr.s);
  else line(k, "  store i32 %s, i32* %s, align 4", ins(k, "trunc i64 %s to i32", v.s).s, ptr.s);
}

typedef enum { NEST_INIT, NEST_MAIN, NEST_FINISH } NestKind;

static void nest_body(KernelGen *k, NestKind kind, Red *only) {
  if (kind == NEST_INIT || kind == NEST_FINISH) {
    Red *r = only;
    Name ptr = out_ptr(k, r->slot, r->is_float, red_index(k, r));
    if (kind == NEST_INIT) {
      Name init = r->is_float ? (r->is_max ? name_f("0xFFF0000000000000") : name_f("0.0"))
                              : (r->is_max ? iconst(INT32_MIN) : iconst(0));
      store_out(k, r->is_float, ptr, init);
    } else {
      Name v = load_out(k, r->is_float, ptr);
      if (r->is_mean) v = ins(k, "fdiv float %s, %s", v.s, fconst((float)r->count).s);
      if (r->is_float) v = round_to(k, r->dt, v);
      store_out(k, r->is_float, ptr, v);
    }
    return;
  }
  /* the accumulating nest: every point of the space once */
  Name flat = iconst(0);
  for (int j = 0; j < k->nd; j++) flat = iadd(k, flat, imul(k, k->coord[j], k->P[j]));
  k->flat = flat;
  for (int i = 0; i < k->n_ids; i++) k->memo[i].s[0] = 0;
  /* Every value first, then the stores: a result written in place over an argument
     (the same pointer, see emit_body) must not be stored before the argument is read. */
  const Func *f = k->f;
  Name *vals = calloc((size_t)f->rets.n + (size_t)k->n_red + 1, sizeof(Name));
  if (!vals) {
    kfail(k, NULL, "out of memory");
    return;
  }
  for (int s = 0; s < f->rets.n; s++) {
    const Value *v = f->rets.items[s];
    if (is_reduction_result(v)) continue;
    Pos p = space_pos(k, &v->type);
    vals[s] = eval(k, v, &p);
  }
  for (int i = 0; i < k->n_red; i++) {
    const Value *x = k->red[i].op->operands[0];
    Pos p = space_pos(k, &x->type);
    vals[f->rets.n + i] = eval(k, x, &p);
  }
  for (int s = 0; s < f->rets.n; s++) {
    const Value *v = f->rets.items[s];
    if (!is_reduction_result(v)) store_out(k, is_float_t(&v->type), out_ptr(k, s, is_float_t(&v->type), flat), vals[s]);
  }
  for (int i = 0; i < k->n_red; i++) {
    Red *r = &k->red[i];
    Name v = vals[f->rets.n + i];
    if (r->in_register) {
      r->val = v;
    } else {
      Name ptr = out_ptr(k, r->slot, r->is_float, red_index(k, r));
      store_out(k, r->is_float, ptr, emit_accum(k, r, load_out(k, r->is_float, ptr), v, NULL));
    }
  }
  free(vals);
}

/* One loop nest over the dims in `loop` (the others at coordinate 0), restricted to the
   chunk [begin, end) of the parallel dims. */
static void emit_nest(KernelGen *k, const bool *loop, NestKind kind, Red *only) {
  int L = -1;
  for (int j = 0; j < k->nd; j++)
    if (k->par[j]) L = j;
  int ids[SPACE_MAX + 2], n_open = 0;
  Name his[SPACE_MAX + 2];
  char pres[SPACE_MAX + 2][NAME_LEN];
  Accs accs_none = {.n = 0};
  Name lo = iconst(0), hi = iconst(0);
  int guard = -1;
  for (int j = 0; j < k->nd; j++) k->coord[j] = iconst(0);
  k->flat.s[0] = 0;
  if (L < 0) {
    /* no parallel dims: the whole nest runs in the chunk that holds index 0 */
    guard = k->label++;
    Name c = ins(k, "icmp slt i64 %%begin, %%end");
    Name z = ins(k, "icmp eq i64 %%begin, 0");
    Name g = ins(k, "and i1 %s, %s", c.s, z.s);
    line(k, "  br i1 %s, label %%G%d.body, label %%G%d.exit", g.s, guard, guard);
    char b[NAME_LEN];
    snprintf(b, sizeof b, "G%d.body", guard);
    block(k, b);
  } else {
    bool outer = false;
    for (int j = 0; j < L; j++)
      if (k->par[j]) outer = true;
    int64_t sL = k->size[L];
    if (!outer) {
      lo = name_f("%%begin");
      hi = name_f("%%end");
    } else {
      /* rows of the last parallel dim */
      Name qb = iudiv(k, name_f("%%begin"), sL);
      Name qe = iudiv(k, ins(k, "add i64 %%end, %lld", (long long)(sL - 1)), sL);
      snprintf(pres[n_open], NAME_LEN, "%s", k->block);
      Name q;
      ids[n_open] = loop_open(k, qb, qe, &q, &accs_none);
      his[n_open++] = qe;
      Name base = imul(k, q, sL);
      Name l0 = ins(k, "sub i64 %%begin, %s", base.s);
      Name lneg = ins(k, "icmp slt i64 %s, 0", l0.s);
      lo = ins(k, "select i1 %s, i64 0, i64 %s", lneg.s, l0.s);
      Name h0 = ins(k, "sub i64 %%end, %s", base.s);
      Name hbig = ins(k, "icmp sgt i64 %s, %lld", h0.s, (long long)sL);
      hi = ins(k, "select i1 %s, i64 %lld, i64 %s", hbig.s, (long long)sL, h0.s);
      Name rest = q;
      for (int j = L - 1; j >= 0; j--)
        if (k->par[j]) {
          bool first = true;
          for (int i = 0; i < j; i++)
            if (k->par[i]) first = false;
          k->coord[j] = first ? rest : iurem(k, rest, k->size[j]);
          if (!first) rest = iudiv(k, rest, k->size[j]);
        }
    }
  }
  int last = -1;
  for (int j = 0; j < k->nd; j++)
    if (loop[j] && !(k->par[j] && j != L)) last = j;
  for (int j = 0; j < k->nd; j++) {
    if (!loop[j] || (k->par[j] && j != L)) continue;
    Name jlo = j == L ? lo : iconst(0), jhi = j == L ? hi : iconst(k->size[j]);
    Accs accs = {.n = 0};
    if (j == last && kind == NEST_MAIN) {
      /* register accumulators: the output index does not depend on this loop */
      for (int i = 0; i < k->n_red; i++) {
        Red *r = &k->red[i];
        if (!r->in_register) continue;
        r->ptr = out_ptr(k, r->slot, r->is_float, red_index(k, r));
        r->init = load_out(k, r->is_float, r->ptr);
        accs.r[accs.n++] = r;
      }
    }
    snprintf(pres[n_open], NAME_LEN, "%s", k->block);
    ids[n_open] = loop_open(k, jlo, jhi, &k->coord[j], &accs);
    his[n_open++] = jhi;
    if (j == last) {
      nest_body(k, kind, only);
      n_open--;
      loop_close(k, ids[n_open], his[n_open], pres[n_open], &accs);
      for (int a = 0; a < accs.n; a++) store_out(k, accs.r[a]->is_float, accs.r[a]->ptr, accs.r[a]->out);
    }
  }
  if (last < 0) nest_body(k, kind, only);   /* nothing to loop over: one point */
  while (n_open > 0) {
    n_open--;
    loop_close(k, ids[n_open], his[n_open], pres[n_open], &accs_none);
  }
  if (guard >= 0) {
    line(k, "  br label %%G%d.exit", guard);
    char b[NAME_LEN];
    snprintf(b, sizeof b, "G%d.exit", guard);
    block(k, b);
  }
}

/* A reduction whose runs do not fit the space (then nothing is parallel): its outputs
   one flat loop, in the chunk that holds index 0. */
static void emit_flat_outputs(KernelGen *k, NestKind kind, Red *r) {
  int guard = k->label++;
  Name c = ins(k, "icmp slt i64 %%begin, %%end");
  Name z = ins(k, "icmp eq i64 %%begin, 0");
  line(k, "  br i1 %s, label %%G%d.body, label %%G%d.exit", ins(k, "and i1 %s, %s", c.s, z.s).s, guard, guard);
  char b[NAME_LEN];
  snprintf(b, sizeof b, "G%d.body", guard);
  block(k, b);
  char pre[NAME_LEN];
  snprintf(pre, sizeof pre, "%s", k->block);
  Name i;
  Accs none = {.n = 0};
  int id = loop_open(k, iconst(0), iconst(r->out_n), &i, &none);
  Name ptr = out_ptr(k, r->slot, r->is_float, i);
  if (kind == NEST_INIT) {
    store_out(k, r->is_float, ptr, r->is_float ? (r->is_max ? name_f("0xFFF0000000000000") : name_f("0.0"))
                                               : (r->is_max ? iconst(INT32_MIN) : iconst(0)));
  } else {
    Name v = load_out(k, r->is_float, ptr);
    if (r->is_mean) v = ins(k, "fdiv float %s, %s", v.s, fconst((float)r->count).s);
    if (r->is_float) v = round_to(k, r->dt, v);
    store_out(k, r->is_float, ptr, v);
  }
  loop_close(k, id, iconst(r->out_n), pre, &none);
  line(k, "  br label %%G%d.exit", guard);
  snprintf(b, sizeof b, "G%d.exit", guard);
  block(k, b);
}

static bool needs_finish(const Red *r) { return r->is_mean || (r->is_float && round_fn(r->dt)); }

/* ---------------------------------------------------------------- functions */

static const char *buf_type(const KernelGen *k, int b) {
  const Func *f = k->f;
  const Value *v = b < f->args.n ? f->args.items[b] : f->rets.items[b - f->args.n];
  return is_float_t(&v->type) ? "float" : "i32";
}

static void buf_param_name(const KernelGen *k, int b, char *out, size_t n) {
  if (b < k->f->args.n) snprintf(out, n, "%%a%d", b);
  else snprintf(out, n, "%%r%d", b - k->f->args.n);
}

/* One body: the loop nests over noalias buffers; buffers aliased to an earlier one are
   not parameters but that buffer's pointer. */
static void emit_body(KernelGen *k, const int *alias, const char *body_name) {
  const Func *f = k->f;
  int nb = f->args.n + f->rets.n;
  Str *o = k->o;
  k->tmp = 0;
  k->label = 0;
  str_add(o, "define internal void @\"%s\"(", body_name);
  for (int b = 0; b < nb; b++) {
    if (alias && alias[b] != b) continue;
    char pn[NAME_LEN];
    buf_param_name(k, b, pn, sizeof pn);
    str_add(o, "%s* noalias %s, ", buf_type(k, b), pn);
  }
  str_add(o, "i64 %%begin, i64 %%end) #1 {\n");
  block(k, "entry");
  for (int b = 0; b < nb; b++) {
    int rep = alias ? alias[b] : b;
    char pn[NAME_LEN];
    buf_param_name(k, rep, pn, sizeof pn);
    if (strcmp(buf_type(k, b), buf_type(k, rep)))   /* an int32 result over an f32 argument, or so */
      k->buf[b] = ins(k, "bitcast %s* %s to %s*", buf_type(k, rep), pn, buf_type(k, b));
    else
      k->buf[b] = name_f("%s", pn);
  }
  bool mask[SPACE_MAX];
  for (int i = 0; i < k->n_red; i++) {
    Red *r = &k->red[i];
    if (!r->regular) {
      emit_flat_outputs(k, NEST_INIT, r);
      continue;
    }
    for (int j = 0; j < k->nd; j++) mask[j] = !r->reduced[j];
    emit_nest(k, mask, NEST_INIT, r);
  }
  for (int j = 0; j < k->nd; j++) mask[j] = true;
  emit_nest(k, mask, NEST_MAIN, NULL);
  for (int i = 0; i < k->n_red; i++) {
    Red *r = &k->red[i];
    if (!needs_finish(r)) continue;
    if (!r->regular) {
      emit_flat_outputs(k, NEST_FINISH, r);
      continue;
    }
    for (int j = 0; j < k->nd; j++) mask[j] = !r->reduced[j];
    emit_nest(k, mask, NEST_FINISH, r);
  }
  str_add(o, "  ret void\n}\n");
}

int cpu_emit_kernel(KernelGen *k, const Variant *variants, int n_variants) {
  const Func *f = k->f;
  if (!cpu_valid_symbol(f->name) || !strncmp(f->name, "loom_", 5) || !strncmp(f->name, "llvm.", 5) ||
      !strcmp(f->name, "tanhf"))
    return kfail(k, NULL, "the name cannot be a JIT symbol (at most 31 characters of [A-Za-z0-9_.-], not loom_*, "
                 "llvm.* or tanhf)");
  if (cpu_space_analyze(k)) return k->rc;
  int nb = f->args.n + f->rets.n;
  k->memo = calloc((size_t)(k->n_ids ? k->n_ids : 1), sizeof(Name));
  k->buf = calloc((size_t)nb + 1, sizeof(Name));
  if (!k->memo || !k->buf) return kfail(k, NULL, "out of memory");
  Str *o = k->o;
  /* the entry point: unpack args[], pick the body */
  str_add(o, "\n; kernel @%s: N = %lld, space [", f->name, (long long)k->N);
  for (int j = 0; j < k->nd; j++) str_add(o, "%s%lld%s", j ? "," : "", (long long)k->size[j], k->par[j] ? "p" : "");
  str_add(o, "] (p: parallel), parallel extent %lld; %d in-place variant%s\n", (long long)k->extent, n_variants,
          n_variants == 1 ? "" : "s");
  str_add(o, "define void @\"%s\"(i8** %%args, i64 %%begin, i64 %%end) #0 {\nentry:\n", f->name);
  for (int b = 0; b < nb; b++) {
    str_add(o, "  %%pp%d = getelementptr inbounds i8*, i8** %%args, i64 %d\n", b, b);
    str_add(o, "  %%p%d = load i8*, i8** %%pp%d, align 8\n", b, b);
    str_add(o, "  %%b%d = bitcast i8* %%p%d to %s*\n", b, b, buf_type(k, b));
  }
  for (int v = 0; v <= n_variants; v++) {
    const int *alias = v < n_variants ? variants[v].alias : NULL;
    if (alias) {   /* this body if its buffers coincide */
      str_add(o, "  %%same%d.0 = icmp eq i1 1, 1\n", v);
      int n = 0;
      for (int b = 0; b < nb; b++)
        if (alias[b] != b) {
          str_add(o, "  %%eq%d.%d = icmp eq i8* %%p%d, %%p%d\n", v, b, b, alias[b]);
          str_add(o, "  %%same%d.%d = and i1 %%same%d.%d, %%eq%d.%d\n", v, n + 1, v, n, v, b);
          n++;
        }
      str_add(o, "  br i1 %%same%d.%d, label %%v%d, label %%next%d\nv%d:\n", v, n, v, v, v);
    }
    str_add(o, "  call void @\"%s.body%s%.0d\"(", f->name, alias ? ".inplace" : "", alias ? v + 1 : 0);
    for (int b = 0; b < nb; b++)
      if (!alias || alias[b] == b) str_add(o, "%s* %%b%d, ", buf_type(k, b), b);
    str_add(o, "i64 %%begin, i64 %%end)\n  ret void\n");
    if (alias) str_add(o, "next%d:\n", v);
  }
  str_add(o, "}\n\n");
  /* the bodies */
  for (int v = 0; v <= n_variants && !k->rc; v++) {
    char name[NAME_LEN + 32];
    if (v < n_variants) snprintf(name, sizeof name, "%s.body.inplace%d", f->name, v + 1);
    else snprintf(name, sizeof name, "%s.body", f->name);
    emit_body(k, v < n_variants ? variants[v].alias : NULL, name);
  }
  return k->rc;
}

bool cpu_valid_symbol(const char *s) {
  if (!*s || strlen(s) > 31) return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '.' ||
          *s == '-'))
      return false;
  return true;
}

