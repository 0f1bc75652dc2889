/* codegen/cpu/llvm_module.c — the LLVM IR text of all kernel funcs of a module.
 *
 * Per kernel: its in-place patterns (call sites where a result is an argument's memory:
 * each gets its own body, see llvm_kernel.c), then either its code or, when an earlier
 * kernel has the same ops, types, attributes and patterns, an LLVM alias of that one (the
 * fuse pass makes one kernel per call, so the layers of a model repeat them).  Before the
 * kernels: the helpers (exp and tanh as vectorizable arithmetic, sigmoid, silu, gelu and their
 * derivatives, rounding to bf16/f16/f8), written with the formulas of ir/interp_ops.c.
 * The text is parsed and verified with the LLVM C API before it is returned.
 */
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/IRReader.h>

#include "codegen/cpu/llvm_internal.h"
#include "ir/fmath.h"

/* The in-place patterns of kernel `kf` at the calls of m: buffers of one call that are the
   same memory (same global, or same arena offset), when a result is among them. */
static int call_variants(const Module *m, const Func *kf, Variant **out) {
  int nb = kf->args.n + kf->rets.n, n = 0;
  *out = NULL;
  for (int i = 0; i < m->funcs.n; i++) {
    const Func *f = m->funcs.items[i];
    if (f->is_kernel) continue;
    for (int j = 0; j < f->ops.n; j++) {
      const Op *op = f->ops.items[j];
      if (op->kind != OP_CALL || op->callee != kf || op->n_operands + op->n_results != nb) continue;
      int *alias = malloc(sizeof(int) * (size_t)nb);
      if (!alias) return -1;
      bool result_shared = false;
      for (int b = 0; b < nb; b++) {
        const Value *v = b < op->n_operands ? op->operands[b] : op->results[b - op->n_operands];
        alias[b] = b;
        for (int c = 0; c < b; c++) {
          const Value *w = c < op->n_operands ? op->operands[c] : op->results[c - op->n_operands];
          bool same = v->kind == VAL_GLOBAL || w->kind == VAL_GLOBAL ? v->kind == w->kind && v->global == w->global
                                                                       : v->offset >= 0 && v->offset == w->offset;
          if (same) {
            alias[b] = alias[c];
            if (b >= op->n_operands) result_shared = true;
            break;
          }
        }
      }
      bool dup = !result_shared;
      for (int v = 0; v < n && !dup; v++) dup = !memcmp((*out)[v].alias, alias, sizeof(int) * (size_t)nb);
      if (dup) {
        free(alias);
        continue;
      }
      Variant *grown = realloc(*out, sizeof(Variant) * (size_t)(n + 1));
      if (!grown) {
        free(alias);
        return -1;
      }
      *out = grown;
      (*out)[n++].alias = alias;
    }
  }
  return n;
}

/* Helpers every module carries (unused ones are removed by the optimizer).  The formulas
   are those of ir/interp_ops.c, operation for operation. */
