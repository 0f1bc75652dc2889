/* frontend/build.c — the forward graphs.  Shapes: B batch, T sequence, D model width,
   H heads, KV key/value heads, Dh head size, I MLP width, V vocabulary. */
#include <math.h>
#include <string.h>

#include "frontend/build.h"

typedef struct {
  Builder b;
  Module *m;
  const ModelConfig *c;
  int64_t B, T;
  int64_t V;          /* the vocabulary as the graph holds it: padded to a multiple of tp */
  /* the decode graph (frontend_build_decode): the positions of the new tokens, [B,T] i32,
     and the KV cache's rows; NULL for the training graph */
  Value *pos;
  int64_t tmax;
  char name[256];   /* scratch for value names */
  /* mixture of experts: the load-balancing loss's sums over the sparse layers so far, the
     assignments per expert and the router probabilities per expert ([E] f32) */
  Value *aux_count, *aux_prob;
  int n_sparse;
  double capacity_factor;   /* the run spec's (0: dropless) */
} Graph;

static const char *nm(Graph *g, const char *fmt, int layer) {
  snprintf(g->name, sizeof g->name, fmt, layer);
  return g->name;
}

static Type t2(int64_t a, int64_t b) { int64_t d[] = {a, b}; return type_make(DT_F32, 2, d); }
static Type t1(int64_t a) { return type_make(DT_F32, 1, &a); }

static Value *param(Graph *g, const char *name, Type t, Init init) {
  return module_add_global(g->m, GLOBAL_PARAM, name, t, init)->value;
}
static Value *param_l(Graph *g, const char *fmt, int layer, Type t, Init init) {
  char name[256];
  snprintf(name, sizeof name, fmt, layer);
  return param(g, name, t, init);
}

static void hf_shape(Value *param, int rank, const int64_t *dims) {
  param->global->hf_rank = rank;
  memcpy(param->global->hf_dims, dims, sizeof(int64_t) * (size_t)rank);
}

static Value *reshape(Graph *g, Value *x, int rank, const int64_t *dims, const char *name) {
  return build_typed(&g->b, OP_RESHAPE, x, type_make(x->type.dtype, rank, dims), name);
}

/* x @ W (+ bias broadcast over the leading dims). tb: W is stored [out,in]. */
static Value *linear(Graph *g, Value *x, Value *w, Value *bias, bool tb, const char *name) {
  Value *ops[2] = {x, w};
  op_set_bool(build_begin(&g->b, OP_MATMUL, ops, 2), "tb", tb);
  if (!bias) return build_end(&g->b, name);
  Value *y = build_end(&g->b, NULL);
  Value *bb = build_typed(&g->b, OP_BROADCAST, bias, y->type, NULL);
  return build2(&g->b, OP_ADD, y, bb, name);
}

static Value *norm(Graph *g, Value *x, Value *w, Value *bias, const char *name) {
  Value *ops[3] = {x, w, bias};
  op_set_float(build_begin(&g->b, bias ? OP_LAYERNORM : OP_RMSNORM, ops, bias ? 3 : 2), "eps", g->c->norm_eps);
  return build_end(&g->b, name);
}

static Value *slice(Graph *g, Value *x, const int64_t *start, const int64_t *end, const char *name) {
  Op *op = build_begin(&g->b, OP_SLICE, &x, 1);
  op_set_ints(g->m, op, "start", start, x->type.rank);
  op_set_ints(g->m, op, "end", end, x->type.rank);
  return build_end(&g->b, name);
}

/* Causal attention of the sequence; in the decode graph, the new keys and values written to
   layer l's KV cache (state kv_cache.l<l>.k / .v, [B,Tmax,KV,Dh]) and the new queries
   attending to the cache up to their positions. */
