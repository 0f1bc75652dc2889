/* passes/memory_plan.c — pass "memory-plan": gives every value of a program function that
 * lives in memory a byte offset in one arena per function (Value.offset, printed "at N"),
 * and the function its arena size (Func.arena_bytes, printed "arena N").
 *
 *   - Liveness by op order: a buffer is taken when its op runs and given back after the
 *     last op that reads it (values a function returns live to its end).
 *   - First fit over the free space, 64-byte aligned, in op order; then the same buffers
 *     placed largest first, each at the lowest offset free over its lifetime, and that plan
 *     kept when its arena is smaller (replan_by_size: first fit fragments training steps,
 *     whose kept activations pin holes that the backward's temporaries cannot use).
 *   - A reshape shares its operand's buffer (same bytes, another shape): no copy.
 *   - Async collectives: a wait shares its start's buffer, and a start's operand stays
 *     alive until the wait (the communication thread reads it while compute goes on).
 *   - In place: a kernel call may write an output into the buffer of an input of the same
 *     size that dies at that call (kernels read element i before writing element i).
 *   - Storage: the CPU holds every element in 4 bytes (floats as f32, ids as int32); the
 *     CUDA target uses each dtype's size (bf16: 2).
 * Globals (parameters, gradients, optimizer state) are not in the arena: codegen lays them
 * out in regions of their own.  memory_report() sums everything up for `loom ir --memory`.
 */
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "passes.h"

#define ALIGN 64

static int64_t elem_bytes(const Type *t, int target) {
  return target == TARGET_CUDA ? dtype_size(t->dtype) : 4;
}

static int64_t value_bytes(const Value *v, int target) {
  int64_t n = type_numel(&v->type) * elem_bytes(&v->type, target);
  return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* Free space of the arena as a sorted list of [start, end) holes; the arena grows at its end. */
typedef struct {
  int64_t *start, *end;
  int n, cap;
  int64_t top;    /* end of the highest buffer ever placed: the arena size */
} FreeList;

static void fl_add(FreeList *fl, int64_t s, int64_t e) {
  /* insert sorted, then merge neighbours */
  if (fl->n == fl->cap) {
    fl->cap = fl->cap ? fl->cap * 2 : 64;
    fl->start = realloc(fl->start, sizeof(int64_t) * (size_t)fl->cap);
    fl->end = realloc(fl->end, sizeof(int64_t) * (size_t)fl->cap);
  }
  int i = fl->n;
  while (i > 0 && fl->start[i - 1] > s) {
    fl->start[i] = fl->start[i - 1];
    fl->end[i] = fl->end[i - 1];
    i--;
  }
  fl->start[i] = s;
  fl->end[i] = e;
  fl->n++;
  int out = 0;
  for (int k = 0; k < fl->n; k++) {
    if (out && fl->end[out - 1] >= fl->start[k]) {
      if (fl->end[k] > fl->end[out - 1]) fl->end[out - 1] = fl->end[k];
    } else {
      fl->start[out] = fl->start[k];
      fl->end[out] = fl->end[k];
      out++;
    }
  }
  fl->n = out;
  /* A hole that reaches the top shrinks the used part instead. */
}

static int64_t fl_take(FreeList *fl, int64_t size) {
  for (int k = 0; k < fl->n; k++)
    if (fl->end[k] - fl->start[k] >= size) {
      int64_t at = fl->start[k];
      fl->start[k] += size;
      if (fl->start[k] == fl->end[k]) {
        memmove(fl->start + k, fl->start + k + 1, sizeof(int64_t) * (size_t)(fl->n - k - 1));
        memmove(fl->end + k, fl->end + k + 1, sizeof(int64_t) * (size_t)(fl->n - k - 1));
        fl->n--;
      }
      return at;
    }
  /* No hole fits: extend the arena (merging with a hole that ends at the top). */
  int64_t at = fl->top;
  if (fl->n && fl->end[fl->n - 1] == fl->top) {
    at = fl->start[fl->n - 1];
    fl->n--;
  }
  fl->top = at + size;
  return at;
}

/* The value whose buffer v uses (through reshapes and waits), or v. */
static Value *root_of(Value *v) {
  while (v->kind == VAL_RESULT && (v->def->kind == OP_RESHAPE || v->def->kind == OP_WAIT) &&
         v->def->operands[0]->kind != VAL_GLOBAL)
    v = v->def->operands[0];
  return v;
}

/* Buffers in flight: a collective start reads its operand until its wait, so the operand
   lives at least to the wait (the start's result lives on as the wait's, root_of). */
static void extend_in_flight(Func *f, int64_t *last) {
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    if (op->kind != OP_WAIT || op->operands[0]->kind != VAL_RESULT || !op_is_start(op->operands[0]->def->kind)) continue;
    Value *x = op->operands[0]->def->operands[0];
    if (x->kind != VAL_GLOBAL && last[root_of(x)->id] < i) last[root_of(x)->id] = i;
  }
}

