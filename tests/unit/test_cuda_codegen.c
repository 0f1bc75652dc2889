/* tests/unit/test_cuda_codegen.c — the CUDA backend without a GPU: lowering (codegen/cuda)
 * and compilation with NVRTC (runtime/cuda/nvrtc.h).
 *
 *   lowering     gpt2-tiny, llama-tiny (fp32, bf16) through train,lower with target CUDA:
 *                cuda_lower succeeds; every step is a GEMM or a kernel of the program with a
 *                launch shape; buffers hold each dtype natively (bf16 values as RT_ST_BF16,
 *                round NONE) inside their region; the builtins have the kernels of their
 *                storage signature (and runtime/cuda/cuda_exec.h's cuda_program_check accepts
 *                the program); attention_grad is two steps sharing scratch past the
 *                memory plan's arena; adamw in place; long reductions split in two
 *                steps; kernel names are symbols of the translation unit
 *   a program    a hand-planned program: offsets, storage, regions with native sizes,
 *                launch shapes and i[] of matmul, layernorm (+grad), attention, a fused
 *                kernel with a row reduction
 *   errors       head size 12, a collective, a bool tensor in memory: refused, op named
 *   NVRTC        (skipped with "SKIP: NVRTC not available" lines when libnvrtc cannot be
 *                loaded) gpt2-124M and llama-1B, batch 1, seq 64 (head size 64): the
 *                translation unit compiles for sm_80 and sm_90a and the cubin defines every
 *                kernel the program names.  All four configurations compile for both
 *                (8 compiles, ~40 s on 2 cores with the sanitizers); LOOM_TEST_CUDA_QUICK=1
 *                compiles all four for sm_90a and only llama-1B bf16 for sm_80 (ctest sets it).  Times are
 *                printed.
 *   cache        a second compile of the same source is a hit (same bytes, faster); a
 *                corrupted, truncated or foreign cache entry is ignored, recompiled and
 *                replaced; a compile error returns NVRTC's log with line numbers; PTX for
 *                a virtual architecture
 *
 * Runs from the repository root.  One line per check; ends with "N passed, M failed".
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cuda/cuda.h"
#include "frontend/build.h"
#include "frontend/config.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/cuda/nvrtc.h"
#include "tests/unit/check_each.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ================================================================ helpers */

static Module *build_model(const char *path, int64_t batch, int64_t seq, bool bf16, char *err, size_t errlen) {
  RunSpec *spec = calloc(1, sizeof *spec);
  Module *m = NULL;
  int rc = spec_load(path, spec, err, errlen);
  if (!rc && batch) spec->batch = batch;
  if (!rc && seq) spec->seq = seq;
  if (!rc) rc = spec_validate(spec, err, errlen);
  char name[256];
  frontend_module_name(path, name, sizeof name);
  if (!rc) rc = frontend_build(spec, name, &m, err, errlen);
  free(spec);
  if (rc) return NULL;
  TrainSettings ts = train_defaults;
  ts.bf16 = bf16;
  PassOptions opt = {.train = &ts, .target = TARGET_CUDA};
  if (pipeline_run(m, "train,lower", &opt, err, errlen)) {
    module_free(m);
    return NULL;
  }
  return m;
}

static int st_bytes(int st) {
  return st == RT_ST_BF16 || st == RT_ST_F16 ? 2 : st == RT_ST_F8E4M3 || st == RT_ST_F8E5M2 || st == RT_ST_BOOL ? 1 : 4;
}

static bool valid_symbol(const char *s) {
  if (!*s || strlen(s) > 31 || (*s >= '0' && *s <= '9')) return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_')) return false;
  return true;
}

static int kernel_index(const RtProgram *p, const char *name) {
  for (int k = 0; k < p->n_kernels; k++)
    if (!strcmp(p->kernel_names[k], name)) return k;
  return -1;
}

static const RtStep *find_step(const RtFunc *f, const char *label_prefix, int nth) {
  for (int s = 0; s < f->n_steps; s++)
    if (!strncmp(f->steps[s].label, label_prefix, strlen(label_prefix)) && nth-- == 0) return &f->steps[s];
  return NULL;
}

static const RtFunc *find_func(const RtProgram *p, const char *name) {
  for (int i = 0; i < p->n_funcs; i++)
    if (!strcmp(p->funcs[i].name, name)) return &p->funcs[i];
  return NULL;
}

/* Structural checks of a lowered program (and the CUDA runtime's own check of what it will
   run, runtime/cuda/cuda_exec.h); returns the first problem or NULL. */
static const char *program_problem(const RtProgram *p, const Module *m, const char *tu, char *why, size_t n) {
  char rt[IR_ERR_LEN];
  if (cuda_program_check(p, rt, sizeof rt)) return snprintf(why, n, "cuda_program_check: %.400s", rt), why;
  for (int k = 0; k < p->n_kernels; k++) {
    if (!valid_symbol(p->kernel_names[k])) return snprintf(why, n, "kernel name '%s'", p->kernel_names[k]), why;
    for (int j = 0; j < k; j++)
      if (!strcmp(p->kernel_names[j], p->kernel_names[k])) return snprintf(why, n, "kernel %s twice", p->kernel_names[k]), why;
    char decl[96];
    snprintf(decl, sizeof decl, " %s(LoomArgs a)", p->kernel_names[k]);
    if (!strstr(tu, decl)) return snprintf(why, n, "the TU does not define %s", p->kernel_names[k]), why;
  }
  if (strstr(tu, "#include")) return snprintf(why, n, "the TU includes a header"), why;
  for (int fi = 0; fi < p->n_funcs; fi++) {
    const RtFunc *f = &p->funcs[fi];
    /* the first micro-batch's @grad_step (lower_grads.c) is @grad_step's program */
    const Func *irf = module_find_func(m, strcmp(f->name, RT_FUNC_FIRST_GRAD_STEP) ? f->name : "grad_step");
    bool copies = !strcmp(f->name, RT_FUNC_WEIGHT_COPIES);   /* the lowering's own (lower_fuse.c): no IR func */
    if (copies && (f->n_args || f->n_rets)) return snprintf(why, n, "@%s: arguments", f->name), why;
    if (!copies && (!irf || f->arena_bytes < irf->arena_bytes)) return snprintf(why, n, "@%s: arena", f->name), why;
    for (int s = 0; s < f->n_steps; s++) {
      const RtStep *st = &f->steps[s];
      if (st->kind == RT_STEP_KERNEL) {
        if (st->which < 0 || st->which >= p->n_kernels) return snprintf(why, n, "@%s step %d: which", f->name, s), why;
        uint64_t threads = (uint64_t)st->block[0] * st->block[1] * st->block[2];
        if (!st->grid[0] || !st->grid[1] || !st->grid[2] || !threads || threads > 1024 || threads % 32 ||
            st->grid[1] > 65535 || st->smem > 227 * 1024)
          return snprintf(why, n, "@%s step %d (%s): launch %ux%ux%u / %ux%ux%u smem %u", f->name, s, st->label,
                          st->grid[0], st->grid[1], st->grid[2], st->block[0], st->block[1], st->block[2], st->smem),
                 why;
      } else if (st->kind == RT_STEP_GEMM) {
        int64_t epi = st->i[RT_GEMM_EPI_INT];
        int n_in = 2 + !!(epi & RT_GEMM_EPI_BIAS) + !!(epi & RT_GEMM_EPI_C) + !!(epi & RT_GEMM_EPI_DGELU),
            n_out = 1 + !!(epi & RT_GEMM_EPI_GELU) + !!(epi & RT_GEMM_EPI_BGRAD);
        if (st->n_in != n_in || st->n_out != n_out || st->i[0] <= 0 || st->i[1] <= 0 || st->i[2] <= 0 || st->i[3] <= 0)
          return snprintf(why, n, "@%s step %d: GEMM fields", f->name, s), why;
      } else {
        return snprintf(why, n, "@%s step %d (%s) is a CPU builtin", f->name, s, st->label), why;
      }
      if (st->n_in + st->n_out > RT_MAX_BUFS || st->n_in + st->n_out == 0)
        return snprintf(why, n, "@%s step %d: buffer count", f->name, s), why;
      for (int b = 0; b < st->n_in + st->n_out; b++) {
        const RtBuf *bf = &st->bufs[b];
        int64_t end = bf->offset + st_bytes(bf->storage) * bf->n;
        int64_t limit = bf->region == RT_REGION_ARENA ? f->arena_bytes : p->region_bytes[bf->region];
        if (bf->round != RT_ROUND_NONE || (bf->storage == RT_ST_I32) != (bf->is_int != 0) || bf->offset % 64 ||
            end > limit || bf->n <= 0)
          return snprintf(why, n, "@%s step %d (%s) buffer %d: region %d offset %lld n %lld storage %d round %d",
                          f->name, s, st->label, b, bf->region, (long long)bf->offset, (long long)bf->n, bf->storage,
                          bf->round),
                 why;
      }
    }
  }
  return NULL;
}

