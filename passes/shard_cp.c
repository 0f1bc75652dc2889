/* passes/shard_cp.c — the shard pass's rules for the cp axis (context parallelism).
 *
 * Context parallelism splits the sequence: each cp rank holds T/cp positions of every
 * sequence of its micro-batch (the playbook's "Context Parallelism").  What is cp's own:
 *
 *   - Where the split starts.  Token arguments arrive whole on every cp rank (they are
 *     small); the token embedding takes the rank's positions (its ids S(1)), and from there
 *     the rules that hold on every axis carry S(1) through norms, matmuls and residuals.
 *     Targets meet the logits' split at the cross-entropy, the mean loss becomes a sum over
 *     the rank's tokens and an all-reduce, and weight gradients are partial sums over cp
 *     (contractions over the split sequence), reduced with dp's at the optimizer step.
 *
 *   - The layout (--cp-balance).  contiguous: rank c holds chunk c.  zigzag (default for
 *     causal models): the sequence in 2cp half-chunks, rank c holding c and 2cp-1-c, so every
 *     rank has as much causal attention work.  A zigzag S(1) is a contiguous split of the
 *     sequence permuted into "storage order" (rank 0's two halves, then rank 1's, ...): every
 *     move between S(1) and whole goes through that permutation, written as slices and a
 *     concat (shard_cp_to_storage / shard_cp_from_storage), so the collectives stay the
 *     plain ones.  Ops that need true positions (rope, the attention blocks) carry
 *     seq_axis/seq_n/zigzag and compute them from the rank's coordinate (ir_seq_pos).
 *
 *   - Attention (--cp-attn).  ring (default): the rank's queries meet every rank's K/V
 *     block in turn; K/V travel around the ring by send/recv (relative peers: to the next
 *     rank, from the previous), each transfer started before the block at hand is computed
 *     and received after it, so it is hidden behind that block's attention.  Each block gives
 *     a normalized output and its log-sum-exp; blocks merge exactly:
 *         m = max(l1, l2), l = m + log(e^(l1-m) + e^(l2-m)), o = o1 e^(l1-l) + o2 e^(l2-l).
 *     Blocks (and half-chunks of them) that the causal mask hides are skipped by the block
 *     kernel.  GQA: only the KV heads travel.  The backward runs the ring again: K/V travel
 *     as in the forward, and the dK/dV accumulators travel with them, one hop behind, so
 *     after cp hops each rank holds the gradient of its own keys and values.  The forward's
 *     merged output and lse are kept for it (or recomputed with the ring when the recompute
 *     pass cloned the attention's inputs).  allgather: K/V are all-gathered over cp (storage
 *     order; the block op knows every rank's positions), one block per rank, and dK/dV
 *     reduce-scattered back (Llama 3's long-context recipe).
 */
#include <stdlib.h>
#include <string.h>

#include "shard_internal.h"


/* An op built with its attributes set before its type is inferred (push: into the function). */
static Value *typed(Sharder *s, Op *op, Sharding sh) {
  Type t[IR_MAX_RESULTS];
  char msg[512];
  if (infer_types(op, t, msg, sizeof msg)) {
    shard_fail(s, "shard: cp: %s: %s", op_info(op->kind)->name, msg);
    return op->operands[0];
  }
  op->results[0]->type = t[0];
  op->results[0]->type.sh = sh;
  ptrvec_push(s->m->arena, &s->f->ops, op);
  return op->results[0];
}

/* ---- the zigzag permutation ---- */

/* Storage order -> true order along dim d (or back): 2n half-chunks, the one at storage
   slot j = 2r (+1) being rank r's first (second) half, at true half-chunk r (2n-1-r). */
