/* codegen/cuda/kernel.c — a fused `kernel func` (docs/lowering.md) becomes one CUDA kernel.
 *
 * The space.  Every value computed at "the point" has N elements and is evaluated at the
 * flat row-major index i of the point; a value under a broadcast is evaluated at the index
 * the broadcast maps i to (coordinates by division by constants); reshape is the identity
 * on i.  Values are locals of the loop body, each computed once per point (memoized),
 * loaded from the kernel's buffers in their storage dtype and stored in the results'.
 *
 * Walks (CudaKernelMode):
 *   ELEMENTWISE  no reductions: a grid-stride loop over i, 256 threads a block.
 *   SERIAL       reductions of at most 32 elements: one thread per reduction output o,
 *                a sequential loop over the reduced index j.
 *   ROW          the innermost dims are reduced: one block per output (grid-stride over o),
 *                the block's threads stride over j; a block reduction (shuffles in a fixed
 *                tree, then warps in order).
 *   COLUMN       the innermost dims are kept: a block of 32 x BY threads covers 32
 *                consecutive outputs (coalesced), threadIdx.y strides over j, and row y = 0
 *                adds the BY partial results in order.
 * Every order is fixed by the launch shape, so a kernel gives the same bits on every run.
 * In the reduction walks the point of (o, j) is i = sum of o's and j's coordinates times
 * their strides in the reduction operand's shape; elementwise results of the same kernel
 * are stored at that i (each i is visited once).  All reductions of one kernel reduce the
 * same dims of the same shape (the fuse pass groups them so).
 *
 * Arithmetic is that of ir/interp_ops.c, operation for operation: floats in f32 with the
 * _rn intrinsics (no FMA contraction), integers in 64 bits, narrow float dtypes rounded after
 * every op; reductions accumulate in f32 (or 64-bit integers) and round when stored.
 */
#include "codegen/cuda/cuda_internal.h"

/* ---------------------------------------------------------------- text */

void cuda_float_literal(float f, char *buf, size_t n) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) {   /* inf or NaN */
    snprintf(buf, n, "__int_as_float(0x%08x)", u);
    return;
  }
  char s[64];
  snprintf(s, sizeof s, "%.9g", (double)f);
  float back = strtof(s, NULL);
  uint32_t ub;
  memcpy(&ub, &back, 4);
  if (ub != u) {
    snprintf(buf, n, "__int_as_float(0x%08x)", u);
    return;
  }
  bool dot = strpbrk(s, ".e") != NULL;
  snprintf(buf, n, "%s%sf", s, dot ? "" : ".0");
}

/* ---------------------------------------------------------------- generator state */

#define NAME_LEN 64
#define MAX_COORDS 128

typedef struct {
  char s[NAME_LEN];
} Name;