static void emit_prelude(Str *o) {
  Name c = fconst(0.7978845608028654f), a = fconst(0.044715f), k3 = fconst(3.0f * 0.044715f);
  Name half = fconst(0.5f), one = fconst(1.0f);
  str_add(o,
          "; loom CPU kernels (codegen/cpu/llvm_kernel.c)\n"
          "declare float @llvm.exp.f32(float)\n"
          "declare float @llvm.log.f32(float)\n"
          "declare float @llvm.sqrt.f32(float)\n"
          "declare float @llvm.fabs.f32(float)\n"
          "declare float @llvm.pow.f32(float, float)\n"
          "declare float @llvm.maxnum.f32(float, float)\n"
          "declare float @llvm.minnum.f32(float, float)\n"
          "declare float @llvm.nearbyint.f32(float)\n"
          "declare float @llvm.copysign.f32(float, float)\n"
          "\n");
  /* exp and tanh: ir/fmath.h's fm_expf and fm_tanhf, operation for operation (straight-line
     arithmetic the loop vectorizer turns into vector code; libm's are scalar calls). */
  {
    const double *inv_fact = FM_EXP_COEF;
    str_add(o,
            "define internal float @loom_exp(float %%x) #3 {\n"
            "  %%c0 = call float @llvm.maxnum.f32(float %%x, float %s)\n"
            "  %%xc = call float @llvm.minnum.f32(float %%c0, float %s)\n"
            "  %%t = fmul float %%xc, %s\n  %%t1 = fadd float %%t, %s\n  %%n = fsub float %%t1, %s\n"
            "  %%m1 = fmul float %%n, %s\n  %%r0 = fsub float %%xc, %%m1\n"
            "  %%m2 = fmul float %%n, %s\n  %%r = fsub float %%r0, %%m2\n",
            fconst(FM_EXP_LO).s, fconst(FM_EXP_HI).s, fconst(FM_LOG2E).s, fconst(FM_ROUNDER).s, fconst(FM_ROUNDER).s,
            fconst(FM_LN2_HI).s, fconst(FM_LN2_LO).s);
    str_add(o, "  %%p0 = fadd float 0.0, %s\n", fconst((float)inv_fact[0]).s);
    for (int i = 1; i < 8; i++)
      str_add(o, "  %%q%d = fmul float %%p%d, %%r\n  %%p%d = fadd float %%q%d, %s\n", i, i - 1, i, i,
              fconst((float)inv_fact[i]).s);
    str_add(o,
            "  %%ni = fptosi float %%n to i32\n  %%e1 = ashr i32 %%ni, 1\n  %%e2 = sub i32 %%ni, %%e1\n"
            "  %%b1 = add i32 %%e1, 127\n  %%s1 = shl i32 %%b1, 23\n  %%f1 = bitcast i32 %%s1 to float\n"
            "  %%b2 = add i32 %%e2, 127\n  %%s2 = shl i32 %%b2, 23\n  %%f2 = bitcast i32 %%s2 to float\n"
            "  %%y1 = fmul float %%p7, %%f1\n  %%y = fmul float %%y1, %%f2\n"
            "  %%nan = fcmp uno float %%x, 0.0\n  %%res = select i1 %%nan, float %%x, float %%y\n  ret float %%res\n}\n");
  }
  {
    const double *coef = FM_TANH_COEF;
    str_add(o,
            "define internal float @loom_tanh(float %%x) #3 {\n"
            "  %%a = call float @llvm.fabs.f32(float %%x)\n  %%ac = call float @llvm.minnum.f32(float %%a, float %s)\n"
            "  %%a2 = fmul float %%ac, %s\n  %%e = call float @loom_exp(float %%a2)\n"
            "  %%e1 = fadd float %%e, %s\n  %%q = fdiv float %s, %%e1\n  %%big = fsub float %s, %%q\n"
            "  %%z = fmul float %%a, %%a\n  %%p6 = fadd float 0.0, %s\n",
            fconst(FM_TANH_CLAMP).s, fconst(2.0f).s, fconst(1.0f).s, fconst(2.0f).s, fconst(1.0f).s,
            fconst((float)coef[6]).s);
    for (int i = 5; i >= 0; i--)
      str_add(o, "  %%m%d = fmul float %%p%d, %%z\n  %%p%d = fadd float %%m%d, %s\n", i, i + 1, i, i,
              fconst((float)coef[i]).s);
    str_add(o,
            "  %%az = fmul float %%a, %%z\n  %%azp = fmul float %%az, %%p0\n  %%small = fadd float %%a, %%azp\n"
            "  %%lt = fcmp olt float %%a, %s\n  %%t = select i1 %%lt, float %%small, float %%big\n"
            "  %%r = call float @llvm.copysign.f32(float %%t, float %%x)\n"
            "  %%nan = fcmp uno float %%x, 0.0\n  %%res = select i1 %%nan, float %%x, float %%r\n  ret float %%res\n}\n",
            fconst(FM_TANH_SMALL).s);
  }
  /* sigmoid = 1/(1+exp(-x)); silu = x/(1+exp(-x)) */
  str_add(o,
          "define internal float @loom_sigmoid(float %%x) #3 {\n"
          "  %%n = fneg float %%x\n  %%e = call float @loom_exp(float %%n)\n"
          "  %%d = fadd float %s, %%e\n  %%y = fdiv float %s, %%d\n  ret float %%y\n}\n",
          one.s, one.s);
  str_add(o,
          "define internal float @loom_silu(float %%x) #3 {\n"
          "  %%n = fneg float %%x\n  %%e = call float @loom_exp(float %%n)\n"
          "  %%d = fadd float %s, %%e\n  %%y = fdiv float %%x, %%d\n  ret float %%y\n}\n",
          one.s);
  /* 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) */
  str_add(o,
          "define internal float @loom_gelu_tanh(float %%x) #3 {\n"
          "  %%a1 = fmul float %s, %%x\n  %%a2 = fmul float %%a1, %%x\n  %%a3 = fmul float %%a2, %%x\n"
          "  %%s = fadd float %%x, %%a3\n  %%u = fmul float %s, %%s\n  %%t = call float @loom_tanh(float %%u)\n"
          "  %%h = fmul float %s, %%x\n  %%p = fadd float %s, %%t\n  %%y = fmul float %%h, %%p\n  ret float %%y\n}\n",
          a.s, c.s, half.s, one.s);
  /* u = c * (x + 0.044715f*x*x*x), t = tanhf(u);
     dy * (0.5f*(1+t) + 0.5f*x*(1-t*t)*c*(1 + 3*0.044715f*x*x)) */
  str_add(o,
          "define internal float @loom_gelu_tanh_grad(float %%x, float %%dy) #3 {\n"
          "  %%a1 = fmul float %s, %%x\n  %%a2 = fmul float %%a1, %%x\n  %%a3 = fmul float %%a2, %%x\n"
          "  %%s = fadd float %%x, %%a3\n  %%u = fmul float %s, %%s\n  %%t = call float @loom_tanh(float %%u)\n"
          "  %%p = fadd float %s, %%t\n  %%l = fmul float %s, %%p\n"
          "  %%h = fmul float %s, %%x\n  %%tt = fmul float %%t, %%t\n  %%om = fsub float %s, %%tt\n"
          "  %%r1 = fmul float %%h, %%om\n  %%r2 = fmul float %%r1, %s\n"
          "  %%b1 = fmul float %s, %%x\n  %%b2 = fmul float %%b1, %%x\n  %%b3 = fadd float %s, %%b2\n"
          "  %%r3 = fmul float %%r2, %%b3\n  %%g = fadd float %%l, %%r3\n  %%y = fmul float %%dy, %%g\n  ret float %%y\n}\n",
          a.s, c.s, one.s, half.s, half.s, one.s, c.s, k3.s, one.s);
  /* sg = 1/(1+expf(-x)); dy * sg * (1 + x*(1-sg)) */
  str_add(o,
          "define internal float @loom_silu_grad(float %%x, float %%dy) #3 {\n"
          "  %%sg = call float @loom_sigmoid(float %%x)\n  %%a = fmul float %%dy, %%sg\n"
          "  %%om = fsub float %s, %%sg\n  %%xo = fmul float %%x, %%om\n  %%b = fadd float %s, %%xo\n"
          "  %%y = fmul float %%a, %%b\n  ret float %%y\n}\n",
          one.s, one.s);
  /* bf16: round to nearest even on the upper 16 bits; NaN stays */
  str_add(o,
          "define internal float @loom_round_bf16(float %%x) #3 {\n"
          "  %%u = bitcast float %%x to i32\n  %%h = lshr i32 %%u, 16\n  %%b = and i32 %%h, 1\n"
          "  %%a = add i32 %%u, 32767\n  %%a2 = add i32 %%a, %%b\n  %%m = and i32 %%a2, -65536\n"
          "  %%r = bitcast i32 %%m to float\n  %%nan = fcmp uno float %%x, 0.0\n"
          "  %%y = select i1 %%nan, float %%x, float %%r\n  ret float %%y\n}\n");
  /* f16 / f8: types.c round_to_format: quantum 2^(max(exp, 1-bias) - mbits), nearbyint */
  static const struct { const char *name; int mbits, bias; float maxval; bool has_inf; } fmts[] = {
    {"f16", 10, 15, 65504.0f, true}, {"f8e4m3", 3, 7, 448.0f, false}, {"f8e5m2", 2, 15, 57344.0f, true}};
  for (int i = 0; i < 3; i++) {
    Name maxv = fconst(fmts[i].maxval), inf = name_f("0x7FF0000000000000");
    str_add(o,
            "define internal float @loom_round_%s(float %%x) #3 {\n"
            "  %%u = bitcast float %%x to i32\n  %%sh = lshr i32 %%u, 23\n  %%be = and i32 %%sh, 255\n"
            "  %%special = icmp eq i32 %%be, 255\n  %%e = sub i32 %%be, 127\n"
            "  %%lt = icmp slt i32 %%e, %d\n  %%e2 = select i1 %%lt, i32 %d, i32 %%e\n"
            "  %%qe = add i32 %%e2, %d\n  %%qb = shl i32 %%qe, 23\n  %%q = bitcast i32 %%qb to float\n"
            "  %%d = fdiv float %%x, %%q\n  %%n = call float @llvm.nearbyint.f32(float %%d)\n  %%r = fmul float %%n, %%q\n"
            "  %%ar = call float @llvm.fabs.f32(float %%r)\n  %%over = fcmp ogt float %%ar, %s\n"
            "  %%big = call float @llvm.copysign.f32(float %s, float %%x)\n"
            "  %%r2 = select i1 %%over, float %%big, float %%r\n",
            fmts[i].name, 1 - fmts[i].bias, 1 - fmts[i].bias, 127 - fmts[i].mbits, maxv.s,
            fmts[i].has_inf ? inf.s : maxv.s);
    if (fmts[i].has_inf) {
      str_add(o, "  %%y = select i1 %%special, float %%x, float %%r2\n  ret float %%y\n}\n");
    } else {
      str_add(o,
              "  %%nan = fcmp uno float %%x, 0.0\n  %%sat = call float @llvm.copysign.f32(float %s, float %%x)\n"
              "  %%sp = select i1 %%nan, float %%x, float %%sat\n"
              "  %%y = select i1 %%special, float %%sp, float %%r2\n  ret float %%y\n}\n",
              maxv.s);
    }
  }
}