/* ================================================================ lowering of the tiny models */

static void test_tiny_models(void) {
  static const char *models[] = {"models/gpt2-tiny.json", "models/llama-tiny.json"};
  for (int mi = 0; mi < 2; mi++)
    for (int bf16 = 0; bf16 <= 1; bf16++) {
      char err[IR_ERR_LEN] = "", label[128], why[512];
      snprintf(label, sizeof label, "%s %s", models[mi], bf16 ? "bf16" : "fp32");
      Module *m = build_model(models[mi], 0, 0, bf16, err, sizeof err);
      if (!check(m != NULL, "tiny %s: train,lower with target CUDA%s%s", label, m ? "" : ": ", m ? "" : err)) continue;
      RtProgram p;
      char *tu = NULL;
      int rc = cuda_lower(m, &p, &tu, err, sizeof err);
      if (!check(!rc && tu, "tiny %s: cuda_lower%s%s", label, rc ? ": " : "", rc ? err : "")) {
        module_free(m);
        continue;
      }
      int steps = 0, gemms = 0;
      for (int f = 0; f < p.n_funcs; f++)
        for (int s = 0; s < p.funcs[f].n_steps; s++) {
          steps++;
          gemms += p.funcs[f].steps[s].kind == RT_STEP_GEMM;
        }
      const char *prob = program_problem(&p, m, tu, why, sizeof why);
      check(!prob, "tiny %s: %d functions, %d steps (%d GEMMs), %d kernels: launch shapes, native storage, "
            "buffers in bounds%s%s", label, p.n_funcs, steps, gemms, p.n_kernels, prob ? ": " : "", prob ? prob : "");
      char s = bf16 ? 'b' : 'f';
      const RtFunc *gs = find_func(&p, "grad_step");
      bool gpt2 = mi == 0;
      /* the norm and its kernel */
      const RtStep *norm = gs ? find_step(gs, gpt2 ? "layernorm %" : "rmsnorm %", 0) : NULL;
      char want[64];
      if (gpt2) snprintf(want, sizeof want, "loom_layernorm_%c%c%c%c", s, s, s, s);
      else snprintf(want, sizeof want, "loom_rmsnorm_%c%c%c%c", s, s, s, s);
      check(norm && norm->which == kernel_index(&p, want) && norm->bufs[0].storage == (bf16 ? RT_ST_BF16 : RT_ST_F32) &&
                norm->i[1] == 64 && norm->i[0] == 64 && norm->grid[0] == 64 && norm->block[0] >= 32,
            "tiny %s: the first norm runs %s, rows 64, D 64, a block per row", label, want);
      /* attention forward */
      const RtStep *at = gs ? find_step(gs, "attention %", 0) : NULL;
      /* bf16: on tensor cores (two stages of K and V tiles, rows of D + 8 16-bit elements) */
      snprintf(want, sizeof want, "loom_attn_fwd%s_%c%c%c%c_16", bf16 ? "_tc" : "", s, s, s, s);
      uint32_t want_smem = bf16 ? 2 * 2 * 64 * (16 + 8) * 2 : 4 * (3 * 64 * 17 + 64 * 65);
      check(at && at->which == kernel_index(&p, want) && at->block[0] == 128 && at->grid[0] == 2 * 4 &&
                at->grid[1] == 1 && at->smem == want_smem && at->i[3] == 16 &&
                at->i[5] == (gpt2 ? 4 : 2) && at->i[6] == 1,
            "tiny %s: attention runs %s: grid (B*H, T/64), 128 threads, %u bytes of shared memory", label, want,
            at ? at->smem : 0);
      /* attention_grad: two steps, the scratch past the plan's arena */
      const RtStep *dq = gs ? find_step(gs, "attention_grad", 0) : NULL;
      const Func *irgs = module_find_func(m, "grad_step");
      bool ok = dq && dq + 1 < gs->steps + gs->n_steps && strstr(dq[1].label, "(dk dv)") && dq[1].n_in == 6 &&
                dq[1].n_out == 2 && irgs && dq[1].grid[0] == (uint32_t)(2 * (gpt2 ? 4 : 2)) && dq[1].grid[1] == 1;
      /* the forward of dq's layer (the last one: the backward runs from the last layer) */
      const RtStep *fw = NULL;
      for (int k = 0; gs && k < gs->n_steps; k++)
        if (!strncmp(gs->steps[k].label, "attention %", 11)) fw = &gs->steps[k];
      if (bf16)   /* the forward saved L2 and O (f32) in the stats area past the arena; dq one pass (lower_attn.c) */
        ok = ok && strstr(dq->label, "(dq, saved L2 and O)") && dq->n_in == 6 && dq->n_out == 2 && dq->i[8] == 1 &&
             fw && fw->n_out == 3 && fw->i[8] == 1 && fw->bufs[4].offset == dq->bufs[4].offset &&
             fw->bufs[5].offset == dq->bufs[5].offset && dq->bufs[4].offset >= irgs->arena_bytes &&
             dq->bufs[4].storage == RT_ST_F32 && dq->bufs[4].n == 2 * 4 * 32 && dq->bufs[5].storage == RT_ST_F32 &&
             dq->bufs[5].n == 2 * 32 * 4 * 16 && dq->bufs[7].offset >= irgs->arena_bytes &&
             dq[1].bufs[4].offset == dq->bufs[4].offset && dq[1].bufs[5].offset == dq->bufs[7].offset;
      else   /* f32: two passes, L and Dsum in scratch */
        ok = ok && strstr(dq->label, "(dq)") && dq->n_in == 4 && dq->n_out == 3 && dq->i[8] == 0 &&
             dq->bufs[5].offset >= irgs->arena_bytes && dq->bufs[5].storage == RT_ST_F32 &&
             dq->bufs[5].n == 2 * 4 * 32 && dq->bufs[6].offset >= dq->bufs[5].offset + 4 * dq->bufs[5].n &&
             dq[1].bufs[4].offset == dq->bufs[5].offset && dq[1].bufs[5].offset == dq->bufs[6].offset;
      check(ok, "tiny %s: attention_grad is two steps (dq; dk dv) sharing L and Dsum past the arena (bf16: L2 and O saved "
                "by the forward, dq one pass)",
            label);
      /* bf16: both on tensor cores; dk dv then in tiles of 64 keys */
      char want_dq[64], want_kv[64];
      snprintf(want_dq, sizeof want_dq, "loom_attn_dq%s_%c%c%c%c%c_16", bf16 ? "_tc" : "", s, s, s, s, s);
      snprintf(want_kv, sizeof want_kv, "loom_attn_dkdv%s_%c%c%c%c%c%c_16", bf16 ? "_tc" : "", s, s, s, s, s, s);
      check(dq && dq->which == kernel_index(&p, want_dq) && dq[1].which == kernel_index(&p, want_kv) &&
                dq->smem == (bf16 ? 8u * 64 * 24 : 4u * (2 * 64 * 17 + 2 * 32 * 17 + 64 * 33)) &&
                dq[1].smem == (bf16 ? 4u * 64 * 24 + 4u * (2 * 64 * 24 + 4 * 64) : 4u * (2 * 32 * 17 + 2 * 64 * 17 + 2 * 32 * 65 + 128)),
            "tiny %s: attention_grad runs %s and %s (%u and %u bytes of shared memory)", label, want_dq, want_kv,
            dq ? dq->smem : 0, dq ? dq[1].smem : 0);
      /* layernorm_grad / rmsnorm_grad: from the forward's saved statistics (past the arena), one
         step: per-block partial sums of dw (db) in scratch, summed by the last block */
      const RtStep *ng = gs ? find_step(gs, gpt2 ? "layernorm_grad" : "rmsnorm_grad", 0) : NULL;
      int np = gpt2 ? 2 : 1, res = ng && strstr(ng->label, "+ residual") ? 1 : 0, pt = 5 + np + res;
      ok = ng && strstr(ng->label, "saved statistics") && ng->n_in == 4 + res && ng->n_out == 3 + np && irgs &&
           ng->bufs[3].offset >= irgs->arena_bytes && ng->bufs[3].n == 2 * 64 + 1 && ng->i[2] == pt &&
           ng->bufs[pt].offset >= irgs->arena_bytes && ng->bufs[pt].n == (int64_t)ng->grid[0] * np * 64 &&
           ng->bufs[pt + 1].offset == ng->bufs[3].offset + 8 * 64 && ng->bufs[pt].offset < ng->bufs[3].offset &&
           !strstr(ng[1].label, "(dw)") && (res || !bf16 || !strcmp(p.kernel_names[ng->which], gpt2 ? "loom_lngrads_bbbbf_acc" : "loom_rmsgrads_bbbbf_acc"));
      check(ok, "tiny %s: the norm gradient reads the saved statistics and sums the per-block parts of dw in the same "
            "step (deterministic)", label);
      /* embedding_grad: zero fill, then the scatter without atomics; GPT-2's tied table (lower_gemm.c's
         whole leaves; in bf16 too, whose fusions are on by default: LOOM_CUDA_FUSE_BF16): the
         scatter adds its rows into the f32 gradient, no fill */
      const RtStep *eg = gs ? find_step(gs, "embedding_grad", 0) : NULL;
      bool tied = gpt2;
      if (tied)
        ok = eg && strstr(eg->label, "(+= a gradient)") && eg->n_in == 2 && eg->n_out == 1 && eg->i[5] == 1 &&
             eg->bufs[2].storage == RT_ST_F32 && eg->bufs[2].n == 256 * 64 && eg->bufs[1].storage == RT_ST_I32 &&
             eg->i[0] == 64 && eg->i[1] == 256 && eg->i[2] == 64;
      else
        ok = eg && strstr(eg->label, "(zero)") && eg->n_out == 1 && eg[1].n_in == 2 && eg[1].n_out == 1 &&
             eg[1].bufs[2].offset == eg->bufs[0].offset && eg[1].bufs[1].storage == RT_ST_I32 && eg[1].i[0] == 64 &&
             eg[1].i[1] == 256 && eg[1].i[2] == 64 && eg[1].i[5] == 0;
      check(ok, "tiny %s: embedding_grad %s", label,
            tied ? "adds each first occurrence's rows into the tied table's f32 gradient (no fill)"
                 : "zeroes the table, then each first occurrence of an id sums its rows");
      /* the optimizer: vectorized adamw on f32 state */
      const RtFunc *os = find_func(&p, "optimizer_step");
      const RtStep *ad = os ? find_step(os, "adamw", 0) : NULL;
      /* bf16: the parameters' bf16 copies written by the same launch (output 4, buffer 10), at the
         parameter's offset / 2 past the parameters (lower_fuse.c) */
      int64_t mirror = 0;
      for (int g = 0; g < p.n_globals; g++)
        if (p.globals[g].region == RT_REGION_PARAMS && p.globals[g].offset + 4 * p.globals[g].n > mirror)
          mirror = p.globals[g].offset + 4 * p.globals[g].n;
      mirror = (mirror + 63) / 64 * 64;
      check(ad && ad->which == kernel_index(&p, bf16 ? "loom_adamw_fffffb_v4" : "loom_adamw_fffff_v4") && ad->n_in == 7 &&
                ad->n_out == (bf16 ? 4 : 3) && ad->f[0] == 0.9 && ad->f[1] == 0.95 &&
                (!bf16 || (ad->bufs[10].region == RT_REGION_PARAMS && ad->bufs[10].storage == RT_ST_BF16 &&
                           ad->bufs[10].offset == mirror + ad->bufs[0].offset / 2 && ad->bufs[10].n == ad->bufs[0].n)),
            "tiny %s: adamw runs %s (f32 master state, 4 elements per access%s)", label,
            bf16 ? "loom_adamw_fffffb_v4" : "loom_adamw_fffff_v4", bf16 ? ", the bf16 copy written" : "");
      /* bf16: no step casts a parameter; @weight_copies casts every one into its copy */
      const RtFunc *wc = find_func(&p, RT_FUNC_WEIGHT_COPIES);
      int casts = 0, copied = 0, n_params = 0;
      for (int k = 0; gs && k < gs->n_steps; k++)
        casts += gs->steps[k].kind == RT_STEP_KERNEL && gs->steps[k].n_in == 1 && gs->steps[k].n_out == 1 &&
                 gs->steps[k].bufs[0].region == RT_REGION_PARAMS && gs->steps[k].bufs[0].storage == RT_ST_F32 &&
                 gs->steps[k].bufs[1].storage == RT_ST_BF16;
      for (int k = 0; wc && k < wc->n_steps; k++) {
        const RtStep *st = &wc->steps[k];
        bool good = !strcmp(p.kernel_names[st->which], "loom_copy_fb") && st->bufs[0].region == RT_REGION_PARAMS &&
                    st->bufs[1].offset == mirror + st->bufs[0].offset / 2 && st->bufs[1].n == st->bufs[0].n;
        for (int g = 0; good && g < p.n_globals; g++)
          copied += p.globals[g].region == RT_REGION_PARAMS && p.globals[g].offset >= st->bufs[0].offset &&
                    p.globals[g].offset + 4 * p.globals[g].n <= st->bufs[0].offset + 4 * st->bufs[0].n;
      }
      for (int g = 0; g < p.n_globals; g++) n_params += p.globals[g].region == RT_REGION_PARAMS;
      check(bf16 ? !casts && wc && copied == n_params : !wc,
            "tiny %s: %s", label, bf16 ? "no step casts a parameter; @weight_copies writes every parameter's bf16 copy"
                                       : "no weight copies in fp32");
      ok = ad && strstr(ad->label, "(in place)") && !find_step(os, "assign", 0);
      for (int b = 0; ok && b < 3; b++)
        ok = ad->bufs[7 + b].region == ad->bufs[b].region && ad->bufs[7 + b].offset == ad->bufs[b].offset &&
             ad->bufs[b].region != RT_REGION_ARENA;
      check(ok, "tiny %s: adamw writes p, m, v in place; their assigns have no steps", label);
      /* the multi-tensor AdamW: one launch per weight-decay group (decayed matrices,
         undecayed vectors) over its span, and one fill per group of gradients */
      int adamw = 0, fills = 0, covered = 0, params = 0;
      for (int k = 0; os && k < os->n_steps; k++) {
        const RtStep *st = &os->steps[k];
        if (st->kind != RT_STEP_KERNEL) continue;
        bool is_adamw = !strncmp(p.kernel_names[st->which], "loom_adamw_", 11);
        adamw += is_adamw;
        fills += !strncmp(p.kernel_names[st->which], "loom_fill_", 10) && st->bufs[0].region == RT_REGION_GRADS;
        if (is_adamw) {
          bool launch_covers = (int64_t)st->grid[0] * st->block[0] * 4 >= st->i[0] || st->grid[0] == 65536;
          if (!launch_covers || st->bufs[0].n != st->i[0] || st->bufs[9].n != st->i[0]) covered = -1000;
          for (int g = 0; g < p.n_globals; g++)   /* the parameters inside this launch's span */
            if (p.globals[g].region == RT_REGION_PARAMS && p.globals[g].offset >= st->bufs[0].offset &&
                p.globals[g].offset + 4 * p.globals[g].n <= st->bufs[0].offset + 4 * st->i[0])
              covered++;
        }
      }
      for (int g = 0; g < p.n_globals; g++) params += p.globals[g].region == RT_REGION_PARAMS;
      check(adamw == 2 && fills == 0 && covered == params,
            "tiny %s: optimizer_step: %d adamw launches over %d of %d parameters, %d gradient fills (want 2, all, 0: "
            "the first micro-batch writes the gradients)", label, adamw, covered, params, fills);
      /* @grad_step.first: @grad_step's steps, the gradients' GEMMs with beta 0 where they write a
         whole gradient first (or its parts, c_attn's thirds), and fills of the others (merged) */
      const RtFunc *fs = find_func(&p, RT_FUNC_FIRST_GRAD_STEP);
      int ffills = 0, beta0 = 0, beta1 = 0, beta1_g = 0;
      for (int k = 0; fs && k < fs->n_steps; k++) {
        const RtStep *st = &fs->steps[k];
        if (st->kind == RT_STEP_KERNEL && !strncmp(p.kernel_names[st->which], "loom_fill_", 10) &&
            st->bufs[0].region == RT_REGION_GRADS)
          ffills++;
        if (st->kind == RT_STEP_GEMM && st->n_out && st->bufs[st->n_in].region == RT_REGION_GRADS)
          beta0 += st->i[RT_GEMM_BETA_INT] == 0, beta1 += st->i[RT_GEMM_BETA_INT] == 1;
      }
      for (int k = 0; gs && k < gs->n_steps; k++) {
        const RtStep *st = &gs->steps[k];
        beta1_g += st->kind == RT_STEP_GEMM && st->n_out && st->bufs[st->n_in].region == RT_REGION_GRADS &&
                   st->i[RT_GEMM_BETA_INT] == 1;
      }
      check(fs && gs && fs->n_steps == gs->n_steps + ffills && ffills >= 1 && ffills <= 3 && (beta0 > 0 || !beta1_g) &&
                beta0 + beta1 == beta1_g && fs->arena_bytes == gs->arena_bytes,
            "tiny %s: @grad_step.first: %d fills, %d of the %d gradient GEMMs write (beta 0), the rest add", label, ffills,
            beta0, beta1_g);
      /* the gradient norm: the per-tensor chain (sum of squares, then add) becomes sums of
         squares over the contiguous gradient span, in parts, and one sum of the parts */
      int norm_parts = 0, norm_sums = 0, norm_tensors = 0, grads = 0, other_calls = 0;
      for (int k = 0; os && k < os->n_steps; k++) {
        const RtStep *st = &os->steps[k];
        int t = 0;
        if (sscanf(st->label, "gradient norm: sum of squares [%d tensors]", &t) == 1) {
          norm_parts++;
          norm_tensors += t;
          if (st->bufs[0].region != RT_REGION_GRADS || strcmp(p.kernel_names[st->which], "loom_sumsq_f")) norm_parts = -100;
        } else if (!strncmp(st->label, "gradient norm: sum of ", 22)) {
          norm_sums += !strcmp(p.kernel_names[st->which], "loom_sumparts_f");
        } else if (!strncmp(st->label, "call @", 6)) {
          other_calls++;
        }
      }
      for (int g = 0; g < p.n_globals; g++) grads += p.globals[g].region == RT_REGION_GRADS;
      check(norm_parts >= 1 && norm_sums == 1 && norm_tensors == grads,
            "tiny %s: the gradient norm over all %d gradients in %d span(s) and one sum of parts (%d other fused calls "
            "left in optimizer_step)", label, grads, norm_parts, other_calls);
      /* GEMMs: storage of the operands */
      const RtStep *mm = gs ? find_step(gs, "matmul", 0) : NULL;
      check(mm && mm->kind == RT_STEP_GEMM && mm->bufs[0].storage == (bf16 ? RT_ST_BF16 : RT_ST_F32) &&
                mm->bufs[2].storage == (bf16 ? RT_ST_BF16 : RT_ST_F32) && mm->grid[0] == 0,
            "tiny %s: matmul is a GEMM over %s buffers", label, bf16 ? "bf16" : "f32");
      /* fused kernels: i[0] = N */
      const RtStep *call = gs ? find_step(gs, "call @", 0) : NULL;
      check(call && call->i[0] > 0 && !strncmp(p.kernel_names[call->which], "k", 1),
            "tiny %s: fused kernels are named k<n>_<func> and get N in i[0]", label);
      /* globals: native sizes */
      int64_t want_params = 0;
      for (int g = 0; g < p.n_globals; g++)
        if (p.globals[g].region == RT_REGION_PARAMS && p.globals[g].offset + 4 * p.globals[g].n > want_params)
          want_params = p.globals[g].offset + 4 * p.globals[g].n;
      want_params = (want_params + 63) / 64 * 64;
      if (bf16) want_params += (want_params / 2 + 63) / 64 * 64;   /* and their bf16 copies */
      check(p.region_bytes[RT_REGION_PARAMS] == want_params, "tiny %s: parameters f32 in a region of %lld bytes%s", label,
            (long long)p.region_bytes[RT_REGION_PARAMS], bf16 ? " (their bf16 copies included)" : "");
      free(tu);
      rt_program_free(&p);
      module_free(m);
    }
}