static Value *attention(Graph *g, Value *q, Value *k, Value *v, int l, const char *name) {
  double scale = 1.0 / sqrt((double)g->c->head_dim);
  /* Mistral's sliding window (the others' are refused by spec_validate when shorter than seq) */
  int64_t window = g->c->arch == ARCH_MISTRAL ? g->c->sliding_window : 0;
  if (!g->pos) {
    Value *ops[3] = {q, k, v};
    Op *op = build_begin(&g->b, OP_ATTENTION, ops, 3);
    op_set_float(op, "scale", scale);
    if (window) op_set_int(op, "window", window);
    return build_end(&g->b, name);
  }
  Value *cache[2];
  for (int j = 0; j < 2; j++) {
    int64_t d[] = {g->B, g->tmax, k->type.dims[2], k->type.dims[3]};
    char cname[96];
    snprintf(cname, sizeof cname, "kv_cache.l%d.%s", l, j ? "v" : "k");
    cache[j] = module_add_global(g->m, GLOBAL_STATE, cname, type_make(k->type.dtype, 4, d), (Init){INIT_ZEROS, 0})->value;
    Value *w[3] = {cache[j], j ? v : k, g->pos};
    func_add_op(g->b.f, OP_KV_WRITE, w, 3, NULL);
  }
  Value *ops[4] = {q, cache[0], cache[1], g->pos};
  Op *op = build_begin(&g->b, OP_ATTENTION_CACHED, ops, 4);
  op_set_float(op, "scale", scale);
  if (window) op_set_int(op, "window", window);
  return build_end(&g->b, name);
}

static Value *rope(Graph *g, Value *x, const char *name) {
  Value *ops[2] = {x, g->pos};
  Op *op = build_begin(&g->b, g->pos ? OP_ROPE_AT : OP_ROPE, ops, g->pos ? 2 : 1);
  op_set_float(op, "theta", g->c->rope_theta);
  if (g->c->rope_factor > 0) {   /* Llama 3.1's scaling (rope_type "llama3") */
    op_set_float(op, "factor", g->c->rope_factor);
    op_set_float(op, "low_freq_factor", g->c->rope_low_freq);
    op_set_float(op, "high_freq_factor", g->c->rope_high_freq);
    op_set_int(op, "original_max_pos", g->c->rope_orig_max);
  }
  return build_end(&g->b, name);
}

/* Vocabulary padding.  When tensor parallelism (or the spec's vocab_multiple) does not
   divide the vocabulary, the graph holds V rounded up to a multiple of both: the embedding tables get zero rows past the real
   vocabulary (not in checkpoints: loaders fill them with zeros, writers drop them), the
   padded logits are set to -inf before the loss, so they never touch it nor any gradient,
   and @forward returns the real vocabulary's logits. */
static Value *vocab_param(Graph *g, Value *table) {
  if (g->V != g->c->vocab_size) {
    table->global->hf_rank = 2;
    table->global->hf_dims[0] = g->c->vocab_size;
    table->global->hf_dims[1] = table->type.dims[1];
  }
  return table;
}

/* logits + mask, mask[v] = -inf past the real vocabulary and 0 before it: a [V] vector
   broadcast over the rows.  The gradient of the add passes dlogits through unchanged, so
   the backward keeps nothing of the mask (a where over the logits would keep a bool tensor
   of their size: 0.77 GiB for GPT-2 124M at 16 x 1024). */
static Value *mask_padding(Graph *g, Value *logits) {
  if (g->V == g->c->vocab_size) return logits;
  int64_t dv[] = {g->V};
  Type ti = type_make(DT_I32, 1, dv), tf = type_make(logits->type.dtype, 1, dv);
  Value *col = build_typed(&g->b, OP_IOTA, NULL, ti, NULL);
  op_set_int(col->def, "dim", 0);
  Value *lim = build_typed(&g->b, OP_CONSTANT, NULL, ti, NULL);
  op_set_float(lim->def, "value", (double)g->c->vocab_size);
  Value *pad = build2(&g->b, OP_GE, col, lim, "vocab_padding");
  Value *ninf = build_typed(&g->b, OP_CONSTANT, NULL, tf, NULL);
  op_set_float(ninf->def, "value", -INFINITY);
  Value *zero = build_typed(&g->b, OP_CONSTANT, NULL, tf, NULL);
  op_set_float(zero->def, "value", 0.0);
  Value *ops[3] = {pad, ninf, zero};
  Value *mask = build(&g->b, OP_WHERE, ops, 3, "vocab_mask");
  Value *bm = build_typed(&g->b, OP_BROADCAST, mask, logits->type, NULL);
  return build2(&g->b, OP_ADD, logits, bm, "logits");
}

