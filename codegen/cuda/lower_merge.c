/* codegen/cuda/lower_merge.c — the multi-tensor AdamW and the merged fills: consecutive
   per-tensor launches over neighbouring tensors become one launch over their span.  Called by
   the lowering (lower.c) and by the first micro-batch's function (lower_grads.c), below both. */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cuda_internal.h"
#include "codegen/lower_common.h"

/* Is step st a launch of the prelude's kernel family `base` ("loom_adamw_", "loom_fill_")? */
static bool launches(const Lower *L, const RtStep *st, const char *base) {
  return st->kind == RT_STEP_KERNEL && st->which >= 0 && st->which < L->n_names &&
         !strncmp(L->names[st->which], base, strlen(base));
}

/* b starts where span a ends in a region (the next 64-byte-aligned place) and is alike;
   *dist: b's offset from a's, in elements. */
static bool follows(const RtBuf *a, const RtBuf *b, int64_t *dist) {
  int sz = cl_st_size(a->storage);
  if (a->region != b->region || a->region == RT_REGION_ARENA || a->storage != b->storage || a->round != b->round ||
      b->offset != cg_align64(a->offset + sz * a->n))
    return false;
  *dist = (b->offset - a->offset) / sz;
  return true;
}

static bool same_place(const RtBuf *a, const RtBuf *b) { return a->region == b->region && a->offset == b->offset; }

/* Can step u (an in-place AdamW or a fill of a global) extend step h over a longer span? */
static bool extends(const Lower *L, const RtStep *h, const RtStep *u) {
  if (h->which != u->which) return false;
  int64_t d0 = 0, d = 0;
  if (launches(L, h, "loom_adamw_") && launches(L, u, "loom_adamw_")) {
    for (int k = 0; k < 3; k++)   /* in place only */
      if (!same_place(&h->bufs[7 + k], &h->bufs[k]) || !same_place(&u->bufs[7 + k], &u->bufs[k])) return false;
    for (int k = 0; k < 4; k++)
      if (h->f[k] != u->f[k]) return false;
    for (int k = 4; k < 7; k++)   /* gscale, lr, t: the same scalars */
      if (!same_place(&h->bufs[k], &u->bufs[k])) return false;
    for (int k = 0; k < 4; k++) {   /* p, m, v, g: each right after the span so far, by as many elements */
      if (!follows(&h->bufs[k], &u->bufs[k], &d) || (k > 0 && d != d0)) return false;
      d0 = d;
    }
    /* the bf16 copies (lower_fuse.c: the parameters' mirror at half scale): the same distance */
    return h->n_out == 3 || (h->n_out == 4 && u->n_out == 4 && h->bufs[10].region == u->bufs[10].region &&
                             u->bufs[10].offset - h->bufs[10].offset == d0 * cl_st_size(h->bufs[10].storage));
  }
  return launches(L, h, "loom_fill_") && launches(L, u, "loom_fill_") && h->n_in == 0 && u->n_in == 0 &&
         h->f[0] == u->f[0] && follows(&h->bufs[0], &u->bufs[0], &d);
}

/* Does step t or u write bytes the other reads or writes? */
static bool conflict(const RtStep *t, const RtStep *u) {
  for (int i = 0; i < t->n_in + t->n_out; i++)
    for (int j = 0; j < u->n_in + u->n_out; j++)
      if ((i >= t->n_in || j >= u->n_in) && cl_overlap(&t->bufs[i], &u->bufs[j])) return true;
  return false;
}

/* The multi-tensor AdamW: consecutive in-place AdamW launches whose p, m, v and g each
   follow one another (cg_placement_order puts a weight-decay group's parameters, gradients
   and moments in the same order) become one launch over the span, and the fills that zero
   contiguous gradients one fill.  A launch moves into an earlier one only if no launch in
   between conflicts with it.  The 64-byte gaps between tensors are zero in every region
   (allocations start zeroed) and stay zero under both (AdamW of zeros is zero), so the
   results are those of one launch per tensor, bit for bit. */
void cl_merge_updates(const Lower *L, RtFunc *rf) {
  int out = 0, *tensors = calloc((size_t)rf->n_steps + 1, sizeof *tensors);   /* per kept step: merged into it */
  if (!tensors) return;   /* unmerged is correct, only slower */
  for (int s = 0; s < rf->n_steps; s++) {
    RtStep *u = &rf->steps[s];
    bool mergeable = launches(L, u, "loom_adamw_") || launches(L, u, "loom_fill_");
    int into = -1;
    for (int t = out - 1; mergeable && t >= 0; t--) {
      if (extends(L, &rf->steps[t], u)) {
        into = t;
        break;
      }
      if (conflict(&rf->steps[t], u)) break;   /* u may not move before t */
    }
    if (into < 0) {
      if (out != s) rf->steps[out] = *u;
      tensors[out++] = 1;
      continue;
    }
    RtStep *h = &rf->steps[into];   /* h covers [its start, the end of u) in each of its buffers */
    int64_t n = (u->bufs[0].offset - h->bufs[0].offset) / cl_st_size(u->bufs[0].storage) + u->bufs[0].n;
    bool adamw = launches(L, h, "loom_adamw_");
    for (int k = 0; k < (adamw ? 4 : 1); k++) h->bufs[k].n = n;
    for (int k = 7; adamw && k < 7 + h->n_out; k++) h->bufs[k].n = n;   /* p m v and the bf16 copy */
    h->i[0] = n;
    bool vec = strstr(L->names[h->which], "_v4") != NULL;   /* 4 per thread; every span stays a multiple of 4 */
    cl_launch_ew(h, vec ? n / 4 : n);
    tensors[into]++;
  }
  rf->n_steps = out;
  for (int t = 0; t < out; t++) cg_label_merged(&rf->steps[t], tensors[t]);
  free(tensors);
}