/* ================================================================ a hand-planned program */

static const char *program_text =
    "module @p {\n"
    "  mesh dp=1 tp=1 cp=1 pp=1 ep=1\n"
    "  param $w : f32[16,8] = normal(0.02)\n"
    "  param $ln.weight : bf16[8] = ones\n"
    "  param $ln.bias : bf16[8] = zeros\n"
    "  state $grad.w : f32[16,8] = zeros\n"
    "  func @f(%x: bf16[2,4,16] at 0, %q: bf16[1,8,2,64] at 256, %dy: bf16[2,4,8] at 2304) -> (bf16[2,4,8], f32[2,4], "
    "bf16[1,8,2,64], bf16[2,4,8]) arena 8192 {\n"
    "    %w16 = cast $w : bf16[16,8] at 2432\n"
    "    %h = matmul %x, %w16 : bf16[2,4,8] at 2752\n"
    "    %y = layernorm %h, $ln.weight, $ln.bias {eps=1e-05} : bf16[2,4,8] at 2880\n"
    "    %g, %s = call %y, $ln.bias {callee=@k0} : bf16[2,4,8] at 3008, f32[2,4] at 3136\n"
    "    %o = attention %q, %q, %q {scale=0.125} : bf16[1,8,2,64] at 3200\n"
    "    %dx, %dw, %db = layernorm_grad %dy, %h, $ln.weight {eps=1e-05} : bf16[2,4,8] at 5248, bf16[8] at 5376, "
    "bf16[8] at 5440\n"
    "    return %g, %s, %o, %dx\n"
    "  }\n"
    "  kernel func @k0(%y: bf16[2,4,8], %b: bf16[8]) -> (bf16[2,4,8], f32[2,4]) {\n"
    "    %bb = broadcast %b : bf16[2,4,8]\n"
    "    %a = add %y, %bb : bf16[2,4,8]\n"
    "    %t = tanh %a : bf16[2,4,8]\n"
    "    %t32 = cast %t : f32[2,4,8]\n"
    "    %s = reduce_sum %t32 {dims=[2]} : f32[2,4]\n"
    "    return %t, %s\n"
    "  }\n"
    "}\n";

