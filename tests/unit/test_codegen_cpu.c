/* tests/unit/test_codegen_cpu.c — the CPU backend against the reference executor.
 *
 *   kernels      every elementwise op, broadcasts (leading dims, size-1 dims, chains),
 *                reshapes, constant, iota, cast, reductions (sum/max/mean over inner,
 *                outer, middle and all dims, int sums, several outputs, several reductions),
 *                bf16/f16/f8 values, and shapes that do not share a loop nest: each kernel
 *                func is compiled (codegen/cpu -> runtime/jit), run on random inputs over
 *                its whole parallel extent and again in 3 uneven chunks (run out of order),
 *                and compared with interp_run on the same kernel func: elementwise results
 *                within 1e-6 relative, reduction results within 1e-5 (bf16: one bf16 step)
 *   in place     results written over arguments (one body per in-place pattern)
 *   models       gpt2-tiny and llama-tiny (fp32, bf16) through train,fuse,memory-plan:
 *                cpu_lower succeeds and every fused kernel matches the reference
 *   vectorized   the optimized LLVM IR of an elementwise, a gelu and a reduction kernel
 *                holds vector code (`<N x float>`); gelu calls no scalar function
 *   transcendentals  the kernels' exp and tanh within 2 ulp of libm's double exp/tanh
 *                (swept over [-110, 110]), bitwise ir/fmath.h's, and the special values
 *   lowering     a small planned program (matmul, layernorm, call, reshape, adamw, fill)
 *                through cpu_lower: steps, buffers, extents and global regions; errors for
 *                what is not lowered
 *   jit errors   bad IR text and missing symbols are reported, not crashed on
 *
 * Runs from the repository root.  One line per check; ends with "N passed, M failed".
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/cpu/cpu.h"
#include "frontend/build.h"
#include "frontend/config.h"
#include "ir/fmath.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/cpu/jit.h"
#define SPLITMIX_SEED 0x1234567887654321ull   /* this test's data since it was written */
#include "tests/unit/splitmix.h"
#include "tests/unit/check_each.h"

static double uniform(double lo, double hi) { return lo + (hi - lo) * urand(); }

/* |got - want| within k units in the last place of want */
static bool close_ulps(float got, float want, int k) {
  if (got == want) return true;
  float u = nextafterf(fabsf(want), INFINITY) - fabsf(want);
  return fabs((double)got - (double)want) <= k * (double)u;
}

/* ================================================================ kernels */

#define MAX_BUFS 80

static bool is_reduction_result(const Value *v) {
  return v->kind == VAL_RESULT && op_info(v->def->kind)->cls == CLASS_REDUCTION;
}

/* Compares JIT outputs with the reference; returns the first mismatch in `why`. */
static bool compare(const Func *k, Tensor **ref, void **bufs, double *worst, char *why, size_t n) {
  for (int r = 0; r < k->rets.n; r++) {
    const Value *v = k->rets.items[r];
    const Tensor *t = ref[r];
    bool red = is_reduction_result(v);
    double tol = red ? 1e-5 : 1e-6;
    if (red && v->type.dtype != DT_F32) tol = 8e-3;   /* reassociated sums may round to the next bf16 */
    for (int64_t i = 0; i < t->n; i++) {
      if (t->f) {
        float got = ((float *)bufs[k->args.n + r])[i], want = t->f[i];
        if (isnan(got) && isnan(want)) continue;
        double d = fabs((double)got - (double)want), scale = red ? fmax(fabs(want), 1.0) : fabs(want);
        if (got == want) continue;
        double rel = d / (scale > 0 ? scale : 1e-30);
        if (rel > *worst) *worst = rel;
        if (!(d <= tol * scale)) {
          snprintf(why, n, "result %d element %lld: got %.9g, reference %.9g", r, (long long)i, got, want);
          return false;
        }
      } else {
        int32_t got = ((int32_t *)bufs[k->args.n + r])[i];
        if (got != (int32_t)t->i[i]) {
          snprintf(why, n, "result %d element %lld: got %d, reference %lld", r, (long long)i, got, (long long)t->i[i]);
          return false;
        }
      }
    }
  }
  return true;
}

static void poison_outputs(const Func *k, void **bufs) {
  for (int r = 0; r < k->rets.n; r++) {
    const Value *v = k->rets.items[r];
    int64_t n = type_numel(&v->type);
    if (dtype_is_float(v->type.dtype))
      for (int64_t i = 0; i < n; i++) ((float *)bufs[k->args.n + r])[i] = NAN;
    else
      for (int64_t i = 0; i < n; i++) ((int32_t *)bufs[k->args.n + r])[i] = 0x7eadbeef;
  }
}

/* Runs kernel k (compiled: fn) on random inputs, whole and in 3 chunks, against the
   reference.  Returns false with the reason in `why`. */
static bool run_kernel(const Func *k, JitKernelFn fn, GlobalStore *g, int64_t *extent_out, double *worst, char *why,
                       size_t whylen) {
  char err[IR_ERR_LEN] = "";
  int64_t extent = 0;
  if (cpu_kernel_extent(k, &extent, err, sizeof err)) {
    snprintf(why, whylen, "extent: %s", err);
    return false;
  }
  *extent_out = extent;
  if (k->args.n + k->rets.n > MAX_BUFS) {
    snprintf(why, whylen, "more than %d buffers", MAX_BUFS);
    return false;
  }
  Tensor *args[MAX_BUFS] = {0}, *ref[MAX_BUFS] = {0};
  void *bufs[MAX_BUFS] = {0};
  for (int a = 0; a < k->args.n; a++) {
    const Type *t = &((const Value *)k->args.items[a])->type;
    args[a] = tensor_new(t);
    int64_t n = args[a]->n;
    bufs[a] = calloc((size_t)(n ? n : 1), 4);
    for (int64_t i = 0; i < n; i++) {
      if (args[a]->f) {
        float x = dtype_round(t->dtype, (float)uniform(-2, 2));
        args[a]->f[i] = x;
        ((float *)bufs[a])[i] = x;
      } else {
        int64_t x = t->dtype == DT_BOOL ? (int64_t)(rng() % 2) : (int64_t)(rng() % 13) - 6;
        args[a]->i[i] = x;
        ((int32_t *)bufs[a])[i] = (int32_t)x;
      }
    }
  }
  for (int r = 0; r < k->rets.n; r++) {
    int64_t n = type_numel(&((const Value *)k->rets.items[r])->type);
    bufs[k->args.n + r] = calloc((size_t)(n ? n : 1), 4);
  }
  bool ok = false;
  if (interp_run(k, g, args, ref, err, sizeof err)) {
    snprintf(why, whylen, "the reference failed: %s", err);
  } else {
    poison_outputs(k, bufs);
    fn((char **)bufs, 0, extent);
    ok = compare(k, ref, bufs, worst, why, whylen);
    /* three uneven chunks, run last first */
    int64_t c1 = extent / 5, c2 = c1 + (extent - c1) * 2 / 3;
    if (ok) {
      poison_outputs(k, bufs);
      fn((char **)bufs, c2, extent);
      fn((char **)bufs, 0, c1);
      fn((char **)bufs, c1, c2);
      char inner[256] = "";
      ok = compare(k, ref, bufs, worst, inner, sizeof inner);
      if (!ok)
        snprintf(why, whylen, "in chunks [0,%lld) [%lld,%lld) [%lld,%lld): %s", (long long)c1, (long long)c1,
                 (long long)c2, (long long)c2, (long long)extent, inner);
    }
  }
  for (int i = 0; i < MAX_BUFS; i++) {
    tensor_free(args[i]);
    tensor_free(ref[i]);
    free(bufs[i]);
  }
  return ok;
}

