/* codegen/cuda/cost.c — the cost of a lowered CUDA program's steps (cost.h): category, FLOPs,
 * bytes and roofline bound of every launch and library call, and the totals of one step.
 *
 * Categories come from the kernel a step launches (RtProgram.kernel_names: the prelude's
 * templates are named loom_<family>_<storages>, fused kernels k<n>_<func> and their finish
 * kernels f<n>_<func>).  A fused kernel is a reduction when it has reduction outputs (i[1] > 0:
 * lower.c's launch convention), a cast when it only converts one buffer to another storage of
 * the same length, else elementwise.
 */
#include "codegen/cuda/cost.h"
#include "codegen/cuda/cuda.h"
#include "codegen/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const cat_names[CC_COUNT] = {"gemm", "attention", "norm", "elementwise", "loss",
                                                "optimizer", "cast", "reduce", "copy", "comm"};

const char *cuda_cost_cat_name(int cat) { return cat >= 0 && cat < CC_COUNT ? cat_names[cat] : "?"; }

static double buf_bytes(const RtBuf *b) { return (double)b->n * cl_st_size(b->storage); }

static bool starts(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

/* A prelude kernel's category from its family name (after "loom_"). */
static int family_cat(const char *k) {
  static const struct {
    const char *prefix;
    int cat;
  } fam[] = {
      {"attn", CC_ATTENTION},      {"layernorm", CC_NORM},      {"rmsnorm", CC_NORM},       {"lngrad", CC_NORM},
      {"rmsgrad", CC_NORM},        {"normsum", CC_NORM},        {"xent", CC_LOSS},          {"adamw", CC_OPTIMIZER},
      {"sumsq", CC_REDUCE},        {"sumparts", CC_REDUCE},     {"copy_", CC_CAST},         {"cast", CC_CAST},
      {"accumulate", CC_ELEMENTWISE}, {"assign", CC_COPY},      {"softmax", CC_ELEMENTWISE}, {"rope", CC_ELEMENTWISE},
      {"gmm", CC_GEMM},            {"moe_wgrad", CC_REDUCE},    {"moe_hist", CC_REDUCE},    {"moe_offsets", CC_REDUCE},
      {"moe_place", CC_COPY},      {"topk", CC_REDUCE},         {"fill", CC_COPY},          {"copyraw", CC_COPY},
  };
  for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
    if (starts(k, fam[i].prefix)) return fam[i].cat;
  return CC_COPY;   /* transpose, slice, pad, concat, broadcast, embedding, iota, gathers, ... */
}

void cuda_step_cost(const RtProgram *p, const RtStep *st, CudaStepCost *c) {
  memset(c, 0, sizeof *c);
  c->peak_dtype = DT_F32;
  for (int k = 0; k < st->n_in + st->n_out && k < RT_MAX_BUFS; k++) c->bytes += buf_bytes(&st->bufs[k]);
  if (st->kind == RT_STEP_BUILTIN) {
    c->cat = CC_COMM;
    return;
  }
  if (st->kind == RT_STEP_GEMM) {
    c->cat = CC_GEMM;
    const int64_t *i = st->i;
    c->flops = 2.0 * (double)i[0] * (double)i[1] * (double)i[2] * (double)i[3];
    int s = st->bufs[0].storage;
    c->peak_dtype = s == RT_ST_BF16 ? DT_BF16 : s == RT_ST_F16 ? DT_F16 : DT_F32;
    /* an operand that is a view (a row stride): its rows x columns, not the span */
    for (int k = 0; k < 2; k++)
      if (i[RT_GEMM_LDA_INT + k] > 0)
        c->bytes += ((double)i[1 + k] * (double)i[3] - (double)st->bufs[k].n) * cl_st_size(st->bufs[k].storage);
    double cb = i[RT_GEMM_LDC_INT] > 0 ? (double)i[1] * (double)i[2] * cl_st_size(st->bufs[st->n_in].storage)
                                       : buf_bytes(&st->bufs[st->n_in]);
    if (i[RT_GEMM_LDC_INT] > 0) c->bytes += cb - buf_bytes(&st->bufs[st->n_in]);
    /* C read as well when the GEMM accumulates into it (beta = 1: CUDA_GEMM_BETA_INT) */
    if (i[CUDA_GEMM_BETA_INT] && st->n_out) c->bytes += cb;
    return;
  }
  const char *name = st->which >= 0 && st->which < p->n_kernels ? p->kernel_names[st->which] : "";
  if (name[0] == 'k' || name[0] == 'f') {   /* fused kernels and their finish kernels */
    bool reduces = name[0] == 'f' || st->i[1] > 0;
    bool cast = !reduces && st->n_in == 1 && st->n_out == 1 && st->bufs[0].n == st->bufs[1].n &&
                st->bufs[0].storage != st->bufs[1].storage && !st->bufs[0].is_int && !st->bufs[1].is_int;
    c->cat = reduces ? CC_REDUCE : cast ? CC_CAST : CC_ELEMENTWISE;
    return;
  }
  const char *fam = starts(name, "loom_") ? name + 5 : name;
  c->cat = family_cat(fam);
  if (starts(fam, "embedding")) {
    /* a gather (scatter) touches the rows of its ids, at most n_ids of the table's: the table
       counted at min(rows, n_ids) rows (read and written when the backward adds into it, i[5]) */
    int t = starts(fam, "embedding_bwd") ? 2 : 0;
    const RtBuf *tb = &st->bufs[t];
    double row = (double)st->i[2] * cl_st_size(tb->storage), rows = (double)st->i[0];
    if (rows * row < buf_bytes(tb)) c->bytes += rows * row * (t && st->i[5] ? 2 : 1) - buf_bytes(tb);
  }
  if (c->cat == CC_ATTENTION && !starts(fam, "attn_cached")) {
    /* i: B, T, H, D, S, KV, causal (attention and the attention blocks alike) */
    const int64_t *i = st->i;
    double bhtsd = (double)i[0] * (double)i[2] * (double)i[1] * (double)i[4] * (double)i[3];
    /* tile products of 2 B H T S D FLOPs: forward 2, dk dv 4, dq 3 (S, dP, dS K) from a saved
       L2 (i[8] of attn_dq: lower_attn.c; the attention blocks get lse as an operand), else 5
       (a first pass recomputes L2 and Dsum) */
    bool dq_saved = starts(fam, "attnblk") || i[8];
    double k = strstr(fam, "dkdv") ? 8 : strstr(fam, "dq") ? (dq_saved ? 6 : 10) : 4;
    c->flops = k * bhtsd * (i[6] ? 0.5 : 1.0);
    int s = st->bufs[0].storage;
    c->peak_dtype = strstr(fam, "_tc") || strstr(fam, "_wg") ? (s == RT_ST_F16 ? DT_F16 : DT_BF16) : DT_F32;   /* mma.sync, wgmma */
  } else if (c->cat == CC_GEMM) {   /* grouped matmuls: i R K N */
    c->flops = 2.0 * (double)st->i[0] * (double)st->i[1] * (double)st->i[2];
    c->peak_dtype = st->bufs[0].storage == RT_ST_BF16 ? DT_BF16 : DT_F32;
  }
}

double cuda_step_bound(const CudaStepCost *c, const Hardware *hw) {
  double peak = hw->peak_flops[c->peak_dtype] > 0 ? hw->peak_flops[c->peak_dtype] : hw->peak_flops[DT_F32];
  double eff = c->cat == CC_ATTENTION ? hw->eff_attention : hw->eff_matmul;
  double tc = c->flops > 0 && peak > 0 ? c->flops / (peak * eff) : 0;
  double tm = hw->mem_bw > 0 ? c->bytes / (hw->mem_bw * hw->eff_memory) : 0;
  return tc > tm ? tc : tm;
}

static int cuda_find_program_func(const RtProgram *p, const char *name) {
  for (int f = 0; f < p->n_funcs; f++)
    if (!strcmp(p->funcs[f].name, name)) return f;
  return -1;
}

int64_t cuda_cost_calls(const RtProgram *p, int f, int64_t grad_accum) {
  bool train = false;
  for (int k = 0; k < p->n_funcs; k++)
    train |= !strcmp(p->funcs[k].name, "grad_step") || !strcmp(p->funcs[k].name, "optimizer_step");
  if (!strcmp(p->funcs[f].name, RT_FUNC_WEIGHT_COPIES)) return 0;   /* once after a load, not a step */
  if (!train) return 1;
  /* the first micro-batch runs the variant that writes the gradients (lower_grads.c) */
  bool first = cuda_find_program_func(p, RT_FUNC_FIRST_GRAD_STEP) >= 0;
  if (!strcmp(p->funcs[f].name, RT_FUNC_FIRST_GRAD_STEP)) return 1;
  if (!strcmp(p->funcs[f].name, "grad_step")) return (grad_accum > 0 ? grad_accum : 1) - first;
  return !strcmp(p->funcs[f].name, "optimizer_step");
}

void cuda_cost(const RtProgram *p, const Hardware *hw, int64_t grad_accum, CudaCost *out) {
  memset(out, 0, sizeof *out);
  out->grad_accum = grad_accum;
  for (int f = 0; f < p->n_funcs; f++) {
    int64_t calls = cuda_cost_calls(p, f, grad_accum);
    for (int s = 0; calls && s < p->funcs[f].n_steps; s++) {
      CudaStepCost c;
      cuda_step_cost(p, &p->funcs[f].steps[s], &c);
      double b = cuda_step_bound(&c, hw);
      out->flops[c.cat] += (double)calls * c.flops;
      out->bytes[c.cat] += (double)calls * c.bytes;
      out->bound_s[c.cat] += (double)calls * b;
      out->launches[c.cat] += calls;
      out->total_flops += (double)calls * c.flops;
      out->total_bytes += (double)calls * c.bytes;
      out->total_bound_s += (double)calls * b;
      out->total_launches += calls;
    }
  }
}

static void json_str(FILE *o, const char *s) {
  fputc('"', o);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fprintf(o, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) fprintf(o, "\\u%04x", *s);
    else fputc(*s, o);
  }
  fputc('"', o);
}