static Value *permute(Sharder *s, Value *x, int d, bool to_storage) {
  int64_t n = s->m->mesh.size[AX_CP], T = x->type.dims[d];
  if (T % (2 * n)) {
    shard_fail(s, "shard: cp zigzag: dim %d (%lld) of a value split over cp is not a multiple of 2 x cp = %lld; "
                  "choose a seq that divides, or --cp-balance contiguous",
               d, (long long)T, (long long)(2 * n));
    return x;
  }
  int64_t h = T / (2 * n);
  Value **parts = malloc(sizeof(Value *) * (size_t)(2 * n));
  if (!parts) {
    shard_fail(s, "shard: out of memory");
    return x;
  }
  for (int64_t j = 0; j < 2 * n; j++) {
    int64_t r = j / 2, true_chunk = j % 2 ? 2 * n - 1 - r : r;
    /* to storage: slot j reads true chunk; from storage: true chunk i reads its slot */
    int64_t src;
    if (to_storage) src = true_chunk;
    else src = j < n ? 2 * j : 2 * (2 * n - 1 - j) + 1;
    int64_t lo[IR_MAX_RANK] = {0}, hi[IR_MAX_RANK];
    for (int i = 0; i < x->type.rank; i++) hi[i] = x->type.dims[i];
    lo[d] = src * h;
    hi[d] = (src + 1) * h;
    Op *sl = op_new(s->m, OP_SLICE, &x, 1, &x->type);
    op_set_ints(s->m, sl, "start", lo, x->type.rank);
    op_set_ints(s->m, sl, "end", hi, x->type.rank);
    parts[j] = typed(s, sl, x->type.sh);
  }
  Op *cat = op_new(s->m, OP_CONCAT, parts, (int)(2 * n), &x->type);
  free(parts);
  op_set_int(cat, "dim", d);
  Value *y = typed(s, cat, x->type.sh);
  y->name = x->name;
  return y;
}

Value *shard_cp_reshard(Sharder *s, Value *v, Place have, Place want) {
  int axis = AX_CP;
  if (!s->cp_zigzag) return NULL;   /* contiguous: the plain collectives */
  if (have.kind == SH_S && want.kind == SH_S && have.dim != want.dim) {   /* through whole */
    Value *w = shard_cp_reshard(s, v, have, R);
    return shard_cp_reshard(s, w, R, want);
  }
  if (have.kind == SH_S && want.kind == SH_R) {
    Value *g = shard_collective(s, OP_ALL_GATHER, v, axis, have.dim, 0, R, NULL);
    return permute(s, g, have.dim, false);
  }
  if (have.kind == SH_R && want.kind == SH_S)
    return shard_collective(s, OP_SHARD_SLICE, permute(s, v, want.dim, true), axis, want.dim, 0, want, NULL);
  if (have.kind == SH_P && want.kind == SH_S)
    return shard_collective(s, OP_REDUCE_SCATTER, permute(s, v, want.dim, true), axis, want.dim, 0, want, NULL);
  return NULL;
}

/* ---- the rules ---- */

bool shard_cp_rule(Sharder *s, const Op *op, const Place *in, const Type *gin, Decision *d) {
  switch (op->kind) {
  case OP_EMBEDDING:   /* the token embedding takes this rank's positions */
    if (s->in_step && gin[1].rank >= 2 && in[1].kind == SH_R && in[0].kind == SH_R) {
      d->need[0] = R;
      d->need[1] = S(1);
      d->give[0] = S(1);
      return true;
    }
    return false;
  case OP_ROPE:   /* positions come from the rank's coordinate: the split stays */
    d->need[0] = d->give[0] = in[0];
    return true;
  case OP_ATTENTION:
  case OP_ATTENTION_GRAD:   /* the ring (shard_cp_emit_attention): every operand and result S(1) */
    for (int i = 0; i < op->n_operands; i++) d->need[i] = S(1);
    for (int r = 0; r < op->n_results; r++) d->give[r] = S(1);
    return true;
  default: return false;
  }
}

/* rope over a sequence split on cp: positions from the rank's coordinate. */
void shard_cp_mark_positions(Sharder *s, Op *c) {
  const Value *x = c->operands[0];
  if (place_of(x, AX_CP).kind != SH_S) return;
  Attr *a = &c->attrs[op_attr_index(c->kind, "seq_axis")];
  a->s = mesh_axis_names[AX_CP];
  a->set = true;
  op_set_int(c, "seq_n", s->m->mesh.size[AX_CP]);
  if (s->cp_zigzag) op_set_bool(c, "zigzag", true);
}

/* ---- ring attention ---- */

static Value *op1(Sharder *s, OpKind k, Value *a, Value *b) {
  Value *ops[2] = {a, b};
  return shard_local_op(s, k, ops, b ? 2 : 1, NULL, a->type.sh, NULL);
}

static Value *cast_to(Sharder *s, Value *x, DType dt) {
  if (x->type.dtype == dt) return x;
  Type t = x->type;
  t.dtype = dt;
  return shard_local_op(s, OP_CAST, &x, 1, &t, x->type.sh, NULL);
}

