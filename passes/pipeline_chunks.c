/* passes/pipeline_chunks.c — the pipeline pass's chunk functions: the cut (which values
 * cross each chunk boundary; a value needed further away relayed through the chunks between),
 * then per chunk @fwd.cK and
 * @bwd.cK (or @bwd_b.cK and @bwd_w.cK), with their sends, receives and stash, from the tables
 * pipeline_units.c made.  Its own file: the functions are built here and nowhere else; the
 * optimizer steps (pipeline_optimizer.c) reuse only its op copier (Out, pipeline_emit). */
#include <stdlib.h>
#include <string.h>

#include "passes/pipeline_internal.h"
#include "ir/schedule.h"

/* map[id] = x; the pool remembers what to clear (end_out). */
static void map_set(Out *o, int id, Value *x) {
  if (o->clone && !o->map[id]) o->pp->touched[o->pp->n_touched++] = id;
  o->map[id] = x;
}

/* A function of the chunks is done: its map (the pool) is cleared for the next. */
static void end_out(Out *o) {
  PP *pp = o->pp;
  for (int k = 0; k < pp->n_touched; k++) o->map[pp->touched[k]] = NULL;
  pp->n_touched = 0;
}


/* A chunk function's new op: the parameters its global operands are about are used by the
   chunk's rank (what global_users would find walking the functions afterwards). */
static void note_globals(Out *o, const Op *c) {
  PP *pp = o->pp;
  if (!o->clone || !pp->used) return;
  for (int k = 0; k < c->n_operands; k++)
    if (c->operands[k]->kind == VAL_GLOBAL) {
      const Global *p = param_of(pp, c->operands[k]->global);
      if (p) pp->used[pp->rank * pp->used_ng + p->index] = true;
    }
}

/* A floating op (parameters and constants only) cloned into o->f. */
static Value *clone_float(Out *o, Value *v) {
  pipeline_emit(o, o->pp->def[v->id]);   /* its operands got (and cloned) in turn */
  return o->map[v->id];
}

Value *pipeline_get(Out *o, Value *v) {
  if (v->kind == VAL_GLOBAL) return v;
  if (o->map[v->id]) return o->map[v->id];
  if (o->clone && v->kind == VAL_RESULT && o->pp->vphase[v->id] == PH_FLOAT) return clone_float(o, v);
  return NULL;
}

void pipeline_emit(Out *o, Op *op) {
  Value *ops[256];   /* (a concat of cp's zigzag permutation has 2cp operands; shard allows cp <= 128) */
  for (int k = 0; k < op->n_operands && k < 256; k++) ops[k] = pipeline_get(o, op->operands[k]);
  Op *c = op_new_n(o->pp->m, op->kind, ops, op->n_operands, NULL, op->n_results);   /* types copied once, below */
  /* the schema's attributes only (the rest stay zero): the whole array is 8 cache lines of
     an op the walk has not touched yet, and this copy was the pass's hottest line */
  memcpy(c->attrs, op->attrs, sizeof(Attr) * (size_t)op_info(op->kind)->n_attrs);
  c->callee = op->callee;
  ptrvec_push(o->pp->m->arena, &o->f->ops, c);
  note_globals(o, c);
  for (int r = 0; r < op->n_results; r++) {
    c->results[r]->type = op->results[r]->type;
    c->results[r]->name = op->results[r]->name;
    map_set(o, op->results[r]->id, c->results[r]);
  }
}

static Out new_out(PP *pp, const char *name) {
  Out o = {module_add_func(pp->m, name), pp->map_pool, pp, true};
  for (int a = 0; a < pp->g->args.n; a++) {
    Value *v = pp->g->args.items[a];
    map_set(&o, v->id, func_add_arg(o.f, v->name, v->type));
  }
  return o;
}

static void p2p(Out *o, Value *v, bool send, int peer, int tag) {
  PP *pp = o->pp;
  Op *op;
  if (send) {
    Value *x = pipeline_get(o, v);
    op = op_new(pp->m, OP_SEND, &x, 1, NULL);
  } else {
    op = op_new(pp->m, OP_RECV, NULL, 0, &v->type);
    op->results[0]->name = v->name;
    map_set(o, v->id, op->results[0]);
  }
  op->attrs[op_attr_index(op->kind, "axis")] = (Attr){.kind = ATTR_STR, .s = "pp", .set = true};
  op_set_int(op, "n", pp->p);
  op_set_int(op, "peer", peer);
  op_set_int(op, "tag", tag);
  ptrvec_push(pp->m->arena, &o->f->ops, op);
  note_globals(o, op);
}