static void emit_attributes(Str *o) {
  str_add(o,
          "\nattributes #0 = { nounwind }\n"
          "attributes #1 = { nounwind }\n"
          "attributes #2 = { nounwind readnone willreturn }\n"
          "attributes #3 = { nounwind readnone willreturn alwaysinline }\n");
}

/* Parses and verifies the text with LLVM: a codegen bug shows up here, with the line. */
static int check_text(const char *text, char *err, size_t errlen) {
  LLVMContextRef ctx = LLVMContextCreate();
  LLVMMemoryBufferRef buf = LLVMCreateMemoryBufferWithMemoryRangeCopy(text, strlen(text), "loom-kernels");
  LLVMModuleRef mod = NULL;
  char *msg = NULL;
  int rc = 0;
  if (LLVMParseIRInContext(ctx, buf, &mod, &msg)) {
    snprintf(err, errlen, "internal error: the generated LLVM IR does not parse: %s", msg ? msg : "?");
    rc = IR_ERUN;
  } else if (LLVMVerifyModule(mod, LLVMReturnStatusAction, &msg)) {
    snprintf(err, errlen, "internal error: the generated LLVM IR does not verify: %s", msg ? msg : "?");
    rc = IR_ERUN;
  }
  if (msg) LLVMDisposeMessage(msg);
  if (mod) LLVMDisposeModule(mod);
  LLVMContextDispose(ctx);
  return rc;
}