/* ---- the second placement: largest buffers first ---- */

typedef struct {
  int64_t size, start, end;   /* bytes; lifetime [start, end] in op indices, inclusive (args: -1) */
  int64_t off;
  int id;                     /* the root value's id: the buffer's owner */
} Buf;

/* Largest first, then earliest, then by owner: a total order (owners are distinct). */
static inline bool before(const Buf *x, const Buf *y) {
  if (x->size != y->size) return x->size > y->size;
  if (x->start != y->start) return x->start < y->start;
  return x->id < y->id;
}

/* b in that order: a merge sort with the comparison inline (qsort's calls through a
   pointer were a tenth of `loom plan`'s memory plans). */
static void sort_by_size(Buf *b, int n) {
  Buf *tmp = malloc(sizeof(Buf) * ((size_t)n + 1)), *from = b, *to = tmp;
  if (!tmp) {   /* insertion sort: the same order, slower */
    for (int i = 1; i < n; i++) {
      Buf x = b[i];
      int j = i;
      while (j > 0 && before(&x, &b[j - 1])) b[j] = b[j - 1], j--;
      b[j] = x;
    }
    return;
  }
  for (int w = 1; w < n; w *= 2) {
    for (int lo = 0; lo < n; lo += 2 * w) {
      int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
      while (i < mid && j < hi) to[k++] = before(&from[j], &from[i]) ? from[j++] : from[i++];
      while (i < mid) to[k++] = from[i++];
      while (j < hi) to[k++] = from[j++];
    }
    Buf *t = from;
    from = to, to = t;
  }
  if (from != b) memcpy(b, from, sizeof(Buf) * (size_t)n);
  free(tmp);
}

/* Bit j set when placed buffer k0 + j (j < 8) lives at some time of [s, e]. */
static inline unsigned alive8(const int32_t *ps, const int32_t *pe, int k0, int32_t s, int32_t e) {
#if defined(__SSE2__)
  __m128i lo = _mm_set1_epi32(s - 1), hi = _mm_set1_epi32(e + 1);   /* ps <= e and pe >= s */
  __m128i m0 = _mm_and_si128(_mm_cmpgt_epi32(hi, _mm_loadu_si128((const __m128i *)(ps + k0))),
                             _mm_cmpgt_epi32(_mm_loadu_si128((const __m128i *)(pe + k0)), lo));
  __m128i m1 = _mm_and_si128(_mm_cmpgt_epi32(hi, _mm_loadu_si128((const __m128i *)(ps + k0 + 4))),
                             _mm_cmpgt_epi32(_mm_loadu_si128((const __m128i *)(pe + k0 + 4)), lo));
  return (unsigned)_mm_movemask_ps(_mm_castsi128_ps(m0)) | (unsigned)_mm_movemask_ps(_mm_castsi128_ps(m1)) << 4;
#else
  unsigned mask = 0;
  for (int j = 0; j < 8; j++) mask |= (unsigned)((ps[k0 + j] <= e) & (s <= pe[k0 + j])) << j;
  return mask;
#endif
}

