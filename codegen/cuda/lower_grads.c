/* codegen/cuda/lower_grads.c — the first micro-batch writes the gradients (issue 31).
 *
 * The optimizer pass zeroes every gradient after AdamW (`fill $grad.* 0` in @optimizer_step)
 * so that the next step's @grad_step can add into it: 2 bytes a parameter moved again each
 * step for nothing (GPT-2 124M: 0.50 GB a step).  Instead, for a single-device program, the
 * lowering drops those fills from @optimizer_step and adds a variant of @grad_step,
 * RT_FUNC_FIRST_GRAD_STEP, for the first micro-batch of a step, which writes its gradients
 * rather than adding to them:
 *   - a gradient that GEMMs with beta = 1 (lower_gemm.c's accumulation) touch first, the whole
 *     of it (C the gradient, packed, one batch) or parts that cover it once (c_attn's q, k and v
 *     thirds, C with a row stride), gets beta = 0 there: not read, written;
 *   - every other gradient (pieces written apart, kernels that add, gradients nothing in
 *     @grad_step touches) is zeroed by a fill at the start of the variant, as the optimizer's
 *     fill did, only for those.
 * 0 + x is x (but for a negative zero, which becomes +0 when added): the same values as before.
 * The CUDA runtime (runtime/cuda/cuda_call.c, cuda_step.c) runs the variant instead of @grad_step when the
 * gradients are stale (after @optimizer_step), and zeroes them itself before anything else
 * reads them then (another function, the host).  A program with collectives (a mesh rank) or
 * without both functions keeps the fills.  LOOM_CUDA_NO_GRAD_WRITE=1: the fills stay (the tests'
 * unfused program). */
#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"

static int find(const RtProgram *p, const char *name) {
  for (int f = 0; f < p->n_funcs; f++)
    if (!strcmp(p->funcs[f].name, name)) return f;
  return -1;
}

static bool is_fill(const Lower *L, const RtStep *st) {
  return st->kind == RT_STEP_KERNEL && st->which >= 0 && st->which < L->n_names && !strncmp(L->names[st->which], "loom_fill_", 10) &&
         st->n_in == 0 && st->n_out == 1 && st->f[0] == 0;
}

static RtBuf global_buf(const RtGlobal *g, int storage) {
  return (RtBuf){.region = g->region, .storage = storage, .offset = g->offset, .n = g->n};
}

/* Does step st read or write any byte of b? */
static bool touches(const RtStep *st, const RtBuf *b) {
  for (int k = 0; k < st->n_in + st->n_out; k++)
    if (cl_overlap(&st->bufs[k], b)) return true;
  return false;
}

/* Is st a GEMM that adds its product (beta = 1, one batch, or a batch packed one after another:
   lower_moe.c's expert weight gradients) into a part of b, f32, and reads b nowhere else?  Its
   part as rows x [*col, *col + *cols) of b seen as rows of *ld columns. */
static bool gemm_adds_part(const RtStep *st, const RtBuf *b, int64_t *col, int64_t *cols, int64_t *ld) {
  if (st->kind != RT_STEP_GEMM || st->i[RT_GEMM_BETA_INT] != 1 || st->i[0] < 1 || st->n_out < 1) return false;
  if (st->i[0] > 1 && (st->i[RT_GEMM_LDC_INT] || st->i[8] != st->i[1] * st->i[2])) return false;
  const RtBuf *c = &st->bufs[st->n_in];
  int64_t M = st->i[0] * st->i[1], N = st->i[2], ldc = st->i[RT_GEMM_LDC_INT] ? st->i[RT_GEMM_LDC_INT] : st->i[2];
  int64_t at = (c->offset - b->offset) / 4;
  if (c->region != b->region || c->storage != RT_ST_F32 || c->offset < b->offset || (c->offset - b->offset) % 4 ||
      M * ldc != b->n || at + N > ldc)
    return false;
  for (int k = 0; k < st->n_in + st->n_out; k++)
    if (k != st->n_in && cl_overlap(&st->bufs[k], b)) return false;
  *col = at, *cols = N, *ld = ldc;
  return true;
}

/* The steps of body[0..n) that write global b first, as GEMMs adding into parts of it that
   together cover it once before any other step touches it: their indices into *first (at most
   8), their count; 0 when b is not written so. */
static int gemms_writing(const RtStep *body, int n, const RtBuf *b, int *first) {
  int k = 0;
  int64_t cover[8][2], ld = 0, total = 0;
  for (int s = 0; s < n && total < b->n; s++) {
    if (!touches(&body[s], b)) continue;
    int64_t col, cols, l;
    if (k == 8 || !gemm_adds_part(&body[s], b, &col, &cols, &l) || (k && l != ld)) return 0;
    for (int q = 0; q < k; q++)   /* disjoint from the parts so far */
      if (col < cover[q][0] + cover[q][1] && cover[q][0] < col + cols) return 0;
    ld = l;
    cover[k][0] = col, cover[k][1] = cols;
    first[k++] = s;
    total += cols * (b->n / ld);
  }
  return total == b->n ? k : 0;
}

