/* ir/interp.c — the reference executor: runs a verified function op by op on the CPU.
   Tensors hold floats as f32 values already rounded to their dtype (so bf16 is emulated
   exactly), integers as int64.  Intermediate tensors are freed after their last use.
   The meaning of each op is in interp_ops.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "interp_ops.h"

Tensor *tensor_new(const Type *t) {
  Tensor *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->type = *t;
  x->n = type_numel(t);
  size_t n = (size_t)(x->n ? x->n : 1);
  if (dtype_is_float(t->dtype)) x->f = calloc(n, sizeof(float));
  else x->i = calloc(n, sizeof(int64_t));
  if (!x->f && !x->i) {
    free(x);
    return NULL;
  }
  return x;
}

void tensor_free(Tensor *t) {
  if (!t) return;
  free(t->f);
  free(t->i);
  free(t);
}

Tensor *tensor_clone(const Tensor *t) {
  Tensor *c = tensor_new(&t->type);
  if (!c) return NULL;
  if (t->f) memcpy(c->f, t->f, sizeof(float) * (size_t)t->n);
  else memcpy(c->i, t->i, sizeof(int64_t) * (size_t)t->n);
  return c;
}

/* ---- deterministic initialization ---- */

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return ((splitmix64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

/* Each global gets its own stream, seeded from the run seed and its name, so adding a
   parameter does not change the others. */
static uint64_t name_seed(uint64_t seed, const char *name) {
  uint64_t h = seed ^ 0x5851F42D4C957F2Dull;
  for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
  return h;
}

void globals_init(const Module *m, GlobalStore *g, uint64_t seed) {
  for (int i = 0; i < m->globals.n; i++) {
    const Global *gl = m->globals.items[i];
    Tensor *t = g->t[i];
    uint64_t s = name_seed(seed, gl->name);
    for (int64_t k = 0; k < t->n; k++) {
      double v = 0;
      switch (gl->init.kind) {
      case INIT_ZEROS: v = 0; break;
      case INIT_ONES: v = 1; break;
      case INIT_CONST: v = gl->init.value; break;
      case INIT_NORMAL: {
        double u1 = uniform01(&s), u2 = uniform01(&s);
        v = gl->init.value * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
        break;
      }
      }
      if (t->f) t->f[k] = dtype_round(t->type.dtype, (float)v);
      else t->i[k] = (int64_t)v;
    }
    /* Rows past the checkpoint shape (a padded vocabulary) are zero.  (Only whole tensors
       are initialized: per-rank pieces are split from them.) */
    if (gl->hf_rank == t->type.rank && gl->hf_dims[0] < t->type.dims[0] && t->f) {
      int64_t row = t->n / t->type.dims[0];
      for (int64_t k = gl->hf_dims[0] * row; k < t->n; k++) t->f[k] = 0;
    }
  }
}

GlobalStore *globals_new(const Module *m) {
  GlobalStore *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->n = m->globals.n;
  g->t = calloc((size_t)(g->n ? g->n : 1), sizeof(Tensor *));
  for (int i = 0; i < g->n; i++) {
    g->t[i] = tensor_new(&((const Global *)m->globals.items[i])->value->type);
    if (!g->t[i]) {
      globals_free(g);
      return NULL;
    }
  }
  globals_init(m, g, 0);
  return g;
}

void globals_free(GlobalStore *g) {
  if (!g) return;
  for (int i = 0; i < g->n; i++) tensor_free(g->t[i]);
  free(g->t);
  free(g);
}

/* ---- the run loop ---- */

/* ---- collectives: the dimension bookkeeping around flat communicator calls ---- */

/* Splits x at dim d into outer (dims before d), the dim itself, and inner (dims after). */
static void split_at(const Type *t, int d, int64_t *outer, int64_t *mid, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < d; i++) *outer *= t->dims[i];
  *mid = t->dims[d];
  for (int i = d + 1; i < t->rank; i++) *inner *= t->dims[i];
}

/* Moves chunk c of n along a dim (outer, mid, inner) between layouts:
   to_chunks: x[o][c*m + j][i] -> buf[c][o][j][i];  else the reverse. */
static void rechunk(float *dst, const float *src, int64_t n, int64_t outer, int64_t m, int64_t inner, bool to_chunks) {
  for (int64_t c = 0; c < n; c++)
    for (int64_t o = 0; o < outer; o++) {
      const int64_t a = ((o * n + c) * m) * inner, b = ((c * outer + o) * m) * inner;
      if (to_chunks) memcpy(dst + b, src + a, sizeof(float) * (size_t)(m * inner));
      else memcpy(dst + a, src + b, sizeof(float) * (size_t)(m * inner));
    }
}

/* all_to_allv (ops.def) over the flat all_to_all: every rank sends n chunks of S rows (the
   most it can send one rank: all its rows), its rows for rank j at the front of chunk j. */
static int all_to_allv(const Op *op, Tensor **in, Tensor *y, IrComm *comm, char *err, size_t errlen) {
  const Tensor *x = in[0], *sc = in[1], *rcv = in[2];
  int axis = mesh_axis_parse(op_attr(op, "axis")->s);
  int64_t n = op_int(op, "n"), S = x->type.dims[0], D = x->type.dims[1], G = sc->n, el = G / n, rows = y->type.dims[0];
  int64_t sent = 0, got = 0;
  for (int64_t g = 0; g < G; g++) {
    if (sc->i[g] < 0 || rcv->i[g] < 0) return snprintf(err, errlen, "all_to_allv: negative counts"), IR_ERUN;
    sent += sc->i[g], got += rcv->i[g];
  }
  if (sent > S || got > rows) {
    snprintf(err, errlen, "all_to_allv: %lld rows to send of %lld, %lld to receive into %lld", (long long)sent, (long long)S,
             (long long)got, (long long)rows);
    return IR_ERUN;
  }
  if (n > 1 && !comm) {
    snprintf(err, errlen, "all_to_allv runs over %s=%lld ranks, but the program runs as one rank", mesh_axis_names[axis], (long long)n);
    return IR_ERUN;
  }
  float *buf = calloc((size_t)(2 * n * S * D + 1), sizeof(float));
  if (!buf) return snprintf(err, errlen, "out of memory"), IR_ERUN;
  float *snd = buf, *rcvb = buf + n * S * D;
  int64_t at = 0;
  for (int64_t j = 0; j < n; j++) {
    int64_t c = 0;
    for (int64_t e = 0; e < el; e++) c += sc->i[j * el + e];
    memcpy(snd + j * S * D, x->f + at * D, sizeof(float) * (size_t)(c * D));
    at += c;
  }
  int rc = n > 1 ? comm->all_to_all(comm, axis, snd, rcvb, S * D) : (memcpy(rcvb, snd, sizeof(float) * (size_t)(S * D)), 0);
  at = 0;
  for (int64_t i = 0; !rc && i < n; i++) {
    int64_t c = 0;
    for (int64_t e = 0; e < el; e++) c += rcv->i[i * el + e];
    memcpy(y->f + at * D, rcvb + i * S * D, sizeof(float) * (size_t)(c * D));
    at += c;
  }
  if (!rc) memset(y->f + at * D, 0, sizeof(float) * (size_t)((rows - at) * D));
  free(buf);
  if (rc) snprintf(err, errlen, "all_to_allv over %s failed", mesh_axis_names[axis]);
  return rc ? IR_ERUN : 0;
}

static int collective(const Op *op, Tensor *x, Tensor *y, IrComm *comm, char *err, size_t errlen) {
  if (op->kind == OP_WAIT) {   /* the reference runs a start to completion: the wait has it */
    memcpy(y->f ? (void *)y->f : (void *)y->i, x->f ? (void *)x->f : (void *)x->i,
           (size_t)x->n * (x->f ? sizeof(float) : sizeof(int64_t)));
    return 0;
  }
  const OpKind kind = op_sync_of(op->kind);   /* a start does its collective, at once */
  int axis = mesh_axis_parse(op_attr(op, "axis")->s);
  int64_t n = op_int(op, "n");
  if (kind == OP_SEND || kind == OP_RECV) {
    bool send = kind == OP_SEND;
    if (!comm || (send ? !comm->send : !comm->recv)) {
      snprintf(err, errlen, "%s needs a partner on %s, but the program runs without point-to-point transfers",
               send ? "send" : "recv", mesh_axis_names[axis]);
      return IR_ERUN;
    }
    int peer = (int)op_int(op, "peer");
    if (op_bool(op, "rel")) peer = (int)((comm->coord[axis] + peer) % n);   /* a ring: relative to this rank */
    int64_t tag = op_int(op, "tag");
    int rc = send ? comm->send(comm, axis, peer, tag, x->f, x->n) : comm->recv(comm, axis, peer, tag, y->f, y->n);
    if (rc) snprintf(err, errlen, "%s with %s rank %d failed (another rank failed, or the sizes differ)",
                     send ? "send" : "recv", mesh_axis_names[axis], peer);
    return rc ? IR_ERUN : 0;
  }
  if (n > 1 && !comm) {
    snprintf(err, errlen, "this collective runs over %s=%lld ranks, but the program runs as one rank", mesh_axis_names[axis],
             (long long)n);
    return IR_ERUN;
  }
  int coord = comm ? comm->coord[axis] : 0;
  if (kind == OP_SHARD_SLICE || kind == OP_SHARD_PAD) {
    /* A chunk of `dim` split in `parts`; ranks n/parts apart share one. */
    int64_t parts = op_int(op, "parts"), outer, mid, inner, chunk = coord / (n / parts);
    bool slice = kind == OP_SHARD_SLICE;
    split_at(&(slice ? y : x)->type, (int)op_int(op, "dim"), &outer, &mid, &inner);
    for (int64_t o = 0; o < outer; o++) {
      int64_t whole = ((o * parts + chunk) * mid) * inner, part = (o * mid) * inner;
      for (int64_t k = 0; k < mid * inner; k++) {
        if (slice) {
          if (y->f) y->f[part + k] = x->f[whole + k];
          else y->i[part + k] = x->i[whole + k];
        } else {
          if (y->f) y->f[whole + k] = x->f[part + k];
          else y->i[whole + k] = x->i[part + k];
        }
      }
    }
    return 0;
  }
  if (!x->f) {
    snprintf(err, errlen, "collectives move float values; this one is %s", dtype_name(x->type.dtype));
    return IR_ERUN;
  }
  if (n == 1) {   /* one rank: every collective is the identity */
    memcpy(y->f, x->f, sizeof(float) * (size_t)x->n);
    return 0;
  }
  int rc = 0;
  int64_t outer, mid, inner;
  float *tmp = NULL;
  switch (kind) {
  case OP_ALL_REDUCE:
    memcpy(y->f, x->f, sizeof(float) * (size_t)x->n);
    rc = comm->all_reduce(comm, axis, y->f, y->n, !strcmp(op_attr(op, "reduce")->s, "max"));
    break;
  case OP_ALL_GATHER:   /* rank r's piece lands at chunk r of `dim` */
    split_at(&x->type, (int)op_int(op, "dim"), &outer, &mid, &inner);
    tmp = malloc(sizeof(float) * (size_t)y->n);
    rc = comm->all_gather(comm, axis, x->f, tmp, x->n);
    if (!rc) rechunk(y->f, tmp, n, outer, mid, inner, false);
    break;
  case OP_REDUCE_SCATTER:   /* rank r keeps the sum of chunk r of `dim` */
    split_at(&y->type, (int)op_int(op, "dim"), &outer, &mid, &inner);
    tmp = malloc(sizeof(float) * (size_t)x->n);
    rechunk(tmp, x->f, n, outer, mid, inner, true);
    rc = comm->reduce_scatter(comm, axis, tmp, y->f, y->n);
    break;
  case OP_ALL_TO_ALL: {   /* chunk r of `split` goes to rank r; what rank r sends lands at chunk r of `concat` */
    /* Sent chunks: x along `split` in n parts; received chunks: y along `concat`. */
    int64_t so, sm, si, co, cm, ci;
    split_at(&x->type, (int)op_int(op, "split"), &so, &sm, &si);
    split_at(&y->type, (int)op_int(op, "concat"), &co, &cm, &ci);
    sm /= n;
    cm /= n;
    tmp = malloc(sizeof(float) * 2 * (size_t)x->n);
    rechunk(tmp, x->f, n, so, sm, si, true);
    rc = comm->all_to_all(comm, axis, tmp, tmp + x->n, x->n / n);
    if (!rc) rechunk(y->f, tmp + x->n, n, co, cm, ci, false);
    break;
  }
  default: break;
  }
  free(tmp);
  if (rc) snprintf(err, errlen, "%s over %s failed", op_info(kind)->name, mesh_axis_names[axis]);
  return rc ? IR_ERUN : 0;
}

int interp_run(const Func *f, GlobalStore *g, Tensor **args, Tensor **rets, char *err, size_t errlen) {
  return interp_run_comm(f, g, args, rets, NULL, err, errlen);
}

int interp_run_comm(const Func *f, GlobalStore *g, Tensor **args, Tensor **rets, IrComm *comm, char *err,
                    size_t errlen) {
  int n = func_number((Func *)f);
  Tensor **vals = calloc((size_t)(n ? n : 1), sizeof(Tensor *));
  int *last_use = calloc((size_t)(n ? n : 1), sizeof(int));
  if (!vals || !last_use) {
    free(vals);
    free(last_use);
    snprintf(err, errlen, "out of memory");
    return IR_ERUN;
  }
  /* Liveness: an intermediate dies after the last op that reads it, unless returned. */
  for (int i = 0; i < n; i++) last_use[i] = -1;
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int k = 0; k < op->n_operands; k++)
      if (op->operands[k]->kind != VAL_GLOBAL) last_use[op->operands[k]->id] = i;
  }
  for (int i = 0; i < f->rets.n; i++) {
    const Value *v = f->rets.items[i];
    if (v->kind != VAL_GLOBAL) last_use[v->id] = f->ops.n;
  }
  int rc = 0;
  for (int i = 0; i < f->args.n; i++) {
    const Value *v = f->args.items[i];
    if (!type_shape_eq(&args[i]->type, &v->type)) {
      char a[256], b[256];
      snprintf(err, errlen, "@%s: argument %d is %s, expected %s", f->name, i, type_str(&args[i]->type, a, sizeof a),
               type_str(&v->type, b, sizeof b));
      rc = IR_EINPUT;
      goto done;
    }
    vals[v->id] = args[i];
  }
  for (int i = 0; i < f->ops.n && !rc; i++) {
    const Op *op = f->ops.items[i];
    Tensor *in[256], *out[IR_MAX_RESULTS] = {0};
    for (int k = 0; k < op->n_operands; k++) {
      const Value *v = op->operands[k];
      in[k] = v->kind == VAL_GLOBAL ? g->t[v->global->index] : vals[v->id];
    }
    for (int r = 0; r < op->n_results; r++) {
      out[r] = tensor_new(&op->results[r]->type);
      if (!out[r]) {
        snprintf(err, errlen, "out of memory allocating the result of op %d (%s)", i, op_info(op->kind)->name);
        rc = IR_ERUN;
      }
      vals[op->results[r]->id] = out[r];
    }
    if (rc) break;
    char msg[1024] = "";
    if (op->kind == OP_CALL) {
      /* A fused kernel means exactly what its body's ops mean. */
      Tensor *res[IR_MAX_RESULTS] = {0};
      rc = interp_run_comm(op->callee, g, in, res, comm, msg, sizeof msg);
      for (int r = 0; r < op->n_results; r++) {
        if (!rc) memcpy(out[r]->f ? (void *)out[r]->f : (void *)out[r]->i, res[r]->f ? (void *)res[r]->f : (void *)res[r]->i,
                        (size_t)out[r]->n * (out[r]->f ? sizeof(float) : sizeof(int64_t)));
        tensor_free(res[r]);
      }
    } else if (op->kind == OP_ALL_TO_ALLV) {
      rc = all_to_allv(op, in, out[0], comm, msg, sizeof msg);
    } else if (op_info(op->kind)->cls == CLASS_COLLECTIVE) {
      rc = collective(op, op->n_operands ? in[0] : NULL, op->n_results ? out[0] : NULL, comm, msg, sizeof msg);
    } else {
      rc = interp_op_rank(op, in, out, comm ? comm->coord : NULL, msg, sizeof msg);
    }
    if (rc) {
      char text[512];
      snprintf(err, errlen, "@%s: op %d failed: %s\n  %s", f->name, i, msg, op_to_string(op, text, sizeof text));
      break;
    }
    for (int r = 0; r < op->n_results; r++)
      if (dtype_is_float(out[r]->type.dtype) && out[r]->type.dtype != DT_F32)
        for (int64_t k = 0; k < out[r]->n; k++) out[r]->f[k] = dtype_round(out[r]->type.dtype, out[r]->f[k]);
    /* Free what died here (never arguments: the caller owns them). */
    for (int k = 0; k < op->n_operands; k++) {
      const Value *v = op->operands[k];
      if (v->kind == VAL_RESULT && last_use[v->id] == i && vals[v->id]) {
        tensor_free(vals[v->id]);
        vals[v->id] = NULL;
      }
    }
    for (int r = 0; r < op->n_results; r++)
      if (last_use[op->results[r]->id] < 0) {
        tensor_free(vals[op->results[r]->id]);
        vals[op->results[r]->id] = NULL;
      }
  }
  if (!rc)
    for (int i = 0; i < f->rets.n; i++) {
      const Value *v = f->rets.items[i];
      Tensor *t = v->kind == VAL_GLOBAL ? g->t[v->global->index] : vals[v->id];
      rets[i] = tensor_clone(t);
    }
done:
  /* Free everything still held except arguments. */
  for (int i = 0; i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    for (int r = 0; r < op->n_results; r++) {
      tensor_free(vals[op->results[r]->id]);
      vals[op->results[r]->id] = NULL;
    }
  }
  free(vals);
  free(last_use);
  return rc;
}