/* Offsets for bufs, largest first, each at the lowest offset where it overlaps no placed
   buffer alive at the same time (the "greedy by size" offset assignment of inference
   runtimes' planners).  The placed buffers are kept in offset order (an insertion after
   those at the same offset), so each new one walks them once, skipping those alive at other
   times: eight at a time, their lifetimes side by side, so the skipping is a vector compare
   (the walk is most of `loom plan`'s memory plans).  Returns the arena size. */
static int64_t place_by_size(Buf *b, int nb) {
  sort_by_size(b, nb);
  /* the placed buffers by offset: lifetime [ps, pe] (op indices), bytes [po, pt) */
  int32_t *ps = calloc(2 * ((size_t)nb + 8), sizeof(int32_t));
  int64_t *po = calloc(2 * ((size_t)nb + 8), sizeof(int64_t));
  if (!ps || !po) {   /* no second plan: first fit's stands */
    free(ps), free(po);
    return INT64_MAX;
  }
  int32_t *pe = ps + nb + 8;
  int64_t *pt = po + nb + 8, top = 0;
  for (int i = 0; i < nb; i++) {
    int64_t at = 0, size = b[i].size;
    int32_t s = (int32_t)b[i].start, e = (int32_t)b[i].end;
    bool placed = false;
    for (int k0 = 0; k0 < i && !placed; k0 += 8) {
      unsigned mask = alive8(ps, pe, k0, s, e);   /* which of the next eight are alive at the same time */
      if (k0 + 8 > i) mask &= (1u << (i - k0)) - 1;
      for (; mask; mask &= mask - 1) {
        int k = k0 + __builtin_ctz(mask);
        if (po[k] >= at + size) {   /* the gap below this one fits */
          placed = true;
          break;
        }
        if (pt[k] > at) at = pt[k];
      }
    }
    b[i].off = at;
    if (at + size > top) top = at + size;
    int lo = 0, hi = i;   /* insert after every buffer at an offset <= at */
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (po[mid] > at) hi = mid;
      else lo = mid + 1;
    }
    memmove(ps + lo + 1, ps + lo, sizeof(int32_t) * (size_t)(i - lo));
    memmove(pe + lo + 1, pe + lo, sizeof(int32_t) * (size_t)(i - lo));
    memmove(po + lo + 1, po + lo, sizeof(int64_t) * (size_t)(i - lo));
    memmove(pt + lo + 1, pt + lo, sizeof(int64_t) * (size_t)(i - lo));
    ps[lo] = s, pe[lo] = e, po[lo] = at, pt[lo] = at + size;
  }
  free(ps), free(po);
  return top;
}

/* The buffer that holds v: through reshapes and waits (root_of), and outputs written in
   place over an input (alias). */
static int owner(Value *v, const int *alias) {
  int id = root_of(v)->id;
  while (alias[id] >= 0) id = alias[id];
  return id;
}

/* After the first-fit plan (offsets set, alias[] its in-place choices): the same buffers
   placed largest first; kept when the arena gets smaller.  First fit in op order leaves the
   backward's temporaries above holes that the values kept from the forward pin (the arena
   grows with the layers while what is alive at once does not); largest-first packs the
   long-lived buffers together. */
