/* frontend/bounds.c: the largest model and run loom will try to build, checked before any
 * graph is built or buffer allocated.
 *
 * Each value on its own is read by config.c and spec.c (a size is at most 2^31-1, a count
 * at least 1); these checks bound what the values make together, so that a hostile or
 * mistyped config fails at once with the key to change instead of building a graph of a
 * billion layers, overflowing a product of sizes, or handing BLAS a dimension past its int
 * range.  The bounds are what loom can run, with a wide margin over the largest models
 * trained today (Llama 3 405B: 126 layers, 16384 wide, 128256 tokens; DeepSeek-V3: 256
 * experts); whether a run that passes them fits this machine's memory is checked later,
 * against the memory plan (driver/resources.c). */
#include "frontend/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Layers: the training passes take time that grows faster than the layer count (2 s at
   128 layers on two cores, half a minute at 512): past this a compile does not finish. */
#define BOUND_LAYERS 1024
/* Experts per layer: every routing step keeps per-expert counts and offsets. */
#define BOUND_EXPERTS 65536
/* Elements of all parameters together, and of one activation: 2^48 elements of 4 bytes
   are 1 PiB, far past any machine, and every byte count derived from them stays far from
   int64's limit. */
#define BOUND_ELEMENTS 281474976710656.0
/* Tokens of one micro-batch: the rows of the GEMMs, which BLAS takes as an int. */
#define BOUND_TOKENS 2147483647LL
/* Micro-batches per optimizer step. */
#define BOUND_GRAD_ACCUM 65536
/* Optimizer steps: the run keeps each step's loss, norm and learning rate. */
#define BOUND_STEPS 2147483647LL
/* Ranks of a mesh. */
#define BOUND_WORLD (1LL << 20)

/* The config.json names of the fields (GPT-2's own names; the Llama family's). */
typedef enum { K_LAYERS, K_HIDDEN, K_VOCAB, K_INTER, K_EXPERTS, K_POS } Field;
static const char *field_key(const ModelConfig *m, Field k) {
  bool gpt2 = m->arch == ARCH_GPT2;
  switch (k) {
  case K_LAYERS: return gpt2 ? "n_layer" : "num_hidden_layers";
  case K_HIDDEN: return gpt2 ? "n_embd" : "hidden_size";
  case K_VOCAB: return "vocab_size";
  case K_INTER: return gpt2 ? "n_inner" : "intermediate_size";
  case K_EXPERTS: return m->arch == ARCH_QWEN3_MOE ? "num_experts" : "num_local_experts";
  case K_POS: return gpt2 ? "n_positions" : "max_position_embeddings";
  }
  return "?";
}

static int refuse(const ModelConfig *m, const char *file, const char *prefix, Field k, int64_t value, char *err,
                  size_t errlen, const char *why) {
  return config_errorf(err, errlen, 2, "%s: key \"%s%s\": %lld is more than loom can run: %s", file, prefix,
                       field_key(m, k), (long long)value, why);
}

int config_check_bounds(const ModelConfig *m, const char *file, const char *keyprefix, char *err, size_t errlen) {
  char prefix[80] = "";
  if (keyprefix && keyprefix[0])
    snprintf(prefix, sizeof prefix, "%s%s", keyprefix, keyprefix[strlen(keyprefix) - 1] == '.' ? "" : ".");
  char why[256];
  if (m->n_layer > BOUND_LAYERS) {
    snprintf(why, sizeof why, "at most %d layers (compiling takes longer than linearly in the layers); "
             "the largest models trained have about 130", BOUND_LAYERS);
    return refuse(m, file, prefix, K_LAYERS, m->n_layer, err, errlen, why);
  }
  if (m->n_experts > BOUND_EXPERTS) {
    snprintf(why, sizeof why, "at most %d experts per layer; the largest models have a few hundred", BOUND_EXPERTS);
    return refuse(m, file, prefix, K_EXPERTS, m->n_experts, err, errlen, why);
  }
  /* The parameters, in floating point (an int64 product of these sizes can overflow), by
     part: what a layer holds and what the vocabulary does. */
  double V = (double)m->vocab_size, C = (double)m->hidden, L = (double)m->n_layer, I = (double)m->intermediate;
  double H = (double)m->n_head, KV = (double)m->n_kv_head, D = (double)m->head_dim, P = (double)m->max_pos;
  double attn = C * (H + 2 * KV) * D + H * D * C, mlp = (m->arch == ARCH_GPT2 ? 2 : 3) * C * I;
  double experts = m->n_experts > 0 ? (double)m->n_experts * (3 * C * (double)m->moe_intermediate + C) : 0;
  double vocab = V * C * (m->tied || m->arch == ARCH_GPT2 ? 1 : 2), pos = m->arch == ARCH_GPT2 ? P * C : 0;
  double layers = L * (attn + (experts > mlp ? experts : mlp));
  double total = vocab + pos + layers;
  /* One matrix's elements: the widest products of two sizes. */
  double widest = C * (H + 2 * KV) * D;
  Field wk = K_HIDDEN;
  if (V * C > widest) widest = V * C, wk = K_VOCAB;
  /* GPT-2's n_inner defaults to 4 x n_embd: then the width is what to change */
  if (C * I > widest) widest = C * I, wk = m->arch == ARCH_GPT2 && m->intermediate == 4 * m->hidden ? K_HIDDEN : K_INTER;
  if (experts > widest) widest = experts, wk = K_EXPERTS;
  if (P * C > widest && m->arch == ARCH_GPT2) widest = P * C, wk = K_POS;
  if (total > BOUND_ELEMENTS || widest > BOUND_ELEMENTS) {
    /* name what makes it so large: the widest matrix, else the largest part */
    Field k = widest > BOUND_ELEMENTS ? wk : vocab >= layers ? K_VOCAB : experts > mlp && experts >= attn ? K_EXPERTS
              : K_HIDDEN;
    int64_t value = k == K_VOCAB ? m->vocab_size : k == K_INTER ? m->intermediate : k == K_EXPERTS ? m->n_experts
                    : k == K_POS ? m->max_pos : m->hidden;
    snprintf(why, sizeof why, "the model would have %.3g parameters (at most %.3g: 2^48, a petabyte of weights); "
             "set a smaller %s", total, BOUND_ELEMENTS, field_key(m, k));
    return refuse(m, file, prefix, k, value, err, errlen, why);
  }
  return 0;
}