static bool buf_is(const RtBuf *b, RtRegion region, int64_t offset, int64_t n, int storage) {
  return b->region == region && b->offset == offset && b->n == n && b->storage == storage && b->round == RT_ROUND_NONE;
}

static void test_program(void);
static void test_program_twice(void) {   /* with the norms' saved statistics, and without */
  test_program();
  setenv("LOOM_CUDA_NO_NORM_STATS", "1", 1);
  test_program();
  unsetenv("LOOM_CUDA_NO_NORM_STATS");
}

static void test_program(void) {
  char err[IR_ERR_LEN] = "";
  Module *m = NULL;
  if (parse_module("program", program_text, &m, err, sizeof err) || verify_module(m, err, sizeof err)) {
    check(false, "program: the test program is bad: %s", err);
    module_free(m);
    return;
  }
  RtProgram p;
  char *tu = NULL;
  if (!check(!cuda_lower(m, &p, &tu, err, sizeof err), "program: cuda_lower%s%s", err[0] ? ": " : "", err)) {
    module_free(m);
    return;
  }
  const RtGlobal *gl = p.globals;
  check(p.n_globals == 4 && gl[0].offset == 0 && gl[1].region == RT_REGION_PARAMS && gl[1].offset == 512 &&
            gl[1].round == RT_ROUND_BF16 && gl[2].offset == 576 && gl[3].region == RT_REGION_GRADS &&
            p.region_bytes[RT_REGION_PARAMS] == 640 && p.region_bytes[RT_REGION_GRADS] == 512,
        "program: globals with native sizes (bf16 [8] takes 16 bytes of a 64-byte slot), regions 640/512");
  const RtFunc *f = &p.funcs[0];
  /* LOOM_CUDA_NO_NORM_STATS=1: layernorm_grad recomputes the statistics, in two steps */
  int steps = getenv("LOOM_CUDA_NO_NORM_STATS") ? 7 : 6;
  check(p.n_funcs == 1 && f->n_steps == steps && f->arena_bytes > 8192 && buf_is(&f->args[0], RT_REGION_ARENA, 0, 128, RT_ST_BF16),
        "program: %d steps, arguments in bf16, the arena grows by the scratch (%lld bytes)", steps, (long long)f->arena_bytes);
  if (f->n_steps == 6 && steps == 6) {
    const RtStep *s = f->steps;
    /* the forward saves (mean, rstd) past the scratch (8192 + 512), the gradient reads them:
       dy h w stats -> dx dw db, the parts in scratch, the counter after the 8 rows' statistics */
    check(s[2].n_out == 2 && s[2].i[2] == 1 && buf_is(&s[2].bufs[4], RT_REGION_ARENA, 8704, 17, RT_ST_F32) &&
              s[5].kind == RT_STEP_KERNEL && !strcmp(p.kernel_names[s[5].which], "loom_lngrads_bbbbb") &&
              s[5].n_in == 4 && s[5].n_out == 5 && s[5].grid[0] == 8 && s[5].i[2] == 7 &&
              buf_is(&s[5].bufs[3], RT_REGION_ARENA, 8704, 17, RT_ST_F32) &&
              buf_is(&s[5].bufs[5], RT_REGION_ARENA, 5376, 8, RT_ST_BF16) &&
              buf_is(&s[5].bufs[7], RT_REGION_ARENA, 8192, 8 * 2 * 8, RT_ST_F32) &&
              buf_is(&s[5].bufs[8], RT_REGION_ARENA, 8704 + 64, 1, RT_ST_F32) && f->arena_bytes == 8192 + 512 + 128,
          "program: layernorm saves its statistics; layernorm_grad is one step from them (dx, dw, db; parts in scratch)");
  }
  if (f->n_steps == 7 && steps == 7) {
    const RtStep *s = f->steps;
    check(s[0].kind == RT_STEP_KERNEL && !strcmp(p.kernel_names[s[0].which], "loom_copy_fb") &&
              buf_is(&s[0].bufs[0], RT_REGION_PARAMS, 0, 128, RT_ST_F32) &&
              buf_is(&s[0].bufs[1], RT_REGION_ARENA, 2432, 128, RT_ST_BF16) && s[0].i[0] == 128 &&
              s[0].block[0] == 256 && s[0].grid[0] == 1,
          "program: a cast f32 -> bf16 runs loom_copy_fb, 256 threads");
    check(s[1].kind == RT_STEP_GEMM && s[1].i[0] == 1 && s[1].i[1] == 8 && s[1].i[2] == 8 && s[1].i[3] == 16 &&
              s[1].i[7] == 0 && buf_is(&s[1].bufs[2], RT_REGION_ARENA, 2752, 64, RT_ST_BF16),
          "program: matmul [2,4,16] x [16,8] (a shared weight) -> one GEMM, the batch folded into M: M 8, N 8, K 16, "
          "bf16 output");
    check(s[2].kind == RT_STEP_KERNEL && !strcmp(p.kernel_names[s[2].which], "loom_layernorm_bbbb") &&
              s[2].i[0] == 8 && s[2].i[1] == 8 && s[2].f[0] == 1e-05 && s[2].grid[0] == 8 && s[2].block[0] == 32 &&
              buf_is(&s[2].bufs[1], RT_REGION_PARAMS, 512, 8, RT_ST_BF16),
          "program: layernorm runs loom_layernorm_bbbb, a block per row");
    check(s[3].kind == RT_STEP_KERNEL && !strncmp(p.kernel_names[s[3].which], "k0_k0", 5) && s[3].i[0] == 64 &&
              s[3].i[1] == 8 && s[3].i[2] == 8 && s[3].block[0] == 256 &&
              buf_is(&s[3].bufs[3], RT_REGION_ARENA, 3136, 8, RT_ST_F32),
          "program: the fused kernel k0: N 64, 8 outputs of 8 elements (a thread each)");
    check(s[4].kind == RT_STEP_KERNEL && !strcmp(p.kernel_names[s[4].which], "loom_attn_fwd_tc_bbbb_64") &&
              s[4].grid[0] == 2 && s[4].grid[1] == 1 && s[4].block[0] == 128 &&
              s[4].smem == 2 * 2 * 64 * 72 * 2 && s[4].i[0] == 1 && s[4].i[1] == 8 && s[4].i[2] == 2 &&
              s[4].i[3] == 64 && s[4].i[4] == 8 && s[4].i[5] == 2 && s[4].i[6] == 1 && s[4].f[0] == 0.125,
          "program: bf16 attention runs on tensor cores, loom_attn_fwd_tc_bbbb_64, with %u bytes of dynamic shared "
          "memory", s[4].smem);
    check(s[5].kind == RT_STEP_KERNEL && !strcmp(p.kernel_names[s[5].which], "loom_lngrad_bbbb") &&
              s[5].n_in == 3 && s[5].n_out == 2 && s[5].grid[0] == 8 &&
              buf_is(&s[5].bufs[4], RT_REGION_ARENA, 8192, 8 * 2 * 8, RT_ST_F32) &&
              s[6].kind == RT_STEP_KERNEL && !strcmp(p.kernel_names[s[6].which], "loom_normsum_bb") &&
              s[6].n_in == 1 && s[6].n_out == 2 && s[6].i[0] == 8 && s[6].i[1] == 8 && s[6].i[2] == 2 &&
              buf_is(&s[6].bufs[1], RT_REGION_ARENA, 5376, 8, RT_ST_BF16) && f->arena_bytes == 8192 + 512,
          "program: layernorm_grad: dx and partials (scratch at 8192), then their sums into dw, db");
  }
  check(strstr(tu, "struct LoomArgs {\n  void *buf[16];\n  long long i[40];\n  double f[4];\n};") != NULL,
        "program: the TU defines LoomArgs as runtime/program.h says");
  char *tu2 = NULL;
  check(!cuda_emit(m, &tu2, err, sizeof err) && tu2 && !strcmp(tu, tu2), "program: cuda_emit gives the same TU");
  free(tu2);
  free(tu);
  rt_program_free(&p);
  /* LOOM_CUDA_WGMMA=1: the attention is the Hopper forward, whose q k v tensor maps the step
     describes (program.h's RT_TMAP_INT) and whose wrapper takes them */
  setenv("LOOM_CUDA_WGMMA", "1", 1);
  tu = NULL;
  if (check(!cuda_lower(m, &p, &tu, err, sizeof err), "program (wgmma): cuda_lower%s%s", err[0] ? ": " : "", err)) {
    const RtStep *a = NULL;
    for (int k = 0; k < p.funcs[0].n_steps; k++)
      if (!strcmp(p.kernel_names[p.funcs[0].steps[k].which], "loom_attn_fwd_wg_bbbb_64")) a = &p.funcs[0].steps[k];
    const int64_t want[3 * RT_TMAP_FIELDS] = {0, 64, 2, 8, 1, 128, 1, 64, 2, 8, 1, 64, 2, 64, 2, 8, 1, 64};
    check(a && a->block[0] == 384 && a->tmaps == 3 && !memcmp(&a->i[RT_TMAP_INT], want, sizeof want) &&
              a->i[RT_TMAP_INT + sizeof want / sizeof *want] == 0,
          "program (wgmma): loom_attn_fwd_wg_bbbb_64 with 3 tensor maps: q k v as [1][8][2][64], boxes of 128, 64, 64 rows");
    check(tu && strstr(tu, "loom_attn_fwd_wg_bbbb_64(LoomArgs a, const __grid_constant__ LoomTmaps t) { "
                           "loom_attn_fwd_wg<loom_sbf16, loom_sbf16, loom_sbf16, loom_sbf16, 64>(a, t); }\n"
                           "LOOM_TMAP_KERNEL(loom_attn_fwd_wg_bbbb_64)\n"),
          "program (wgmma): the wrapper takes the tensor maps as a __grid_constant__ parameter");
    free(tu);
    rt_program_free(&p);
  }
  unsetenv("LOOM_CUDA_WGMMA");
  module_free(m);
}