static void replan_by_size(Func *f, int target, const int64_t *last, const int *alias) {
  int n = func_number(f);
  Value **val = calloc((size_t)n + 1, sizeof *val);
  int *buf = malloc(sizeof(int) * ((size_t)n + 1));
  Buf *b = malloc(sizeof(Buf) * ((size_t)n + 1));
  int64_t *def = malloc(sizeof(int64_t) * ((size_t)n + 1));
  int64_t *delta = calloc((size_t)f->ops.n + 3, sizeof(int64_t));
  if (!val || !buf || !b || !def || !delta) {
    free(val), free(buf), free(b), free(def), free(delta);
    return;   /* the first-fit plan stands */
  }
  for (int i = 0; i < n; i++) buf[i] = -1, def[i] = -1;
  int nb = 0;
  for (int i = 0; i < f->args.n; i++) val[((Value *)f->args.items[i])->id] = f->args.items[i];
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) {
      val[op->results[r]->id] = op->results[r];
      def[op->results[r]->id] = i;
    }
  }
  for (int id = 0; id < n; id++) {
    Value *v = val[id];
    if (!v || root_of(v) != v) continue;   /* reshapes and waits: their root's buffer */
    int o = owner(v, alias);
    int64_t end = last[id] < def[id] ? def[id] : last[id];   /* read by nobody: dies where it is made */
    if (buf[o] < 0) {
      buf[o] = nb;
      b[nb++] = (Buf){value_bytes(val[o], target), def[id], end, 0, o};
    }
    Buf *x = &b[buf[o]];
    if (def[id] < x->start) x->start = def[id];
    if (end > x->end) x->end = end;
  }
  /* The bytes alive at once bound every plan from below: when first fit reached it, keep it. */
  int64_t live = 0, bound = 0;
  for (int k = 0; k < nb; k++) {
    delta[b[k].start + 1] += b[k].size;   /* index + 1: arguments start at -1 */
    delta[b[k].end + 2] -= b[k].size;
  }
  for (int i = 0; i <= f->ops.n + 1; i++) {
    live += delta[i];
    if (live > bound) bound = live;
  }
  if (nb && bound < f->arena_bytes) {
    int64_t top = place_by_size(b, nb);   /* sorts b */
    if (top < f->arena_bytes) {
      for (int k = 0; k < nb; k++) buf[b[k].id] = k;   /* owner id -> its placed buffer */
      for (int id = 0; id < n; id++)
        if (val[id]) val[id]->offset = b[buf[owner(val[id], alias)]].off;
      f->arena_bytes = top;
    }
  }
  free(def), free(val), free(buf), free(b), free(delta);
}

