/* passes/verify_collectives.c — pass "verify-collectives": a proof, before anything runs,
 * that the ranks' programs fit together.
 *
 * Every rank's program is expanded into the sequence of its communication events: for a
 * pipelined module the functions of its pp coordinate's actions (ir/schedule.h), micro-batch
 * by micro-batch, then @optimizer_step.sR; otherwise @grad_step then @optimizer_step (or, in
 * a module without them, every function in order).  Each collective (all_reduce,
 * all_gather, reduce_scatter, all_to_all, or the start of one) and each send and recv is
 * an event.  The
 * simulation then runs all ranks with the runtime's semantics: a send returns at once (it
 * is buffered), a recv waits for the message of its peer with its tag (plus the micro-batch),
 * a collective waits until every member of its axis group reaches a collective.  It proves:
 *   - the members of every group issue the same collectives in the same order, with the same
 *     kind, shape, dtype and attributes;
 *   - every recv gets a message of its shape and dtype, and every send is received;
 *   - nothing waits forever (a deadlock names every blocked rank and what it waits for).
 * The first violation is reported with the rank, the function, the op and the fix.  Ranks
 * may run different modules (verify_collectives_ranks: `loom ir --rank-ir R=FILE`), which is
 * how hand-edited per-rank dumps are checked.
 */
#include <stdlib.h>
#include <string.h>

#include "ir/schedule.h"
#include "passes/passes.h"

typedef struct {
  const Func *f;
  const Op *op;
  int index;       /* op index in f */
  int64_t mb;      /* micro-batch (-1: none) */
} Event;

typedef struct {
  Event *ev;
  int n, cap;
} Events;

static void push(Events *e, const Func *f, const Op *op, int index, int64_t mb) {
  if (e->n == e->cap) {
    e->cap = e->cap ? e->cap * 2 : 256;
    e->ev = realloc(e->ev, sizeof(Event) * (size_t)e->cap);
  }
  e->ev[e->n++] = (Event){f, op, index, mb};
}

/* A start is the event of its collective: the runtime's communication thread runs a rank's
   collectives in the order their starts are issued.  Simulating each start as if it blocked
   until its group completes it only blocks more than the runtime does (there the rank goes
   on and blocks at the wait, and every earlier start completes first), so what passes here
   cannot deadlock there.  Waits are not events. */
static bool is_comm(const Op *op) {
  return op_is_start(op->kind) || op->kind == OP_ALL_REDUCE || op->kind == OP_ALL_GATHER || op->kind == OP_REDUCE_SCATTER ||
         op->kind == OP_ALL_TO_ALL || op->kind == OP_SEND || op->kind == OP_RECV;
}

static void add_func(Events *e, const Func *f, int64_t mb) {
  for (int i = 0; f && i < f->ops.n; i++) {
    const Op *op = f->ops.items[i];
    if (op->kind == OP_CALL && op->callee) add_func(e, op->callee, mb);
    else if (is_comm(op)) push(e, f, op, i, mb);
  }
}

static const Func *find(const Module *m, const char *fmt, int k) {
  char name[96];
  snprintf(name, sizeof name, fmt, k);
  return module_find_func(m, name);
}

/* The peer's coordinate on the axis of a send or recv (rel: relative to rank r's). */
static int64_t peer_coord(const Mesh *mesh, int r, int axis, const Op *op) {
  int64_t peer = op_int(op, "peer"), c[AX_COUNT];
  if (!op_bool(op, "rel")) return peer;
  mesh_rank_coords(mesh, r, c);
  return (c[axis] + peer) % mesh->size[axis];
}