/* ================================================================ errors */

static void expect_error(const char *what, const char *text, const char *needle) {
  char err[IR_ERR_LEN] = "";
  Module *m = NULL;
  if (parse_module(what, text, &m, err, sizeof err)) {
    check(false, "error %s: the test module does not parse: %s", what, err);
    return;
  }
  PassOptions opt = {.target = TARGET_CUDA};
  RtProgram p;
  int rc = pipeline_run(m, "lower", &opt, err, sizeof err);
  if (!rc) rc = cuda_lower(m, &p, NULL, err, sizeof err);
  else {
    check(false, "error %s: lowering passes failed: %s", what, err);
    module_free(m);
    return;
  }
  check(rc && strstr(err, needle), "error %s: refused: %s", what, err);
  if (!rc) rt_program_free(&p);
  module_free(m);
}

static void test_errors(void) {
  expect_error("head size",
               "module @e {\n  mesh dp=1 tp=1 cp=1 pp=1 ep=1\n"
               "  func @f(%q: f32[1,4,2,12]) -> (f32[1,4,2,12]) {\n"
               "    %o = attention %q, %q, %q {scale=0.3} : f32[1,4,2,12]\n    return %o\n  }\n}\n",
               "head size 12");
  expect_error("bool in memory",
               "module @e {\n  mesh dp=1 tp=1 cp=1 pp=1 ep=1\n"
               "  func @f(%x: f32[4], %y: f32[4]) -> (bool[4]) {\n"
               "    %c = ge %x, %y : bool[4]\n    return %c\n  }\n}\n",
               "bool");
}