static void plan_func(Func *f, int target) {
  int n = func_number(f);
  int *alias = malloc(sizeof(int) * ((size_t)n + 1));   /* a result written in place: the input's id */
  for (int i = 0; i < n; i++) alias[i] = -1;
  int64_t *last = malloc(sizeof(int64_t) * ((size_t)n + 1));   /* last reader's op index (per root) */
  for (int i = 0; i < n; i++) last[i] = -1;
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind != VAL_GLOBAL) last[root_of(v)->id] = i;
    }
  }
  for (int i = 0; i < f->rets.n; i++) {
    Value *v = f->rets.items[i];
    if (v->kind != VAL_GLOBAL) last[root_of(v)->id] = f->ops.n;
  }
  extend_in_flight(f, last);
  FreeList fl = {0};
  for (int i = 0; i < f->args.n; i++) {
    Value *v = f->args.items[i];
    v->offset = fl_take(&fl, value_bytes(v, target));
    if (last[v->id] < 0) last[v->id] = f->ops.n;   /* an argument nobody reads keeps its place */
  }
  int max_operands = 0;
  for (int i = 0; i < f->ops.n; i++)
    if (((Op *)f->ops.items[i])->n_operands > max_operands) max_operands = ((Op *)f->ops.items[i])->n_operands;
  bool *reused = malloc((size_t)max_operands + 1);   /* per op: which inputs an output took */
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    memset(reused, 0, (size_t)op->n_operands + 1);
    for (int r = 0; r < op->n_results; r++) {
      Value *v = op->results[r];
      if ((op->kind == OP_RESHAPE || op->kind == OP_WAIT) && op->operands[0]->kind != VAL_GLOBAL) {
        v->offset = root_of(v)->offset;
        continue;
      }
      int64_t size = value_bytes(v, target);
      v->offset = -1;
      /* In place over an input that dies here -- not a reduction's result: a kernel reads
         several elements of its input for one element of such a result. */
      const Value *kr = op->kind == OP_CALL && op->callee ? op->callee->rets.items[r] : NULL;
      bool reduced = kr && kr->kind == VAL_RESULT && op_info(kr->def->kind)->cls == CLASS_REDUCTION;
      if (op->kind == OP_CALL && !reduced)
        for (int k = 0; k < op->n_operands && v->offset < 0; k++) {
          Value *in = op->operands[k];
          if (in->kind == VAL_GLOBAL || reused[k] || root_of(in) != in || last[in->id] != i ||
              value_bytes(in, target) != size || type_numel(&in->type) != type_numel(&v->type))
            continue;
          bool dup = false;   /* the same input passed twice must not be reused twice */
          for (int j = 0; j < op->n_operands; j++) dup |= j != k && op->operands[j] == in && reused[j];
          if (dup) continue;
          reused[k] = true;
          v->offset = in->offset;
          alias[v->id] = in->id;
        }
      if (v->offset < 0) v->offset = fl_take(&fl, size);
    }
    /* Inputs whose last reader this was go back to the free list (once each). */
    for (int k = 0; k < op->n_operands; k++) {
      Value *in = op->operands[k];
      if (in->kind == VAL_GLOBAL || root_of(in) != in || last[in->id] != i || reused[k]) continue;
      bool seen = false;
      for (int j = 0; j < k; j++) seen |= op->operands[j] == in;
      for (int j = 0; j < op->n_operands; j++) seen |= reused[j] && op->operands[j] == in;
      if (!seen) fl_add(&fl, in->offset, in->offset + value_bytes(in, target));
    }
    /* Results nobody reads die at once. */
    for (int r = 0; r < op->n_results; r++) {
      Value *v = op->results[r];
      if (root_of(v) == v && last[v->id] < 0)
        fl_add(&fl, v->offset, v->offset + value_bytes(v, target));
    }
  }
  free(reused);
  f->arena_bytes = fl.top;
  free(fl.start);
  free(fl.end);
  replan_by_size(f, target, last, alias);
  free(last);
  free(alias);
}

/* Independent check of a plan: two buffers whose lifetimes overlap must not share bytes,
   unless one is a reshape of the other or a kernel output written in place over an
   input that dies at that call.  Lifetimes: [defining op, last reader]. */