void cuda_cost_report(FILE *o, const RtProgram *p, const Hardware *hw, const CudaCost *c, bool json) {
  double other_bytes = c->total_bytes - c->bytes[CC_GEMM] - c->bytes[CC_ATTENTION];
  if (json) {
    fprintf(o, "{\"hardware\": ");
    json_str(o, hw->name);
    fprintf(o, ", \"grad_accum\": %lld, \"steps\": [", (long long)c->grad_accum);
    bool first = true;
    for (int f = 0; f < p->n_funcs; f++) {
      int64_t calls = cuda_cost_calls(p, f, c->grad_accum);
      for (int s = 0; calls && s < p->funcs[f].n_steps; s++) {
        const RtStep *st = &p->funcs[f].steps[s];
        CudaStepCost sc;
        cuda_step_cost(p, st, &sc);
        fprintf(o, "%s\n  {\"func\": ", first ? "" : ",");
        json_str(o, p->funcs[f].name);
        fprintf(o, ", \"calls\": %lld, \"step\": %d, \"category\": \"%s\", \"kernel\": ", (long long)calls, s,
                cuda_cost_cat_name(sc.cat));
        json_str(o, st->kind == RT_STEP_GEMM      ? "cublasLtMatmul"
                    : st->kind == RT_STEP_BUILTIN ? "nccl"
                    : st->which >= 0 && st->which < p->n_kernels ? p->kernel_names[st->which] : "?");
        fprintf(o, ", \"label\": ");
        json_str(o, st->label);
        fprintf(o, ", \"flops\": %.0f, \"bytes\": %.0f, \"bound_us\": %.6g}", sc.flops, sc.bytes,
                cuda_step_bound(&sc, hw) * 1e6);
        first = false;
      }
    }
    fprintf(o, "\n], \"categories\": {");
    for (int k = 0; k < CC_COUNT; k++)
      fprintf(o, "%s\n  \"%s\": {\"launches\": %lld, \"flops\": %.0f, \"bytes\": %.0f, \"bound_ms\": %.6g}", k ? "," : "",
              cat_names[k], (long long)c->launches[k], c->flops[k], c->bytes[k], c->bound_s[k] * 1e3);
    fprintf(o, "\n}, \"launches\": %lld, \"flops\": %.0f, \"bytes\": %.0f, \"bytes_outside_gemm_attention\": %.0f, "
            "\"bound_ms\": %.6g}\n", (long long)c->total_launches, c->total_flops, c->total_bytes, other_bytes,
            c->total_bound_s * 1e3);
    return;
  }
  int *order = malloc(sizeof(int) * (size_t)(p->n_funcs + 1));   /* in the order a step runs them */
  int n_order = 0;
  for (int pass = 0; order && pass < 3; pass++)
    for (int f = 0; f < p->n_funcs; f++) {
      const char *name = p->funcs[f].name;
      int key = !strcmp(name, RT_FUNC_FIRST_GRAD_STEP) ? 0 : !strcmp(name, "grad_step") ? 1 : 2;
      if (key == pass) order[n_order++] = f;
    }
  if (!order) return;
  fprintf(o, "# every launch and library call of one step (");
  for (int q = 0, first = 1; q < n_order; q++) {
    int f = order[q];
    int64_t calls = cuda_cost_calls(p, f, c->grad_accum);
    if (calls) fprintf(o, "%s@%s x %lld", first ? "" : ", ", p->funcs[f].name, (long long)calls), first = 0;
  }
  fprintf(o, ") on %s:\n# bound = max(FLOPs / peak, bytes / bandwidth), efficiencies matmul %.2f, attention %.2f, "
          "memory %.2f\n", hw->name, hw->eff_matmul, hw->eff_attention, hw->eff_memory);
  fprintf(o, "%-16s %5s %-11s %10s %10s %10s  %-26s %s\n", "function", "step", "category", "GFLOP", "MB", "bound us",
          "kernel", "label");
  for (int q = 0; q < n_order; q++) {
    int f = order[q];
    int64_t calls = cuda_cost_calls(p, f, c->grad_accum);
    for (int s = 0; calls && s < p->funcs[f].n_steps; s++) {
      const RtStep *st = &p->funcs[f].steps[s];
      CudaStepCost sc;
      cuda_step_cost(p, st, &sc);
      const char *k = st->kind == RT_STEP_GEMM      ? "cublasLtMatmul"
                      : st->kind == RT_STEP_BUILTIN ? "nccl"
                      : st->which >= 0 && st->which < p->n_kernels ? p->kernel_names[st->which] : "?";
      fprintf(o, "@%-15s %5d %-11s %10.3f %10.3f %10.2f  %-26s %s\n", p->funcs[f].name, s, cuda_cost_cat_name(sc.cat),
              sc.flops * 1e-9, sc.bytes * 1e-6, cuda_step_bound(&sc, hw) * 1e6, k, st->label);
    }
  }
  free(order);
  fprintf(o, "\n%-12s %9s %12s %10s %11s\n", "category", "launches", "TFLOP", "GB", "bound ms");
  for (int k = 0; k < CC_COUNT; k++)
    fprintf(o, "%-12s %9lld %12.4f %10.3f %11.3f\n", cat_names[k], (long long)c->launches[k], c->flops[k] * 1e-12,
            c->bytes[k] * 1e-9, c->bound_s[k] * 1e3);
  fprintf(o, "%-12s %9lld %12.4f %10.3f %11.3f\n", "total", (long long)c->total_launches, c->total_flops * 1e-12,
          c->total_bytes * 1e-9, c->total_bound_s * 1e3);
  fprintf(o, "launches a step: %lld\nGB outside gemm and attention: %.3f\n", (long long)c->total_launches,
          other_bytes * 1e-9);
}