const char *config_largest_key(const ModelConfig *m, int64_t *value) {
  double V = (double)m->vocab_size, C = (double)m->hidden, L = (double)m->n_layer, I = (double)m->intermediate;
  double vocab = V * C * (m->tied || m->arch == ARCH_GPT2 ? 1 : 2);
  double experts = m->n_experts > 0 ? L * (double)m->n_experts * 3 * C * (double)m->moe_intermediate : 0;
  double layers = L * 12 * C * C + (m->arch == ARCH_GPT2 ? 2 : 3) * L * C * I;
  Field k = vocab >= layers && vocab >= experts ? K_VOCAB : experts >= layers ? K_EXPERTS
            : L >= 4 * sqrt(C) ? K_LAYERS : K_HIDDEN;
  *value = k == K_VOCAB ? m->vocab_size : k == K_EXPERTS ? m->n_experts : k == K_LAYERS ? m->n_layer : m->hidden;
  return field_key(m, k);
}

int spec_check_bounds(const RunSpec *s, char *err, size_t errlen) {
  const char *f = s->path[0] ? s->path : "run spec";
  const ModelConfig *m = &s->model;
  if (s->steps > BOUND_STEPS)
    return config_errorf(err, errlen, 2, "%s: key \"steps\" (--steps): %lld steps are more than loom can run: at most "
                         "%lld; set the number of optimizer steps (e.g. 1000)", f, (long long)s->steps,
                         (long long)BOUND_STEPS);
  if (s->grad_accum > BOUND_GRAD_ACCUM)
    return config_errorf(err, errlen, 2, "%s: key \"grad_accum\" (--grad-accum): %lld micro-batches per step are more "
                         "than loom can run: at most %d; for a larger batch per step use more data-parallel ranks "
                         "(--mesh dp=N)", f, (long long)s->grad_accum, BOUND_GRAD_ACCUM);
  /* batch and seq are each at most 2^31-1 (spec.c), so their product fits int64 */
  int64_t tokens = s->batch * s->seq;
  if (tokens > BOUND_TOKENS)
    return config_errorf(err, errlen, 2, "%s: key \"batch\" (--batch): batch %lld x seq %lld = %lld tokens in one "
                         "micro-batch, more than loom can run: at most %lld (a matrix's rows are a BLAS int); lower "
                         "batch and raise grad_accum (--grad-accum) instead", f, (long long)s->batch,
                         (long long)s->seq, (long long)tokens, (long long)BOUND_TOKENS);
  double widest = (double)m->vocab_size;
  if ((double)m->intermediate > widest) widest = (double)m->intermediate;
  if ((double)m->hidden > widest) widest = (double)m->hidden;
  if ((double)tokens * widest > BOUND_ELEMENTS)
    return config_errorf(err, errlen, 2, "%s: key \"batch\" (--batch): batch %lld x seq %lld tokens x %lld (the "
                         "model's widest activation) = %.3g elements in one tensor, more than loom can run (2^48); "
                         "lower batch", f, (long long)s->batch, (long long)s->seq, (long long)widest,
                         (double)tokens * widest);
  double world = 1;
  for (int a = 0; a < MESH_AXES; a++) world *= (double)s->mesh[a];
  if (world > (double)BOUND_WORLD)
    return config_errorf(err, errlen, 2, "%s: key \"mesh\" (--mesh): %.0f ranks are more than loom can run: at most "
                         "%lld; choose smaller axes", f, world, (long long)BOUND_WORLD);
  return 0;
}