static Name name_f(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static Name name_f(const char *fmt, ...) {
  Name n;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(n.s, sizeof n.s, fmt, ap);
  va_end(ap);
  return n;
}

/* Where a value is evaluated: the point (flat index "i" of the space, memoized) or a flat
   index in the value's own shape (a variable name). */
typedef struct {
  bool space;
  Name flat;
} Pos;

typedef struct {
  const Func *f;
  Str *o;                  /* the point body being written */
  int64_t N;
  int n_ids;
  Name *memo;               /* per value id: its local at the point ("" = not yet) */
  int tmp;
  struct {
    int64_t lo, hi;
    Name name;
  } coords[MAX_COORDS];
  int n_coords;
  bool used_shape;          /* the body needs the space's shape (constants, not i[0]) */
  int vec;                  /* elementwise, 4 points per thread: args read at the point and results
                               move as loom_v4 (0: one point per thread) */
  bool vload[RT_MAX_BUFS];  /* with vec: argument b is read at the point (a loom_v4 load) */
  const char *indent;
  char *err;
  size_t errlen;
  int rc;
} KG;

static int kfail(KG *k, const Op *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int kfail(KG *k, const Op *op, const char *fmt, ...) {
  if (k->rc) return k->rc;
  char msg[1024], text[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (op)
    snprintf(k->err, k->errlen, "kernel @%s: op '%s' (%s): %s", k->f->name, op_info(op->kind)->name,
             op_to_string(op, text, sizeof text), msg);
  else
    snprintf(k->err, k->errlen, "kernel @%s: %s", k->f->name, msg);
  k->rc = IR_EINPUT;
  return k->rc;
}

static void line(KG *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(KG *k, const char *fmt, ...) {
  str_add(k->o, "%s", k->indent);
  va_list ap;
  va_start(ap, fmt);
  str_vadd(k->o, fmt, ap);
  va_end(ap);
  str_add(k->o, "\n");
}

static int64_t prod(const Type *t, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= t->dims[d];
  return p;
}

static bool is_float_t(const Type *t) { return dtype_is_float(t->dtype); }

static bool is_reduction_result(const Value *v) {
  return v->kind == VAL_RESULT && op_info(v->def->kind)->cls == CLASS_REDUCTION;
}

/* C pointer element type and load/store of a buffer of dtype dt; NULL if unsupported. */
static const char *elem_type(DType dt) {
  switch (dt) {
  case DT_F32: return "float";
  case DT_BF16:
  case DT_F16: return "unsigned short";
  case DT_F8E4M3:
  case DT_F8E5M2: return "unsigned char";
  case DT_I32: return "int";
  case DT_BOOL: return "unsigned char";
  default: return NULL;
  }
}

static const char *load_fn(DType dt) {
  switch (dt) {
  case DT_BF16: return "loom_bf16_to_f32";
  case DT_F16: return "loom_f16_to_f32";
  case DT_F8E4M3: return "loom_f8e4m3_to_f32";
  case DT_F8E5M2: return "loom_f8e5m2_to_f32";
  case DT_I32:
  case DT_BOOL: return "(long long)";
  default: return "";
  }
}

static const char *store_fn(DType dt) {
  switch (dt) {
  case DT_BF16: return "loom_f32_to_bf16";
  case DT_F16: return "loom_f32_to_f16";
  case DT_F8E4M3: return "loom_f32_to_f8e4m3";
  case DT_F8E5M2: return "loom_f32_to_f8e5m2";
  case DT_I32: return "(int)";
  case DT_BOOL: return "(unsigned char)";
  default: return "";
  }
}

static const char *round_fn(DType dt) {
  switch (dt) {
  case DT_BF16: return "loom_round_bf16";
  case DT_F16: return "loom_round_f16";
  case DT_F8E4M3: return "loom_round_f8e4m3";
  case DT_F8E5M2: return "loom_round_f8e5m2";
  default: return NULL;
  }
}

static const char *ctype(const Type *t) { return is_float_t(t) ? "float" : "long long"; }

static Name flit(float f) {
  Name n;
  cuda_float_literal(f, n.s, sizeof n.s);
  return n;
}

/* Declares a local holding expr; returns its name. */
static Name local(KG *k, const char *type, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static Name local(KG *k, const char *type, const char *prefix, const char *fmt, ...) {
  Name n = name_f("%s%d", prefix, k->tmp++);
  str_add(k->o, "%sconst %s %s = ", k->indent, type, n.s);
  va_list ap;
  va_start(ap, fmt);
  str_vadd(k->o, fmt, ap);
  va_end(ap);
  str_add(k->o, ";\n");
  return n;
}

/* ---------------------------------------------------------------- coordinates */

/* (i / lo) % (hi / lo) at the point. */
static Name space_coord(KG *k, int64_t lo, int64_t hi) {
  if (lo >= hi) return name_f("0u");
  for (int c = 0; c < k->n_coords; c++)
    if (k->coords[c].lo == lo && k->coords[c].hi == hi) return k->coords[c].name;
  k->used_shape = true;
  Name n;
  if (lo == 1 && hi >= k->N) return name_f("i");
  if (hi >= k->N) n = local(k, "I", "c", "i / %lldu", (long long)lo);
  else if (lo == 1) n = local(k, "I", "c", "i %% %lldu", (long long)hi);
  else n = local(k, "I", "c", "(i / %lldu) %% %lldu", (long long)lo, (long long)(hi / lo));
  if (k->n_coords < MAX_COORDS) {
    k->coords[k->n_coords].lo = lo;
    k->coords[k->n_coords].hi = hi;
    k->coords[k->n_coords++].name = n;
  }
  return n;
}

/* Coordinate e of a value of type t at p. */
static Name coord(KG *k, const Pos *p, const Type *t, int e) {
  if (t->dims[e] == 1) return name_f("0u");
  int64_t lo = prod(t, e + 1, t->rank), hi = lo * t->dims[e];
  if (p->space) return space_coord(k, lo, hi);
  k->used_shape = true;
  if (hi >= type_numel(t) && lo == 1) return p->flat;
  if (hi >= type_numel(t)) return local(k, "I", "c", "%s / %lldu", p->flat.s, (long long)lo);
  if (lo == 1) return local(k, "I", "c", "%s %% %lldu", p->flat.s, (long long)hi);
  return local(k, "I", "c", "(%s / %lldu) %% %lldu", p->flat.s, (long long)lo, (long long)t->dims[e]);
}

/* ---------------------------------------------------------------- values */

static Name eval(KG *k, const Value *v, const Pos *p);

static Name rounded(KG *k, const Type *t, const char *expr) {
  const char *fn = is_float_t(t) ? round_fn(t->dtype) : NULL;
  if (fn) return local(k, "float", "v", "%s(%s)", fn, expr);
  return local(k, ctype(t), "v", "%s", expr);
}

/* Wrapping 64-bit integer arithmetic (the reference's int64_t without undefined overflow). */
#define UADD(a, b, op) "(long long)((unsigned long long)%s " op " (unsigned long long)%s)"

static Name eval_elementwise(KG *k, const Op *op, const Pos *p) {
  const Type *t = &op->results[0]->type;
  bool fl = is_float_t(t);
  Name a = eval(k, op->operands[0], p);
  Name b = op->n_operands >= 2 ? eval(k, op->operands[1], p) : a;
  char e[512];
  const char *A = a.s, *B = b.s;
  switch (op->kind) {
  case OP_NEG: snprintf(e, sizeof e, fl ? "-%s" : "loom_ineg(%s)", A); break;
  case OP_EXP: snprintf(e, sizeof e, "expf(%s)", A); break;
  case OP_LOG: snprintf(e, sizeof e, "logf(%s)", A); break;
  case OP_SQRT: snprintf(e, sizeof e, "sqrtf(%s)", A); break;
  case OP_RSQRT: snprintf(e, sizeof e, "__fdiv_rn(1.0f, sqrtf(%s))", A); break;
  case OP_RECIP: snprintf(e, sizeof e, "__fdiv_rn(1.0f, %s)", A); break;
  case OP_TANH: snprintf(e, sizeof e, "tanhf(%s)", A); break;
  case OP_SIGMOID: snprintf(e, sizeof e, "loom_sigmoid(%s)", A); break;
  case OP_GELU_TANH: snprintf(e, sizeof e, "loom_gelu_tanh(%s)", A); break;
  case OP_SILU: snprintf(e, sizeof e, "loom_silu(%s)", A); break;
  case OP_RELU: snprintf(e, sizeof e, fl ? "%s > 0.0f ? %s : 0.0f" : "%s > 0 ? %s : 0LL", A, A); break;
  case OP_ABS: snprintf(e, sizeof e, fl ? "fabsf(%s)" : "%s < 0 ? loom_ineg(%s) : %s", A, A, A); break;
  case OP_SQUARE: snprintf(e, sizeof e, fl ? "__fmul_rn(%s, %s)" : UADD("%s", "%s", "*"), A, A); break;
  case OP_SCALE: snprintf(e, sizeof e, "__fmul_rn(%s, %s)", A, flit((float)op_float(op, "by")).s); break;
  case OP_ADD_SCALAR: snprintf(e, sizeof e, "__fadd_rn(%s, %s)", A, flit((float)op_float(op, "value")).s); break;
  case OP_SIGN:
    snprintf(e, sizeof e, fl ? "(float)((%s > 0.0f) - (%s < 0.0f))" : "(long long)((%s > 0) - (%s < 0))", A, A);
    break;
  case OP_ADD: snprintf(e, sizeof e, fl ? "__fadd_rn(%s, %s)" : UADD("%s", "%s", "+"), A, B); break;
  case OP_SUB: snprintf(e, sizeof e, fl ? "__fsub_rn(%s, %s)" : UADD("%s", "%s", "-"), A, B); break;
  case OP_MUL: snprintf(e, sizeof e, fl ? "__fmul_rn(%s, %s)" : UADD("%s", "%s", "*"), A, B); break;
  case OP_DIV: snprintf(e, sizeof e, fl ? "__fdiv_rn(%s, %s)" : "loom_idiv(%s, %s)", A, B); break;
  case OP_MAX: snprintf(e, sizeof e, "%s > %s ? %s : %s", A, B, A, B); break;
  case OP_MIN: snprintf(e, sizeof e, "%s < %s ? %s : %s", A, B, A, B); break;
  case OP_POW: snprintf(e, sizeof e, "powf(%s, %s)", A, B); break;
  case OP_GELU_TANH_GRAD: snprintf(e, sizeof e, "loom_gelu_tanh_grad(%s, %s)", A, B); break;
  case OP_SILU_GRAD: snprintf(e, sizeof e, "loom_silu_grad(%s, %s)", A, B); break;
  case OP_RELU_GRAD: snprintf(e, sizeof e, fl ? "%s > 0.0f ? %s : 0.0f" : "%s > 0 ? %s : 0LL", A, B); break;
  case OP_EQ: snprintf(e, sizeof e, "(long long)(%s == %s)", A, B); break;
  case OP_GE: snprintf(e, sizeof e, "(long long)(%s >= %s)", A, B); break;
  case OP_WHERE: {
    Name c = eval(k, op->operands[2], p);
    snprintf(e, sizeof e, "%s != 0 ? %s : %s", A, B, c.s);
    break;
  }
  default: kfail(k, op, "has no CUDA kernel code"); return name_f("0");
  }
  return rounded(k, t, e);
}

static Name eval_cast(KG *k, const Op *op, const Pos *p) {
  const Type *from = &op->operands[0]->type, *to = &op->results[0]->type;
  Name x = eval(k, op->operands[0], p);
  char e[256];
  if (is_float_t(from) && is_float_t(to)) snprintf(e, sizeof e, "%s", x.s);
  else if (!is_float_t(from) && is_float_t(to)) snprintf(e, sizeof e, "(float)%s", x.s);
  else if (to->dtype == DT_BOOL) snprintf(e, sizeof e, is_float_t(from) ? "(long long)(%s != 0.0f)" : "(long long)(%s != 0)", x.s);
  else if (is_float_t(from)) snprintf(e, sizeof e, "(long long)%s", x.s);
  else snprintf(e, sizeof e, "%s", x.s);
  return rounded(k, to, e);
}

static Name eval(KG *k, const Value *v, const Pos *p) {
  if (k->rc) return name_f("0");
  bool memo = p->space && v->id >= 0 && v->id < k->n_ids;
  if (memo && k->memo[v->id].s[0]) return k->memo[v->id];
  const Type *t = &v->type;
  if (p->space && type_numel(t) != k->N) {
    kfail(k, v->kind == VAL_RESULT ? v->def : NULL, "a value of %lld elements is computed at the points of the "
          "%lld-element space", (long long)type_numel(t), (long long)k->N);
    return name_f("0");
  }
  Name r;
  if (v->kind == VAL_ARG) {
    if (k->vec && v->index < RT_MAX_BUFS && !strcmp(p->flat.s, "i")) {   /* from the group's vector load */
      k->vload[v->index] = true;
      r = local(k, ctype(t), "v", "%s(a%dv.v[j4])", load_fn(t->dtype), v->index);
    } else {
      r = local(k, ctype(t), "v", "%s(a%d[%s])", load_fn(t->dtype), v->index, p->flat.s);
    }
  } else if (v->kind == VAL_GLOBAL) {
    kfail(k, NULL, "reads the global $%s; kernels take globals as arguments", v->global->name);
    return name_f("0");
  } else {
    const Op *op = v->def;
    const OpInfo *info = op_info(op->kind);
    const Value *x = op->n_operands ? op->operands[0] : NULL;
    if (info->cls == CLASS_ELEMENTWISE) {
      r = eval_elementwise(k, op, p);
    } else {
      switch (op->kind) {
      case OP_RESHAPE: r = eval(k, x, p); break;
      case OP_BROADCAST: {
        if (type_numel(&x->type) == type_numel(t)) {   /* only leading dims added: same index */
          r = eval(k, x, p);
          break;
        }
        int off = t->rank - x->type.rank;
        char e[1024] = "";
        size_t n = 0;
        for (int d = 0; d < x->type.rank; d++) {
          if (x->type.dims[d] == 1) continue;
          Name c = coord(k, p, t, d + off);
          int64_t stride = prod(&x->type, d + 1, x->type.rank);
          if (stride == 1) n += (size_t)snprintf(e + n, sizeof e - n, "%s%s", n ? " + " : "", c.s);
          else n += (size_t)snprintf(e + n, sizeof e - n, "%s%s * %lldu", n ? " + " : "", c.s, (long long)stride);
          if (n >= sizeof e) {
            kfail(k, op, "index expression too long");
            return name_f("0");
          }
        }
        Pos q = {.space = false};
        q.flat = n ? local(k, "I", "f", "%s", e) : name_f("0u");
        k->used_shape = true;
        r = eval(k, x, &q);
        break;
      }
      case OP_CONSTANT: {
        double c = op_float(op, "value");
        if (is_float_t(t)) r = flit(dtype_round(t->dtype, (float)c));
        else r = name_f("%lldLL", (long long)c);
        break;
      }
      case OP_IOTA: {
        Name c = coord(k, p, t, (int)op_int(op, "dim"));
        k->used_shape = true;
        char e[128];
        snprintf(e, sizeof e, is_float_t(t) ? "(float)%s" : "(long long)%s", c.s);
        r = rounded(k, t, e);
        break;
      }
      case OP_CAST: r = eval_cast(k, op, p); break;
      default:
        if (info->cls == CLASS_REDUCTION)
          kfail(k, op, "uses a reduction result inside the kernel; the CUDA backend supports reductions only as "
                "kernel results");
        else
          kfail(k, op, "cannot be evaluated inside a kernel");
        return name_f("0");
      }
    }
  }
  if (memo) k->memo[v->id] = r;
  return r;
}

/* ---------------------------------------------------------------- walks */

typedef struct {
  int slot;          /* result index */
  const Op *op;
  bool fl, is_max, is_mean;
  DType dt;
  Name acc;
} KRed;

/* Runs of a shape: maximal groups of adjacent dims (dims of size 1 skipped) with the same
   flag, outermost first; each run spans flat strides [lo, hi). */
typedef struct {
  int64_t lo, size;
  bool reduced;
} KRun;

static int runs_of(const Type *t, const bool *reduced, KRun *runs) {
  KRun tmp[IR_MAX_RANK];
  int n = 0;
  for (int d = t->rank - 1; d >= 0; d--) {
    if (t->dims[d] == 1) continue;
    int64_t lo = prod(t, d + 1, t->rank);
    if (n && tmp[n - 1].reduced == reduced[d]) tmp[n - 1].size *= t->dims[d];
    else tmp[n++] = (KRun){lo, t->dims[d], reduced[d]};
  }
  for (int j = 0; j < n; j++) runs[j] = tmp[n - 1 - j];
  return n;
}

/* "sum of coord(var over the runs with flag) * lo" */
static void map_terms(char *e, size_t cap, size_t *n, const KRun *runs, int nr, bool reduced, const char *var) {
  int64_t stride = 1;
  for (int j = nr - 1; j >= 0; j--) {
    if (runs[j].reduced != reduced) continue;
    bool outer = true;
    for (int q = 0; q < j; q++)
      if (runs[q].reduced == reduced) outer = false;
    char c[128];
    if (outer && stride == 1) snprintf(c, sizeof c, "%s", var);
    else if (outer) snprintf(c, sizeof c, "%s / %lldu", var, (long long)stride);
    else if (stride == 1) snprintf(c, sizeof c, "%s %% %lldu", var, (long long)runs[j].size);
    else snprintf(c, sizeof c, "(%s / %lldu) %% %lldu", var, (long long)stride, (long long)runs[j].size);
    if (runs[j].lo == 1) *n += (size_t)snprintf(e + *n, cap - *n, "%s(%s)", *n ? " + " : "", c);
    else *n += (size_t)snprintf(e + *n, cap - *n, "%s(%s) * %lldu", *n ? " + " : "", c, (long long)runs[j].lo);
    if (*n >= cap) *n = cap - 1;
    stride *= runs[j].size;
  }
}

static const char *acc_init(const KRed *r) {
  if (r->fl) return r->is_max ? "-__int_as_float(0x7f800000)" : "0.0f";
  return r->is_max ? "(long long)(1ull << 63)" : "0LL";
}

static void emit_accumulate(KG *k, const KRed *r, Name v) {
  if (r->fl && r->is_max) line(k, "%s = fmaxf(%s, %s);", r->acc.s, r->acc.s, v.s);
  else if (r->fl) line(k, "%s = __fadd_rn(%s, %s);", r->acc.s, r->acc.s, v.s);
  else if (r->is_max) line(k, "%s = %s > %s ? %s : %s;", r->acc.s, r->acc.s, v.s, r->acc.s, v.s);
  else line(k, "%s = " UADD("%s", "%s", "+") ";", r->acc.s, r->acc.s, v.s);
}

/* Stores reduction r's final value (from expression `total`) at output o. */
static void emit_final(KG *k, const KRed *r, const char *total, int64_t count) {
  char v[256];
  if (r->is_mean) snprintf(v, sizeof v, "__fdiv_rn(%s, %s)", total, flit((float)count).s);
  else snprintf(v, sizeof v, "%s", total);
  line(k, "r%d[o] = %s(%s);", r->slot, store_fn(r->dt), v);
}

/* The point body at index i: every value, then the stores of the elementwise results, then
   the accumulation of the reductions. */
static void emit_point(KG *k, KRed *reds, int n_red) {
  const Func *f = k->f;
  for (int i = 0; i < k->n_ids; i++) k->memo[i].s[0] = 0;
  k->n_coords = 0;
  Name vals[IR_MAX_RESULTS];
  Pos sp = {.space = true, .flat = name_f("i")};
  for (int s = 0; s < f->rets.n && s < IR_MAX_RESULTS; s++) {
    const Value *v = f->rets.items[s];
    vals[s] = is_reduction_result(v) ? eval(k, v->def->operands[0], &sp) : eval(k, v, &sp);
  }
  for (int s = 0; s < f->rets.n && s < IR_MAX_RESULTS; s++) {
    const Value *v = f->rets.items[s];
    if (is_reduction_result(v)) continue;
    if (k->vec) line(k, "r%dv.v[j4] = %s(%s);", s, store_fn(v->type.dtype), vals[s].s);
    else line(k, "r%d[i] = %s(%s);", s, store_fn(v->type.dtype), vals[s].s);
  }
  for (int q = 0; q < n_red; q++) emit_accumulate(k, &reds[q], vals[reds[q].slot]);
}

int cuda_kernel_body(const Func *f, Str *out, Str *fin, CudaKernelInfo *info, char *err, size_t errlen) {
  memset(info, 0, sizeof *info);
  KG kg = {.f = f, .err = err, .errlen = errlen, .indent = "    "};
  KG *k = &kg;
  /* N, and what the backend supports */
  for (int i = 0; i < f->args.n; i++) {
    const Value *v = f->args.items[i];
    if (type_numel(&v->type) > k->N) k->N = type_numel(&v->type);
    if (!elem_type(v->type.dtype))
      return kfail(k, NULL, "argument %d is %s: the CUDA backend holds only f32, bf16, f16, f8, i32 and bool tensors in "
                   "memory", i, dtype_name(v->type.dtype));
  }
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++)
      if (type_numel(&op->results[r]->type) > k->N) k->N = type_numel(&op->results[r]->type);
    const OpInfo *oi = op_info(op->kind);
    bool ok = oi->cls == CLASS_ELEMENTWISE || oi->cls == CLASS_REDUCTION || op->kind == OP_BROADCAST ||
              op->kind == OP_RESHAPE || op->kind == OP_CONSTANT || op->kind == OP_IOTA || op->kind == OP_CAST;
    if (!ok) return kfail(k, op, "cannot appear in a kernel func");
  }
  if (k->N <= 0) return kfail(k, NULL, "has no elements; empty kernels are not supported");
  if (f->rets.n > IR_MAX_RESULTS) return kfail(k, NULL, "has too many results");
  KRed reds[IR_MAX_RESULTS];
  int n_red = 0;
  const Op *red0 = NULL;
  for (int s = 0; s < f->rets.n; s++) {
    const Value *v = f->rets.items[s];
    if (v->kind == VAL_GLOBAL) return kfail(k, NULL, "returns the global $%s", v->global->name);
    if (!elem_type(v->type.dtype))
      return kfail(k, NULL, "result %d is %s: the CUDA backend holds only f32, bf16, f16, f8, i32 and bool tensors in "
                   "memory", s, dtype_name(v->type.dtype));
    if (!is_reduction_result(v)) {
      if (type_numel(&v->type) != k->N)
        return kfail(k, NULL, "result %d has %lld elements, neither the kernel's %lld nor a reduction", s,
                     (long long)type_numel(&v->type), (long long)k->N);
      continue;
    }
    const Op *op = v->def;
    if (type_numel(&op->operands[0]->type) != k->N)
      return kfail(k, op, "reduces %lld elements, not the kernel's %lld", (long long)type_numel(&op->operands[0]->type),
                   (long long)k->N);
    if (red0 && !(attr_eq(&op->attrs[0], &red0->attrs[0]) && type_shape_eq(&op->operands[0]->type, &red0->operands[0]->type)))
      return kfail(k, op, "reduces other dims than the kernel's first reduction; the CUDA backend needs every "
                   "reduction of a kernel to reduce the same dims of the same shape");
    if (!red0) red0 = op;
    KRed *r = &reds[n_red++];
    memset(r, 0, sizeof *r);
    r->slot = s;
    r->op = op;
    r->fl = is_float_t(&v->type);
    r->is_max = op->kind == OP_REDUCE_MAX;
    r->is_mean = op->kind == OP_REDUCE_MEAN;
    r->dt = v->type.dtype;
    r->acc = name_f("acc%d", n_red - 1);
  }
  k->n_ids = func_number((Func *)f);
  k->memo = calloc((size_t)(k->n_ids ? k->n_ids : 1), sizeof(Name));
  if (!k->memo) return kfail(k, NULL, "out of memory");
  bool wide = k->N > INT32_MAX;
  Str point = {0};
  Str *o = out;

  /* the walk */
  KRun runs[IR_MAX_RANK];
  int nr = 0;
  if (n_red) {
    const Type *x = &red0->operands[0]->type;
    bool reduced[IR_MAX_RANK] = {0};
    for (int d = 0; d < red0->attrs[0].n; d++) reduced[red0->attrs[0].ints[d]] = true;
    nr = runs_of(x, reduced, runs);
    info->out_n = type_numel(&((const Value *)f->rets.items[reds[0].slot])->type);
    info->count = info->out_n ? k->N / info->out_n : 0;
    bool inner_reduced = nr > 0 && runs[nr - 1].reduced;
    if (info->count <= 32) info->mode = CK_SERIAL;
    else if (inner_reduced || info->out_n == 1) info->mode = CK_ROW;
    else info->mode = CK_COLUMN;
  } else {
    info->mode = CK_ELEMENTWISE;
  }
  info->N = k->N;
  info->block[0] = 256;
  info->block[1] = info->block[2] = 1;
  uint32_t by = 1;
  /* Elementwise over a multiple of 4 points: 4 per thread, with vector loads and stores of
     what is read and written at the point (8 or 16 bytes; bases are 64-byte aligned). */
  if (info->mode == CK_ELEMENTWISE && k->N % 4 == 0 && f->args.n <= RT_MAX_BUFS) k->vec = 4;
  switch (info->mode) {
  case CK_ELEMENTWISE: info->work = k->vec ? k->N / 4 : k->N; info->per_block = 256; break;
  case CK_SERIAL: info->work = info->out_n; info->per_block = 256; break;
  case CK_ROW: {
    uint32_t b = 64;
    while (b < 256 && (int64_t)b < info->count) b *= 2;
    if (info->count >= 4096 && info->out_n <= 128) b = 1024;
    info->block[0] = b;
    info->work = info->out_n;
    info->per_block = 1;
    break;
  }
  case CK_COLUMN: {
    /* BY rows of 32 partial results per reduction in shared memory: at most 32 KiB */
    int words = 0;
    for (int q = 0; q < n_red; q++) words += reds[q].fl ? 1 : 2;
    while (by < 16 && (int64_t)by * 32 < info->count && (int64_t)words * by * 2 * 128 <= 32768) by *= 2;
    info->block[0] = 32;
    info->block[1] = by;
    info->work = (info->out_n + 31) / 32;
    info->per_block = 1;
    break;
  }
  }
  /* Few blocks and long reductions: split the reduced range (two kernels, see cuda_internal.h). */
  info->split = 1;
  info->n_red = n_red;
  if ((info->mode == CK_ROW || info->mode == CK_COLUMN) && info->work < 128 && info->count >= 4096) {
    int64_t g = (256 + info->work - 1) / info->work, by_count = info->count / 2048;
    info->split = g < by_count ? g : by_count;
    if (info->split < 2) info->split = 1;
  }
  if (info->split > 1) {
    if (info->mode == CK_ROW) info->block[0] = 256;
    info->work *= info->split;
    for (int q = 0; q < n_red; q++) info->scratch_bytes += ((reds[q].fl ? 4 : 8) * info->out_n * info->split + 63) / 64 * 64;
    info->fin_block = 256;
    info->fin_work = info->out_n;
  }
  const int64_t G = info->split, chunk = (info->count + G - 1) / G;

  /* the point body, written first (it decides whether the shape is needed) */
  k->o = &point;
  k->indent = info->mode == CK_ELEMENTWISE && !k->vec ? "    " : "      ";
  if (n_red) {
    char e[2048] = "";
    size_t n = 0;
    map_terms(e, sizeof e, &n, runs, nr, false, "o");
    map_terms(e, sizeof e, &n, runs, nr, true, "j");
    line(k, "const I i = %s;", n ? e : "0u");
  }
  emit_point(k, reds, n_red);
  if (point.oom) kfail(k, NULL, "out of memory");
  if (k->rc) {
    str_free(&point);
    free(k->memo);
    return k->rc;
  }

  /* the kernel */
  k->o = o;
  str_add(o, "{\n  typedef unsigned %s I;\n", wide ? "long long" : "int");
  for (int b = 0; b < f->args.n; b++) {
    const Value *v = f->args.items[b];
    str_add(o, "  const %s *a%d = (const %s *)a.buf[%d];\n", elem_type(v->type.dtype), b, elem_type(v->type.dtype), b);
  }
  for (int s = 0; s < f->rets.n; s++) {
    const Value *v = f->rets.items[s];
    if (G > 1 && is_reduction_result(v)) continue;   /* the finish kernel stores those */
    str_add(o, "  %s *r%d = (%s *)a.buf[%d];\n", elem_type(v->type.dtype), s, elem_type(v->type.dtype), f->args.n + s);
  }
  const char *u = wide ? "ull" : "u";
  switch (info->mode) {
  case CK_ELEMENTWISE:
    if (k->used_shape) str_add(o, "  const I n = %lld%s;\n", (long long)k->N, u);
    else str_add(o, "  const I n = (I)a.i[0];\n");
    if (!k->vec) {
      str_add(o, "  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {\n");
      str_add(o, "%s", point.s ? point.s : "");
      str_add(o, "  }\n");
      break;
    }
    str_add(o, "  for (I i4 = ((I)blockIdx.x * blockDim.x + threadIdx.x) * 4%s; i4 < n; i4 += (I)gridDim.x * blockDim.x * 4%s) {\n",
            u, u);
    for (int b = 0; b < f->args.n; b++)
      if (k->vload[b])
        str_add(o, "    const loom_v4<%s> a%dv = loom_ldv4(a%d + i4);\n", elem_type(((const Value *)f->args.items[b])->type.dtype),
                b, b);
    for (int s = 0; s < f->rets.n; s++)
      str_add(o, "    loom_v4<%s> r%dv;\n", elem_type(((const Value *)f->rets.items[s])->type.dtype), s);
    str_add(o, "#pragma unroll\n    for (I j4 = 0; j4 < 4%s; j4++) {\n      const I i = i4 + j4;\n      (void)i;\n", u);
    str_add(o, "%s", point.s ? point.s : "");
    str_add(o, "    }\n");
    for (int s = 0; s < f->rets.n; s++) str_add(o, "    loom_stv4(r%d + i4, r%dv);\n", s, s);
    str_add(o, "  }\n");
    break;
  case CK_SERIAL:
    str_add(o, "  for (I o = (I)blockIdx.x * blockDim.x + threadIdx.x; o < %lld%s; o += (I)gridDim.x * blockDim.x) {\n",
             (long long)info->out_n, u);
    for (int q = 0; q < n_red; q++)
      str_add(o, "    %s %s = %s;\n", reds[q].fl ? "float" : "long long", reds[q].acc.s, acc_init(&reds[q]));
    str_add(o, "    for (I j = 0; j < %lld%s; j++) {\n", (long long)info->count, u);
    str_add(o, "%s", point.s);
    str_add(o, "    }\n");
    k->indent = "    ";
    for (int q = 0; q < n_red; q++) emit_final(k, &reds[q], reds[q].acc.s, info->count);
    str_add(o, "  }\n");
    break;
  case CK_ROW: {
    bool any_f = false, any_i = false;
    for (int q = 0; q < n_red; q++) {
      if (reds[q].fl) any_f = true;
      else any_i = true;
    }
    if (any_f) str_add(o, "  __shared__ float loom_rf[32];\n");
    if (any_i) str_add(o, "  __shared__ long long loom_ri[32];\n");
    if (G > 1) {
      str_add(o, "  char *sp = (char *)a.buf[%d];\n", f->args.n + f->rets.n);
      str_add(o, "  for (I ob = blockIdx.x; ob < %lld%s; ob += gridDim.x) {\n", (long long)(info->out_n * G), u);
      str_add(o, "    const I o = ob / %lld%s, part = ob %% %lld%s;\n", (long long)G, u, (long long)G, u);
      str_add(o, "    const I j_end = part * %lld%s + %lld%s < %lld%s ? part * %lld%s + %lld%s : %lld%s;\n",
               (long long)chunk, u, (long long)chunk, u, (long long)info->count, u, (long long)chunk, u, (long long)chunk,
               u, (long long)info->count, u);
    } else {
      str_add(o, "  for (I o = blockIdx.x; o < %lld%s; o += gridDim.x) {\n", (long long)info->out_n, u);
    }
    for (int q = 0; q < n_red; q++)
      str_add(o, "    %s %s = %s;\n", reds[q].fl ? "float" : "long long", reds[q].acc.s, acc_init(&reds[q]));
    if (G > 1)
      str_add(o, "    for (I j = part * %lld%s + threadIdx.x; j < j_end; j += blockDim.x) {\n", (long long)chunk, u);
    else
      str_add(o, "    for (I j = threadIdx.x; j < %lld%s; j += blockDim.x) {\n", (long long)info->count, u);
    str_add(o, "%s", point.s);
    str_add(o, "    }\n");
    for (int q = 0; q < n_red; q++)
      str_add(o, "    %s = loom_block_reduce<%s, %s>(%s, %s, %s);\n", reds[q].acc.s, reds[q].fl ? "float" : "long long",
               reds[q].is_max ? "true" : "false", reds[q].acc.s, reds[q].fl ? "loom_rf" : "loom_ri", acc_init(&reds[q]));
    str_add(o, "    if (threadIdx.x == 0) {\n");
    k->indent = "      ";
    if (G > 1)
      for (int q = 0, off = 0; q < n_red; q++) {
        line(k, "((%s *)(sp + %d))[o * %lld%s + part] = %s;", reds[q].fl ? "float" : "long long", off, (long long)G, u,
             reds[q].acc.s);
        off += (int)(((reds[q].fl ? 4 : 8) * info->out_n * G + 63) / 64 * 64);
      }
    else
      for (int q = 0; q < n_red; q++) emit_final(k, &reds[q], reds[q].acc.s, info->count);
    str_add(o, "    }\n  }\n");
    break;
  }
  case CK_COLUMN: {
    int nf = 0, ni = 0;
    for (int q = 0; q < n_red; q++) {
      if (reds[q].fl) nf++;
      else ni++;
    }
    if (nf) str_add(o, "  __shared__ float loom_cf[%d][%u][32];\n", nf, by);
    if (ni) str_add(o, "  __shared__ long long loom_ci[%d][%u][32];\n", ni, by);
    if (G > 1) {
      str_add(o, "  char *sp = (char *)a.buf[%d];\n", f->args.n + f->rets.n);
      str_add(o, "  for (I obp = blockIdx.x; obp < %lld%s; obp += gridDim.x) {\n", (long long)info->work, u);
      str_add(o, "    const I ob = obp / %lld%s, part = obp %% %lld%s;\n", (long long)G, u, (long long)G, u);
      str_add(o, "    const I j_end = part * %lld%s + %lld%s < %lld%s ? part * %lld%s + %lld%s : %lld%s;\n",
               (long long)chunk, u, (long long)chunk, u, (long long)info->count, u, (long long)chunk, u, (long long)chunk,
               u, (long long)info->count, u);
    } else {
      str_add(o, "  for (I ob = blockIdx.x; ob < %lld%s; ob += gridDim.x) {\n", (long long)info->work, u);
    }
    str_add(o, "    const I o = ob * 32u + threadIdx.x;\n");
    for (int q = 0; q < n_red; q++)
      str_add(o, "    %s %s = %s;\n", reds[q].fl ? "float" : "long long", reds[q].acc.s, acc_init(&reds[q]));
    str_add(o, "    if (o < %lld%s)\n", (long long)info->out_n, u);
    if (G > 1)
      str_add(o, "    for (I j = part * %lld%s + threadIdx.y; j < j_end; j += %uu) {\n", (long long)chunk, u, by);
    else
      str_add(o, "    for (I j = threadIdx.y; j < %lld%s; j += %uu) {\n", (long long)info->count, u, by);
    str_add(o, "%s", point.s);
    str_add(o, "    }\n");
    for (int q = 0, fi = 0, ii = 0; q < n_red; q++)
      str_add(o, "    %s[%d][threadIdx.y][threadIdx.x] = %s;\n", reds[q].fl ? "loom_cf" : "loom_ci",
               reds[q].fl ? fi++ : ii++, reds[q].acc.s);
    str_add(o, "    __syncthreads();\n");
    str_add(o, "    if (threadIdx.y == 0 && o < %lld%s) {\n", (long long)info->out_n, u);
    for (int q = 0, fi = 0, ii = 0; q < n_red; q++) {
      const KRed *r = &reds[q];
      const char *arr = r->fl ? "loom_cf" : "loom_ci";
      int idx = r->fl ? fi++ : ii++;
      str_add(o, "      %s t%d = %s[%d][0][threadIdx.x];\n", r->fl ? "float" : "long long", q, arr, idx);
      str_add(o, "      for (int y = 1; y < %u; y++) {\n", by);
      Name tq = name_f("t%d", q), uq = name_f("%s[%d][y][threadIdx.x]", arr, idx);
      KRed tmp = *r;
      tmp.acc = tq;
      k->indent = "        ";
      emit_accumulate(k, &tmp, uq);
      str_add(o, "      }\n");
      k->indent = "      ";
      if (G > 1) {
        int off = 0;
        for (int q2 = 0; q2 < q; q2++) off += (int)(((reds[q2].fl ? 4 : 8) * info->out_n * G + 63) / 64 * 64);
        line(k, "((%s *)(sp + %d))[o * %lld%s + part] = %s;", r->fl ? "float" : "long long", off, (long long)G, u, tq.s);
      } else {
        emit_final(k, r, tq.s, info->count);
      }
    }
    str_add(o, "    }\n    __syncthreads();\n  }\n");
    break;
  }
  }
  str_add(o, "}\n");
  if (G > 1 && fin) {
    /* the finish kernel: one thread per output, the parts in order */
    Str *fo = fin;
    str_add(fo, "{\n  typedef unsigned %s I;\n  const char *sp = (const char *)a.buf[0];\n", wide ? "long long" : "int");
    for (int q = 0; q < n_red; q++) {
      const Value *v = f->rets.items[reds[q].slot];
      str_add(fo, "  %s *r%d = (%s *)a.buf[%d];\n", elem_type(v->type.dtype), reds[q].slot, elem_type(v->type.dtype), 1 + q);
    }
    str_add(fo, "  for (I o = (I)blockIdx.x * blockDim.x + threadIdx.x; o < %lld%s; o += (I)gridDim.x * blockDim.x) {\n",
             (long long)info->out_n, u);
    k->o = fo;
    for (int q = 0, off = 0; q < n_red; q++) {
      const KRed *r = &reds[q];
      const char *ty = r->fl ? "float" : "long long";
      str_add(fo, "    %s %s = ((const %s *)(sp + %d))[o * %lld%s];\n", ty, r->acc.s, ty, off, (long long)G, u);
      str_add(fo, "    for (I p = 1; p < %lld%s; p++) {\n", (long long)G, u);
      Name pv = name_f("((const %s *)(sp + %d))[o * %lld%s + p]", ty, off, (long long)G, u);
      k->indent = "      ";
      emit_accumulate(k, r, pv);
      str_add(fo, "    }\n");
      k->indent = "    ";
      emit_final(k, r, r->acc.s, info->count);
      off += (int)(((r->fl ? 4 : 8) * info->out_n * G + 63) / 64 * 64);
    }
    str_add(fo, "  }\n}\n");
    if (fo->oom) kfail(k, NULL, "out of memory");
  }
  str_free(&point);
  free(k->memo);
  if (o->oom) return kfail(k, NULL, "out of memory");
  return k->rc;
}