/* Compiles every kernel func of m and runs each against the reference.  One line per
   kernel, or (summary) one line for all of them plus a line per failure. */
static void check_module_kernels(const char *label, Module *m, bool summary) {
  char err[IR_ERR_LEN] = "";
  char *ll = NULL;
  if (cpu_emit_llvm(m, &ll, err, sizeof err)) {
    check(false, "kernels %s: cpu_emit_llvm: %s", label, err);
    return;
  }
  int nk = 0;
  for (int i = 0; i < m->funcs.n; i++) nk += ((Func *)m->funcs.items[i])->is_kernel;
  const char **names = calloc((size_t)nk + 1, sizeof *names);
  void **fns = calloc((size_t)nk + 1, sizeof *fns);
  for (int i = 0, j = 0; i < m->funcs.n; i++)
    if (((Func *)m->funcs.items[i])->is_kernel) names[j++] = ((Func *)m->funcs.items[i])->name;
  Jit *jit = NULL;
  if (jit_load(ll, names, nk, fns, &jit, err, sizeof err)) {
    check(false, "kernels %s: jit_load: %s", label, err);
  } else {
    GlobalStore *g = globals_new(m);
    int n_ok = 0, n_serial = 0;
    double worst_all = 0;
    for (int ki = 0, fi = 0; fi < m->funcs.n; fi++) {
      const Func *k = m->funcs.items[fi];
      if (!k->is_kernel) continue;
      JitKernelFn fn = (JitKernelFn)(uintptr_t)fns[ki++];
      char why[512] = "";
      double worst = 0;
      int64_t extent = 0;
      bool ok = run_kernel(k, fn, g, &extent, &worst, why, sizeof why);
      n_ok += ok;
      int64_t N = 0;
      for (int a = 0; a < k->args.n; a++)
        if (type_numel(&((const Value *)k->args.items[a])->type) > N) N = type_numel(&((const Value *)k->args.items[a])->type);
      n_serial += extent == 1 && N > 1;
      if (worst > worst_all) worst_all = worst;
      if (!summary || !ok)
        check(ok, "kernel %s @%s: extent %lld, whole and in 3 chunks, max rel diff %.2g%s%s", label, k->name,
              (long long)extent, worst, ok ? "" : ": ", why);
    }
    if (summary)
      check(n_ok == nk, "kernels %s: %d of %d fused kernels match the reference, whole and in chunks (max rel diff "
            "%.2g; %d with parallel extent 1: reductions over all dims)", label, n_ok, nk, worst_all, n_serial);
    globals_free(g);
  }
  jit_free(jit);
  free(names);
  free(fns);
  free(ll);
}

/* Runs every kernel func of the module text through the JIT and the reference. */
static void kernel_case(const char *label, const char *text) {
  char err[IR_ERR_LEN] = "";
  Module *m = NULL;
  if (parse_module(label, text, &m, err, sizeof err) || verify_module(m, err, sizeof err))
    check(false, "kernel %s: the test IR is bad: %s", label, err);
  else
    check_module_kernels(label, m, false);
  module_free(m);
}

/* A module around one kernel func. */
static char *kmodule(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *kmodule(const char *fmt, ...) {
  static char buf[8192];
  char body[7000];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  snprintf(buf, sizeof buf, "module @t {\n%s\n}\n", body);
  return buf;
}

static void test_elementwise(void) {
  static const char *unary[] = {"neg", "exp", "tanh", "sigmoid", "gelu_tanh", "silu", "relu", "abs", "square", "sign"};
  for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++)
    kernel_case(unary[i], kmodule("  kernel func @k(%%x: f32[5,37]) -> (f32[5,37]) {\n"
                                  "    %%y = %s %%x : f32[5,37]\n    return %%y\n  }",
                                  unary[i]));
  /* ops that want positive inputs */
  static const char *positive[] = {"log", "sqrt", "rsqrt", "recip"};
  for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++)
    kernel_case(positive[i], kmodule("  kernel func @k(%%x: f32[3,41]) -> (f32[3,41]) {\n"
                                     "    %%a = abs %%x : f32[3,41]\n    %%y = %s %%a : f32[3,41]\n    return %%y\n  }",
                                     positive[i]));
  kernel_case("scale,add_scalar", kmodule("  kernel func @k(%%x: f32[7,9]) -> (f32[7,9], f32[7,9]) {\n"
                                          "    %%a = scale %%x {by=-0.37} : f32[7,9]\n"
                                          "    %%b = add_scalar %%x {value=1.25} : f32[7,9]\n    return %%a, %%b\n  }"));
  static const char *binary[] = {"add", "sub", "mul", "div", "max", "min", "gelu_tanh_grad", "silu_grad", "relu_grad"};
  for (size_t i = 0; i < sizeof binary / sizeof binary[0]; i++)
    kernel_case(binary[i], kmodule("  kernel func @k(%%x: f32[4,50], %%y: f32[4,50]) -> (f32[4,50]) {\n"
                                   "    %%z = %s %%x, %%y : f32[4,50]\n    return %%z\n  }",
                                   binary[i]));
  kernel_case("pow", kmodule("  kernel func @k(%%x: f32[4,50], %%y: f32[4,50]) -> (f32[4,50]) {\n"
                             "    %%a = abs %%x : f32[4,50]\n    %%z = pow %%a, %%y : f32[4,50]\n    return %%z\n  }"));
  kernel_case("eq,ge,where", kmodule("  kernel func @k(%%x: f32[6,11], %%y: f32[6,11]) -> (bool[6,11], f32[6,11]) {\n"
                                     "    %%r = relu %%x : f32[6,11]\n    %%ry = relu %%y : f32[6,11]\n"
                                     "    %%e = eq %%r, %%ry : bool[6,11]\n    %%g = ge %%x, %%y : bool[6,11]\n"
                                     "    %%w = where %%g, %%x, %%y : f32[6,11]\n    return %%e, %%w\n  }"));
  /* integers */
  kernel_case("int unary", kmodule("  kernel func @k(%%x: i32[3,21]) -> (i32[3,21], i32[3,21], i32[3,21], i32[3,21], i32[3,21]) {\n"
                                   "    %%a = neg %%x : i32[3,21]\n    %%b = abs %%x : i32[3,21]\n    %%c = relu %%x : i32[3,21]\n"
                                   "    %%d = square %%x : i32[3,21]\n    %%e = sign %%x : i32[3,21]\n"
                                   "    return %%a, %%b, %%c, %%d, %%e\n  }"));
  kernel_case("int binary", kmodule("  kernel func @k(%%x: i32[3,21], %%y: i32[3,21]) -> (i32[3,21], i32[3,21], i32[3,21], i32[3,21], "
                                    "i32[3,21], i32[3,21], i32[3,21], bool[3,21], bool[3,21], i32[3,21]) {\n"
                                    "    %%a = add %%x, %%y : i32[3,21]\n    %%b = sub %%x, %%y : i32[3,21]\n"
                                    "    %%c = mul %%x, %%y : i32[3,21]\n    %%d = div %%x, %%y : i32[3,21]\n"
                                    "    %%e = max %%x, %%y : i32[3,21]\n    %%f = min %%x, %%y : i32[3,21]\n"
                                    "    %%g = relu_grad %%x, %%y : i32[3,21]\n    %%h = eq %%x, %%y : bool[3,21]\n"
                                    "    %%i = ge %%x, %%y : bool[3,21]\n    %%j = where %%i, %%x, %%y : i32[3,21]\n"
                                    "    return %%a, %%b, %%c, %%d, %%e, %%f, %%g, %%h, %%i, %%j\n  }"));
}