static Value *unpadded(Graph *g, Value *logits) {
  if (g->V == g->c->vocab_size) return logits;
  int64_t start[] = {0, 0, 0}, end[] = {g->B, g->T, g->c->vocab_size};
  return slice(g, logits, start, end, "logits_unpadded");
}

/* Mean cross-entropy over all positions. */
static Value *loss(Graph *g, Value *logits, Value *targets) {
  Value *ce = build2(&g->b, OP_CROSS_ENTROPY, logits, targets, "ce");
  int64_t dims[] = {0, 1};
  op_set_ints(g->m, build_begin(&g->b, OP_REDUCE_MEAN, &ce, 1), "dims", dims, 2);
  return build_end(&g->b, "loss");
}

static Type t3(int64_t a, int64_t b, int64_t c) { int64_t d[] = {a, b, c}; return type_make(DT_F32, 3, d); }

/* A stack of E experts' weights: the IR's [E,...] global `P.experts.X`, E tensors
   `P.experts.<e>.X.weight` in checkpoints (ir.h's hf_experts). */
static Value *experts_param(Graph *g, const char *prefix, int l, const char *x, Type t, Init init) {
  char fmt[256];
  snprintf(fmt, sizeof fmt, "%s.experts.%s", prefix, x);
  Value *p = param_l(g, fmt, l, t, init);
  p->global->hf_experts = true;
  return p;
}

static Value *with_int(Graph *g, OpKind k, Value **ops, int n, const char *attr, int64_t v, const char *name) {
  op_set_int(build_begin(&g->b, k, ops, n), attr, v);
  return build_end(&g->b, name);
}

/* The sparse MLP of layer l (Mixtral's block_sparse_moe, Qwen3-MoE's mlp) on h[B,T,D]: the
   router's softmax over E experts, the top k per token (renormalized where the model does),
   the token rows sorted by expert (moe_sort, moe_count, moe_dispatch), each expert's SwiGLU
   as grouped matmuls over the sorted rows, and the weighted sum back per token
   (moe_combine).  Adds the layer's share of the load-balancing loss to g->aux_*. */