/* Relays: a value a chunk more than one away needs. A forward value read two or more chunks
   on goes up the forward chunk by chunk (each chunk between receives it and sends it on); a
   forward value read by an earlier chunk's backward, or a backward value read two or more
   chunks down, goes down the backward the same way (a forward value stashed in its own chunk
   first). The load-balancing loss of a mixture of experts makes both: the routing counts of a
   sparse layer summed with the next sparse layer's (a dense layer between: two chunks on), and
   their sum over every layer, which the loss's gradient reads in every sparse layer. The
   crossing bits of chunks vchunk - 1 .. vchunk + 1 stay in need3; a relay's further ones are
   here. */
static int relay_cmp(const void *a, const void *b) {
  const PipeRelay *x = a, *y = b;
  return x->id != y->id ? (x->id < y->id ? -1 : 1) : (x->c > y->c) - (x->c < y->c);
}

static void relay_or(PP *pp, int id, int c, unsigned char bits) {
  int d = c - pp->vchunk[id];
  if (d >= -1 && d <= 1) {
    pp->need3[3 * (size_t)id + (size_t)(d + 1)] |= bits;
    return;
  }
  for (int r = 0; r < pp->n_relays; r++)
    if (pp->relays[r].id == id && pp->relays[r].c == c) {
      pp->relays[r].bits |= bits;
      return;
    }
  if (pp->n_relays == pp->cap_relays) {
    pp->cap_relays = pp->cap_relays ? 2 * pp->cap_relays : 64;
    pp->relays = realloc(pp->relays, sizeof *pp->relays * (size_t)pp->cap_relays);
  }
  pp->relays[pp->n_relays++] = (PipeRelay){id, c, bits};
}

/* Value id from chunk `from` to chunk `to`, one boundary at a time: `first` at its own chunk,
   `mid` at each between (received and sent on), `last` at the reader's. */
static void relay_path(PP *pp, int id, int from, int to, unsigned char first, unsigned char mid, unsigned char last) {
  int step = to > from ? 1 : -1;
  relay_or(pp, id, from, first);
  for (int c = from + step; c != to; c += step) relay_or(pp, id, c, mid);
  relay_or(pp, id, to, last);
}

/* Tags: (chunk the transfer goes into) x 2 + direction (0 forward, 1 backward), x 256 + the
   value's index at that boundary. */
static int tag_of(int into, int dir, int k) { return ((into * 2 + dir) << 8) | k; }

/* The values each chunk's parts need from elsewhere, and checks that they can get there,
   for every chunk at once: build_chunk then walks only its own ops and values. Bits: 1 F-in
   (from c-1), 2 F->B stash, 4 B-in (from c+1), 8 B->W stash, 16 F-out (to c+1), 32 B-out
   (to c-1). */