static void test_broadcast_reshape(void) {
  kernel_case("broadcast leading dims", kmodule("  kernel func @k(%%x: f32[3,5,33], %%b: f32[33]) -> (f32[3,5,33]) {\n"
                                                "    %%bb = broadcast %%b : f32[3,5,33]\n    %%y = add %%x, %%bb : f32[3,5,33]\n"
                                                "    return %%y\n  }"));
  kernel_case("broadcast size-1 dims", kmodule("  kernel func @k(%%x: f32[6,35], %%s: f32[6,1]) -> (f32[6,35]) {\n"
                                               "    %%sb = broadcast %%s : f32[6,35]\n    %%y = mul %%x, %%sb : f32[6,35]\n"
                                               "    return %%y\n  }"));
  kernel_case("broadcast middle", kmodule("  kernel func @k(%%x: f32[2,3,4,7], %%s: f32[3,1,7]) -> (f32[2,3,4,7]) {\n"
                                          "    %%sb = broadcast %%s : f32[2,3,4,7]\n    %%y = sub %%x, %%sb : f32[2,3,4,7]\n"
                                          "    return %%y\n  }"));
  kernel_case("broadcast scalar", kmodule("  kernel func @k(%%x: f32[5,9], %%s: f32[]) -> (f32[5,9]) {\n"
                                          "    %%sb = broadcast %%s : f32[5,9]\n    %%y = div %%x, %%sb : f32[5,9]\n"
                                          "    return %%y\n  }"));
  kernel_case("broadcast chains, small iota",
              kmodule("  kernel func @k(%%x: f32[3,2,5], %%c: f32[5]) -> (f32[3,2,5]) {\n"
                      "    %%s1 = broadcast %%c : f32[1,5]\n"
                      "    %%sb = broadcast %%s1 : f32[3,2,5]\n    %%i = iota {dim=0} : f32[2,1]\n"
                      "    %%eb = broadcast %%i : f32[3,2,5]\n    %%y = add %%x, %%sb : f32[3,2,5]\n"
                      "    %%z = mul %%y, %%eb : f32[3,2,5]\n    return %%z\n  }"));
  kernel_case("reshape between N-element values",
              kmodule("  kernel func @k(%%x: f32[6,20], %%y: f32[12,10], %%c: f32[10]) -> (f32[12,10], f32[6,20]) {\n"
                      "    %%r = reshape %%x : f32[12,10]\n    %%cb = broadcast %%c : f32[12,10]\n"
                      "    %%s = add %%r, %%y : f32[12,10]\n    %%t = mul %%s, %%cb : f32[12,10]\n"
                      "    %%u = reshape %%t : f32[6,20]\n    %%v = exp %%u : f32[6,20]\n    return %%t, %%v\n  }"));
  /* [6,4] next to [4,6]: no common loop nest, so coordinates come from div/mod */
  kernel_case("incompatible shapes", kmodule("  kernel func @k(%%x: f32[6,4], %%a: f32[4], %%b: f32[6]) -> (f32[4,6]) {\n"
                                             "    %%ab = broadcast %%a : f32[6,4]\n    %%s = add %%x, %%ab : f32[6,4]\n"
                                             "    %%r = reshape %%s : f32[4,6]\n    %%bb = broadcast %%b : f32[4,6]\n"
                                             "    %%y = mul %%r, %%bb : f32[4,6]\n    return %%y\n  }"));
}

static void test_sources_casts(void) {
  kernel_case("constant", kmodule("  kernel func @k(%%x: f32[4,9]) -> (f32[4,9]) {\n"
                                  "    %%c = constant {value=0.1} : f32[4,9]\n    %%y = add %%x, %%c : f32[4,9]\n"
                                  "    return %%y\n  }"));
  kernel_case("iota", kmodule("  kernel func @k(%%x: f32[3,4,5]) -> (f32[3,4,5], i32[3,4,5], f32[3,4,5]) {\n"
                              "    %%i = iota {dim=1} : f32[3,4,5]\n    %%y = mul %%x, %%i : f32[3,4,5]\n"
                              "    %%j = iota {dim=2} : i32[3,4,5]\n    %%s = iota {dim=0} : f32[3,1,1]\n"
                              "    %%sb = broadcast %%s : f32[3,4,5]\n    %%z = add %%x, %%sb : f32[3,4,5]\n"
                              "    return %%y, %%j, %%z\n  }"));
  kernel_case("cast", kmodule("  kernel func @k(%%x: f32[5,13], %%n: i32[5,13]) -> (i32[5,13], f32[5,13], bool[5,13], bool[5,13], bf16[5,13], f32[5,13]) {\n"
                              "    %%s = scale %%x {by=3} : f32[5,13]\n    %%a = cast %%s : i32[5,13]\n"
                              "    %%b = cast %%n : f32[5,13]\n    %%r = relu %%x : f32[5,13]\n    %%c = cast %%r : bool[5,13]\n"
                              "    %%d = cast %%n : bool[5,13]\n    %%e = cast %%x : bf16[5,13]\n    %%e2 = exp %%e : bf16[5,13]\n"
                              "    %%f = cast %%e2 : f32[5,13]\n    return %%a, %%b, %%c, %%d, %%e, %%f\n  }"));
  kernel_case("bf16 chain", kmodule("  kernel func @k(%%x: bf16[8,24], %%b: bf16[24]) -> (bf16[8,24], bf16[8,24]) {\n"
                                    "    %%bb = broadcast %%b : bf16[8,24]\n    %%y = add %%x, %%bb : bf16[8,24]\n"
                                    "    %%g = gelu_tanh %%y : bf16[8,24]\n    %%c = constant {value=0.3} : bf16[8,24]\n"
                                    "    %%z = mul %%g, %%c : bf16[8,24]\n    %%w = silu_grad %%x, %%z : bf16[8,24]\n"
                                    "    return %%z, %%w\n  }"));
  kernel_case("f16 and f8", kmodule("  kernel func @k(%%x: f32[4,40]) -> (f16[4,40], f8e4m3[4,40], f8e5m2[4,40]) {\n"
                                    "    %%s = scale %%x {by=300} : f32[4,40]\n    %%a = cast %%s : f16[4,40]\n"
                                    "    %%e = exp %%a : f16[4,40]\n    %%b = cast %%s : f8e4m3[4,40]\n"
                                    "    %%c = cast %%x : f8e5m2[4,40]\n    %%d = mul %%c, %%c : f8e5m2[4,40]\n"
                                    "    return %%e, %%b, %%d\n  }"));
}