/* The IR text of a one-op function lowered for CUDA: its only step, or NULL (err says why);
   *m and *p to free (p only when the step is there). */
static const RtStep *lower_one(const char *what, const char *text, Module **m, RtProgram *p, char *err, size_t errlen) {
  *m = NULL;
  memset(p, 0, sizeof *p);
  int rc = parse_module(what, text, m, err, errlen);
  PassOptions opt = {.target = TARGET_CUDA};
  if (!rc) rc = pipeline_run(*m, "lower", &opt, err, errlen);
  if (!rc) rc = cuda_lower(*m, p, NULL, err, errlen);
  if (!rc && (p->n_funcs != 1 || p->funcs[0].n_steps != 1)) rt_program_free(p), rc = 1;
  return rc ? NULL : &p->funcs[0].steps[0];
}

/* A partitioned program's all_reduce: an RT_STEP_BUILTIN step that the runtime runs as NCCL
   (program.h's i[]: n, axis, size, max), not a kernel. */
static void test_collective_step(void) {
  const char *text = "module @e {\n  mesh dp=2 tp=1 cp=1 pp=1 ep=1\n"
                     "  func @f(%x: f32[4]) -> (f32[4]) {\n"
                     "    %y = all_reduce %x {axis=\"dp\", n=2} : f32[4]\n    return %y\n  }\n}\n";
  char err[1024] = "";
  Module *m;
  RtProgram p;
  const RtStep *st = lower_one("collective", text, &m, &p, err, sizeof err);
  check(st && st->kind == RT_STEP_BUILTIN && st->which == RT_B_ALL_REDUCE && st->i[0] == 4 && st->i[1] == 0 &&
            st->i[2] == 2 && st->i[3] == 0 && st->n_in == 1 && st->n_out == 1,
        "collective: all_reduce over dp is one RT_B_ALL_REDUCE step (n 4, axis dp, size 2, sum) %s", err);
  if (st) rt_program_free(&p);
  module_free(m);
}

/* A pipeline's send to a fixed rank: an RT_B_SEND step with rel=0 and the peer's coordinate
   (i: n, axis, size, peer, tag, rel), which the runtime leaves to the pipeline driver
   (cuda_pipe_transfers lists it; the ring plan ignores it). */
static void test_fixed_rank_send(void) {
  const char *text = "module @e {\n  mesh dp=1 tp=1 cp=1 pp=2 ep=1\n"
                     "  func @f(%x: f32[4]) -> () {\n"
                     "    send %x {axis=\"pp\", n=2, peer=1, tag=7, rel=false}\n    return\n  }\n}\n";
  char err[1024] = "";
  Module *m;
  RtProgram p;
  const RtStep *st = lower_one("fixed-rank send", text, &m, &p, err, sizeof err);
  check(st && st->kind == RT_STEP_BUILTIN && st->which == RT_B_SEND && st->i[0] == 4 && st->i[1] == 3 && st->i[2] == 2 &&
            st->i[3] == 1 && st->i[4] == 7 && st->i[5] == 0,
        "fixed-rank send: one RT_B_SEND step (n 4, axis pp, size 2, peer 1, tag 7, rel 0) %s", err);
  CudaPipeXfer *x = NULL;
  int nx = 0;
  CudaP2pPlan pl;
  check(st && !cuda_pipe_transfers(&p, 0, &x, &nx) && nx == 1 && x[0].send && x[0].peer == 1 && x[0].tag == 7 && x[0].bytes == 16,
        "fixed-rank send: cuda_pipe_transfers lists it (send to pp 1, tag 7, 16 bytes)");
  check(st && !cuda_p2p_plan(&p.funcs[0], &pl, err, sizeof err) && pl.n_ops == 0,
        "fixed-rank send: the ring plan leaves it to the pipeline driver %s", err);
  if (st) cuda_p2p_plan_free(&pl), rt_program_free(&p);
  free(x);
  module_free(m);
}

/* ================================================================ NVRTC */

static char cache_root[256];