static Value *moe_mlp(Graph *g, Value *h, int l) {
  const ModelConfig *c = g->c;
  int64_t B = g->B, T = g->T, N = B * T, D = c->hidden, E = c->n_experts, k = c->top_k, F = c->moe_intermediate;
  const char *pre = c->arch == ARCH_MIXTRAL ? "model.layers.%d.block_sparse_moe" : "model.layers.%d.mlp";
  bool mixtral = c->arch == ARCH_MIXTRAL;
  Init w = {INIT_NORMAL, 0.02}, proj = {INIT_NORMAL, 0.02 / sqrt(2.0 * (double)c->n_layer)};
  char gname[256];
  snprintf(gname, sizeof gname, "%s.gate.weight", pre);
  Value *gate_w = param_l(g, gname, l, t2(E, D), w);
  Value *w1 = experts_param(g, pre, l, mixtral ? "w1" : "gate_proj", t3(E, F, D), w);
  Value *w3 = experts_param(g, pre, l, mixtral ? "w3" : "up_proj", t3(E, F, D), w);
  Value *w2 = experts_param(g, pre, l, mixtral ? "w2" : "down_proj", t3(E, D, F), proj);
  int64_t nd[] = {N, D}, nk[] = {N, k}, n1[] = {N, 1}, btd[] = {B, T, D};
  Value *x = reshape(g, h, 2, nd, NULL);
  /* the routing in f32 whatever the precision (as transformers' softmax(..., dtype=float)) */
  Value *logits = linear(g, x, gate_w, NULL, true, nm(g, "l%d.router_logits", l));
  Value *probs = build1(&g->b, OP_SOFTMAX, build_typed(&g->b, OP_CAST, logits, t2(N, E), NULL),
                        nm(g, "l%d.router_probs", l));                                         /* [N,E] f32 */
  Value *idx = with_int(g, OP_TOPK, &probs, 1, "k", k, nm(g, "l%d.experts", l));              /* [N,k] i32 */
  Value *wts = build2(&g->b, OP_GATHER_LAST, probs, idx, NULL);                               /* [N,k] */
  if (c->norm_topk) {
    int64_t one = 1;
    op_set_ints(g->m, build_begin(&g->b, OP_REDUCE_SUM, &wts, 1), "dims", &one, 1);
    Value *sum = reshape(g, build_end(&g->b, NULL), 2, n1, NULL);
    wts = build2(&g->b, OP_DIV, wts, build_typed(&g->b, OP_BROADCAST, sum, wts->type, NULL), NULL);
  }
  value_set_name(g->m, wts, nm(g, "l%d.routing_weights", l));
  int64_t cap = 0;
  if (g->capacity_factor > 0) cap = (int64_t)ceil(g->capacity_factor * (double)(N * k) / (double)E);
  Value *pos = with_int(g, OP_MOE_SORT, &idx, 1, "experts", E, nm(g, "l%d.expert_pos", l));   /* [N*k] i32 */
  op_set_int(pos->def, "capacity", cap);
  Value *cnt = with_int(g, OP_MOE_COUNT, &idx, 1, "experts", E, nm(g, "l%d.expert_load", l)); /* [E] i32 */
  op_set_int(cnt->def, "capacity", cap);
  Value *ones = build_typed(&g->b, OP_CONSTANT, NULL, type_make(x->type.dtype, 2, nk), NULL);
  op_set_float(ones->def, "value", 1.0);
  Value *dops[3] = {x, pos, ones};
  Value *xs = with_int(g, OP_MOE_DISPATCH, dops, 3, "rows", N * k, nm(g, "l%d.expert_in", l));  /* [N*k,D] */
  Value *g1[3] = {xs, w1, cnt}, *g3[3] = {xs, w3, cnt};
  Value *gate = build1(&g->b, OP_SILU, build(&g->b, OP_GROUPED_MATMUL, g1, 3, NULL), nm(g, "l%d.expert_gate", l));
  Value *up = build(&g->b, OP_GROUPED_MATMUL, g3, 3, nm(g, "l%d.expert_up", l));
  Value *a = build2(&g->b, OP_MUL, gate, up, nm(g, "l%d.expert_swiglu", l));                 /* [N*k,F] */
  Value *g2[3] = {a, w2, cnt};
  Value *ys = build(&g->b, OP_GROUPED_MATMUL, g2, 3, nm(g, "l%d.expert_out", l));            /* [N*k,D] */
  Value *cops[3] = {ys, pos, wts};
  Value *y = reshape(g, build(&g->b, OP_MOE_COMBINE, cops, 3, NULL), 3, btd, nm(g, "l%d.mlp_out", l));
  if (!g->pos) {
    /* the routing's counts (without capacity): transformers' load_balancing_loss_func, and
       state moe_load.l<N> (the tokens each expert was chosen for since the trainer last read
       and zeroed it: the step line's expert load, --log-experts) */
    Value *all = cap ? with_int(g, OP_MOE_COUNT, &idx, 1, "experts", E, NULL) : cnt;
    Value *cf = build_typed(&g->b, OP_CAST, all, t1(E), NULL);
    char lname[64];
    snprintf(lname, sizeof lname, "moe_load.l%d", l);
    Value *acc[2] = {module_add_global(g->m, GLOBAL_STATE, lname, t1(E), (Init){INIT_ZEROS, 0})->value, cf};
    func_add_op(g->b.f, OP_ACCUMULATE, acc, 2, NULL);
    if (!c->router_aux) return y;
    int64_t zero = 0;
    op_set_ints(g->m, build_begin(&g->b, OP_REDUCE_SUM, &probs, 1), "dims", &zero, 1);
    Value *ps = build_end(&g->b, NULL);
    g->aux_count = g->aux_count ? build2(&g->b, OP_ADD, g->aux_count, cf, NULL) : cf;
    g->aux_prob = g->aux_prob ? build2(&g->b, OP_ADD, g->aux_prob, ps, NULL) : ps;
    g->n_sparse++;
  }
  return y;
}