static void test_reductions(void) {
  kernel_case("sum inner", kmodule("  kernel func @k(%%x: f32[6,70]) -> (f32[6]) {\n"
                                   "    %%s = reduce_sum %%x {dims=[1]} : f32[6]\n    return %%s\n  }"));
  kernel_case("max inner", kmodule("  kernel func @k(%%x: f32[6,70]) -> (f32[6]) {\n"
                                   "    %%s = reduce_max %%x {dims=[1]} : f32[6]\n    return %%s\n  }"));
  kernel_case("mean inner", kmodule("  kernel func @k(%%x: f32[3,4,50]) -> (f32[3,4]) {\n"
                                    "    %%s = reduce_mean %%x {dims=[2]} : f32[3,4]\n    return %%s\n  }"));
  kernel_case("sum outer", kmodule("  kernel func @k(%%x: f32[2,30,45]) -> (f32[45]) {\n"
                                   "    %%s = reduce_sum %%x {dims=[0,1]} : f32[45]\n    return %%s\n  }"));
  kernel_case("max outer", kmodule("  kernel func @k(%%x: f32[30,45]) -> (f32[45]) {\n"
                                   "    %%s = reduce_max %%x {dims=[0]} : f32[45]\n    return %%s\n  }"));
  kernel_case("sum middle", kmodule("  kernel func @k(%%x: f32[3,20,11]) -> (f32[3,11]) {\n"
                                    "    %%s = reduce_sum %%x {dims=[1]} : f32[3,11]\n    return %%s\n  }"));
  kernel_case("mean outer and inner", kmodule("  kernel func @k(%%x: f32[4,9,25]) -> (f32[9]) {\n"
                                              "    %%s = reduce_mean %%x {dims=[0,2]} : f32[9]\n    return %%s\n  }"));
  kernel_case("sum all", kmodule("  kernel func @k(%%x: f32[7,33]) -> (f32[]) {\n"
                                 "    %%q = square %%x : f32[7,33]\n    %%s = reduce_sum %%q {dims=[0,1]} : f32[]\n"
                                 "    return %%s\n  }"));
  kernel_case("int sum and max", kmodule("  kernel func @k(%%x: i32[5,17]) -> (i32[5], i32[17]) {\n"
                                         "    %%s = reduce_sum %%x {dims=[1]} : i32[5]\n"
                                         "    %%m = reduce_max %%x {dims=[0]} : i32[17]\n    return %%s, %%m\n  }"));
  kernel_case("elementwise and reduction outputs (k.ir)",
              kmodule("  kernel func @k(%%x: f32[2,4], %%b: f32[4]) -> (f32[2,4], f32[2]) {\n"
                      "    %%bb = broadcast %%b : f32[2,4]\n    %%y = add %%x, %%bb : f32[2,4]\n"
                      "    %%g = gelu_tanh %%y : f32[2,4]\n    %%s = reduce_sum %%g {dims=[1]} : f32[2]\n"
                      "    return %%g, %%s\n  }"));
  kernel_case("bias grad: outputs over two dims",
              kmodule("  kernel func @k(%%dy: f32[4,8,24], %%x: f32[4,8,24]) -> (f32[24], f32[24], f32[4,8,24]) {\n"
                      "    %%m = mul %%dy, %%x : f32[4,8,24]\n    %%db = reduce_sum %%dy {dims=[0,1]} : f32[24]\n"
                      "    %%dw = reduce_sum %%m {dims=[0,1]} : f32[24]\n    %%dx = scale %%m {by=0.5} : f32[4,8,24]\n"
                      "    return %%db, %%dw, %%dx\n  }"));
  kernel_case("reductions over different dims",
              kmodule("  kernel func @k(%%x: f32[5,6,7]) -> (f32[5,7], f32[5], f32[6]) {\n"
                      "    %%a = reduce_sum %%x {dims=[1]} : f32[5,7]\n    %%b = reduce_max %%x {dims=[1,2]} : f32[5]\n"
                      "    %%c = reduce_mean %%x {dims=[0,2]} : f32[6]\n    return %%a, %%b, %%c\n  }"));
  kernel_case("reduction of a reshaped operand",
              kmodule("  kernel func @k(%%x: f32[6,40]) -> (f32[6,4]) {\n"
                      "    %%r = reshape %%x : f32[6,4,10]\n    %%e = exp %%r : f32[6,4,10]\n"
                      "    %%s = reduce_sum %%e {dims=[2]} : f32[6,4]\n    return %%s\n  }"));
  kernel_case("reduction that does not fit the space",
              kmodule("  kernel func @k(%%x: f32[6,4], %%a: f32[4]) -> (f32[4], f32[4], f32[6,4]) {\n"
                      "    %%ab = broadcast %%a : f32[6,4]\n    %%s = add %%x, %%ab : f32[6,4]\n"
                      "    %%r = reshape %%s : f32[4,6]\n    %%t = reduce_sum %%r {dims=[1]} : f32[4]\n"
                      "    %%u = reduce_max %%s {dims=[0]} : f32[4]\n    return %%t, %%u, %%s\n  }"));
  kernel_case("bf16 reductions", kmodule("  kernel func @k(%%x: bf16[4,64]) -> (bf16[4], bf16[64], bf16[4,64]) {\n"
                                         "    %%e = exp %%x : bf16[4,64]\n    %%s = reduce_sum %%e {dims=[1]} : bf16[4]\n"
                                         "    %%m = reduce_mean %%x {dims=[0]} : bf16[64]\n    return %%s, %%m, %%e\n  }"));
  kernel_case("size-1 reduced dims", kmodule("  kernel func @k(%%x: f32[5,1,8]) -> (f32[5,8]) {\n"
                                             "    %%s = reduce_sum %%x {dims=[1]} : f32[5,8]\n    return %%s\n  }"));
  kernel_case("big row sums", kmodule("  kernel func @k(%%x: f32[3,2048]) -> (f32[3]) {\n"
                                      "    %%s = reduce_sum %%x {dims=[1]} : f32[3]\n    return %%s\n  }"));
}