/* [B,T,H] -> [B,T,H,Dh] like `like`. */
static Value *per_row(Sharder *s, Value *x, const Value *like) {
  Type k = x->type;
  k.dims[k.rank++] = 1;
  x = shard_local_op(s, OP_RESHAPE, &x, 1, &k, x->type.sh, NULL);
  Type t = like->type;
  t.dtype = x->type.dtype;
  return shard_local_op(s, OP_BROADCAST, &x, 1, &t, like->type.sh, NULL);
}

static void set_seq_attrs(Sharder *s, Op *op, const Op *like, int64_t shift) {
  op->attrs[0] = like->attrs[0];   /* scale, causal: the first two, in both schemas */
  op->attrs[1] = like->attrs[1];
  Attr *a = &op->attrs[op_attr_index(op->kind, "seq_axis")];
  a->s = mesh_axis_names[AX_CP];
  a->set = true;
  op_set_int(op, "seq_n", s->m->mesh.size[AX_CP]);
  if (s->cp_zigzag) op_set_bool(op, "zigzag", true);
  if (shift) op_set_int(op, "kv_shift", shift);
  op_set_int(op, "window", op_int(like, "window"));
}

/* The ring's length under a sliding window: 1 + the last step st at which some rank's queries
   see some key of rank (c - st) mod n (causal, and less than `window` positions back), so that
   the steps after it (every rank's block wholly outside the windows) are neither computed nor
   sent.  Without a window every step counts (the ring as it was).  L: a rank's rows. */
static int64_t ring_steps(const Sharder *s, const Op *like, int64_t L) {
  int64_t n = s->m->mesh.size[AX_CP], W = op_int(like, "window");
  if (W <= 0 || L <= 0) return n;
  bool zz = s->cp_zigzag, causal = op_bool(like, "causal");
  int64_t h = zz ? L / 2 : L, runs = zz ? 2 : 1, last = 0;
  for (int64_t st = 1; st < n; st++)
    for (int64_t c = 0; c < n; c++) {
      int64_t r = ((c - st) % n + n) % n;
      for (int64_t i = 0; i < runs; i++)
        for (int64_t j = 0; j < runs; j++) {
          int64_t qlo = ir_seq_pos(c, i * h, L, n, zz), qhi = qlo + h - 1;
          int64_t klo = ir_seq_pos(r, j * h, L, n, zz), khi = klo + h - 1;
          if ((!causal || klo <= qhi) && qlo - khi < W) last = st;
        }
    }
  return last + 1;
}

/* A multi-result op on per-rank values; results typed by inference, placed like `sh`. */
static Op *block_op(Sharder *s, OpKind k, Value **ops, int n, const Op *like, int64_t shift, const Sharding *sh) {
  Type t[IR_MAX_RESULTS];
  int nres = op_info(k)->n_results;
  for (int r = 0; r < nres; r++) t[r] = ops[0]->type;
  Op *c = op_new_n(s->m, k, ops, n, t, nres);
  set_seq_attrs(s, c, like, shift);
  char msg[512];
  if (infer_types(c, t, msg, sizeof msg)) {
    shard_fail(s, "shard: cp: %s: %s", op_info(k)->name, msg);
    return c;
  }
  for (int r = 0; r < nres; r++) {
    c->results[r]->type = t[r];
    c->results[r]->type.sh = sh[r];
  }
  ptrvec_push(s->m->arena, &s->f->ops, c);
  return c;
}

/* send x to the cp rank `peer` ahead (coordinates mod n); the matching recv_from names the
   sender as n - peer ahead. */
static void send_to(Sharder *s, Value *x, int64_t peer, int64_t tag) {
  Op *o = op_new(s->m, OP_SEND, &x, 1, NULL);
  Attr *a = &o->attrs[op_attr_index(OP_SEND, "axis")];
  a->s = mesh_axis_names[AX_CP];
  a->set = true;
  op_set_int(o, "n", s->m->mesh.size[AX_CP]);
  op_set_int(o, "peer", peer);
  op_set_int(o, "tag", tag);
  op_set_bool(o, "rel", true);
  ptrvec_push(s->m->arena, &s->f->ops, o);
}