static int expand(const Module *m, const int coord[AX_COUNT], Events *e, char *err, size_t errlen) {
  if (m->pipe.kind) {
    Schedule s;
    int rc = schedule_build(m->pipe.kind, (int)m->mesh.size[AX_PP], (int)m->pipe.virt, (int)m->pipe.micro, &s, err, errlen);
    if (rc) return rc;
    int q = coord[AX_PP];
    for (int i = 0; i < s.n[q]; i++) {
      const Action *a = &s.acts[q][i];
      const char *fmt = a->kind == ACT_F ? "fwd.c%d" : a->kind == ACT_W ? "bwd_w.c%d" : s.split_bw ? "bwd_b.c%d" : "bwd.c%d";
      const Func *f = find(m, fmt, a->chunk);
      if (!f) {
        char name[96];
        snprintf(name, sizeof name, fmt, a->chunk);
        snprintf(err, errlen, "verify-collectives: pp rank %d's schedule runs @%s, which the module lacks", q, name);
        schedule_free(&s);
        return IR_EINPUT;
      }
      add_func(e, f, a->mb);
    }
    schedule_free(&s);
    add_func(e, find(m, "optimizer_step.s%d", q), -1);
    return 0;
  }
  const Func *g = module_find_func(m, "grad_step"), *o = module_find_func(m, "optimizer_step");
  if (g || o) {
    add_func(e, g, -1);
    add_func(e, o, -1);
  } else {
    for (int i = 0; i < m->funcs.n; i++)
      if (!((Func *)m->funcs.items[i])->is_kernel) add_func(e, m->funcs.items[i], -1);
  }
  return 0;
}

static const Type *ev_type(const Op *op) { return op->kind == OP_RECV ? &op->results[0]->type : &op->operands[0]->type; }

static char *describe(const Event *ev, char *buf, size_t n) {
  char text[400];
  op_to_string(ev->op, text, sizeof text);
  if (ev->mb >= 0) snprintf(buf, n, "@%s (micro-batch %lld) op %d: %s", ev->f->name, (long long)ev->mb, ev->index, text);
  else snprintf(buf, n, "@%s op %d: %s", ev->f->name, ev->index, text);
  return buf;
}

static void coords_str(const Mesh *mesh, int rank, char *buf, size_t n) {
  int64_t c[AX_COUNT];
  mesh_rank_coords(mesh, rank, c);
  snprintf(buf, n, "dp=%lld tp=%lld cp=%lld pp=%lld ep=%lld", (long long)c[AX_DP], (long long)c[AX_TP],
           (long long)c[AX_CP], (long long)c[AX_PP], (long long)c[AX_EP]);
}

/* The rank with coordinate `to` on `axis`, others as rank's. */
static int rank_at(const Mesh *mesh, int rank, int axis, int64_t to) {
  int64_t c[AX_COUNT];
  mesh_rank_coords(mesh, rank, c);
  c[axis] = to;
  /* the mixed radix of mesh_rank_coords: pp, dp, ep, cp, tp from outer to inner */
  static const int order[AX_COUNT] = {AX_PP, AX_DP, AX_EP, AX_CP, AX_TP};
  int64_t r = 0;
  for (int i = 0; i < AX_COUNT; i++) r = r * mesh->size[order[i]] + c[order[i]];
  return (int)r;
}

typedef struct {
  int from, to;
  int64_t mb, tag;
  const Event *send;
  bool taken;
} Msg;

static bool same_collective(const Op *a, const Op *b) {
  if (op_sync_of(a->kind) != op_sync_of(b->kind) || !type_shape_eq(ev_type(a), ev_type(b))) return false;
  const OpInfo *info = op_info(a->kind);
  for (int k = 0; k < info->n_attrs; k++)
    if (!attr_eq(&a->attrs[k], &b->attrs[k])) return false;
  return true;
}