/* ================================================================ in place */

/* A result written over an argument (the memory plan does this for dying inputs): the
   first result lands on %a, which only the second result reads. */
static void test_inplace(void) {
  const char *text =
      "module @ip {\n"
      "  func @f(%a: f32[16,40] at 0, %b: f32[16,40] at 2560, %c: f32[40] at 5120) -> (f32[16,40], f32[16,40]) arena 7680 {\n"
      "    %o1, %o2 = call %a, %b, %c {callee=@k} : f32[16,40] at 0, f32[16,40] at 5184\n"
      "    %o3, %o4 = call %b, %o1, %c {callee=@k} : f32[16,40] at 5184, f32[16,40] at 2560\n"
      "    return %o1, %o2\n"
      "  }\n"
      "  kernel func @k(%a: f32[16,40], %b: f32[16,40], %c: f32[40]) -> (f32[16,40], f32[16,40]) {\n"
      "    %cb = broadcast %c : f32[16,40]\n    %o1 = mul %b, %cb : f32[16,40]\n"
      "    %e = exp %a : f32[16,40]\n    %o2 = add %e, %b : f32[16,40]\n    return %o1, %o2\n"
      "  }\n"
      "}\n";
  char err[IR_ERR_LEN] = "";
  Module *m = NULL;
  char *ll = NULL;
  Jit *jit = NULL;
  void *fn[1];
  const char *names[1] = {"k"};
  if (parse_module("inplace", text, &m, err, sizeof err) || verify_module(m, err, sizeof err) ||
      cpu_emit_llvm(m, &ll, err, sizeof err) || jit_load(ll, names, 1, fn, &jit, err, sizeof err)) {
    check(false, "in place: %s", err);
  } else {
    check(strstr(ll, "k.body.inplace1") && strstr(ll, "k.body.inplace2"),
          "in place: the kernel has a body for each in-place pattern of its calls");
    enum { N = 640 };
    static float a[N], a0[N], b[N], c[40], o2[N], want1[N], want2[N], b2[N];
    for (int i = 0; i < N; i++) a[i] = a0[i] = (float)uniform(-2, 2), b[i] = b2[i] = (float)uniform(-2, 2);
    for (int i = 0; i < 40; i++) c[i] = (float)uniform(-2, 2);
    for (int i = 0; i < N; i++) {
      want1[i] = b[i] * c[i % 40];
      want2[i] = fm_expf(a0[i]) + b[i];
    }
    JitKernelFn k = (JitKernelFn)(uintptr_t)fn[0];
    /* call 1: o1 over a */
    char *bufs1[5] = {(char *)a, (char *)b, (char *)c, (char *)a, (char *)o2};
    k(bufs1, 0, 300);
    k(bufs1, 300, N);
    bool ok = true;
    for (int i = 0; i < N && ok; i++) ok = a[i] == want1[i] && o2[i] == want2[i];
    check(ok, "in place: a result over an argument read only by the other result");
    /* call 2: the second result over the first argument (b2 here) */
    char *bufs2[5] = {(char *)b2, (char *)want1, (char *)c, (char *)o2, (char *)b2};
    k(bufs2, 0, N);
    ok = true;
    for (int i = 0; i < N && ok; i++) ok = o2[i] == want1[i] * c[i % 40] && b2[i] == fm_expf(b[i]) + want1[i];
    check(ok, "in place: the second result over the first argument");
  }
  jit_free(jit);
  free(ll);
  module_free(m);
}

/* ================================================================ models */

static Module *build_model(const char *path, char *err, size_t errlen) {
  RunSpec *spec = calloc(1, sizeof *spec);
  Module *m = NULL;
  int rc = spec_load(path, spec, err, errlen);
  if (!rc) rc = spec_validate(spec, err, errlen);
  char name[256];
  frontend_module_name(path, name, sizeof name);
  if (!rc) rc = frontend_build(spec, name, &m, err, errlen);
  free(spec);
  return rc ? NULL : m;
}

/* The tiny models through training, fuse and memory-plan: every program function lowers,
   every fused kernel matches the reference. */
static void test_models(void) {
  static const char *models[] = {"models/gpt2-tiny.json", "models/llama-tiny.json"};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      char err[IR_ERR_LEN] = "", label[128];
      snprintf(label, sizeof label, "%s %s", models[i], bf16 ? "bf16" : "fp32");
      Module *m = build_model(models[i], err, sizeof err);
      TrainSettings ts = train_defaults;
      ts.bf16 = bf16;
      PassOptions opt = {.train = &ts};
      if (!m || pipeline_run(m, "train,lower", &opt, err, sizeof err)) {
        check(false, "model %s: building and lowering the IR: %s", label, err);
        module_free(m);
        continue;
      }
      RtProgram p;
      int rc = cpu_lower(m, &p, NULL, err, sizeof err);
      int steps = 0, kernels = 0;
      for (int f = 0; !rc && f < p.n_funcs; f++) {
        steps += p.funcs[f].n_steps;
        for (int s = 0; s < p.funcs[f].n_steps; s++) kernels += p.funcs[f].steps[s].kind == RT_STEP_KERNEL;
      }
      check(!rc, "model %s: cpu_lower: %d functions, %d steps, %d kernel calls%s%s", label, rc ? 0 : p.n_funcs, steps,
            kernels, rc ? ": " : "", rc ? err : "");
      /* AdamW over all parameters: one in-place step per weight-decay group (2: decayed
         matrices, undecayed vectors), no assigns left, one fill per group of gradients */
      int adamw = 0, adamw_out = 0, assigns = 0, fills = 0, opt_f = -1;
      for (int f = 0; !rc && f < p.n_funcs; f++)
        if (!strcmp(p.funcs[f].name, "optimizer_step")) opt_f = f;
      for (int q = 0; opt_f >= 0 && q < p.funcs[opt_f].n_steps; q++) {
        const RtStep *st = &p.funcs[opt_f].steps[q];
        if (st->kind != RT_STEP_BUILTIN) continue;
        adamw += st->which == RT_B_ADAMW;
        adamw_out += st->which == RT_B_ADAMW && st->n_out;
        assigns += st->which == RT_B_ASSIGN;
        fills += st->which == RT_B_FILL && st->bufs[0].region == RT_REGION_GRADS;
      }
      check(!rc && adamw == 2 && adamw_out == 0 && assigns == 0 && fills == 2,
            "model %s: optimizer_step updates every parameter in %d in-place adamw steps (%d not in place), %d "
            "assigns, %d gradient fills (want 2, 0, 0, 2)", label, adamw, adamw_out, assigns, fills);
      if (!rc) rt_program_free(&p);
      check_module_kernels(label, m, true);
      module_free(m);
    }
}

/* ================================================================ vectorized */