/* loss + coef * E * sum_e f_e P_e: f_e the share of the k-per-token assignments that went to
   expert e and P_e the mean router probability of e, both over every token of every sparse
   layer (transformers' load_balancing_loss_func with no attention mask). */
static Value *add_aux_loss(Graph *g, Value *loss) {
  if (!g->aux_count) return loss;
  const ModelConfig *c = g->c;
  double n = (double)g->n_sparse * (double)(g->B * g->T);
  Value *prod = build2(&g->b, OP_MUL, g->aux_count, g->aux_prob, NULL);
  int64_t zero = 0;
  op_set_ints(g->m, build_begin(&g->b, OP_REDUCE_SUM, &prod, 1), "dims", &zero, 1);
  Value *aux = build_end(&g->b, NULL);
  op_set_float(build_begin(&g->b, OP_SCALE, &aux, 1), "by", (double)c->n_experts / (n * n));
  aux = build_end(&g->b, "aux_loss");
  op_set_float(build_begin(&g->b, OP_SCALE, &aux, 1), "by", c->aux_coef);
  return build2(&g->b, OP_ADD, loss, build_end(&g->b, NULL), "loss_total");
}

static void gpt2(Graph *g, Value *tokens, Value *targets, Func *f) {
  const ModelConfig *c = g->c;
  int64_t B = g->B, T = g->T, D = c->hidden, H = c->n_head, Dh = c->head_dim, I = c->intermediate, V = g->V;
  Init w = {INIT_NORMAL, 0.02}, proj = {INIT_NORMAL, 0.02 / sqrt(2.0 * (double)c->n_layer)};
  Init zeros = {INIT_ZEROS, 0}, ones = {INIT_ONES, 0};
  Value *wte = vocab_param(g, param(g, "wte.weight", t2(V, D), w));
  Value *wpe = param(g, "wpe.weight", t2(c->max_pos, D), (Init){INIT_NORMAL, 0.01});
  int64_t btd[] = {B, T, D}, bthd[] = {B, T, H, Dh};
  Type x_type = type_make(DT_F32, 3, btd);

  Value *x = build2(&g->b, OP_EMBEDDING, wte, tokens, "tok_emb");   /* [B,T,D] */
  if (g->pos) {   /* decode: the rows of the new tokens' positions */
    x = build2(&g->b, OP_ADD, x, build2(&g->b, OP_EMBEDDING, wpe, g->pos, "pos_emb"), "x");
  } else {
    int64_t start[] = {0, 0}, end[] = {T, D};
    Value *pos = slice(g, wpe, start, end, "pos_emb");                 /* rows 0..T-1: [T,D] */
    x = build2(&g->b, OP_ADD, x, build_typed(&g->b, OP_BROADCAST, pos, x_type, NULL), "x");
  }
  for (int l = 0; l < c->n_layer; l++) {
    Value *ln1w = param_l(g, "h.%d.ln_1.weight", l, t1(D), ones);
    Value *ln1b = param_l(g, "h.%d.ln_1.bias", l, t1(D), zeros);
    /* c_attn is [D,3D] in checkpoints, [D,3,D] here (same bytes): a split of the last dim
       across ranks then keeps whole heads of q, k and v together. */
    int64_t d3d[] = {D, 3, D}, d3[] = {3, D};
    Value *attw = param_l(g, "h.%d.attn.c_attn.weight", l, type_make(DT_F32, 3, d3d), w);
    Value *attb = param_l(g, "h.%d.attn.c_attn.bias", l, type_make(DT_F32, 2, d3), zeros);
    hf_shape(attw, 2, (int64_t[]){D, 3 * D});
    hf_shape(attb, 1, (int64_t[]){3 * D});
    Value *prw = param_l(g, "h.%d.attn.c_proj.weight", l, t2(D, D), proj);
    Value *prb = param_l(g, "h.%d.attn.c_proj.bias", l, t1(D), zeros);
    Value *ln2w = param_l(g, "h.%d.ln_2.weight", l, t1(D), ones);
    Value *ln2b = param_l(g, "h.%d.ln_2.bias", l, t1(D), zeros);
    Value *fcw = param_l(g, "h.%d.mlp.c_fc.weight", l, t2(D, I), w);
    Value *fcb = param_l(g, "h.%d.mlp.c_fc.bias", l, t1(I), zeros);
    Value *mpw = param_l(g, "h.%d.mlp.c_proj.weight", l, t2(I, D), proj);
    Value *mpb = param_l(g, "h.%d.mlp.c_proj.bias", l, t1(D), zeros);

    Value *h = norm(g, x, ln1w, ln1b, nm(g, "h%d.ln_1", l));
    Value *qkv[3];
    for (int j = 0; j < 3; j++) {   /* q, k, v: x @ c_attn[:, j, :] + bias[j] */
      int64_t ws[] = {0, j, 0}, we[] = {D, j + 1, D}, bs[] = {j, 0}, be[] = {j + 1, D}, dd[] = {D, D};
      Value *wj = reshape(g, slice(g, attw, ws, we, NULL), 2, dd, NULL);
      Value *bj = reshape(g, slice(g, attb, bs, be, NULL), 1, &D, NULL);
      qkv[j] = reshape(g, linear(g, h, wj, bj, false, NULL), 4, bthd, nm(g, j == 0 ? "h%d.q" : j == 1 ? "h%d.k" : "h%d.v", l));
    }
    Value *q = qkv[0], *k = qkv[1], *v = qkv[2];
    Value *a = attention(g, q, k, v, l, nm(g, "h%d.attn", l));                  /* [B,T,H,Dh] */
    a = linear(g, reshape(g, a, 3, btd, NULL), prw, prb, false, nm(g, "h%d.attn_out", l));
    x = build2(&g->b, OP_ADD, x, a, nm(g, "h%d.x_attn", l));
    h = norm(g, x, ln2w, ln2b, nm(g, "h%d.ln_2", l));
    h = linear(g, h, fcw, fcb, false, nm(g, "h%d.fc", l));                      /* [B,T,I] */
    h = build1(&g->b, OP_GELU_TANH, h, nm(g, "h%d.gelu", l));
    h = linear(g, h, mpw, mpb, false, nm(g, "h%d.mlp_out", l));
    x = build2(&g->b, OP_ADD, x, h, nm(g, "h%d.out", l));
  }
  Value *lnfw = param(g, "ln_f.weight", t1(D), ones), *lnfb = param(g, "ln_f.bias", t1(D), zeros);
  x = norm(g, x, lnfw, lnfb, "ln_f");
  Value *logits = mask_padding(g, linear(g, x, wte, NULL, true, "logits"));   /* [B,T,V] */
  func_add_ret(f, unpadded(g, logits));
  if (targets) func_add_ret(f, loss(g, logits, targets));
}