int memory_plan_check(Func *f, int target, char *err, size_t errlen) {
  int n = func_number(f);
  int64_t *def = malloc(sizeof(int64_t) * ((size_t)n + 1)), *last = malloc(sizeof(int64_t) * ((size_t)n + 1));
  Value **val = calloc((size_t)n + 1, sizeof *val);
  for (int i = 0; i < n; i++) def[i] = last[i] = -1;
  for (int i = 0; i < f->args.n; i++) {   /* arguments: written before op 0, live to their last reader */
    Value *v = f->args.items[i];
    val[v->id] = v;
  }
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) {
      val[op->results[r]->id] = op->results[r];
      def[op->results[r]->id] = i;
    }
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind != VAL_GLOBAL && last[root_of(op->operands[k])->id] < i)
        last[root_of(op->operands[k])->id] = i;
  }
  for (int i = 0; i < f->rets.n; i++) {
    Value *v = f->rets.items[i];
    if (v->kind != VAL_GLOBAL) last[root_of(v)->id] = f->ops.n;
  }
  for (int i = 0; i < f->args.n; i++) {
    Value *v = f->args.items[i];
    if (last[v->id] < 0) last[v->id] = f->ops.n;   /* never read: kept, as the planner does */
  }
  extend_in_flight(f, last);
  int rc = 0;
  for (int a = 0; a < n && !rc; a++) {
    Value *x = val[a];
    if (!x || root_of(x) != x) continue;
    if (x->offset < 0 || x->offset + value_bytes(x, target) > f->arena_bytes) {
      snprintf(err, errlen, "@%s: %%%s at %lld does not fit the arena of %lld bytes", f->name, x->name ? x->name : "?",
               (long long)x->offset, (long long)f->arena_bytes);
      rc = IR_ERUN;
      break;
    }
    int64_t xl = last[a] < 0 ? def[a] : last[a];
    for (int b = a + 1; b < n && !rc; b++) {
      Value *y = val[b];
      if (!y || root_of(y) != y) continue;
      int64_t yl = last[b] < 0 ? def[b] : last[b];
      bool live_together = def[a] < yl && def[b] < xl;
      bool share = x->offset < y->offset + value_bytes(y, target) && y->offset < x->offset + value_bytes(x, target);
      if (!live_together || !share) continue;
      /* y written in place over x by the call that reads x for the last time? */
      bool in_place = y->kind == VAL_RESULT && y->def->kind == OP_CALL && xl == def[b] && x->offset == y->offset;
      if (!in_place) {
        snprintf(err, errlen, "@%s: %%%s and %%%s are alive together and share bytes at %lld (a memory-plan bug)", f->name,
                 x->name ? x->name : "?", y->name ? y->name : "?", (long long)y->offset);
        rc = IR_ERUN;
      }
    }
  }
  free(def);
  free(last);
  free(val);
  return rc;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  int target = ctx->opt ? ctx->opt->target : TARGET_CPU;
  for (int i = 0; i < m->funcs.n; i++) {
    Func *f = m->funcs.items[i];
    if (f->is_kernel) continue;
    plan_func(f, target);
    if (ctx->opt && ctx->opt->no_self_checks) continue;
    int rc = memory_plan_check(f, target, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

const Pass pass_memory_plan = {"memory-plan", "offsets of every value in one arena per function (liveness, in place)", run};

/* ---- the report ---- */

static void human(char *buf, size_t n, int64_t bytes) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
}

/* Live bytes right after op index `at` of f (values defined at or before, read after). */
static int64_t live_after(Func *f, int at, int target) {
  int n = func_number(f);
  int64_t *last = malloc(sizeof(int64_t) * ((size_t)n + 1)), *def = malloc(sizeof(int64_t) * ((size_t)n + 1));
  for (int i = 0; i < n; i++) last[i] = def[i] = -1;
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) def[op->results[r]->id] = i;
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind != VAL_GLOBAL) last[root_of(op->operands[k])->id] = i;
  }
  int64_t bytes = 0;
  for (int i = 0; i < f->ops.n; i++) {
    Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) {
      Value *v = op->results[r];
      if (root_of(v) == v && def[v->id] <= at && last[v->id] > at) bytes += value_bytes(v, target);
    }
  }
  free(last);
  free(def);
  return bytes;
}

int64_t memory_live_peak(Func *f, int target) {
  int n = func_number(f), nops = f->ops.n;
  int64_t *last = malloc(sizeof(int64_t) * ((size_t)n + 1)), *delta = calloc((size_t)nops + 2, sizeof(int64_t));
  for (int i = 0; i < n; i++) last[i] = -1;
  for (int i = 0; i < nops; i++) {
    Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind != VAL_GLOBAL) last[root_of(op->operands[k])->id] = i;
  }
  for (int i = 0; i < f->rets.n; i++)
    if (((Value *)f->rets.items[i])->kind != VAL_GLOBAL) last[root_of(f->rets.items[i])->id] = nops;
  for (int i = 0; i < f->args.n; i++) {
    Value *v = f->args.items[i];
    delta[0] += value_bytes(v, target);
    delta[(last[v->id] < 0 ? nops : last[v->id]) + 1] -= value_bytes(v, target);
  }
  for (int i = 0; i < nops; i++) {
    Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) {
      Value *v = op->results[r];
      if (root_of(v) != v) continue;
      bool in_place = false;   /* written over an input that dies here: no bytes of its own */
      for (int k = 0; k < op->n_operands && !in_place; k++) {
        Value *in = op->operands[k];
        in_place = in->kind != VAL_GLOBAL && root_of(in) == in && last[in->id] == i && in->offset == v->offset &&
                   v->offset >= 0;
      }
      /* in place: the input's bytes (counted through op i) carry the output from op i + 1 */
      int64_t b = value_bytes(v, target), from = in_place ? i + 1 : i, to = last[v->id] < i ? i : last[v->id];
      if (from > to) continue;
      delta[from] += b;
      delta[to + 1] -= b;
    }
  }
  int64_t cur = 0, best = 0;
  for (int i = 0; i <= nops; i++) {
    cur += delta[i];
    if (cur > best) best = cur;
  }
  free(last);
  free(delta);
  return best;
}