static void test_vectorized(void) {
  const char *text = kmodule(
      "  kernel func @add(%%x: f32[64,256], %%b: f32[256]) -> (f32[64,256]) {\n"
      "    %%bb = broadcast %%b : f32[64,256]\n    %%y = add %%x, %%bb : f32[64,256]\n    return %%y\n  }\n"
      "  kernel func @gelu(%%x: f32[64,256]) -> (f32[64,256]) {\n"
      "    %%y = gelu_tanh %%x : f32[64,256]\n    return %%y\n  }\n"
      "  kernel func @rowsum(%%x: f32[64,256]) -> (f32[64]) {\n"
      "    %%s = reduce_sum %%x {dims=[1]} : f32[64]\n    return %%s\n  }\n"
      "  kernel func @colsum(%%x: f32[64,256]) -> (f32[256]) {\n"
      "    %%s = reduce_sum %%x {dims=[0]} : f32[256]\n    return %%s\n  }");
  char err[IR_ERR_LEN] = "";
  Module *m = NULL;
  char *ll = NULL, *opt = NULL;
  if (parse_module("vec", text, &m, err, sizeof err) || cpu_emit_llvm(m, &ll, err, sizeof err) ||
      jit_optimize_ir(ll, &opt, err, sizeof err)) {
    check(false, "vectorized: %s", err);
  } else {
    static const char *kernels[] = {"add", "gelu", "rowsum", "colsum"};
    for (int i = 0; i < 4; i++) {
      char head[64];
      snprintf(head, sizeof head, "define void @%s(", kernels[i]);
      const char *f = strstr(opt, head);
      const char *end = f ? strstr(f, "\n}\n") : NULL;
      int width = 0;
      for (const char *p = f; p && p < end; p++) {
        int w;
        if (*p == '<' && sscanf(p, "<%d x float>", &w) == 1 && w > width) width = w;
      }
      check(width >= 4, "vectorized: kernel @%s has <%d x float> code after O2", kernels[i], width);
    }
    const char *g = strstr(opt, "define void @gelu(");
    const char *gend = g ? strstr(g, "\n}\n") : NULL;
    const char *call = g ? strstr(g, "call") : NULL;
    bool calls = false;   /* any call left in the gelu kernel other than LLVM intrinsics */
    for (; call && call < gend; call = strstr(call + 4, "call"))
      if (strncmp(call, "call ", 5) == 0 && !strstr(call, "@llvm.") ) {
        const char *eol = strchr(call, '\n'), *l = strstr(call, "@llvm.");
        if (!l || (eol && l > eol)) calls = true;
      }
    check(g && !calls, "vectorized: the gelu loop calls no scalar function (tanh is inline arithmetic)");
  }
  free(ll);
  free(opt);
  module_free(m);
}

/* ================================================================ transcendentals */

/* The kernels' own exp and tanh (vectorizable arithmetic, codegen/cpu/llvm_module.c)
   against libm's double exp/tanh, rounded: every 61st float of [-110, 110] for exp, every
   13th positive float below 12 for tanh (and its negation), plus the specials. */
static double ulp_error(float got, double exact) {
  float w = (float)exact;
  if (got == w || (isnan(got) && isnan(exact))) return 0;
  if (isinf(w) || isinf(got)) return INFINITY;
  double u = nextafterf(fabsf(w), INFINITY) - fabsf(w);   /* subnormal results: ulp 2^-149 */
  return fabs((double)got - exact) / u;
}

static void test_transcendentals(void) {
  const char *text = kmodule("  kernel func @f(%%x: f32[4096]) -> (f32[4096], f32[4096]) {\n"
                             "    %%e = exp %%x : f32[4096]\n    %%t = tanh %%x : f32[4096]\n    return %%e, %%t\n  }");
  char err[IR_ERR_LEN] = "";
  Module *m = NULL;
  char *ll = NULL;
  Jit *jit = NULL;
  void *fn[1];
  const char *names[1] = {"f"};
  if (parse_module("tr", text, &m, err, sizeof err) || cpu_emit_llvm(m, &ll, err, sizeof err) ||
      jit_load(ll, names, 1, fn, &jit, err, sizeof err)) {
    check(false, "transcendentals: %s", err);
    free(ll);
    module_free(m);
    return;
  }
  JitKernelFn k = (JitKernelFn)(uintptr_t)fn[0];
  enum { N = 4096 };
  static float x[N], e[N], t[N];
  char *bufs[3] = {(char *)x, (char *)e, (char *)t};
  double worst_e = 0, worst_t = 0;
  float at_e = 0, at_t = 0;
  int64_t n_e = 0, n_t = 0, n_diff = 0;
  /* exp over [-110, 110]: bit patterns of positive floats up to 110, both signs */
  uint32_t top;
  float lim = 110.0f;
  memcpy(&top, &lim, 4);
  int fill = 0;
  for (uint32_t u = 0;; u += 61) {
    bool last = u > top;
    if (!last) {
      float v;
      memcpy(&v, &u, 4);
      x[fill++] = v;
      x[fill++] = -v;
    }
    if (fill >= N - 1 || (last && fill)) {
      k(bufs, 0, fill);
      for (int i = 0; i < fill; i++) {
        float fe = fm_expf(x[i]), ft = fm_tanhf(x[i]);
        if (memcmp(&fe, &e[i], 4) || memcmp(&ft, &t[i], 4)) n_diff++;
        double de = ulp_error(e[i], exp((double)x[i]));
        if (de > worst_e) worst_e = de, at_e = x[i];
        if (fabsf(x[i]) < 12.0f) {
          double dt = ulp_error(t[i], tanh((double)x[i]));
          if (dt > worst_t) worst_t = dt, at_t = x[i];
          n_t++;
        }
      }
      n_e += fill;
      fill = 0;
    }
    if (last) break;
  }
  check(worst_e <= 2.0, "transcendentals: exp within 2 ulp of exact over %lld points of [-110, 110] (worst %.2f at %g)",
        (long long)n_e, worst_e, at_e);
  check(worst_t <= 2.0, "transcendentals: tanh within 2 ulp of exact over %lld points of (-12, 12) (worst %.2f at %g)",
        (long long)n_t, worst_t, at_t);
  check(n_diff == 0, "transcendentals: the JIT kernel gives bitwise ir/fmath.h's fm_expf and fm_tanhf (%lld of %lld differ)",
        (long long)n_diff, (long long)n_e);
  static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 100.0f, -100.0f, 88.7f, -87.0f, -120.0f, 0.55f, 9.0f};
  int nsp = (int)(sizeof sp / sizeof sp[0]);
  memcpy(x, sp, sizeof sp);
  k(bufs, 0, nsp);
  bool ok = true;
  for (int i = 0; i < nsp; i++) {
    float we = expf(sp[i]), wt = tanhf(sp[i]);
    ok = ok && (isnan(we) ? isnan(e[i]) : close_ulps(e[i], we, 2) || (we < 1e-37f && e[i] < 1e-37f));
    ok = ok && (isnan(wt) ? isnan(t[i]) : close_ulps(t[i], wt, 2) && signbit(t[i]) == signbit(wt));
    if (!ok) {
      check(false, "transcendentals: special %g: exp %g (libm %g), tanh %g (libm %g)", sp[i], e[i], we, t[i], wt);
      break;
    }
  }
  if (ok) check(true, "transcendentals: +-0, +-inf, NaN, overflow, underflow and the branch points agree with libm");
  jit_free(jit);
  free(ll);
  module_free(m);
}