static void llama(Graph *g, Value *tokens, Value *targets, Func *f) {
  const ModelConfig *c = g->c;
  int64_t B = g->B, T = g->T, D = c->hidden, H = c->n_head, KV = c->n_kv_head, Dh = c->head_dim;
  int64_t I = c->intermediate, V = g->V;
  Init w = {INIT_NORMAL, 0.02}, proj = {INIT_NORMAL, 0.02 / sqrt(2.0 * (double)c->n_layer)};
  Init ones = {INIT_ONES, 0};
  int64_t bthd[] = {B, T, H, Dh}, btkd[] = {B, T, KV, Dh}, bth[] = {B, T, H * Dh};
  Value *emb = vocab_param(g, param(g, "model.embed_tokens.weight", t2(V, D), w));
  Value *x = build2(&g->b, OP_EMBEDDING, emb, tokens, "tok_emb");   /* [B,T,D] */
  for (int l = 0; l < c->n_layer; l++) {
    Value *n1w = param_l(g, "model.layers.%d.input_layernorm.weight", l, t1(D), ones);
    Value *qw = param_l(g, "model.layers.%d.self_attn.q_proj.weight", l, t2(H * Dh, D), w);
    Value *kw = param_l(g, "model.layers.%d.self_attn.k_proj.weight", l, t2(KV * Dh, D), w);
    Value *vw = param_l(g, "model.layers.%d.self_attn.v_proj.weight", l, t2(KV * Dh, D), w);
    Value *ow = param_l(g, "model.layers.%d.self_attn.o_proj.weight", l, t2(D, H * Dh), proj);
    Value *n2w = param_l(g, "model.layers.%d.post_attention_layernorm.weight", l, t1(D), ones);
    Init zeros = {INIT_ZEROS, 0};   /* Qwen2's q/k/v biases */
    Value *qb = c->qkv_bias ? param_l(g, "model.layers.%d.self_attn.q_proj.bias", l, t1(H * Dh), zeros) : NULL;
    Value *kb = c->qkv_bias ? param_l(g, "model.layers.%d.self_attn.k_proj.bias", l, t1(KV * Dh), zeros) : NULL;
    Value *vb = c->qkv_bias ? param_l(g, "model.layers.%d.self_attn.v_proj.bias", l, t1(KV * Dh), zeros) : NULL;
    bool sparse = config_layer_is_moe(c, l);
    Value *qn = c->qk_norm ? param_l(g, "model.layers.%d.self_attn.q_norm.weight", l, t1(Dh), ones) : NULL;
    Value *kn = c->qk_norm ? param_l(g, "model.layers.%d.self_attn.k_norm.weight", l, t1(Dh), ones) : NULL;
    Value *gw = sparse ? NULL : param_l(g, "model.layers.%d.mlp.gate_proj.weight", l, t2(I, D), w);
    Value *uw = sparse ? NULL : param_l(g, "model.layers.%d.mlp.up_proj.weight", l, t2(I, D), w);
    Value *dw = sparse ? NULL : param_l(g, "model.layers.%d.mlp.down_proj.weight", l, t2(D, I), proj);

    Value *h = norm(g, x, n1w, NULL, nm(g, "l%d.input_norm", l));
    Value *q = reshape(g, linear(g, h, qw, qb, true, NULL), 4, bthd, NULL);   /* [B,T,H,Dh] */
    Value *k = reshape(g, linear(g, h, kw, kb, true, NULL), 4, btkd, NULL);   /* [B,T,KV,Dh] */
    if (c->qk_norm) {   /* Qwen3 (dense and MoE): RMSNorm over each head's Dh, before RoPE */
      q = norm(g, q, qn, NULL, nm(g, "l%d.q_norm", l));
      k = norm(g, k, kn, NULL, nm(g, "l%d.k_norm", l));
    }
    Value *v = reshape(g, linear(g, h, vw, vb, true, NULL), 4, btkd, nm(g, "l%d.v", l));
    q = rope(g, q, nm(g, "l%d.q", l));
    k = rope(g, k, nm(g, "l%d.k", l));
    Value *a = attention(g, q, k, v, l, nm(g, "l%d.attn", l));
    a = linear(g, reshape(g, a, 3, bth, NULL), ow, NULL, true, nm(g, "l%d.attn_out", l));
    x = build2(&g->b, OP_ADD, x, a, nm(g, "l%d.x_attn", l));
    h = norm(g, x, n2w, NULL, nm(g, "l%d.post_norm", l));
    if (sparse) {
      h = moe_mlp(g, h, l);
    } else {
      Value *gate = build1(&g->b, OP_SILU, linear(g, h, gw, NULL, true, NULL), nm(g, "l%d.gate", l));   /* [B,T,I] */
      Value *up = linear(g, h, uw, NULL, true, nm(g, "l%d.up", l));
      h = build2(&g->b, OP_MUL, gate, up, nm(g, "l%d.swiglu", l));
      h = linear(g, h, dw, NULL, true, nm(g, "l%d.mlp_out", l));
    }
    x = build2(&g->b, OP_ADD, x, h, nm(g, "l%d.out", l));
  }
  Value *nw = param(g, "model.norm.weight", t1(D), ones);
  x = norm(g, x, nw, NULL, "final_norm");
  Value *head = c->tied ? emb : vocab_param(g, param(g, "lm_head.weight", t2(V, D), w));
  Value *logits = mask_padding(g, linear(g, x, head, NULL, true, "logits"));   /* [B,T,V] */
  func_add_ret(f, unpadded(g, logits));
  if (targets) func_add_ret(f, add_aux_loss(g, loss(g, logits, targets)));
}