/* What makes two kernels the same code: their args, ops (kinds, operands by position,
   attributes, result types), results, and in-place patterns; not their names.  The fuse
   pass makes one kernel per call, so every layer of a model repeats the same kernels. */
static void kernel_key(Str *key, const Func *f, const Variant *variants, int nv) {
  func_number((Func *)f);
  char t[256];
  for (int i = 0; i < f->args.n; i++) str_add(key, "a %s;", type_str(&((const Value *)f->args.items[i])->type, t, sizeof t));
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    const OpInfo *info = op_info(op->kind);
    str_add(key, "o %d", (int)op->kind);
    for (int j = 0; j < op->n_operands; j++) {
      const Value *v = op->operands[j];
      if (v->kind == VAL_GLOBAL) str_add(key, " $%s", v->global->name);
      else str_add(key, " %d", v->id);
    }
    for (int j = 0; j < info->n_attrs; j++) {
      const Attr *a = &op->attrs[j];
      uint64_t fb;
      memcpy(&fb, &a->f, 8);
      str_add(key, " {%d %d %lld %llx %d", (int)a->kind, (int)a->set, (long long)a->i, (unsigned long long)fb, a->n);
      for (int q = 0; q < a->n; q++) str_add(key, ",%lld", (long long)a->ints[q]);
      str_add(key, " %s}", a->s ? a->s : "");
    }
    for (int r = 0; r < op->n_results; r++) str_add(key, " : %s", type_str(&op->results[r]->type, t, sizeof t));
    str_add(key, ";");
  }
  for (int i = 0; i < f->rets.n; i++) {
    const Value *v = f->rets.items[i];
    str_add(key, "r %d;", v->kind == VAL_GLOBAL ? -1 : v->id);
  }
  for (int v = 0; v < nv; v++) {
    str_add(key, "v");
    for (int b = 0; b < f->args.n + f->rets.n; b++) str_add(key, " %d", variants[v].alias[b]);
    str_add(key, ";");
  }
}

