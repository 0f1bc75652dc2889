/* driver/sample.c — generation with a KV cache, shared by `loom sample` (tools/cmd_sample.c)
 * and compiled executables (tools/runner/runner.c): a lowered program's @decode(tokens,
 * positions) -> logits (frontend_build_decode) run one token at a time on the cpu backend.
 *
 * The prompt goes through @decode one token at a time (each call writes that token's keys
 * and values into the cache), then every new token is picked from the last logits and fed
 * back, until max_new tokens or an end-of-sequence id.  Picking: temperature 0 is greedy
 * (argmax, the lowest id on ties, as torch.argmax); otherwise softmax(logits / T), cut to
 * the top_k largest and to the smallest set whose mass reaches top_p, renormalized, and drawn
 * with a 64-bit xorshift* generator seeded by seed (the same seed gives the same text).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/io/checkpoint.h"
#include "driver/driver.h"

/* W as a safetensors path: the file, DIR/model.safetensors, or a checkpoint's newest step's. */
int sample_weights_path(const char *w, char *out, size_t n, char *err, size_t errlen) {
  struct stat st;
  if (stat(w, &st)) {
    snprintf(err, errlen, "%s: no such file or folder (give --weights a safetensors file, a folder with "
             "model.safetensors, or a --save-dir)", w);
    return EXIT_USAGE;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(out, n, "%s", w);
    return 0;
  }
  snprintf(out, n, "%s/model.safetensors", w);
  if (!stat(out, &st)) return 0;
  char stepdir[4096];
  int64_t step;
  int rc = ckpt_latest(w, stepdir, sizeof stepdir, &step, err, errlen);
  if (rc) return rc;
  snprintf(out, n, "%s/model.safetensors", stepdir);
  return 0;
}