void frontend_module_name(const char *path, char *buf, size_t n) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t len = strlen(base);
  if (len > 5 && !strcmp(base + len - 5, ".json")) len -= 5;
  if (len == 0 || len >= n) len = len >= n ? n - 1 : 0;
  size_t k = 0;
  for (size_t i = 0; i < len; i++) {
    char ch = base[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
    buf[k++] = ok ? ch : '_';
  }
  if (k == 0 || !((buf[0] >= 'a' && buf[0] <= 'z') || (buf[0] >= 'A' && buf[0] <= 'Z') || buf[0] == '_')) {
    /* Names must start with a letter for the text form. */
    memmove(buf + 1, buf, k < n - 1 ? k : n - 2);
    buf[0] = 'm';
    k = k < n - 1 ? k + 1 : n - 1;
  }
  buf[k] = 0;
}

static int build_module(const RunSpec *spec, const char *name, int64_t tmax, Module **out, char *err, size_t errlen) {
  Graph g;
  memset(&g, 0, sizeof g);
  g.m = module_new(name);
  for (int a = 0; a < AX_COUNT; a++) g.m->mesh.size[a] = spec->mesh[a];   /* MESH_* follow AX_* order */
  g.c = &spec->model;
  g.capacity_factor = spec->capacity_factor;
  g.B = spec->batch;
  g.T = spec->seq;
  /* the vocabulary the graph holds: a multiple of tp (each rank a whole share) and of
     vocab_multiple (aligned GEMMs: e.g. 128), padded as vocab_param describes */
  int64_t tp = spec->mesh[MESH_TP], mult = spec->vocab_multiple > 0 ? spec->vocab_multiple : 1, a = tp, b = mult;
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  int64_t lcm = tp / a * mult;
  g.V = (spec->model.vocab_size + lcm - 1) / lcm * lcm;
  Func *f = module_add_func(g.m, tmax ? "decode" : "forward");
  g.b.f = f;
  int64_t bt[] = {g.B, g.T};
  Value *tokens = func_add_arg(f, "tokens", type_make(DT_I32, 2, bt)), *targets = NULL;
  if (tmax) {
    g.pos = func_add_arg(f, "positions", type_make(DT_I32, 2, bt));
    g.tmax = tmax;
  } else {
    targets = func_add_arg(f, "targets", type_make(DT_I32, 2, bt));
  }
  if (spec->model.arch == ARCH_GPT2) gpt2(&g, tokens, targets, f);
  else llama(&g, tokens, targets, f);
  if (g.b.err[0]) {
    snprintf(err, errlen, "%s: cannot build the model graph: %s", spec->path, g.b.err);
    module_free(g.m);
    return IR_EINPUT;
  }
  int rc = verify_module(g.m, err, errlen);
  if (rc) {
    module_free(g.m);
    return rc;
  }
  *out = g.m;
  return 0;
}

int frontend_build(const RunSpec *spec, const char *name, Module **out, char *err, size_t errlen) {
  return build_module(spec, name, 0, out, err, errlen);
}

int frontend_build_decode(const RunSpec *spec, const char *name, int64_t tmax, Module **out, char *err, size_t errlen) {
  if (tmax < 1) {
    snprintf(err, errlen, "the KV cache needs at least one row");
    return IR_EINPUT;
  }
  return build_module(spec, name, tmax, out, err, errlen);
}