/* ================================================================ lowering */

static const char *program_text =
    "module @p {\n"
    "  mesh dp=1 tp=1 cp=1 pp=1 ep=1\n"
    "  param $w : f32[16,8] = normal(0.02)\n"
    "  param $ln.weight : f32[8] = ones\n"
    "  param $ln.bias : f32[8] = zeros\n"
    "  state $grad.w : f32[16,8] = zeros\n"
    "  state $adam_m.w : f32[16,8] = zeros\n"
    "  state $adam_v.w : f32[16,8] = zeros\n"
    "  param $e : bf16[4] = zeros\n"
    "  func @forward(%x: f32[2,4,16] at 0, %q: f32[3,8,16] at 1344) -> (f32[2,4,8], f32[2,4], f32[3,8,8]) arena 3904 {\n"
    "    %h = matmul %x, $w : f32[2,4,8] at 512\n"
    "    %y = layernorm %h, $ln.weight, $ln.bias {eps=1e-05} : f32[2,4,8] at 768\n"
    "    %g, %s = call %y, $ln.bias {callee=@k0} : f32[2,4,8] at 1024, f32[2,4] at 1280\n"
    "    %r = reshape %g : f32[8,8] at 1024\n"
    "    %r2 = reshape %g : f32[8,8] at 2880\n"
    "    %qq = matmul %q, %q {tb=true} : f32[3,8,8] at 3136\n"
    "    return %g, %s, %qq\n"
    "  }\n"
    "  func @opt(%lr: f32[] at 0, %t: f32[] at 64, %gs: f32[] at 128) -> () arena 1728 {\n"
    "    %p2, %m2, %v2 = adamw $w, $adam_m.w, $adam_v.w, $grad.w, %gs, %lr, %t {beta1=0.9, beta2=0.95, eps=1e-08, "
    "weight_decay=0.1} : f32[16,8] at 192, f32[16,8] at 704, f32[16,8] at 1216\n"
    "    assign $w, %p2\n"
    "    fill $grad.w {value=0}\n"
    "    return\n"
    "  }\n"
    "  kernel func @k0(%y: f32[2,4,8], %b: f32[8]) -> (f32[2,4,8], f32[2,4]) {\n"
    "    %bb = broadcast %b : f32[2,4,8]\n"
    "    %a = add %y, %bb : f32[2,4,8]\n"
    "    %t = tanh %a : f32[2,4,8]\n"
    "    %s = reduce_sum %t {dims=[2]} : f32[2,4]\n"
    "    return %t, %s\n"
    "  }\n"
    "}\n";

static bool buf_is(const RtBuf *b, RtRegion region, int64_t offset, int64_t n) {
  return b->region == region && b->offset == offset && b->n == n;
}