/* The CUDA backend's 2-byte copies of the weights a bf16 program reads (ir/module.c's
   weight_copy_dtypes; codegen/cuda/lower_fuse.c places them): when any parameter has one, the
   copies mirror the whole parameter region at half its bytes.  The cpu backend has none (nor
   the CUDA program under LOOM_CUDA_NO_WEIGHT_COPIES=1, a test switch the plan ignores). */
int64_t memory_weight_copies(const Module *m, int target) { return memory_weight_copies_given(m, target, NULL, 0); }

/* A global's bytes where the target holds it: on CUDA each global starts on a 64-byte
   boundary of its region (codegen/cuda/lower.c), so its share of the region is its size
   rounded up to 64, and a region is the sum of its globals' shares. */
static int64_t global_bytes(const Global *g, int target) {
  int64_t b = type_numel(&g->value->type) * elem_bytes(&g->value->type, target);
  return target == TARGET_CUDA ? (b + 63) / 64 * 64 : b;
}

int64_t memory_weight_copies_given(const Module *m, int target, const FuncFigures *given, int n_given) {
  if (target != TARGET_CUDA || m->globals.n == 0) return 0;
  DType *copy = malloc(sizeof(DType) * (size_t)m->globals.n);
  bool *before = n_given > 0 ? calloc((size_t)m->funcs.n + 1, 1) : NULL;
  for (int i = 0; before && i < n_given && i < m->funcs.n; i++) before[i] = given[i].given;
  int n = copy && (before || n_given <= 0) ? weight_copy_dtypes_before_fuse(m, copy, before) : -1;
  free(copy);
  free(before);
  if (n <= 0) return 0;
  int64_t params = 0;
  for (int i = 0; i < m->globals.n; i++) {
    const Global *g = m->globals.items[i];
    if (g->kind == GLOBAL_PARAM) params += global_bytes(g, target);
  }
  return (params / 2 + 63) / 64 * 64;   /* the copies' region after the parameters', 64-byte aligned (lower_fuse.c) */
}

int64_t memory_planned_peak(const Module *m, int target, int64_t *state, int64_t *arena) {
  int64_t st = 0, ar = 0;
  for (int i = 0; i < m->globals.n; i++) {
    const Global *g = m->globals.items[i];
    st += global_bytes(g, target);
  }
  st += memory_weight_copies(m, target);
  for (int i = 0; i < m->funcs.n; i++) {
    const Func *f = m->funcs.items[i];
    if (!f->is_kernel && memory_func_arena(f, target) > ar) ar = memory_func_arena(f, target);
  }
  if (state) *state = st;
  if (arena) *arena = ar;
  return st + ar;
}

int64_t memory_activations(Func *f, int target) {
  const Value *loss = f->rets.n ? f->rets.items[f->rets.n - 1] : NULL;
  if (!loss || loss->kind != VAL_RESULT) return 0;
  for (int k = 0; k < f->ops.n; k++)
    if (f->ops.items[k] == loss->def) return live_after(f, k, target);
  return 0;
}

