/* passes/lower_memo.c — lowering each distinct function once (lower_memo.h).
 *
 * The key of a function: its structural hash (func_hash: ops, attributes, types, names,
 * the globals it reads) and what else the lowering and the time model read: the mesh, whether
 * the module is partitioned and pipelined (the overlap pass leaves pipelines alone), the
 * storage target and the overlap setting.  The globals a lowered function reads are kept as
 * positions in its first-use order of globals before lowering (lowering drops reads, never
 * adds one), so an equal function of another module finds its own.  The table is open
 * addressing under a lock; when it is 70% full it stops taking entries (lowering goes on).
 * func_hash ignores the numbers in names and renames peers and tags, so a pipeline's interior
 * chunks (the same ops on other layers' parameters) have one key: within a module the first
 * of them is lowered and the others take its figures (twin_figures). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "passes/lower_memo.h"

enum { MEMO_CAP = 1 << 16 };

typedef struct {
  uint64_t key[2];   /* {0, 0}: empty */
  double call_s;
  int64_t arena_bytes;
  int n_slots;
  int *slots;        /* the globals it reads once lowered, as first-use positions (NULL: empty) */
} Entry;

struct LowerMemo {
  pthread_mutex_t lock;
  Entry *e;
  int n;
};

LowerMemo *lower_memo_new(void) {
  LowerMemo *memo = calloc(1, sizeof *memo);
  if (memo && !(memo->e = calloc(MEMO_CAP, sizeof(Entry)))) {
    free(memo);
    return NULL;
  }
  if (memo) pthread_mutex_init(&memo->lock, NULL);
  return memo;
}

void lower_memo_free(LowerMemo *memo) {
  if (!memo) return;
  for (int i = 0; i < MEMO_CAP; i++) free(memo->e[i].slots);
  pthread_mutex_destroy(&memo->lock);
  free(memo->e), free(memo);
}

/* key's entry: its slot (an empty one when absent), or -1 when the table is full. */
static int slot_of_key(const LowerMemo *memo, const uint64_t key[2]) {
  for (int n = 0, at = (int)(key[0] & (MEMO_CAP - 1)); n < MEMO_CAP; n++, at = (at + 1) & (MEMO_CAP - 1)) {
    const Entry *e = &memo->e[at];
    if ((!e->key[0] && !e->key[1]) || (e->key[0] == key[0] && e->key[1] == key[1])) return at;
  }
  return -1;
}

/* Per function of the module: its key, its globals before lowering (indices), its figures. */
typedef struct {
  uint64_t key[2];
  int n_pre, *pre;
  FuncFigures fig;
} Fn;

/* The memo's figures for f (fn->key): fn->fig.given when found. */
static int look_up(LowerMemo *memo, Fn *fn) {
  pthread_mutex_lock(&memo->lock);
  int at = slot_of_key(memo, fn->key), rc = 0;
  const Entry *e = at >= 0 && memo->e[at].slots ? &memo->e[at] : NULL;
  if (e) {
    int *g = malloc(sizeof(int) * ((size_t)e->n_slots + 1));
    for (int k = 0; g && k < e->n_slots; k++) g[k] = fn->pre[e->slots[k]];
    fn->fig = (FuncFigures){true, e->call_s, e->arena_bytes, e->n_slots, g};
    rc = g ? 0 : IR_ERUN;
  }
  pthread_mutex_unlock(&memo->lock);
  return rc;
}

/* f, just lowered: its figures into fn->fig and the memo.  slot_of (per global, -1) and seen
   (per global, false) are scratch, left as found. */