static void remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static void test_models_nvrtc(bool full) {
  static const struct {
    const char *path;
    bool bf16;
  } cfg[] = {{"models/gpt2-124M.json", false}, {"models/gpt2-124M.json", true},
             {"models/llama-1B.json", false},  {"models/llama-1B.json", true}};
  double total = 0;
  for (int c = 0; c < 4; c++) {
    char err[IR_ERR_LEN] = "", label[128];
    snprintf(label, sizeof label, "%s %s", cfg[c].path, cfg[c].bf16 ? "bf16" : "fp32");
    Module *m = build_model(cfg[c].path, 1, 64, cfg[c].bf16, err, sizeof err);
    if (!check(m != NULL, "nvrtc %s: train,lower (batch 1, seq 64)%s%s", label, m ? "" : ": ", m ? "" : err)) continue;
    RtProgram p;
    char *tu = NULL;
    if (!check(!cuda_lower(m, &p, &tu, err, sizeof err), "nvrtc %s: cuda_lower%s%s", label, err[0] ? ": " : "", err)) {
      module_free(m);
      continue;
    }
    char why[512];
    const char *prob = program_problem(&p, m, tu, why, sizeof why);
    int64_t steps = 0;
    for (int f = 0; f < p.n_funcs; f++) steps += p.funcs[f].n_steps;
    check(!prob, "nvrtc %s: %lld steps, %d kernels, TU %zu bytes%s%s", label, (long long)steps, p.n_kernels,
          strlen(tu), prob ? ": " : "", prob ? prob : "");
    const RtFunc *gs = find_func(&p, "grad_step");
    const RtStep *at = gs ? find_step(gs, "attention %", 0) : NULL;
    check(at && at->i[3] == 64, "nvrtc %s: head size 64", label);
    const RtFunc *os = find_func(&p, "optimizer_step");
    int adamw = 0, params = 0;
    for (int k = 0; os && k < os->n_steps; k++)
      adamw += os->steps[k].kind == RT_STEP_KERNEL && !strncmp(p.kernel_names[os->steps[k].which], "loom_adamw_", 11);
    for (int g = 0; g < p.n_globals; g++) params += p.globals[g].region == RT_REGION_PARAMS;
    check(adamw == 2, "nvrtc %s: AdamW over %d parameter tensors in %d launches (want 2)", label, params, adamw);
    static const char *archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
      if (a == 1 && !full && c != 3) continue;
      unsigned char *img = NULL;
      size_t n = 0;
      bool cubin = false, hit = false;
      char *log = NULL;
      double t0 = now();
      int rc = nvrtc_compile_cached(tu, archs[a], NULL, 0, &img, &n, &cubin, &log, &hit, err, sizeof err);
      double t1 = now();
      total += t1 - t0;
      if (!check(!rc && cubin && !hit, "nvrtc %s: compiles for %s (cold: %.1f s, %zu bytes)%s%s", label, archs[a],
                 t1 - t0, n, rc ? ": " : "", rc ? err : "")) {
        if (log && *log) printf("%.3000s\n", log);
        free(log);
        continue;
      }
      int missing = 0;
      const char *first = "";
      for (int k = 0; k < p.n_kernels; k++)
        if (!nvrtc_image_has_kernel(img, n, cubin, p.kernel_names[k])) {
          if (!missing) first = p.kernel_names[k];
          missing++;
        }
      check(!missing, "nvrtc %s: the %s cubin defines all %d kernels%s%s", label, archs[a], p.n_kernels,
            missing ? ", missing " : "", first);
      check(log && !strstr(log, "warning"), "nvrtc %s: no warnings%s%.300s", label, log && *log ? ": " : "",
            log ? log : "");
      if (c == 3 && a == 0) {
        /* the cache: the same source again */
        unsigned char *img2 = NULL;
        size_t n2 = 0;
        char *log2 = NULL;
        double t2 = now();
        rc = nvrtc_compile_cached(tu, archs[a], NULL, 0, &img2, &n2, &cubin, &log2, &hit, err, sizeof err);
        double t3 = now();
        check(!rc && hit && n2 == n && !memcmp(img, img2, n) && t3 - t2 < (t1 - t0) / 4,
              "cache: %s again is a hit with the same %zu bytes (%.3f s cached vs %.1f s cold)", label, n2, t3 - t2,
              t1 - t0);
        free(img2);
        free(log2);
      }
      free(img);
      free(log);
    }
    free(tu);
    rt_program_free(&p);
    module_free(m);
  }
  printf("NVRTC compile time of the models: %.1f s in total\n", total);
}

static const char *small_tu =
    "struct LoomArgs { void *buf[16]; long long i[40]; double f[4]; };\n"
    "extern \"C\" __global__ void loom_small(LoomArgs a) {\n"
    "  float *x = (float *)a.buf[0];\n"
    "  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < a.i[0]; i += gridDim.x * blockDim.x) x[i] *= 2.0f;\n"
    "}\n";

static int compile_small(const char *src, unsigned char **img, size_t *n, bool *hit, char *err, size_t errlen) {
  bool cubin;
  char *log = NULL;
  int rc = nvrtc_compile_cached(src, "sm_80", NULL, 0, img, n, &cubin, &log, hit, err, errlen);
  free(log);
  return rc;
}

static void test_cache(void) {
  char err[IR_ERR_LEN] = "", path[1200];
  unsigned char *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  bool hit = true;
  int rc = compile_small(small_tu, &a, &na, &hit, err, sizeof err);
  check(!rc && !hit && nvrtc_image_has_kernel(a, na, true, "loom_small") && !nvrtc_image_has_kernel(a, na, true, "loom_sm"),
        "cache: a small TU compiles cold%s%s", rc ? ": " : "", rc ? err : "");
  rc = nvrtc_cache_path(small_tu, "sm_80", NULL, 0, path, sizeof path, err, sizeof err);
  struct stat sb;
  check(!rc && !strncmp(path, cache_root, strlen(cache_root)) && !stat(path, &sb) && sb.st_size > (off_t)na,
        "cache: the entry is a file in LOOM_CACHE_DIR (%s)", path);
  /* corrupt one payload byte */
  FILE *f = fopen(path, "r+b");
  if (f) {
    fseek(f, 100, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 100, SEEK_SET);
    fputc(ch ^ 0x5a, f);
    fclose(f);
  }
  rc = compile_small(small_tu, &b, &nb, &hit, err, sizeof err);
  check(!rc && !hit && nb == na && !memcmp(a, b, na), "cache: a corrupted entry is ignored and recompiled");
  free(b);
  b = NULL;
  rc = compile_small(small_tu, &b, &nb, &hit, err, sizeof err);
  check(!rc && hit && nb == na && !memcmp(a, b, na), "cache: the entry was replaced (now a hit)");
  free(b);
  b = NULL;
  /* truncated */
  if (!truncate(path, 60)) {
    rc = compile_small(small_tu, &b, &nb, &hit, err, sizeof err);
    check(!rc && !hit && nb == na && !memcmp(a, b, na), "cache: a truncated entry is recompiled");
    free(b);
    b = NULL;
  }
  /* foreign content */
  f = fopen(path, "wb");
  if (f) {
    fputs("not a loom cache entry", f);
    fclose(f);
  }
  rc = compile_small(small_tu, &b, &nb, &hit, err, sizeof err);
  check(!rc && !hit && nb == na && !memcmp(a, b, na), "cache: a foreign file is recompiled");
  free(b);
  b = NULL;
  /* other options: another entry */
  const char *opts[] = {"-lineinfo"};
  char path2[1200];
  rc = nvrtc_cache_path(small_tu, "sm_80", opts, 1, path2, sizeof path2, err, sizeof err);
  check(!rc && strcmp(path, path2), "cache: options are part of the key");
  /* compile errors: NVRTC's log with line numbers */
  const char *bad = "struct LoomArgs { void *buf[16]; long long i[40]; double f[4]; };\n"
                    "extern \"C\" __global__ void k(LoomArgs a) {\n  undefined_thing(a);\n}\n";
  bool cubin;
  char *log = NULL;
  rc = nvrtc_compile_cached(bad, "sm_80", NULL, 0, &b, &nb, &cubin, &log, &hit, err, sizeof err);
  check(rc == 1 && log && strstr(log, "loom.cu(3)") && strstr(log, "error") && strstr(err, "undefined_thing") && !b,
        "cache: a compile error returns the log with line numbers: %s", err);
  free(log);
  log = NULL;
  /* PTX for a virtual architecture */
  rc = nvrtc_compile_cached(small_tu, "compute_80", NULL, 0, &b, &nb, &cubin, &log, &hit, err, sizeof err);
  check(!rc && !cubin && b && strstr((char *)b, ".entry loom_small") && nvrtc_image_has_kernel(b, nb, false, "loom_small"),
        "cache: compute_80 gives PTX");
  free(b);
  free(log);
  /* caching off */
  setenv("LOOM_CACHE_DIR", "off", 1);
  char dir[64];
  nvrtc_cache_dir(dir, sizeof dir);
  rc = compile_small(small_tu, &b, &nb, &hit, err, sizeof err);
  check(!dir[0] && !rc && !hit, "cache: LOOM_CACHE_DIR=off compiles without the cache");
  free(b);
  setenv("LOOM_CACHE_DIR", cache_root, 1);
  free(a);
  char hex[65];
  nvrtc_sha256_hex("abc", 3, hex);
  check(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "cache: SHA-256 of \"abc\"");
}

/* Several NVRTC programs (nvrtc_compile_programs): a marked TU as cuda_lower writes it, a
   heavy unit per program and the light ones together, a bundle of their cubins; a heavy
   unit's cubin found in the cache from another TU with other light kernels and another head. */