static uint64_t hash_str(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

int cpu_emit_llvm(const Module *m, char **llvm_ir_text, char *err, size_t errlen) {
  *llvm_ir_text = NULL;
  Str body = {0}, all = {0};
  int rc = 0, n_unique = 0;
  /* kernels already emitted: key hash, key, name */
  int cap = m->funcs.n + 1;
  uint64_t *hashes = calloc((size_t)cap, sizeof *hashes);
  char **keys = calloc((size_t)cap, sizeof *keys);
  const char **names = calloc((size_t)cap, sizeof *names);
  if (!hashes || !keys || !names) {
    snprintf(err, errlen, "out of memory");
    rc = IR_ERUN;
  }
  for (int i = 0; i < m->funcs.n && !rc; i++) {
    const Func *f = m->funcs.items[i];
    if (!f->is_kernel) continue;
    Variant *variants = NULL;
    int nv = call_variants(m, f, &variants);
    if (nv < 0) {
      snprintf(err, errlen, "out of memory");
      rc = IR_ERUN;
      break;
    }
    Str key = {0};
    kernel_key(&key, f, variants, nv);
    uint64_t h = key.s ? hash_str(key.s) : 0;
    int same = -1;
    for (int u = 0; u < n_unique && same < 0; u++)
      if (hashes[u] == h && key.s && !strcmp(keys[u], key.s)) same = u;
    if (same >= 0 && cpu_valid_symbol(f->name)) {
      /* the same code under another name */
      str_add(&body, "\n; kernel @%s: the same code as @%s\n@\"%s\" = alias void (i8**, i64, i64), "
              "void (i8**, i64, i64)* @\"%s\"\n", f->name, names[same], f->name, names[same]);
      free(key.s);
    } else {
      KernelGen *k = calloc(1, sizeof *k);
      if (!k) {
        snprintf(err, errlen, "out of memory");
        rc = IR_ERUN;
        free(key.s);
      } else {
        k->f = f;
        k->o = &body;
        k->err = err;
        k->errlen = errlen;
        rc = cpu_emit_kernel(k, variants, nv);
        free(k->memo);
        free(k->buf);
        free(k);
        hashes[n_unique] = h;
        keys[n_unique] = key.s ? key.s : calloc(1, 1);
        names[n_unique++] = f->name;
      }
    }
    for (int v = 0; v < nv; v++) free(variants[v].alias);
    free(variants);
  }
  if (!rc) {
    emit_prelude(&all);
    if (body.s) str_add(&all, "%s", body.s);
    emit_attributes(&all);
    if (all.oom || body.oom) {
      snprintf(err, errlen, "out of memory writing LLVM IR");
      rc = IR_ERUN;
    }
  }
  for (int u = 0; u < n_unique; u++) free(keys[u]);
  free(hashes);
  free(keys);
  free(names);
  free(body.s);
  if (!rc) rc = check_text(all.s, err, errlen);
  if (rc) {
    free(all.s);
    return rc;
  }
  *llvm_ir_text = all.s;
  return 0;
}