int pipeline_cut_all(PP *pp) {
  Func *g = pp->g;
  int nv = pp->n_vals, n = g->ops.n, C = pp->C;
  pp->need3 = calloc(3 * (size_t)nv + 1, 1);
  pp->vchunk = malloc(sizeof(int) * ((size_t)nv + 1));
  pp->cv_start = calloc((size_t)C + 2, sizeof(int));
  pp->first_op = malloc(sizeof(int) * (3 * (size_t)C + 1));
  pp->next_op = malloc(sizeof(int) * ((size_t)n + 1));
  pp->map_pool = calloc((size_t)nv + 1, sizeof(Value *));
  pp->touched = malloc(sizeof(int) * ((size_t)nv + 1));
  int *tail = malloc(sizeof(int) * (3 * (size_t)C + 1));
  if (!pp->need3 || !pp->vchunk || !pp->cv_start || !pp->first_op || !pp->next_op || !pp->map_pool || !pp->touched || !tail) {
    free(tail);
    return pipeline_fail(pp, IR_ERUN, "pipeline: out of memory");
  }
  for (int id = 0; id < nv; id++) pp->vchunk[id] = -1;
  for (int k = 0; k < 3 * C; k++) pp->first_op[k] = tail[k] = -1;
  for (int i = 0; i < n; i++) {
    Op *op = g->ops.items[i];
    pp->next_op[i] = -1;
    if (pp->phase[i] != PH_F && pp->phase[i] != PH_B) continue;
    int oc = op_chunk(pp, i), part = pp->part[i];
    int kind = 3 * oc + (pp->phase[i] == PH_F ? 0 : part == PART_W ? 2 : 1);
    if (pp->phase[i] == PH_F || part == PART_B || part == PART_W) {   /* the ops build_chunk emits, in order */
      if (tail[kind] < 0) pp->first_op[kind] = i;
      else pp->next_op[tail[kind]] = i;
      tail[kind] = i;
    }
    for (int k = 0; k < op->n_operands; k++) {
      Value *v = op->operands[k];
      if (v->kind != VAL_RESULT || pp->vphase[v->id] == PH_FLOAT) continue;
      int vc = val_chunk(pp, v), d = oc - vc;
      unsigned char *nd = pp->need3 + 3 * (size_t)v->id;   /* [0]: chunk vc - 1, [1]: vc, [2]: vc + 1 */
      pp->vchunk[v->id] = vc;
      unsigned char w = part == PART_W ? 8 : 0;   /* the reader is a W part: B -> W stash */
      if (pp->vphase[v->id] == PH_F && d < 0 && part != PART_F) {   /* relayed down the backward (stashed first) */
        relay_path(pp, v->id, vc, oc, 2 | 32, 4 | 32, 4 | w);
      } else if (pp->vphase[v->id] == PH_F && d > 1) {   /* relayed up the forward */
        relay_path(pp, v->id, vc, oc, 16, 1 | 16, (unsigned char)(1 | (part != PART_F ? 2 : 0) | w));
      } else if (pp->vphase[v->id] == PH_F) {
        if (d != 0 && d != 1) goto bad;
        nd[d + 1] |= (part != PART_F ? 2 : 0) | (part == PART_W ? 8 : 0) | (d == 1 ? 1 : 0);
        if (d == 1) nd[1] |= 16;
      } else {   /* a backward value */
        int dpart = pp->vidx[v->id] >= 0 ? pp->part[pp->vidx[v->id]] : PART_F;
        if (d > 0) goto bad;
        if (d == 0 && part == PART_W && dpart != PART_W) nd[1] |= 8;
        if (d == -1) nd[0] |= 4 | (part == PART_W ? 8 : 0), nd[1] |= 32;
        if (d < -1) relay_path(pp, v->id, vc, oc, 32, 4 | 32, 4 | w);   /* relayed down the backward */
      }
      continue;
    bad:;
      char text[512];
      free(tail);
      return pipeline_fail(pp, IR_EINPUT, "the pipeline cut needs %%%s (made in the backward of chunk %d) in chunk %d, "
                  "which runs before it (op: %s); try another --pp-split",
                  v->name ? v->name : "?", vc, oc, op_to_string(op, text, sizeof text));
    }
  }
  free(tail);
  if (pp->n_relays) qsort(pp->relays, (size_t)pp->n_relays, sizeof *pp->relays, relay_cmp);
  /* each chunk's values with bits, ids ascending (= program order of their ops) */
  for (int pass = 0; pass < 2; pass++) {
    int *at = pass ? calloc((size_t)C + 1, sizeof(int)) : NULL;
    if (pass) {
      for (int c = 0; c < C; c++) at[c] = pp->cv_start[c];
      pp->cv_ids = malloc(sizeof(int) * ((size_t)pp->cv_start[C] + 1));
    }
    int rr = 0;
    for (int id = 0; id < nv; id++) {
      for (int d = -1; d <= 1 && pp->vchunk[id] >= 0; d++) {
        int c = pp->vchunk[id] + d;
        if (c < 0 || c >= C || !pp->need3[3 * (size_t)id + (size_t)(d + 1)]) continue;
        if (pass) pp->cv_ids[at[c]++] = id;
        else pp->cv_start[c + 1]++;
      }
      for (; rr < pp->n_relays && pp->relays[rr].id == id; rr++) {   /* sorted by id */
        if (pass) pp->cv_ids[at[pp->relays[rr].c]++] = id;
        else pp->cv_start[pp->relays[rr].c + 1]++;
      }
    }
    if (!pass)
      for (int c = 0; c < C; c++) pp->cv_start[c + 1] += pp->cv_start[c];
    free(at);
  }
  return 0;
}

void pipeline_cut_free(PP *pp) {
  free(pp->relays);
  pp->relays = NULL;
  pp->n_relays = pp->cap_relays = 0;
  free(pp->need3), free(pp->vchunk), free(pp->cv_start), free(pp->cv_ids), free(pp->first_op), free(pp->next_op);
  free(pp->map_pool), free(pp->touched);
}

/* The crossing bits of value id at chunk c (cut_all). */
static int need_at(const PP *pp, int id, int c) {
  int d = c - pp->vchunk[id];
  if (d >= -1 && d <= 1) return pp->need3[3 * (size_t)id + (size_t)(d + 1)];
  for (int r = 0; r < pp->n_relays; r++)
    if (pp->relays[r].id == id && pp->relays[r].c == c) return pp->relays[r].bits;
  return 0;
}