static int learn(LowerMemo *memo, Fn *fn, const Func *f, const Module *m, const Hardware *hw, int target, int *slot_of,
                 bool *seen) {
  int *post = malloc(sizeof(int) * ((size_t)m->globals.n + 1)), n_post = 0;
  if (!post) return IR_ERUN;
  for (int j = 0; j < f->ops.n; j++) {   /* the globals it reads now, as memory_rank counts them */
    const Op *op = f->ops.items[j];
    for (int k = 0; k < op->n_operands; k++) {
      const Value *v = op->operands[k];
      if (v->kind != VAL_GLOBAL || seen[v->global->index]) continue;
      seen[v->global->index] = true;
      post[n_post++] = v->global->index;
    }
  }
  for (int k = 0; k < fn->n_pre; k++) slot_of[fn->pre[k]] = k;
  Entry e = {{fn->key[0], fn->key[1]}, timing_call_s(f, m, hw), memory_func_arena(f, target), n_post,
             malloc(sizeof(int) * ((size_t)n_post + 1))};
  bool known = e.slots != NULL;   /* every global it reads, it read before lowering (else it is not kept) */
  for (int k = 0; k < n_post; k++) {
    seen[post[k]] = false;
    if (e.slots) e.slots[k] = slot_of[post[k]], known &= e.slots[k] >= 0;
  }
  for (int k = 0; k < fn->n_pre; k++) slot_of[fn->pre[k]] = -1;
  fn->fig = (FuncFigures){true, e.call_s, e.arena_bytes, n_post, post};
  pthread_mutex_lock(&memo->lock);
  int at = known && 10 * memo->n < 7 * MEMO_CAP ? slot_of_key(memo, fn->key) : -1;
  if (at >= 0 && !memo->e[at].slots) memo->e[at] = e, memo->n++, e.slots = NULL;
  pthread_mutex_unlock(&memo->lock);
  free(e.slots);
  return 0;
}

/* fn's figures from its twin t's (the same key: lowered alike), the globals t reads once
   lowered mapped through their first-use places to fn's own.  slot_of: scratch, -1. */
static int twin_figures(const Fn *t, Fn *fn, int *slot_of) {
  int *g = malloc(sizeof(int) * ((size_t)t->fig.n_globals + 1));
  if (!g) return IR_ERUN;
  for (int k = 0; k < t->n_pre; k++) slot_of[t->pre[k]] = k;
  bool known = true;   /* lowering drops reads, never adds one (see the top) */
  for (int k = 0; k < t->fig.n_globals; k++) {
    int at = slot_of[t->fig.globals[k]];
    known &= at >= 0;
    g[k] = at >= 0 ? fn->pre[at] : -1;
  }
  for (int k = 0; k < t->n_pre; k++) slot_of[t->pre[k]] = -1;
  if (!known) {
    free(g);
    return IR_ERUN;
  }
  fn->fig = (FuncFigures){true, t->fig.call_s, t->fig.arena_bytes, t->fig.n_globals, g};
  return 0;
}