static void test_lowering(void) {
  char err[IR_ERR_LEN] = "";
  Module *m = NULL;
  if (parse_module("program", program_text, &m, err, sizeof err) || verify_module(m, err, sizeof err)) {
    check(false, "lowering: the test program is bad: %s", err);
    module_free(m);
    return;
  }
  RtProgram p;
  char *ll = NULL;
  if (!check(!cpu_lower(m, &p, &ll, err, sizeof err), "lowering: cpu_lower%s%s", err[0] ? ": " : "", err)) {
    module_free(m);
    return;
  }
  check(p.n_funcs == 2 && !strcmp(p.funcs[0].name, "forward") && !strcmp(p.funcs[1].name, "opt"),
        "lowering: two program functions, forward and opt");
  check(p.n_kernels == 1 && !strcmp(p.kernel_names[0], "k0"), "lowering: one kernel, k0");
  /* globals */
  const RtGlobal *gl = p.globals;
  check(p.n_globals == 7 && gl[0].region == RT_REGION_PARAMS && gl[0].offset == 0 && gl[0].n == 128 &&
            gl[0].init == RT_INIT_NORMAL && gl[0].init_value == 0.02 && gl[0].rank == 2 && gl[0].shape[1] == 8 &&
            gl[1].region == RT_REGION_PARAMS && gl[1].offset == 512 && gl[1].init == RT_INIT_ONES &&
            gl[2].region == RT_REGION_PARAMS && gl[2].offset == 576 && gl[3].region == RT_REGION_GRADS &&
            gl[3].offset == 0 && gl[4].region == RT_REGION_OPTIM && gl[4].offset == 0 &&
            gl[5].region == RT_REGION_OPTIM && gl[5].offset == 512 && gl[6].region == RT_REGION_PARAMS &&
            gl[6].offset == 640 && gl[6].round == RT_ROUND_BF16,
        "lowering: globals in regions params/grads/optim at 64-byte aligned offsets");
  check(p.region_bytes[RT_REGION_PARAMS] == 704 && p.region_bytes[RT_REGION_GRADS] == 512 &&
            p.region_bytes[RT_REGION_OPTIM] == 1024,
        "lowering: region sizes %lld/%lld/%lld", (long long)p.region_bytes[RT_REGION_PARAMS],
        (long long)p.region_bytes[RT_REGION_GRADS], (long long)p.region_bytes[RT_REGION_OPTIM]);
  const RtFunc *f = &p.funcs[0];
  check(f->arena_bytes == 3904 && f->n_args == 2 && f->n_rets == 3 && buf_is(&f->args[0], RT_REGION_ARENA, 0, 128) &&
            buf_is(&f->rets[1], RT_REGION_ARENA, 1280, 8),
        "lowering: forward's arena, arguments and results");
  check(f->n_steps == 5, "lowering: forward has 5 steps (the in-place reshape has none), got %d", f->n_steps);
  if (f->n_steps == 5) {
    const RtStep *s = f->steps;
    check(s[0].kind == RT_STEP_GEMM && s[0].n_in == 2 && s[0].n_out == 1 && s[0].i[0] == 2 && s[0].i[1] == 4 &&
              s[0].i[2] == 8 && s[0].i[3] == 16 && s[0].i[4] == 0 && s[0].i[5] == 0 && s[0].i[6] == 64 &&
              s[0].i[7] == 0 && s[0].i[8] == 32 && buf_is(&s[0].bufs[1], RT_REGION_PARAMS, 0, 128) &&
              buf_is(&s[0].bufs[2], RT_REGION_ARENA, 512, 64),
          "lowering: matmul -> GEMM batch 2, M 4, N 8, K 16, strides 64/0/32 (weight shared)");
    check(s[1].kind == RT_STEP_BUILTIN && s[1].which == RT_B_LAYERNORM && s[1].n_in == 3 && s[1].n_out == 1 &&
              s[1].i[0] == 8 && s[1].i[1] == 8 && s[1].f[0] == 1e-05 && buf_is(&s[1].bufs[1], RT_REGION_PARAMS, 512, 8) &&
              buf_is(&s[1].bufs[2], RT_REGION_PARAMS, 576, 8) && buf_is(&s[1].bufs[3], RT_REGION_ARENA, 768, 64),
          "lowering: layernorm -> builtin, rows 8, D 8, eps, params buffers");
    check(s[2].kind == RT_STEP_KERNEL && s[2].which == 0 && s[2].i[0] == 8 && s[2].n_in == 2 && s[2].n_out == 2 &&
              buf_is(&s[2].bufs[2], RT_REGION_ARENA, 1024, 64) && buf_is(&s[2].bufs[3], RT_REGION_ARENA, 1280, 8) &&
              !strcmp(s[2].label, "call @k0"),
          "lowering: call -> kernel 0, extent 8 (kept dims of the row sum)");
    check(s[3].kind == RT_STEP_BUILTIN && s[3].which == RT_B_COPY && s[3].i[0] == 64 &&
              buf_is(&s[3].bufs[1], RT_REGION_ARENA, 2880, 64),
          "lowering: reshape to another offset -> copy");
    check(s[4].kind == RT_STEP_GEMM && s[4].i[0] == 3 && s[4].i[1] == 8 && s[4].i[2] == 8 && s[4].i[3] == 16 &&
              s[4].i[5] == 1 && s[4].i[6] == 128 && s[4].i[7] == 128 && s[4].i[8] == 64,
          "lowering: batched matmul with tb -> strides 128/128/64");
  }
  const RtFunc *o = &p.funcs[1];
  const RtStep *os = o->steps;
  check(o->n_steps == 3 && os[0].which == RT_B_ADAMW && os[0].n_in == 7 && os[0].n_out == 3 && os[0].i[0] == 128 &&
            os[0].f[1] == 0.95 && buf_is(&os[0].bufs[2], RT_REGION_OPTIM, 512, 128) &&
            buf_is(&os[0].bufs[3], RT_REGION_GRADS, 0, 128) && buf_is(&os[0].bufs[9], RT_REGION_ARENA, 1216, 128) &&
            os[1].which == RT_B_ASSIGN && os[1].n_in == 2 && os[1].n_out == 0 && os[1].i[0] == 128 &&
            buf_is(&os[1].bufs[0], RT_REGION_PARAMS, 0, 128) && os[2].which == RT_B_FILL && os[2].n_in == 0 &&
            os[2].n_out == 1 && buf_is(&os[2].bufs[0], RT_REGION_GRADS, 0, 128),
        "lowering: adamw (7 in, 3 out), assign and fill on globals");
  /* the kernel text loads and runs like the test kernels */
  const char *names[1] = {"k0"};
  void *fn[1];
  Jit *jit = NULL;
  check(ll && !jit_load(ll, names, 1, fn, &jit, err, sizeof err), "lowering: the program's kernels load%s%s",
        err[0] ? ": " : "", err);
  jit_free(jit);
  free(ll);
  rt_program_free(&p);
  check(p.funcs == NULL && p.n_funcs == 0, "lowering: rt_program_free");
  module_free(m);

  /* errors name the op */
  static const struct { const char *what, *text, *expect; } bad[] = {
    {"elementwise outside a kernel",
     "module @e {\n  func @f(%x: f32[4] at 0) -> (f32[4]) arena 128 {\n    %y = exp %x : f32[4] at 64\n    return %y\n  }\n}\n",
     "fuse"},
    {"no memory plan", "module @e {\n  func @f(%x: f32[4]) -> (f32[4]) {\n    %y = softmax %x : f32[4]\n    return %y\n  }\n}\n",
     "memory-plan"},
    {"unaligned offset",
     "module @e {\n  func @f(%x: f32[4] at 0) -> (f32[4]) arena 128 {\n    %y = softmax %x : f32[4] at 20\n    return %y\n  }\n}\n",
     "aligned"},
    {"reduction used inside a kernel",
     "module @e {\n  func @f(%x: f32[4,8] at 0) -> (f32[4,8]) arena 256 {\n    %y = call %x {callee=@k} : f32[4,8] at 128\n"
     "    return %y\n  }\n  kernel func @k(%x: f32[4,8]) -> (f32[4,8]) {\n    %m = reduce_max %x {dims=[1]} : f32[4]\n"
     "    %r = reshape %m : f32[4,1]\n    %b = broadcast %r : f32[4,8]\n    %y = sub %x, %b : f32[4,8]\n    return %y\n  }\n}\n",
     "reduction result"},
    {"in place over a broadcast argument",
     "module @e {\n  func @f(%x: f32[4,8] at 0, %c: f32[8] at 128) -> (f32[4,8]) arena 256 {\n"
     "    %y = call %x, %c {callee=@k} : f32[4,8] at 128\n    return %y\n  }\n  kernel func @k(%x: f32[4,8], %c: f32[8]) -> (f32[4,8]) {\n"
     "    %b = broadcast %c : f32[4,8]\n    %y = add %x, %b : f32[4,8]\n    return %y\n  }\n}\n",
     "shares memory"},
    {"in place under a reduction",
     "module @e {\n  func @f(%x: f32[8] at 0) -> (f32[8]) arena 128 {\n    %y = call %x {callee=@k} : f32[8] at 0\n"
     "    return %y\n  }\n  kernel func @k(%x: f32[8]) -> (f32[8]) {\n    %b = broadcast %x : f32[4,8]\n"
     "    %y = reduce_sum %b {dims=[0]} : f32[8]\n    return %y\n  }\n}\n",
     "shares memory"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    Module *em = NULL;
    RtProgram ep;
    err[0] = 0;
    int prc = parse_module(bad[i].what, bad[i].text, &em, err, sizeof err);
    int rc = prc ? -1 : cpu_lower(em, &ep, NULL, err, sizeof err);
    check(rc > 0 && strstr(err, bad[i].expect), "lowering error: %s: %s", bad[i].what, err);
    module_free(em);
  }
}

/* ================================================================ jit errors */

static void test_jit_errors(void) {
  char err[IR_ERR_LEN] = "";
  Jit *jit = NULL;
  void *fn[1];
  const char *names[1] = {"nothere"};
  int rc = jit_load("define void @f( {", names, 1, fn, &jit, err, sizeof err);
  check(rc && !jit && strstr(err, "parse"), "jit error: bad IR text: %s", err);
  err[0] = 0;
  rc = jit_load("define void @f() {\n  ret void\n}\n", names, 1, fn, &jit, err, sizeof err);
  check(rc && !jit && strstr(err, "nothere"), "jit error: missing symbol: %s", err);
}

int main(void) {
  clock_t t0 = clock();
  test_elementwise();
  test_broadcast_reshape();
  test_sources_casts();
  test_reductions();
  test_inplace();
  test_models();
  test_vectorized();
  test_transcendentals();
  test_lowering();
  test_jit_errors();
  printf("(%.1f s)\n", (double)(clock() - t0) / CLOCKS_PER_SEC);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