/* ---------------------------------------------------------------- the measured profile */

typedef struct {
  char name[64];
  int cat;
  int64_t launches;
  double ms, flops, bytes, bound_s;
} ProfRow;

static int by_ms(const void *a, const void *b) {
  double x = ((const ProfRow *)a)->ms, y = ((const ProfRow *)b)->ms;
  return x < y ? 1 : x > y ? -1 : strcmp(((const ProfRow *)a)->name, ((const ProfRow *)b)->name);
}

static void prof_line(FILE *o, const char *name, const ProfRow *r, const char *tail) {
  double s = r->ms * 1e-3;
  fprintf(o, "%-34s %8lld %10.3f %9.1f %9.1f %7.1f%%%s\n", name, (long long)r->launches, r->ms,
          s > 0 ? r->flops / s * 1e-12 : 0, s > 0 ? r->bytes / s * 1e-9 : 0, s > 0 ? 100 * r->bound_s / s : 0, tail);
}

void cuda_profile_report(FILE *o, const RtProgram *p, const Hardware *hw, const float *const *ms, int64_t grad_accum,
                         int top) {
  ProfRow cats[CC_COUNT], total;
  memset(cats, 0, sizeof cats);
  memset(&total, 0, sizeof total);
  int n_rows = 0, cap = 0;
  ProfRow *rows = NULL;
  for (int f = 0; f < p->n_funcs; f++) {
    int64_t calls = cuda_cost_calls(p, f, grad_accum);
    if (!calls || !ms[f]) continue;
    for (int s = 0; s < p->funcs[f].n_steps; s++) {
      const RtStep *st = &p->funcs[f].steps[s];
      CudaStepCost c;
      cuda_step_cost(p, st, &c);
      char name[64];
      if (st->kind == RT_STEP_GEMM)
        snprintf(name, sizeof name, "gemm %lldx%lldx%lld%s%s", (long long)st->i[1], (long long)st->i[2], (long long)st->i[3],
                 st->i[0] > 1 ? " batched" : "", st->i[CUDA_GEMM_EPI_INT] || st->i[CUDA_GEMM_BETA_INT] ? " +epilogue" : "");
      else if (st->kind == RT_STEP_BUILTIN) snprintf(name, sizeof name, "nccl");
      else snprintf(name, sizeof name, "%s", st->which >= 0 && st->which < p->n_kernels ? p->kernel_names[st->which] : "?");
      ProfRow d = {.cat = c.cat, .launches = calls, .ms = (double)calls * ms[f][s], .flops = (double)calls * c.flops,
                   .bytes = (double)calls * c.bytes, .bound_s = (double)calls * cuda_step_bound(&c, hw)};
      ProfRow *acc[2] = {&cats[c.cat], &total};
      for (int k = 0; k < 2; k++) {
        acc[k]->launches += d.launches;
        acc[k]->ms += d.ms;
        acc[k]->flops += d.flops;
        acc[k]->bytes += d.bytes;
        acc[k]->bound_s += d.bound_s;
      }
      int r = 0;
      while (r < n_rows && strcmp(rows[r].name, name)) r++;
      if (r == n_rows) {
        if (n_rows == cap) {
          ProfRow *nr = realloc(rows, sizeof *rows * (size_t)(cap = cap ? 2 * cap : 64));
          if (!nr) continue;   /* the per-kernel table only: the totals stay whole */
          rows = nr;
        }
        rows[n_rows] = (ProfRow){.cat = c.cat};
        snprintf(rows[n_rows++].name, sizeof rows[0].name, "%s", name);
      }
      rows[r].launches += d.launches;
      rows[r].ms += d.ms;
      rows[r].flops += d.flops;
      rows[r].bytes += d.bytes;
      rows[r].bound_s += d.bound_s;
    }
  }
  fprintf(o, "\nCUDA profile of one step (@grad_step x %lld%s, @optimizer_step x 1; the last call of each, timed by "
          "events around every launch and library call); roofline on %s\n", (long long)grad_accum,
          cuda_find_program_func(p, RT_FUNC_FIRST_GRAD_STEP) >= 0 ? ", the first as @" RT_FUNC_FIRST_GRAD_STEP : "", hw->name);
  fprintf(o, "%-34s %8s %10s %9s %9s %8s\n", "category", "launches", "ms", "TFLOP/s", "GB/s", "roofline");
  for (int k = 0; k < CC_COUNT; k++)
    if (cats[k].launches) prof_line(o, cat_names[k], &cats[k], "");
  prof_line(o, "total", &total, "");
  qsort(rows, (size_t)n_rows, sizeof *rows, by_ms);
  fprintf(o, "\n%-34s %8s %10s %9s %9s %8s  category\n", "kernel (the slowest)", "launches", "ms", "TFLOP/s", "GB/s",
          "roofline");
  char tail[24];
  for (int r = 0; r < n_rows && r < top; r++) {
    snprintf(tail, sizeof tail, "  %s", cat_names[rows[r].cat]);
    prof_line(o, rows[r].name, &rows[r], tail);
  }
  free(rows);
}