/* Chunk c's functions: @fwd.cK, then @bwd.cK (or @bwd_b.cK and @bwd_w.cK). */
int pipeline_build_chunk(PP *pp, int c) {
  char name[64];
  const int *ids = pp->cv_ids + pp->cv_start[c], nids = pp->cv_start[c + 1] - pp->cv_start[c];
  bool last = c == pp->C - 1;
  pp->rank = chunk_rank(pp, c);
  /* a transfer's tag holds its index among the values crossing that boundary in 8 bits */
  int crossing[4] = {0, 0, 0, 0};
  for (int x = 0; x < nids; x++) {
    int nd = need_at(pp, ids[x], c);
    crossing[0] += (nd & 1) != 0, crossing[1] += (nd & 16) != 0, crossing[2] += (nd & 4) != 0, crossing[3] += (nd & 32) != 0;
  }
  for (int q = 0; q < 4; q++)
    if (crossing[q] > 256)
      return pipeline_fail(pp, IR_EINPUT, "%d values cross a boundary of chunk %d, and a pipeline carries at most 256 there; "
                  "try another --pp-split or fewer chunks", crossing[q], c);
  /* ---- @fwd.cK ---- */
  snprintf(name, sizeof name, "fwd.c%d", c);
  Out o = new_out(pp, name);
  int k = 0;
  for (int x = 0; x < nids; x++)
    if (need_at(pp, ids[x], c) & 1) p2p(&o, pp->vval[ids[x]], false, chunk_rank(pp, c - 1), tag_of(c, 0, k++));
  for (int i = pp->first_op[3 * c]; i >= 0; i = pp->next_op[i]) pipeline_emit(&o, pp->g->ops.items[i]);
  k = 0;
  for (int x = 0; x < nids; x++)
    if (need_at(pp, ids[x], c) & 16) p2p(&o, pp->vval[ids[x]], true, chunk_rank(pp, c + 1), tag_of(c + 1, 0, k++));
  if (last) {
    Value *loss = pp->g->rets.items[0];
    Value *l = pipeline_get(&o, loss);
    if (!l) {
      end_out(&o);
      return pipeline_fail(pp, IR_ERUN, "internal error: the loss is not computed in the last chunk");
    }
    func_add_ret(o.f, l);
  }
  /* the stash: values received from c-1 first, then the others (ids ascending in each) */
  Value **stash = calloc((size_t)nids + 1, sizeof(Value *));
  int ns = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int x = 0; x < nids; x++) {
      int nd = need_at(pp, ids[x], c);
      if (!(nd & 2) || (pass == 0) != ((nd & 1) != 0)) continue;
      Value *v = pp->vval[ids[x]], *y = o.map[ids[x]];
      if (!y) {
        end_out(&o);
        free(stash);
        return pipeline_fail(pp, IR_ERUN, "internal error: stash value %%%s is not in @%s", v && v->name ? v->name : "?", name);
      }
      func_add_ret(o.f, y);
      stash[ns++] = v;
    }
  end_out(&o);
  /* ---- @bwd.cK or @bwd_b.cK ---- */
  snprintf(name, sizeof name, pp->split ? "bwd_b.c%d" : "bwd.c%d", c);
  o = new_out(pp, name);
  for (int q = 0; q < ns; q++) map_set(&o, stash[q]->id, func_add_arg(o.f, stash[q]->name, stash[q]->type));
  k = 0;
  for (int x = 0; x < nids; x++)
    if (need_at(pp, ids[x], c) & 4) p2p(&o, pp->vval[ids[x]], false, chunk_rank(pp, c + 1), tag_of(c, 1, k++));
  for (int i = pp->first_op[3 * c + 1]; i >= 0; i = pp->next_op[i]) pipeline_emit(&o, pp->g->ops.items[i]);
  if (c > 0) {
    k = 0;
    for (int x = 0; x < nids; x++)
      if (need_at(pp, ids[x], c) & 32) p2p(&o, pp->vval[ids[x]], true, chunk_rank(pp, c - 1), tag_of(c - 1, 1, k++));
  }
  if (pp->split) {
    /* W's inputs: stash values W reads (forward or backward), in id order */
    Value **ws = calloc((size_t)nids + 1, sizeof(Value *));
    int nw = 0;
    for (int x = 0; x < nids; x++)
      if (need_at(pp, ids[x], c) & 8) {
        Value *y = o.map[ids[x]];
        if (!y) {
          end_out(&o);
          free(ws), free(stash);
          return pipeline_fail(pp, IR_ERUN, "internal error: %%%s, which W needs, is not in @%s",
                      pp->vval[ids[x]]->name ? pp->vval[ids[x]]->name : "?", name);
        }
        func_add_ret(o.f, y);
        ws[nw++] = pp->vval[ids[x]];
      }
    end_out(&o);
    snprintf(name, sizeof name, "bwd_w.c%d", c);
    o = new_out(pp, name);
    for (int q = 0; q < nw; q++) map_set(&o, ws[q]->id, func_add_arg(o.f, ws[q]->name, ws[q]->type));
    for (int i = pp->first_op[3 * c + 2]; i >= 0; i = pp->next_op[i]) pipeline_emit(&o, pp->g->ops.items[i]);
    free(ws);
  }
  end_out(&o);
  free(stash);
  return 0;
}