static const char *units_tu(const char *module, const char *light_name) {
  static char buf[2][2048];
  static int which;
  char *b = buf[which++ & 1];
  snprintf(b, 2048,
           "/* module @%s */\n" NVRTC_PRELUDE_MARK
           "struct LoomArgs { void *buf[16]; long long i[40]; double f[4]; };\n"
           "template <int K> __device__ void twice(LoomArgs &a) { ((float *)a.buf[0])[threadIdx.x] *= K; }\n"
           NVRTC_UNIT_MARK "light %s */\n"
           "extern \"C\" __global__ void %s(LoomArgs a) { twice<2>(a); }\n"
           NVRTC_UNIT_MARK "heavy loom_attn_a */\n"
           "extern \"C\" __global__ void loom_attn_a(LoomArgs a) { twice<3>(a); }\n"
           NVRTC_UNIT_MARK "light loom_l2 */\n"
           "extern \"C\" __global__ void loom_l2(LoomArgs a) { twice<4>(a); }\n"
           NVRTC_UNIT_MARK "heavy loom_attn_b */\n"
           "extern \"C\" __global__ void loom_attn_b(LoomArgs a) { twice<5>(a); }\n",
           module, light_name, light_name);
  return b;
}

static void test_programs(void) {
  char err[IR_ERR_LEN] = "";
  unsigned char *img = NULL;
  size_t n = 0;
  bool cubin = false, hit = true;
  int programs = 0;
  char *log = NULL;
  int rc = nvrtc_compile_programs(units_tu("one", "loom_l1"), "sm_80", NULL, 0, &img, &n, &cubin, &log, &hit, &programs,
                                  err, sizeof err);
  const unsigned char *parts[NVRTC_MAX_PROGRAMS];
  size_t sizes[NVRTC_MAX_PROGRAMS];
  int count = rc ? 0 : nvrtc_bundle_parts(img, n, parts, sizes, NVRTC_MAX_PROGRAMS);
  bool all = true;
  static const char *const names[] = {"loom_l1", "loom_attn_a", "loom_l2", "loom_attn_b"};
  for (int k = 0; k < 4; k++) all = all && !rc && nvrtc_image_has_kernel(img, n, true, names[k]);
  check(!rc && cubin && !hit && programs == 3 && count == 3 && all && !nvrtc_image_has_kernel(img, n, true, "loom_l3"),
        "programs: a marked TU compiles as %d programs (want 3: the light kernels, each heavy one), a bundle of %d "
        "cubins holding every kernel%s%s", programs, count, rc ? ": " : "", rc ? err : "");
  /* each part is a cubin of its own: the light one holds both light kernels and no heavy one */
  int light = -1;
  for (int i = 0; i < count; i++)
    if (nvrtc_image_has_kernel(parts[i], sizes[i], true, "loom_l1")) light = i;
  check(light == 0 && nvrtc_image_has_kernel(parts[0], sizes[0], true, "loom_l2") &&
        !nvrtc_image_has_kernel(parts[0], sizes[0], true, "loom_attn_a") &&
        nvrtc_image_has_kernel(parts[1], sizes[1], true, "loom_attn_b") &&
        nvrtc_image_has_kernel(parts[2], sizes[2], true, "loom_attn_a"),
        "programs: the light kernels in the first part, the heavy ones last to first");
  free(log);
  log = NULL;
  /* another module, another light kernel: the heavy programs are cache hits (the module's
     name is outside the prelude), the light one is not */
  unsigned char *img2 = NULL;
  size_t n2 = 0;
  setenv("LOOM_NVRTC_REPORT", "1", 1);
  rc = nvrtc_compile_programs(units_tu("two", "loom_l9"), "sm_80", NULL, 0, &img2, &n2, &cubin, &log, &hit, &programs,
                              err, sizeof err);
  unsetenv("LOOM_NVRTC_REPORT");
  const unsigned char *parts2[NVRTC_MAX_PROGRAMS];
  size_t sizes2[NVRTC_MAX_PROGRAMS];
  count = rc ? 0 : nvrtc_bundle_parts(img2, n2, parts2, sizes2, NVRTC_MAX_PROGRAMS);
  check(!rc && !hit && count == 3 && sizes2[1] == sizes[1] && !memcmp(parts2[1], parts[1], sizes[1]) &&
        sizes2[2] == sizes[2] && !memcmp(parts2[2], parts[2], sizes[2]) && nvrtc_image_has_kernel(img2, n2, true, "loom_l9"),
        "programs: another module's TU reuses the heavy cubins (byte for byte) and compiles its light program");
  free(img2);
  free(log);
  log = NULL;
  /* the same TU again: every program a hit, the same bundle */
  rc = nvrtc_compile_programs(units_tu("one", "loom_l1"), "sm_80", NULL, 0, &img2, &n2, &cubin, &log, &hit, &programs,
                              err, sizeof err);
  check(!rc && hit && n2 == n && !memcmp(img, img2, n), "programs: warm, every program from the cache, the same bundle");
  free(img2);
  free(log);
  log = NULL;
  /* LOOM_NVRTC_SPLIT=0: one program, a plain cubin */
  setenv("LOOM_NVRTC_SPLIT", "0", 1);
  rc = nvrtc_compile_programs(units_tu("one", "loom_l1"), "sm_80", NULL, 0, &img2, &n2, &cubin, &log, &hit, &programs,
                              err, sizeof err);
  unsetenv("LOOM_NVRTC_SPLIT");
  check(!rc && programs == 1 && n2 > 4 && !memcmp(img2, "\x7f" "ELF", 4) && nvrtc_image_has_kernel(img2, n2, true, "loom_attn_b"),
        "programs: LOOM_NVRTC_SPLIT=0 compiles one program, a plain cubin");
  free(img2);
  free(log);
  log = NULL;
  /* a compile error in one program: the error, no image */
  char bad[2300];
  snprintf(bad, sizeof bad, "%s" NVRTC_UNIT_MARK "heavy loom_attn_c */\nextern \"C\" __global__ void loom_attn_c(LoomArgs a) "
           "{ undefined_thing(a); }\n", units_tu("one", "loom_l1"));
  img2 = NULL;
  rc = nvrtc_compile_programs(bad, "sm_80", NULL, 0, &img2, &n2, &cubin, &log, &hit, &programs, err, sizeof err);
  check(rc == 1 && !img2 && strstr(err, "undefined_thing") && log && strstr(log, "error"),
        "programs: a compile error in one program fails the whole: %s", err);
  free(log);
  /* damaged bundles are refused, not read past their end */
  if (n > 40) {
    unsigned char *d = malloc(n);
    memcpy(d, img, n);
    d[16] = 0xff, d[17] = 0xff, d[18] = 0xff, d[19] = 0x7f;   /* the first part's size far past the end */
    check(nvrtc_bundle_parts(d, n, parts2, sizes2, NVRTC_MAX_PROGRAMS) == -1 &&
              nvrtc_bundle_parts(img, 20, parts2, sizes2, NVRTC_MAX_PROGRAMS) == -1 &&
              !nvrtc_image_has_kernel(d, n, true, "loom_l1"),
          "programs: a damaged or truncated bundle is refused");
    free(d);
  }
  free(img);
}

int main(void) {
  double t0 = now();
  test_tiny_models();
  test_program_twice();
  test_errors();
  test_collective_step();
  test_fixed_rank_send();
  char why[2300];
  int major = 0, minor = 0;
  if (!nvrtc_available(&major, &minor, why, sizeof why)) {
    printf("SKIP: NVRTC not available: the CUDA translation units were not compiled (%s)\n", why);
    printf("SKIP: NVRTC not available: the NVRTC cache was not tested\n");
  } else {
    printf("NVRTC %d.%d\n", major, minor);
    snprintf(cache_root, sizeof cache_root, "/tmp/loom-nvrtc-test-XXXXXX");
    if (!mkdtemp(cache_root)) {
      check(false, "a temporary cache directory");
    } else {
      setenv("LOOM_CACHE_DIR", cache_root, 1);
      const char *quick = getenv("LOOM_TEST_CUDA_QUICK");
      test_models_nvrtc(!(quick && *quick && strcmp(quick, "0")));
      test_cache();
      test_programs();
      remove_tree(cache_root);
    }
  }
  printf("(%.1f s)\n", now() - t0);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