static Value *recv_from(Sharder *s, const Value *like, int64_t peer, int64_t tag) {
  Type t = like->type;
  Op *o = op_new(s->m, OP_RECV, NULL, 0, &t);
  Attr *a = &o->attrs[op_attr_index(OP_RECV, "axis")];
  a->s = mesh_axis_names[AX_CP];
  a->set = true;
  op_set_int(o, "n", s->m->mesh.size[AX_CP]);
  op_set_int(o, "peer", peer);
  op_set_int(o, "tag", tag);
  op_set_bool(o, "rel", true);
  o->results[0]->type = t;
  o->results[0]->name = like->name;
  ptrvec_push(s->m->arena, &s->f->ops, o);
  return o->results[0];
}

/* the ring's hops: to the next cp rank, from the previous */
static void send_next(Sharder *s, Value *x, int64_t tag) { send_to(s, x, 1, tag); }
static Value *recv_prev(Sharder *s, const Value *like, int64_t tag) {
  return recv_from(s, like, s->m->mesh.size[AX_CP] - 1, tag);
}

/* The forward ring: the merged output (f32) and lse of q against every rank's k, v. */
static void ring_forward(Sharder *s, const Op *like, Value *q, Value *k, Value *v, Value **o_out, Value **lse_out) {
  int64_t n = s->m->mesh.size[AX_CP];
  Sharding sh[2] = {q->type.sh, q->type.sh};
  if (s->cp_allgather) {
    Value *ops[3] = {q, shard_collective(s, OP_ALL_GATHER, k, AX_CP, 1, 0, R, NULL),
                     shard_collective(s, OP_ALL_GATHER, v, AX_CP, 1, 0, R, NULL)};
    Op *b = block_op(s, OP_ATTENTION_BLOCK, ops, 3, like, -1, sh);
    *o_out = b->results[0];
    *lse_out = b->results[1];
    return;
  }
  Value *o = NULL, *lse = NULL;
  n = ring_steps(s, like, q->type.dims[1]);
  for (int64_t st = 0; st < n && !s->failed; st++) {
    int64_t tag = s->cp_tag;
    if (st < n - 1) {   /* the next block is on its way while this one is computed */
      send_next(s, k, tag);
      send_next(s, v, tag + 1);
      s->cp_tag += 2;
    }
    Value *ops[3] = {q, k, v};
    Op *b = block_op(s, OP_ATTENTION_BLOCK, ops, 3, like, st, sh);
    Value *ob = b->results[0], *lb = b->results[1];
    if (!o) {
      o = ob, lse = lb;
    } else {   /* the exact merge by log-sum-exp */
      Value *m = op1(s, OP_MAX, lse, lb);
      Value *ea = op1(s, OP_EXP, op1(s, OP_SUB, lse, m), NULL), *eb = op1(s, OP_EXP, op1(s, OP_SUB, lb, m), NULL);
      Value *l = op1(s, OP_ADD, ea, eb);
      Value *wa = per_row(s, op1(s, OP_DIV, ea, l), o), *wb = per_row(s, op1(s, OP_DIV, eb, l), o);
      o = op1(s, OP_ADD, op1(s, OP_MUL, o, wa), op1(s, OP_MUL, ob, wb));
      lse = op1(s, OP_ADD, m, op1(s, OP_LOG, l, NULL));
    }
    if (st < n - 1) {
      k = recv_prev(s, k, tag);
      v = recv_prev(s, v, tag + 1);
    }
  }
  *o_out = o;
  *lse_out = lse;
}