void memory_report(FILE *out, Module *m, int target) {
  int64_t params = 0, grads = 0, optim = 0, other = 0;
  for (int i = 0; i < m->globals.n; i++) {
    const Global *g = m->globals.items[i];
    int64_t b = global_bytes(g, target);
    if (g->kind == GLOBAL_PARAM) params += b;
    else if (!strncmp(g->name, GRAD_PREFIX, strlen(GRAD_PREFIX))) grads += b;
    else if (!strncmp(g->name, ADAM_M_PREFIX, strlen(ADAM_M_PREFIX)) || !strncmp(g->name, ADAM_V_PREFIX, strlen(ADAM_V_PREFIX)))
      optim += b;
    else other += b;
  }
  char a[32], b[32], c[32], d[32], e[32], t[32];
  fprintf(out, "memory plan of @%s, per rank (storage: %s):\n", m->name,
          target == TARGET_CUDA ? "cuda, each dtype's size" : "cpu, 4 bytes per element");
  human(a, sizeof a, params);
  human(b, sizeof b, grads);
  human(c, sizeof c, optim);
  fprintf(out, "  parameters        %12s  (%lld bytes)\n", a, (long long)params);
  fprintf(out, "  gradients         %12s  (%lld bytes)\n", b, (long long)grads);
  fprintf(out, "  optimizer state   %12s  (%lld bytes)\n", c, (long long)optim);
  if (other) {
    human(d, sizeof d, other);
    fprintf(out, "  other state       %12s  (%lld bytes)\n", d, (long long)other);
  }
  int64_t copies = m->pipe.kind ? 0 : memory_weight_copies(m, target);
  if (copies) {
    human(d, sizeof d, copies);
    fprintf(out, "  weight copies     %12s  (%lld bytes: the parameters in 2 bytes, written by AdamW)\n", d, (long long)copies);
    other += copies;
  }
  int64_t peak_arena = 0;
  for (int i = 0; i < m->funcs.n; i++) {
    Func *f = m->funcs.items[i];
    if (f->is_kernel) continue;
    if (f->arena_bytes < 0) {
      fprintf(out, "  @%s: not planned (run the memory-plan pass)\n", f->name);
      continue;
    }
    /* Activations: what the forward leaves alive for the backward, i.e. the live bytes
       right after the op that computes the returned loss.  The rest of the peak is
       workspace (backward temporaries, kernel outputs in flight). */
    int64_t act = 0;
    const Value *loss = f->rets.n ? f->rets.items[f->rets.n - 1] : NULL;
    if (!strcmp(f->name, "grad_step") && loss && loss->kind == VAL_RESULT)
      for (int k = 0; k < f->ops.n; k++)
        if (f->ops.items[k] == loss->def) act = live_after(f, k, target);
    int64_t arena = memory_func_arena(f, target), stats, scratch;
    human(d, sizeof d, arena);
    if (act) {
      human(e, sizeof e, act);
      human(t, sizeof t, arena - act);
      fprintf(out, "  @%-16s peak %12s = activations %s + workspace %s  (%lld bytes)\n", f->name, d, e, t,
              (long long)arena);
    } else {
      fprintf(out, "  @%-16s peak %12s  (%lld bytes)\n", f->name, d, (long long)arena);
    }
    memory_cuda_extra_parts(f, target, &stats, &scratch);
    if (stats > 0) {   /* the CUDA lowering's, past the arena (memory_cuda.c) */
      human(e, sizeof e, stats);
      human(t, sizeof t, scratch);
      fprintf(out, "  %-17s of which stats area %s (saved norm and attention statistics, loss rows) + scratch %s\n", "",
              e, t);
    }
    if (arena > peak_arena) peak_arena = arena;
    int64_t live = act ? memory_live_peak(f, target) : 0;
    if (live && live < f->arena_bytes - f->arena_bytes / 100) {   /* more than 1% apart (the planned arena alone) */
      human(e, sizeof e, live);
      fprintf(out, "  %-17s most alive at once %s: the rest of the arena is the first-fit plan's fragmentation\n", "", e);
    }
  }
  human(t, sizeof t, params + grads + optim + other + peak_arena);
  fprintf(out, "  total             %12s  (%lld bytes: state + the largest function arena)\n", t,
          (long long)(params + grads + optim + other + peak_arena));
}