/* xorshift64* */
static double uniform(uint64_t *s) {
  *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
  return (double)((*s * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct {
  float p;
  int32_t id;
} Cand;

static int by_prob(const void *a, const void *b) {
  const Cand *x = a, *y = b;
  return x->p > y->p ? -1 : x->p < y->p ? 1 : x->id - y->id;
}

/* The next token from the logits of the last position. */
static int32_t pick(const float *logits, int64_t V, double temp, int64_t top_k, double top_p, uint64_t *rng, Cand *c) {
  if (temp <= 0) {
    int32_t best = 0;
    for (int64_t v = 1; v < V; v++)
      if (logits[v] > logits[best]) best = (int32_t)v;
    return best;
  }
  double mx = -INFINITY, sum = 0;
  for (int64_t v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
  for (int64_t v = 0; v < V; v++) {
    c[v].id = (int32_t)v;
    c[v].p = (float)exp(((double)logits[v] - mx) / temp);
    sum += c[v].p;
  }
  for (int64_t v = 0; v < V; v++) c[v].p = (float)(c[v].p / sum);
  qsort(c, (size_t)V, sizeof *c, by_prob);
  int64_t n = top_k > 0 && top_k < V ? top_k : V;
  double mass = 0;
  for (int64_t i = 0; i < n; i++) {
    mass += c[i].p;
    if (mass >= top_p) {
      n = i + 1;
      break;
    }
  }
  double total = 0;
  for (int64_t i = 0; i < n; i++) total += c[i].p;
  double r = uniform(rng) * total;
  for (int64_t i = 0; i < n; i++) {
    r -= c[i].p;
    if (r <= 0) return c[i].id;
  }
  return c[n - 1].id;
}

static int emit(Tokenizer *tok, int32_t id, bool ids, bool first, uint8_t **buf, size_t *cap, char *err, size_t errlen) {
  if (ids) {
    printf("%s%d", first ? "" : " ", id);
  } else if (tok) {
    size_t len = 0;
    uint32_t u = (uint32_t)id;
    int rc = tokenizer_decode(tok, &u, 1, buf, &len, cap, err, errlen);
    if (rc) return rc;
    fwrite(*buf, 1, len, stdout);
  } else {
    putchar(id);
  }
  fflush(stdout);
  return 0;
}


int sample_prompt_ids(Tokenizer *tok, int64_t V, const char *prompt, TokIds *out, char *err, size_t errlen) {
  int rc = 0;
  if (tok) {
    if (tokenizer_vocab_size(tok) > V) {
      snprintf(err, errlen, "the tokenizer has %lld tokens, more than the model's vocabulary of %lld: is it this model's "
               "tokenizer?", (long long)tokenizer_vocab_size(tok), (long long)V);
      return EXIT_USAGE;
    }
    rc = tokenizer_encode(tok, (const uint8_t *)prompt, strlen(prompt), out, err, errlen);
  } else if (V != 256) {
    snprintf(err, errlen, "the model's vocabulary has %lld tokens, not 256 bytes: give its tokenizer (--tokenizer "
             "tokenizer.json)", (long long)V);
    return EXIT_USAGE;
  } else {
    for (const char *p = prompt; *p && !rc; p++)
      if (tokids_push(out, (uint8_t)*p)) rc = EXIT_RUN;
    if (rc) snprintf(err, errlen, "out of memory");
  }
  if (!rc && out->n == 0) {
    snprintf(err, errlen, "the prompt gives no tokens");
    rc = EXIT_USAGE;
  }
  return rc;
}

static int cpu_decode(void *ctx, int32_t tok, int32_t pos, float *logits, char *err, size_t errlen) {
  CpuProgram *cp = ctx;
  void *args[2] = {&tok, &pos}, *rets[1] = {logits};
  return cpu_program_call(cp, cpu_find_func(cp, "decode"), args, rets, err, errlen);
}

int sample_generate(CpuProgram *cp, Tokenizer *tok, int64_t V, const TokIds *prompt, const char *prompt_text,
                    int64_t tmax, const SampleOpts *o, char *err, size_t errlen) {
  if (cpu_find_func(cp, "decode") < 0) {
    snprintf(err, errlen, "the program has no @decode to sample with");
    return EXIT_RUN;
  }
  return sample_generate_with(cpu_decode, cp, "cpu backend", tok, V, prompt, prompt_text, tmax, o, err, errlen);
}

int sample_generate_with(SampleDecodeFn call, void *ctx, const char *where, Tokenizer *tok, int64_t V,
                         const TokIds *prompt, const char *prompt_text, int64_t tmax, const SampleOpts *o, char *err,
                         size_t errlen) {
  SampleOpts fit;
  if (o->max_new_default && prompt->n < tmax && prompt->n + o->max_new > tmax) {
    fit = *o;   /* the default asks more than the cache holds: it takes what is left */
    fit.max_new = tmax - prompt->n;
    o = &fit;
  }
  if (prompt->n + o->max_new > tmax) {
    snprintf(err, errlen, "the prompt (%lld tokens) and %lld new tokens need %lld positions, and the KV cache holds %lld; "
             "shorten the prompt or ask for fewer tokens", (long long)prompt->n, (long long)o->max_new,
             (long long)(prompt->n + o->max_new), (long long)tmax);
    return EXIT_USAGE;
  }
  float *logits = malloc(sizeof(float) * (size_t)V);
  Cand *cands = malloc(sizeof(Cand) * (size_t)V);
  uint8_t *dbuf = NULL;
  size_t dcap = 0;
  int rc = 0;
  if (!logits || !cands) {
    snprintf(err, errlen, "out of memory");
    rc = EXIT_RUN;
  }
  uint64_t rng = o->seed * 0x9E3779B97F4A7C15ull + 1;
  double t0 = seconds_now();
  int64_t made = 0;
  if (!rc && !o->ids) {   /* the prompt as given, then the continuation */
    fputs(prompt_text, stdout);
    fflush(stdout);
  }
  /* the prompt, one token a call: its keys and values go into the cache */
  for (int64_t pos = 0; !rc && pos < prompt->n; pos++) rc = call(ctx, (int32_t)prompt->ids[pos], (int32_t)pos, logits, err, errlen);
  double t_first = seconds_now();
  /* then each new token from the last logits, fed back at the next position */
  for (int64_t pos = prompt->n; !rc && made < o->max_new; pos++) {
    int32_t next = pick(logits, V, o->temperature, o->top_k, o->top_p, &rng, cands);
    rc = emit(tok, next, o->ids, made == 0, &dbuf, &dcap, err, errlen);
    made++;
    bool stop = false;
    for (int e = 0; e < o->n_eos; e++) stop |= next == o->eos[e];
    if (rc || stop || made == o->max_new) break;
    rc = call(ctx, next, (int32_t)pos, logits, err, errlen);
  }
  if (!rc) {
    printf("\n");
    double t1 = seconds_now();
    fprintf(stderr, "loom: %lld prompt tokens in %.3f s, %lld new tokens in %.3f s (%.1f tokens/s), KV cache %lld "
            "positions, %s\n", (long long)prompt->n, t_first - t0, (long long)made, t1 - t_first,
            (double)made / (t1 - t_first > 0 ? t1 - t_first : 1e-9), (long long)tmax, where);
  }
  free(dbuf);
  free(cands);
  free(logits);
  return rc;
}