int lower_memo_predict(LowerMemo *memo, Module *m, const char *lowering, const PassOptions *opt, const Hardware *hw,
                       int64_t grad_accum, double *step_s, int64_t *mem, char *err, size_t errlen) {
  int n = m->funcs.n, ng = m->globals.n, rc = 0;
  Fn *fn = calloc((size_t)n + 1, sizeof *fn);
  const Global **pre = malloc(sizeof *pre * ((size_t)ng + 1));
  int *slot_of = malloc(sizeof(int) * ((size_t)ng + 1));
  bool *seen = calloc((size_t)ng + 1, 1);
  uint64_t *gh = malloc(sizeof(uint64_t) * ((size_t)ng + 1));
  FuncFigures *fig = calloc((size_t)n + 1, sizeof *fig);
  void **all = malloc(sizeof(void *) * ((size_t)n + 1)), **miss = malloc(sizeof(void *) * ((size_t)n + 1));
  if (!fn || !pre || !slot_of || !seen || !gh || !fig || !all || !miss) rc = IR_ERUN;
  for (int g = 0; !rc && g < ng; g++) gh[g] = global_hash(m->globals.items[g]), slot_of[g] = -1;
  uint64_t ctx[2] = {0, 0};   /* what the lowering and the time model read besides the function */
  for (int a = 0; a < AX_COUNT; a++) ctx[0] = ctx[0] * 1000003 + (uint64_t)m->mesh.size[a];
  const TrainSettings *ts = opt->train ? opt->train : &train_defaults;
  ctx[1] = (uint64_t)m->local | (uint64_t)(m->pipe.kind != 0) << 1 | (uint64_t)ts->overlap << 2 | (uint64_t)opt->target << 3;
  int n_miss = 0;
  int *twin = malloc(sizeof(int) * ((size_t)n + 1));   /* an earlier missing function with the same key, or -1 */
  if (!twin) rc = IR_ERUN;
  for (int i = 0; i < n && !rc; i++) {
    Func *f = m->funcs.items[i];
    all[i] = f;
    twin[i] = -1;
    func_hash(f, gh, fn[i].key, pre, &fn[i].n_pre, seen);
    fn[i].key[0] ^= ctx[0] * UINT64_C(0x9E3779B97F4A7C15), fn[i].key[1] ^= ctx[1] * UINT64_C(0xC2B2AE3D27D4EB4F);
    if (!fn[i].key[0] && !fn[i].key[1]) fn[i].key[0] = 1;   /* {0, 0} marks an empty entry */
    if (!(fn[i].pre = malloc(sizeof(int) * ((size_t)fn[i].n_pre + 1)))) rc = IR_ERUN;
    for (int k = 0; !rc && k < fn[i].n_pre; k++) fn[i].pre[k] = pre[k]->index;
    if (!rc) rc = look_up(memo, &fn[i]);
    /* the same function met earlier in this module (a pipeline's interior chunks): lowered
       once, its figures shared (twin_figures) */
    for (int j = 0; !rc && !fn[i].fig.given && j < i && twin[i] < 0; j++)
      if (!fn[j].fig.given && twin[j] < 0 && fn[j].key[0] == fn[i].key[0] && fn[j].key[1] == fn[i].key[1]) twin[i] = j;
    if (!rc && !fn[i].fig.given && twin[i] < 0) miss[n_miss++] = f;
  }
  if (rc) snprintf(err, errlen, "out of memory");
  if (!rc && n_miss) {   /* the new ones lowered alone; then the module's functions (and the kernels) again */
    m->funcs = (PtrVec){miss, n_miss, n_miss};
    rc = pipeline_run(m, lowering, opt, err, errlen);
    PtrVec lowered = m->funcs;
    m->funcs = (PtrVec){all, n, n};
    for (int k = 0; k < lowered.n; k++)
      if (((Func *)lowered.items[k])->is_kernel) ptrvec_push(m->arena, &m->funcs, lowered.items[k]);
    for (int i = 0; i < n && !rc; i++)
      if (!fn[i].fig.given && twin[i] < 0 && learn(memo, &fn[i], m->funcs.items[i], m, hw, opt->target, slot_of, seen))
        rc = IR_ERUN, snprintf(err, errlen, "out of memory");
    for (int i = 0; i < n && !rc; i++)
      if (twin[i] >= 0 && twin_figures(&fn[twin[i]], &fn[i], slot_of))
        rc = IR_ERUN, snprintf(err, errlen, "out of memory, or @%s's lowering read a global it did not read before",
                               ((Func *)all[i])->name);
  }
  for (int i = 0; i < n && !rc; i++) fig[i] = fn[i].fig;
  StepTime t;
  if (!rc) rc = timing_predict_given(m, hw, grad_accum, fig, n, &t, err, errlen);
  if (!rc) *step_s = t.step_s, *mem = memory_rank_peak_given(m, opt->target, fig, n);
  for (int i = 0; fn && i < n; i++) free(fn[i].pre), free((void *)fn[i].fig.globals);
  free(fn), free(pre), free(slot_of), free(seen), free(gh), free(fig), free(all), free(miss), free(twin);
  module_free(m);
  return rc;
}