/* The backward ring: dq, dk, dv (f32) of one attention, given its merged output and lse. */
static void ring_backward(Sharder *s, const Op *like, Value *dout, Value *q, Value *k, Value *v, Value *o, Value *lse,
                          Value **res) {
  int64_t n = s->m->mesh.size[AX_CP];
  /* delta = sum over the head dim of dout * out, per row */
  Value *prod = op1(s, OP_MUL, cast_to(s, dout, DT_F32), o);
  int64_t last = 3;
  Op *red = op_new(s->m, OP_REDUCE_SUM, &prod, 1, &lse->type);
  op_set_ints(s->m, red, "dims", &last, 1);
  Value *delta = typed(s, red, lse->type.sh);
  Sharding shq = q->type.sh, shk = k->type.sh, sh[3] = {shq, shk, shk};
  if (s->cp_allgather) {
    Value *ops[6] = {dout, q, shard_collective(s, OP_ALL_GATHER, k, AX_CP, 1, 0, R, NULL),
                     shard_collective(s, OP_ALL_GATHER, v, AX_CP, 1, 0, R, NULL), lse, delta};
    set_place(&sh[1], AX_CP, P);
    sh[2] = sh[1];
    Op *b = block_op(s, OP_ATTENTION_BLOCK_GRAD, ops, 6, like, -1, sh);
    res[0] = b->results[0];
    for (int r = 1; r < 3; r++)
      res[r] = shard_collective(s, OP_REDUCE_SCATTER, b->results[r], AX_CP, 1, 0, S(1), NULL);
    return;
  }
  Value *dq = NULL, *dk = NULL, *dv = NULL;
  int64_t steps = ring_steps(s, like, q->type.dims[1]);
  for (int64_t st = 0; st < steps && !s->failed; st++) {
    int64_t tag = s->cp_tag;
    s->cp_tag += 4;
    if (st < steps - 1) {
      send_next(s, k, tag);
      send_next(s, v, tag + 1);
    }
    Value *ops[6] = {dout, q, k, v, lse, delta};
    Op *b = block_op(s, OP_ATTENTION_BLOCK_GRAD, ops, 6, like, st, sh);
    dq = dq ? op1(s, OP_ADD, dq, b->results[0]) : b->results[0];
    if (st == 0) {
      dk = b->results[1], dv = b->results[2];
    } else {   /* the accumulators of these keys arrive from the previous rank */
      dk = op1(s, OP_ADD, recv_prev(s, b->results[1], tag - 2), b->results[1]);
      dv = op1(s, OP_ADD, recv_prev(s, b->results[2], tag - 1), b->results[2]);
    }
    if (st < steps - 1) {
      send_next(s, dk, tag + 2);
      send_next(s, dv, tag + 3);
      k = recv_prev(s, k, tag);
      v = recv_prev(s, v, tag + 1);
    }
  }
  res[0] = dq;
  if (steps == 1) {   /* (a window within each rank's rows) every rank's keys stayed home */
    res[1] = dk;
    res[2] = dv;
    return;
  }
  /* the last hop brings each rank its own keys' gradients: from rank c + steps - 1 (the
     next rank when the ring went all the way round) */
  int64_t tag = s->cp_tag;
  s->cp_tag += 2;
  send_to(s, dk, n - (steps - 1), tag);
  send_to(s, dv, n - (steps - 1), tag + 1);
  res[1] = recv_from(s, dk, steps - 1, tag);
  res[2] = recv_from(s, dv, steps - 1, tag + 1);
}

/* attention / attention_grad whose operands are split over cp (S(1) there, placed by the
   other axes' rules elsewhere): the ring, or the all-gather form. */
void shard_cp_emit_attention(Sharder *s, const Op *op, Value **ops) {
  bool grad = op->kind == OP_ATTENTION_GRAD;
  int qi = grad ? 1 : 0;
  Value *q = ops[qi], *k = ops[qi + 1], *v = ops[qi + 2], *o = NULL, *lse = NULL;
  /* The forward's merged output and lse, kept for the backward of the same attention. */
  for (int i = 0; grad && i < s->n_cp_fwd; i++)
    if (s->cp_fwd[i].q == op->operands[1] && s->cp_fwd[i].k == op->operands[2] && s->cp_fwd[i].v == op->operands[3])
      o = s->cp_fwd[i].o, lse = s->cp_fwd[i].lse;
  if (!o) ring_forward(s, op, q, k, v, &o, &lse);   /* (the backward of a recomputed attention: again) */
  if (s->failed) return;
  if (!grad) {
    if (s->n_cp_fwd < (int)(sizeof s->cp_fwd / sizeof s->cp_fwd[0]))
      s->cp_fwd[s->n_cp_fwd++] = (CpForward){op->operands[0], op->operands[1], op->operands[2], o, lse};
    Value *y = cast_to(s, o, op->results[0]->type.dtype);
    y->name = op->results[0]->name;
    s->map[op->results[0]->id] = y;
    return;
  }
  Value *res[3];
  ring_backward(s, op, ops[0], q, k, v, o, lse, res);
  for (int r = 0; r < 3 && !s->failed; r++) {
    Value *y = cast_to(s, res[r], ops[r + 1]->type.dtype);
    y->name = op->results[r]->name;
    s->map[op->results[r]->id] = y;
  }
}