int cl_first_grads_func(Lower *L, RtProgram *p) {
  int fg = find(p, "grad_step"), fo = find(p, "optimizer_step");
  if (cl_env_on("LOOM_CUDA_NO_GRAD_WRITE") || fg < 0 || fo < 0 || (L->m && mesh_world(&L->m->mesh) > 1) ||
      strlen(RT_FUNC_FIRST_GRAD_STEP) >= sizeof p->funcs[0].name)
    return 0;
  RtFunc *g = &p->funcs[fg], *o = &p->funcs[fo];
  for (int f = 0; f < 2; f++) {   /* collectives (a mesh rank): every rank's gradients meet elsewhere */
    const RtFunc *fn = f ? o : g;
    for (int s = 0; s < fn->n_steps; s++)
      if (fn->steps[s].kind == RT_STEP_BUILTIN) return 0;
  }
  /* the gradients, and the optimizer's fills of them: each gradient zeroed by one, nothing
     after a fill reads what it zeroed */
  int ng = 0, template_fill = -1;
  bool *drop = calloc((size_t)o->n_steps + 1, 1);
  if (!drop) return 0;   /* the fills stay: correct, only slower */
  for (int s = 0; s < o->n_steps; s++) {
    const RtStep *st = &o->steps[s];
    if (!is_fill(L, st) || st->bufs[0].region != RT_REGION_GRADS || st->bufs[0].storage != RT_ST_F32) continue;
    bool read_after = false;
    for (int t = s + 1; t < o->n_steps && !read_after; t++) read_after = touches(&o->steps[t], &st->bufs[0]);
    if (read_after) continue;
    drop[s] = true;
    template_fill = s;
  }
  for (int k = 0; k < p->n_globals; k++) {
    const RtGlobal *gl = &p->globals[k];
    if (gl->region != RT_REGION_GRADS) continue;
    ng++;
    RtBuf b = global_buf(gl, RT_ST_F32);
    int64_t covered = 0;   /* elements of it the dropped fills zero */
    for (int s = 0; s < o->n_steps; s++)
      if (drop[s] && cl_overlap(&o->steps[s].bufs[0], &b)) {
        const RtBuf *fb = &o->steps[s].bufs[0];
        int64_t lo = fb->offset > b.offset ? fb->offset : b.offset, hi_f = fb->offset + 4 * fb->n, hi_b = b.offset + 4 * b.n;
        covered += ((hi_f < hi_b ? hi_f : hi_b) - lo) / 4;
      }
    if (covered != gl->n) {   /* not zeroed by the optimizer's f32 fills: keep them all */
      free(drop);
      return 0;
    }
  }
  if (!ng || template_fill < 0) {
    free(drop);
    return 0;
  }
  /* the variant: fills first, then @grad_step's steps, beta 0 where a GEMM writes a gradient first */
  RtStep *steps = malloc(sizeof(RtStep) * ((size_t)g->n_steps + (size_t)ng + 1));
  if (!steps) {
    free(drop);
    return 0;
  }
  int n = 0;
  memcpy(steps + ng, g->steps, sizeof(RtStep) * (size_t)g->n_steps);
  RtStep *body = steps + ng;
  int written = 0;
  for (int k = 0; k < p->n_globals; k++) {
    const RtGlobal *gl = &p->globals[k];
    if (gl->region != RT_REGION_GRADS) continue;
    RtBuf b = global_buf(gl, RT_ST_F32);
    int first[8], nw = gemms_writing(body, g->n_steps, &b, first);
    for (int q = 0; q < nw; q++) {
      RtStep *w = &body[first[q]];
      w->i[RT_GEMM_BETA_INT] = 0;
      size_t len = strlen(w->label);
      snprintf(w->label + len, sizeof w->label - len, " (writes)");
    }
    if (nw) {
      written++;
      continue;
    }
    RtStep *st = &steps[n++];
    *st = o->steps[template_fill];
    st->bufs[0] = b;
    st->i[0] = gl->n;
    cl_launch_ew(st, gl->n);
    snprintf(st->label, sizeof st->label, "fill $%.80s", gl->name);
  }
  if (n < ng) memmove(steps + n, body, sizeof(RtStep) * (size_t)g->n_steps);
  RtFunc v = *g;
  snprintf(v.name, sizeof v.name, "%s", RT_FUNC_FIRST_GRAD_STEP);
  v.steps = steps;
  v.n_steps = n + g->n_steps;
  cl_merge_updates(L, &v);   /* the fills of neighbouring gradients: one launch */
  int out = 0;
  for (int s = 0; s < o->n_steps; s++)
    if (!drop[s]) o->steps[out++] = o->steps[s];
  o->n_steps = out;
  free(drop);
  p->funcs[p->n_funcs++] = v;
  (void)written;
  return 0;
}