int verify_collectives_ranks(const Module *const *mods, int world, char *err, size_t errlen) {
  const Mesh *mesh = &mods[0]->mesh;
  if (world != mesh_world(mesh)) {
    snprintf(err, errlen, "verify-collectives: %d programs for a mesh of %lld ranks", world, (long long)mesh_world(mesh));
    return IR_EINPUT;
  }
  Events *ev = calloc((size_t)world, sizeof(Events));
  int *pos = calloc((size_t)world, sizeof(int));
  Msg *msgs = NULL;
  int n_msgs = 0, cap_msgs = 0, rc = 0;
  char a[1200], b[1200], ca[96], cb[96];
  for (int r = 0; r < world && !rc; r++) {
    int64_t c64[AX_COUNT];
    int c[AX_COUNT];
    mesh_rank_coords(mesh, r, c64);
    for (int x = 0; x < AX_COUNT; x++) c[x] = (int)c64[x];
    rc = expand(mods[r], c, &ev[r], err, errlen);
  }
  while (!rc) {
    bool progress = false, left = false;
    for (int r = 0; r < world && !rc; r++) {
      while (pos[r] < ev[r].n && !rc) {
        const Event *e = &ev[r].ev[pos[r]];
        const Op *op = e->op;
        int axis = mesh_axis_parse(op_attr(op, "axis")->s);
        if (axis < 0 || op_int(op, "n") != mesh->size[axis]) {
          coords_str(mesh, r, ca, sizeof ca);
          snprintf(err, errlen, "verify-collectives: rank %d (%s), %s: the axis is not the mesh's (fix n or axis)", r, ca,
                   describe(e, a, sizeof a));
          rc = IR_EINPUT;
          break;
        }
        if (op->kind == OP_SEND) {
          if (n_msgs == cap_msgs) msgs = realloc(msgs, sizeof(Msg) * (size_t)(cap_msgs = cap_msgs ? cap_msgs * 2 : 256));
          msgs[n_msgs++] = (Msg){r, rank_at(mesh, r, axis, peer_coord(mesh, r, axis, op)), e->mb, op_int(op, "tag"), e, false};
          pos[r]++, progress = true;
          continue;
        }
        if (op->kind == OP_RECV) {
          int from = rank_at(mesh, r, axis, peer_coord(mesh, r, axis, op));
          Msg *hit = NULL;
          for (int k = 0; k < n_msgs && !hit; k++)
            if (!msgs[k].taken && msgs[k].to == r && msgs[k].from == from && msgs[k].tag == op_int(op, "tag") &&
                msgs[k].mb == e->mb)
              hit = &msgs[k];
          if (!hit) break;   /* waits */
          if (!type_shape_eq(ev_type(hit->send->op), ev_type(op))) {
            char t1[128], t2[128];
            coords_str(mesh, r, ca, sizeof ca);
            coords_str(mesh, from, cb, sizeof cb);
            snprintf(err, errlen, "verify-collectives: rank %d (%s) receives %s with %s, but rank %d (%s) sends it %s with "
                     "%s; make the recv's type the sent value's", r, ca, type_str(ev_type(op), t1, sizeof t1),
                     describe(e, a, sizeof a), from, cb, type_str(ev_type(hit->send->op), t2, sizeof t2),
                     describe(hit->send, b, sizeof b));
            rc = IR_EINPUT;
            break;
          }
          hit->taken = true;
          pos[r]++, progress = true;
          continue;
        }
        /* A collective: go when every member of the group stands at a collective on this axis. */
        int size = (int)mesh->size[axis];
        bool ready = true;
        for (int k = 0; k < size && ready; k++) {
          int q = rank_at(mesh, r, axis, k);
          if (q == r) continue;
          if (pos[q] >= ev[q].n) {
            ready = false;
            continue;
          }
          const Op *o2 = ev[q].ev[pos[q]].op;
          ready = o2->kind != OP_SEND && o2->kind != OP_RECV && mesh_axis_parse(op_attr(o2, "axis")->s) == axis;
        }
        if (!ready) break;
        for (int k = 0; k < size && !rc; k++) {
          int q = rank_at(mesh, r, axis, k);
          const Event *e2 = &ev[q].ev[pos[q]];
          if (!same_collective(op, e2->op)) {
            coords_str(mesh, r, ca, sizeof ca);
            coords_str(mesh, q, cb, sizeof cb);
            snprintf(err, errlen, "verify-collectives: the %s group of rank %d disagrees: rank %d (%s) issues %s, while rank "
                     "%d (%s) issues %s; every member must issue the same collectives in the same order, with the same "
                     "shapes and dtypes", mesh_axis_names[axis], r, r, ca, describe(e, a, sizeof a), q, cb,
                     describe(e2, b, sizeof b));
            rc = IR_EINPUT;
          }
        }
        if (rc) break;
        for (int k = 0; k < size; k++) pos[rank_at(mesh, r, axis, k)]++;
        progress = true;
      }
      left |= pos[r] < ev[r].n;
    }
    if (rc || !left) break;
    if (!progress) {   /* every rank left waits on another */
      int k = snprintf(err, errlen, "verify-collectives: the ranks deadlock:");
      for (int r = 0; r < world && k < (int)errlen - 1; r++) {
        if (pos[r] >= ev[r].n) continue;
        const Event *e = &ev[r].ev[pos[r]];
        coords_str(mesh, r, ca, sizeof ca);
        if (e->op->kind == OP_RECV) {
          int from = rank_at(mesh, r, mesh_axis_parse(op_attr(e->op, "axis")->s), op_int(e->op, "peer"));
          k += snprintf(err + k, errlen - (size_t)k, "\n  rank %d (%s) waits in %s for rank %d%s", r, ca,
                        describe(e, a, sizeof a), from,
                        pos[from] >= ev[from].n ? ", which has finished without sending it (a missing send, or this "
                                                  "recv's peer or tag is wrong)" : "");
        } else {
          k += snprintf(err + k, errlen - (size_t)k, "\n  rank %d (%s) waits in %s for its %s group", r, ca,
                        describe(e, a, sizeof a), op_attr(e->op, "axis")->s);
        }
      }
      rc = IR_EINPUT;
    }
  }
  for (int k = 0; k < n_msgs && !rc; k++)
    if (!msgs[k].taken) {
      coords_str(mesh, msgs[k].from, ca, sizeof ca);
      snprintf(err, errlen, "verify-collectives: rank %d (%s) sends with %s to rank %d, which never receives it: add the "
               "matching recv (same peer and tag) to rank %d's program", msgs[k].from, ca, describe(msgs[k].send, a, sizeof a),
               msgs[k].to, msgs[k].to);
      rc = IR_EINPUT;
    }
  for (int r = 0; r < world; r++) free(ev[r].ev);
  free(ev), free(pos), free(msgs);
  return rc;
}

static int run(Module *m, PassContext *ctx, char *err, size_t errlen) {
  int64_t world = mesh_world(&m->mesh);
  if (world == 1 && !m->pipe.kind) return 0;
  if (world > 4096) {
    snprintf(err, errlen, "verify-collectives: more than 4096 ranks");
    return IR_EINPUT;
  }
  const Module **mods = malloc(sizeof(Module *) * (size_t)world);
  for (int64_t r = 0; r < world; r++) mods[r] = m;
  const PassOptions *o = ctx->opt;
  for (int k = 0; o && k < o->n_rank_ir; k++) {
    if (o->rank_ir_rank[k] < 0 || o->rank_ir_rank[k] >= world) {
      free(mods);
      snprintf(err, errlen, "--rank-ir names rank %d, but the mesh has %lld ranks", o->rank_ir_rank[k], (long long)world);
      return IR_EINPUT;
    }
    mods[o->rank_ir_rank[k]] = o->rank_ir[k];
  }
  int rc = verify_collectives_ranks(mods, (int)world, err, errlen);
  free(mods);
  return rc;
}

const Pass pass_verify_collectives = {"verify-collectives", "proves every rank's collectives and transfers match and "
                                      "cannot deadlock under the schedule", run};
