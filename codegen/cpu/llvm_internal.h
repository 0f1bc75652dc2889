/* codegen/cpu/llvm_internal.h — what the files of the LLVM kernel emitter share (private
 * to codegen/cpu).
 *
 *   llvm_space.c   the iteration space of a kernel: boundaries, loop dims, parallel dims,
 *                  reductions (cpu_kernel_extent)
 *   llvm_kernel.c  one kernel -> LLVM IR text: values, loop nests, bodies, entry point
 *   llvm_module.c  the module: helpers, in-place variants, deduplication, checking
 *                  (cpu_emit_llvm)
 */
#ifndef LOOM_CODEGEN_CPU_LLVM_INTERNAL_H
#define LOOM_CODEGEN_CPU_LLVM_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cpu/cpu.h"
#include "codegen/text.h"

#define SPACE_MAX 16   /* loop dims of one kernel */
#define NAME_LEN 48

/* An SSA name ("%t12") or a constant ("0x3FE0000000000000", "7"). */
typedef struct {
  char s[NAME_LEN];
} Name;

static inline Name name_f(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline Name name_f(const char *fmt, ...) {
  Name n;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(n.s, sizeof n.s, fmt, ap);
  va_end(ap);
  return n;
}

/* Float constants as LLVM wants them: the hex bits of the double holding the f32 value. */
static inline Name fconst(float f) {
  double d = f;
  uint64_t u;
  memcpy(&u, &d, 8);
  return name_f("0x%016llX", (unsigned long long)u);
}
static inline Name iconst(int64_t v) { return name_f("%lld", (long long)v); }
static inline bool is_zero(Name n) { return !strcmp(n.s, "0"); }

/* ---------------------------------------------------------------- kernels */

typedef struct { int64_t lo, hi, ystride; } KeptRun;   /* coord_range(lo, hi) * ystride */
typedef struct { int64_t lo, hi; bool reduced; } RedRun;

/* A reduction result returned by the kernel (one per result slot). */
typedef struct {
  const Op *op;
  int slot;                 /* index among the kernel's results */
  DType dt;
  bool is_float, is_max, is_mean;
  int64_t count;            /* operand elements per output element */
  int64_t out_n;            /* output elements */
  bool regular;             /* its runs are space boundaries */
  bool reduced[SPACE_MAX];  /* per space dim (regular only) */
  int n_kept;
  KeptRun kept[IR_MAX_RANK];   /* kept runs of the operand: output index terms */
  int n_runs;
  RedRun runs[IR_MAX_RANK];
  bool in_register;         /* accumulates in a phi across the innermost loop */
  Name init, acc, next, out, val, ptr;   /* register accumulation */
} Red;

/* One kernel being compiled: its iteration space (llvm_space.c), then the state of the
   text being written (llvm_kernel.c). */
typedef struct {
  const Func *f;
  int64_t N;                    /* elements of the space */
  int nb;
  int64_t bnd[SPACE_MAX + 1];   /* ascending, 1 .. N */
  int nd;
  int64_t size[SPACE_MAX], P[SPACE_MAX];   /* outermost first; P: elements per step */
  bool par[SPACE_MAX];          /* parallel: kept by every reduction */
  int n_par;
  int64_t extent;               /* the parallel extent (cpu.h) */
  int n_red;
  Red red[IR_MAX_RESULTS];
  /* emission */
  Str *o;
  int tmp, label;
  char block[NAME_LEN];
  Name coord[SPACE_MAX];
  Name flat;
  Name *memo;       /* per value id: the value at the current point ("" = not yet) */
  Name *buf;        /* per buffer (arguments, then results): its pointer in the body */
  int n_ids;
  char *err;
  size_t errlen;
  int rc;
} KernelGen;

/* Buffers that are one and the same memory at a call site: alias[b] is the first buffer
   (arguments, then results) with b's place, or b itself.  A kernel gets one body per
   pattern its calls use; the entry point picks the body by comparing the pointers. */
typedef struct {
  int *alias;   /* n_args + n_rets */
} Variant;

static inline int64_t prod(const Type *t, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; d++) p *= t->dims[d];
  return p;
}

static inline bool is_float_t(const Type *t) { return dtype_is_float(t->dtype); }

static inline int kfail(KernelGen *k, const Op *op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int kfail(KernelGen *k, const Op *op, const char *fmt, ...) {
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

/* Runs of a shape: maximal groups of adjacent dims (dims of size 1 skipped) with the same
   flag, innermost first; each run spans flat strides [lo, hi). */
typedef struct { int64_t lo, hi; bool flag; int first, last; } Run;
static inline int runs_of(const Type *t, const bool *flag, Run *runs) {
  int n = 0;
  for (int d = t->rank - 1; d >= 0; d--) {
    if (t->dims[d] == 1) continue;
    int64_t lo = prod(t, d + 1, t->rank), hi = prod(t, d, t->rank);
    if (n && runs[n - 1].flag == flag[d]) {
      runs[n - 1].hi = hi;
      runs[n - 1].first = d;
    } else {
      runs[n++] = (Run){lo, hi, flag[d], d, d};
    }
  }
  return n;
}

/* Is value v (a kernel argument or op result) the result of a reduction? */
static inline bool is_reduction_result(const Value *v) {
  return v->kind == VAL_RESULT && op_info(v->def->kind)->cls == CLASS_REDUCTION;
}

/* llvm_space.c: fills the analysis part of k (k->f set); 0 or the error (k->err). */
int cpu_space_analyze(KernelGen *k);
bool cpu_space_is_boundary(const KernelGen *k, int64_t b);

/* llvm_kernel.c: appends kernel k->f (entry point and one body per variant) to k->o. */
int cpu_emit_kernel(KernelGen *k, const Variant *variants, int n_variants);
bool cpu_valid_symbol(const char *s);

#endif
