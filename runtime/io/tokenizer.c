/* runtime/io/tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json. See tokenizer.h.
 *
 * Everything is kept in raw bytes: vocabulary keys are mapped back from GPT-2's byte-level
 * alphabet (bytes_to_unicode) at load, so a word is merged as its bytes and the result needs
 * no mapping on the way out.  Merges are a table from a pair of ids to (rank, merged id).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "runtime/io/tokenizer.h"

#include "runtime/io/safetensors.h" /* rt_read_file */

#include <inttypes.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/io/seterr.h"

#define GPT2_PATTERN "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Llama 3's pattern and Qwen2's (the same with single digits): tokenizer_cut is known to be
   safe for these and GPT-2's. */
#define LLAMA3_PATTERN "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_PATTERN "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define MAX_STEPS 8
#define CACHE_WORD_MAX 64          /* words up to this many bytes are cached */
#define CACHE_IDS_MAX (1u << 22)   /* ids held by the cache before it starts over */


/* ---- hash tables ---- */

static uint64_t hash_bytes(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ull;   /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h ^ (h >> 29);
}

/* Byte strings (kept in an arena) to a uint32 value; open addressing, power-of-two size. */
typedef struct {
  uint64_t hash;
  uint32_t off, len, val;
  bool used;
} BmEntry;
typedef struct {
  BmEntry *tab;
  size_t cap, n;
  uint8_t *arena;
  size_t arena_n, arena_cap;
} BytesMap;

static void bm_free(BytesMap *m) {
  free(m->tab);
  free(m->arena);
  memset(m, 0, sizeof *m);
}

static BmEntry *bm_slot(const BytesMap *m, const uint8_t *k, size_t n, uint64_t h) {
  for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    BmEntry *e = &m->tab[i];
    if (!e->used || (e->hash == h && e->len == n && !memcmp(m->arena + e->off, k, n))) return e;
  }
}

static const BmEntry *bm_get(const BytesMap *m, const uint8_t *k, size_t n) {
  if (!m->cap) return NULL;
  BmEntry *e = bm_slot(m, k, n, hash_bytes(k, n));
  return e->used ? e : NULL;
}

static int bm_grow(BytesMap *m) {
  size_t ncap = m->cap ? m->cap * 2 : 1024;
  BmEntry *nt = calloc(ncap, sizeof *nt);
  if (!nt) return -1;
  BytesMap tmp = *m;
  tmp.tab = nt;
  tmp.cap = ncap;
  for (size_t i = 0; i < m->cap; i++)
    if (m->tab[i].used) *bm_slot(&tmp, m->arena + m->tab[i].off, m->tab[i].len, m->tab[i].hash) = m->tab[i];
  free(m->tab);
  m->tab = nt;
  m->cap = ncap;
  return 0;
}

/* Inserts k -> val; returns 1 if k was there already (its value left alone), -1 when out
   of memory, 0 when inserted. */
static int bm_put(BytesMap *m, const uint8_t *k, size_t n, uint32_t val) {
  if ((m->n + 1) * 4 > m->cap * 3 && bm_grow(m)) return -1;
  uint64_t h = hash_bytes(k, n);
  BmEntry *e = bm_slot(m, k, n, h);
  if (e->used) return 1;
  if (m->arena_n + n > m->arena_cap || !m->arena) {
    size_t nc = m->arena_cap ? m->arena_cap * 2 : 1 << 16;
    while (nc < m->arena_n + n) nc *= 2;
    uint8_t *na = realloc(m->arena, nc);
    if (!na) return -1;
    m->arena = na;
    m->arena_cap = nc;
  }
  memcpy(m->arena + m->arena_n, k, n);
  *e = (BmEntry){h, (uint32_t)m->arena_n, (uint32_t)n, val, true};
  m->arena_n += n;
  m->n++;
  return 0;
}

static void bm_clear(BytesMap *m) {
  if (m->tab) memset(m->tab, 0, m->cap * sizeof *m->tab);
  m->n = 0;
  m->arena_n = 0;
}

/* A pair of ids to its merge: rank (0 = first merge) and the merged token's id. */
typedef struct {
  uint64_t key;   /* (left << 32 | right) + 1; 0 = empty */
  uint32_t rank, id;
} PairEntry;
typedef struct {
  PairEntry *tab;
  size_t cap, n;
} PairMap;

static size_t pair_index(uint64_t key, size_t cap) { return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1); }

static const PairEntry *pair_get(const PairMap *m, uint32_t a, uint32_t b) {
  uint64_t key = ((uint64_t)a << 32 | b) + 1;
  for (size_t i = pair_index(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
    if (m->tab[i].key == key) return &m->tab[i];
    if (!m->tab[i].key) return NULL;
  }
}

/* ---- the tokenizer ---- */

typedef struct {
  pcre2_code *re;      /* NULL: no split */
  bool prefix_space;   /* ByteLevel add_prefix_space: a piece not starting with ' ' gets one */
} PreStep;

typedef struct {
  uint8_t *content;
  uint32_t len, id;
} AddedToken;

struct Tokenizer {
  char name[256];
  BytesMap vocab;              /* raw bytes -> id */
  uint32_t byte_id[256];
  PairMap merges;
  bool ignore_merges;
  PreStep steps[MAX_STEPS];
  int n_steps;
  pcre2_match_data *md;
  AddedToken *added;
  int n_added;
  bool added_first[256];       /* a byte some added token starts with */
  bool cut_unsafe;             /* tokenizer_cut never cuts: an added token holds a newline, a step
                                  adds a prefix space or has a regex not known to allow it */
  int64_t vocab_size;
  int64_t *dec_off;            /* [vocab_size]: offset into dec_bytes, -1 for an id without a token */
  uint32_t *dec_len;
  uint8_t *dec_bytes;
  size_t dec_n, dec_cap;
  BytesMap cache;              /* word -> (offset into cache_ids) ; length in the entry below */
  uint32_t *cache_ids;
  size_t cache_n, cache_cap;
  /* BPE scratch */
  struct Sym { uint32_t id; int prev, next; } *sym;
  struct Cand { uint32_t rank; int left, right; uint32_t a, b; } *heap;
  size_t sym_cap, heap_cap;
  uint8_t *piece;              /* a piece with its prefix space */
  size_t piece_cap;
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes are their own code point; the other 68
   get 256, 257, ... in byte order. */
static void byte_level_map(uint32_t to_cp[256], int16_t from_cp[512]) {
  for (int i = 0; i < 512; i++) from_cp[i] = -1;
  int extra = 0;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + extra++);
    from_cp[to_cp[b]] = (int16_t)b;
  }
}

int64_t utf8_invalid_at(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) { i++; continue; }
    int len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07, min = 0x10000;
    else return (int64_t)i;
    if (n - i < (size_t)len) return (int64_t)i;
    for (int k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return (int64_t)i;
      cp = cp << 6 | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return (int64_t)i;
    i += (size_t)len;
  }
  return -1;
}

/* A byte-level string (UTF-8 of the mapped code points) back to raw bytes; -1 if a code
   point is not in the alphabet or the UTF-8 is malformed. */
static int64_t from_byte_level(const int16_t from_cp[512], const uint8_t *s, size_t n, uint8_t *out) {
  int64_t k = 0;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    if (s[i] < 0x80) cp = s[i++];
    else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n) cp = (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F), i += 2;
    else return -1;
    if (cp >= 512 || from_cp[cp] < 0) return -1;
    out[k++] = (uint8_t)from_cp[cp];
  }
  return k;
}

static int add_step(Tokenizer *t, const char *pattern, bool literal, bool prefix_space, char *err, size_t errlen) {
  if (t->n_steps == MAX_STEPS) {
    seterr(err, errlen, "%s: pre_tokenizer has more than %d steps", t->name, MAX_STEPS);
    return 2;
  }
  PreStep *s = &t->steps[t->n_steps++];
  s->prefix_space = prefix_space;
  if (prefix_space || (pattern && (literal || (strcmp(pattern, GPT2_PATTERN) && strcmp(pattern, LLAMA3_PATTERN) &&
                                               strcmp(pattern, QWEN2_PATTERN)))))
    t->cut_unsafe = true;
  if (!pattern) return 0;
    int code;
  PCRE2_SIZE at;
  s->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0),
                        &code, &at, NULL);
  if (!s->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(code, msg, sizeof msg);
    seterr(err, errlen, "%s: pre_tokenizer regex '%s' does not compile at offset %zu: %s", t->name, pattern,
           (size_t)at, (const char *)msg);
    return 2;
  }
  pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE);   /* without JIT, pcre2_match is used */
  return 0;
}

/* One pre-tokenizer object (not a Sequence). */
static int read_pre(Tokenizer *t, json_t *p, char *err, size_t errlen) {
  const char *type = json_string_value(json_object_get(p, "type"));
  if (!type) {
    seterr(err, errlen, "%s: a pre_tokenizer has no \"type\"", t->name);
    return 2;
  }
  if (!strcmp(type, "ByteLevel")) {
    json_t *ur = json_object_get(p, "use_regex");
    bool use_regex = !ur || json_is_true(ur);
    return add_step(t, use_regex ? GPT2_PATTERN : NULL, false, json_is_true(json_object_get(p, "add_prefix_space")),
                    err, errlen);
  }
  if (!strcmp(type, "Split")) {
    json_t *pat = json_object_get(p, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex")), *lit = json_string_value(json_object_get(pat, "String"));
    const char *behavior = json_string_value(json_object_get(p, "behavior"));
    if (!re && !lit) {
      seterr(err, errlen, "%s: pre_tokenizer Split needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}", t->name);
      return 2;
    }
    if (!behavior || strcmp(behavior, "Isolated") || json_is_true(json_object_get(p, "invert"))) {
      seterr(err, errlen, "%s: pre_tokenizer Split with behavior '%s'%s is not supported; loom reads "
             "\"behavior\": \"Isolated\", \"invert\": false (GPT-2, Llama 3)", t->name, behavior ? behavior : "(none)",
             json_is_true(json_object_get(p, "invert")) ? " and invert" : "");
      return 2;
    }
    return add_step(t, re ? re : lit, !re, false, err, errlen);
  }
  seterr(err, errlen, "%s: pre_tokenizer type '%s' is not supported; loom reads ByteLevel and Split (or a "
         "Sequence of them), as GPT-2 and Llama 3 use", t->name, type);
  return 2;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (*p && need <= *cap) return 0;
  size_t nc = *cap ? *cap : 64;
  while (nc < need) nc *= 2;
  void *np = realloc(*p, nc * elem);
  if (!np) return -1;
  *p = np;
  *cap = nc;
  return 0;
}

static int set_decode(Tokenizer *t, uint32_t id, const uint8_t *bytes, size_t n) {
  if (grow((void **)&t->dec_bytes, &t->dec_cap, t->dec_n + n, 1)) return -1;
  memcpy(t->dec_bytes + t->dec_n, bytes, n);
  t->dec_off[id] = (int64_t)t->dec_n;
  t->dec_len[id] = (uint32_t)n;
  t->dec_n += n;
  return 0;
}

/* Looks a merge's side up: its byte-level text to an id. */
static int merge_side(Tokenizer *t, const int16_t from_cp[512], const char *s, uint8_t *buf, uint32_t *id) {
  int64_t k = from_byte_level(from_cp, (const uint8_t *)s, strlen(s), buf);
  if (k <= 0) return -1;
  const BmEntry *e = bm_get(&t->vocab, buf, (size_t)k);
  if (!e) return -1;
  *id = e->val;
  return 0;
}

static int load_model(Tokenizer *t, json_t *root, char *err, size_t errlen) {
  uint32_t to_cp[256];
  int16_t from_cp[512];
  byte_level_map(to_cp, from_cp);
  json_t *model = json_object_get(root, "model");
  const char *type = json_string_value(json_object_get(model, "type"));
  if (!json_is_object(model) || !type || strcmp(type, "BPE")) {
    seterr(err, errlen, "%s: model type is '%s'; loom reads byte-level BPE tokenizers (\"model\": {\"type\": \"BPE\"}, "
           "as GPT-2 and Llama 3 have)", t->name, type ? type : "(missing)");
    return 2;
  }
  const char *bad[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const char *v = json_string_value(json_object_get(model, bad[i]));
    if (v && *v) {
      seterr(err, errlen, "%s: model.%s is '%s'; loom reads byte-level BPE without one (GPT-2, Llama 3)", t->name, bad[i], v);
      return 2;
    }
  }
  json_t *dropout = json_object_get(model, "dropout");
  if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0) {
    seterr(err, errlen, "%s: model.dropout is set; BPE dropout is for training a tokenizer, set it to null", t->name);
    return 2;
  }
  t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
  json_t *vocab = json_object_get(model, "vocab");
  if (!json_is_object(vocab) || json_object_size(vocab) == 0) {
    seterr(err, errlen, "%s: model.vocab must be a non-empty object of token -> id", t->name);
    return 2;
  }
  /* ids first, to size the decode table */
  int64_t max_id = -1;
  const char *key;
  json_t *v;
  json_object_foreach(vocab, key, v) {
    json_int_t id = json_integer_value(v);
    if (!json_is_integer(v) || id < 0 || id >= (1 << 30)) {
      seterr(err, errlen, "%s: model.vocab[\"%.60s\"] must be an id from 0 to 2^30, not %s", t->name, key,
             json_is_integer(v) ? "out of range" : "a non-integer");
      return 2;
    }
    if (id > max_id) max_id = id;
  }
  json_t *added = json_object_get(root, "added_tokens");
  if (added && !json_is_null(added) && !json_is_array(added)) {
    seterr(err, errlen, "%s: added_tokens must be an array", t->name);
    return 2;
  }
  size_t i;
  json_array_foreach(added, i, v) {
    json_t *jid = json_object_get(v, "id");
    json_int_t id = json_integer_value(jid);
    if (!json_is_integer(jid) || id < 0 || id >= (1 << 30) || !json_string_value(json_object_get(v, "content")) ||
        !json_string_length(json_object_get(v, "content"))) {
      seterr(err, errlen, "%s: added_tokens[%zu] needs an \"id\" from 0 to 2^30 and a non-empty \"content\"", t->name, i);
      return 2;
    }
    if (id > max_id) max_id = id;
  }
  /* the decode table is sized by the largest id: an id far past any real vocabulary (the
     largest have about 256k tokens) is a damaged file, not a 4 GB table */
  if (max_id >= (1 << 22)) {
    seterr(err, errlen, "%s: token id %lld is above loom's limit of %d (the largest vocabularies hold about 256k "
           "tokens); is the file damaged?", t->name, (long long)max_id, (1 << 22) - 1);
    return 2;
  }
  t->vocab_size = max_id + 1;
  t->dec_off = malloc(sizeof *t->dec_off * (size_t)t->vocab_size);
  t->dec_len = calloc((size_t)t->vocab_size, sizeof *t->dec_len);
  if (!t->dec_off || !t->dec_len) {
    seterr(err, errlen, "%s: out of memory", t->name);
    return 1;
  }
  for (int64_t k = 0; k < t->vocab_size; k++) t->dec_off[k] = -1;
  uint8_t *buf = malloc(65536);
  if (!buf) return 1;
  int rc = 0;
  json_object_foreach(vocab, key, v) {
    size_t n = strlen(key);
    uint32_t id = (uint32_t)json_integer_value(v);
    int64_t k = n < 65536 ? from_byte_level(from_cp, (const uint8_t *)key, n, buf) : -1;
    if (k < 0) {   /* not in the byte-level alphabet: no word maps to it; decodes as written */
      if (set_decode(t, id, (const uint8_t *)key, n)) rc = 1;
      continue;
    }
    int r = bm_put(&t->vocab, buf, (size_t)k, id);
    if (r < 0 || set_decode(t, id, buf, (size_t)k)) rc = 1;
    if (r == 1) {
      seterr(err, errlen, "%s: model.vocab holds \"%.60s\" twice (after the byte-level mapping)", t->name, key);
      rc = 2;
      break;
    }
  }
  if (rc == 1) seterr(err, errlen, "%s: out of memory", t->name);
  for (int b = 0; !rc && b < 256; b++) {
    uint8_t c = (uint8_t)b;
    const BmEntry *e = bm_get(&t->vocab, &c, 1);
    if (!e) {
      seterr(err, errlen, "%s: the vocabulary lacks byte 0x%02x (the byte-level token U+%04X); a byte-level BPE needs all "
             "256 (train it with initial_alphabet=ByteLevel.alphabet())", t->name, b, to_cp[b]);
      rc = 2;
    } else {
      t->byte_id[b] = e->val;
    }
  }
  /* merges: rank = position */
  json_t *merges = json_object_get(model, "merges");
  if (!rc && !json_is_array(merges)) {
    seterr(err, errlen, "%s: model.merges must be an array", t->name);
    rc = 2;
  }
  size_t nm = rc ? 0 : json_array_size(merges);
  t->merges.cap = 1024;
  while (t->merges.cap < nm * 2) t->merges.cap *= 2;
  if (!rc && !(t->merges.tab = calloc(t->merges.cap, sizeof *t->merges.tab))) {
    seterr(err, errlen, "%s: out of memory", t->name);
    rc = 1;
  }
  char *side = malloc(65536);
  if (!side) rc = 1;
  for (size_t m = 0; !rc && m < nm; m++) {
    json_t *e = json_array_get(merges, m);
    const char *a = NULL, *b = NULL;
    if (json_is_string(e)) {
      const char *s = json_string_value(e), *sp = strchr(s, ' ');
      if (sp && !strchr(sp + 1, ' ') && sp - s < 65535) {
        memcpy(side, s, (size_t)(sp - s));
        side[sp - s] = 0;
        a = side, b = sp + 1;
      }
    } else if (json_is_array(e) && json_array_size(e) == 2) {
      a = json_string_value(json_array_get(e, 0)), b = json_string_value(json_array_get(e, 1));
    }
    if (!a || !b || !*a || !*b) {
      seterr(err, errlen, "%s: model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", t->name, m);
      rc = 2;
      break;
    }
    uint32_t ia, ib;
    uint8_t *both = buf;
    int64_t ka = strlen(a) < 32768 ? from_byte_level(from_cp, (const uint8_t *)a, strlen(a), both) : -1;
    int64_t kb = ka >= 0 && strlen(b) < 32768 ? from_byte_level(from_cp, (const uint8_t *)b, strlen(b), both + ka) : -1;
    const BmEntry *merged = kb >= 0 ? bm_get(&t->vocab, both, (size_t)(ka + kb)) : NULL;
    if (merge_side(t, from_cp, a, buf + 32768, &ia) || merge_side(t, from_cp, b, buf + 32768, &ib) || !merged) {
      seterr(err, errlen, "%s: model.merges[%zu] (\"%.40s\" + \"%.40s\") names a token that is not in the vocabulary",
             t->name, m, a, b);
      rc = 2;
      break;
    }
    uint64_t pk = ((uint64_t)ia << 32 | ib) + 1;
    size_t s = pair_index(pk, t->merges.cap);
    while (t->merges.tab[s].key && t->merges.tab[s].key != pk) s = (s + 1) & (t->merges.cap - 1);
    if (!t->merges.tab[s].key) {   /* a repeated merge keeps its first (highest) priority */
      t->merges.tab[s] = (PairEntry){pk, (uint32_t)m, merged->val};
      t->merges.n++;
    }
  }
  free(side);
  free(buf);
  return rc;
}

static int load_added(Tokenizer *t, json_t *root, char *err, size_t errlen) {
  json_t *added = json_object_get(root, "added_tokens"), *v;
  size_t i, n = json_array_size(added);
  if (!n) return 0;
  if (!(t->added = calloc(n, sizeof *t->added))) return 1;
  json_array_foreach(added, i, v) {
    const char *flags[] = {"lstrip", "rstrip", "single_word"};
    for (int f = 0; f < 3; f++)
      if (json_is_true(json_object_get(v, flags[f]))) {
        seterr(err, errlen, "%s: added_tokens[%zu] (\"%.40s\") sets %s, which loom does not support yet", t->name, i,
               json_string_value(json_object_get(v, "content")), flags[f]);
        return 2;
      }
    const char *c = json_string_value(json_object_get(v, "content"));
    AddedToken *a = &t->added[t->n_added++];
    a->len = (uint32_t)strlen(c);
    a->id = (uint32_t)json_integer_value(json_object_get(v, "id"));
    if (!(a->content = (uint8_t *)strdup(c)) || set_decode(t, a->id, a->content, a->len)) return 1;
    t->added_first[a->content[0]] = true;
    if (memchr(a->content, '\n', a->len)) t->cut_unsafe = true;
  }
  return 0;
}

int tokenizer_load_json(const char *text, size_t n, const char *name, Tokenizer **out, char *err, size_t errlen) {
  *out = NULL;
  Tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    seterr(err, errlen, "%s: out of memory", name);
    return 1;
  }
  snprintf(t->name, sizeof t->name, "%s", name);
  json_error_t je;
  json_t *root = json_loadb(text, n, 0, &je);
  int rc = 0;
  if (!root || !json_is_object(root)) {
    if (root) seterr(err, errlen, "%s: a tokenizer.json is a JSON object", name);
    else seterr(err, errlen, "%s:%d:%d: not valid JSON: %s", name, je.line, je.column, je.text);
    rc = 2;
    goto done;
  }
  json_t *norm = json_object_get(root, "normalizer");
  if (norm && !json_is_null(norm)) {
    seterr(err, errlen, "%s: normalizer '%s' is not supported; loom reads tokenizers without one (\"normalizer\": null, "
           "as GPT-2 and Llama 3 have)", name, json_string_value(json_object_get(norm, "type")));
    rc = 2;
    goto done;
  }
  if ((rc = load_model(t, root, err, errlen)) || (rc = load_added(t, root, err, errlen))) goto done;
  json_t *pre = json_object_get(root, "pre_tokenizer");
  const char *ptype = json_string_value(json_object_get(pre, "type"));
  if (!pre || json_is_null(pre)) {
    seterr(err, errlen, "%s: no pre_tokenizer; a byte-level BPE has ByteLevel (GPT-2) or a Sequence of Split and "
           "ByteLevel (Llama 3)", name);
    rc = 2;
  } else if (ptype && !strcmp(ptype, "Sequence")) {
    json_t *list = json_object_get(pre, "pretokenizers"), *p;
    size_t i;
    if (!json_is_array(list)) {
      seterr(err, errlen, "%s: pre_tokenizer Sequence needs \"pretokenizers\": [...]", name);
      rc = 2;
    }
    json_array_foreach(list, i, p) if (!rc) rc = read_pre(t, p, err, errlen);
  } else {
    rc = read_pre(t, pre, err, errlen);
  }
  if (!rc && !(t->md = pcre2_match_data_create(4, NULL))) rc = 1;
done:
  json_decref(root);
  if (rc) {
    if (rc == 1 && err && !err[0]) seterr(err, errlen, "%s: out of memory", name);
    tokenizer_free(t);
  } else {
    *out = t;
  }
  return rc;
}

int tokenizer_load(const char *path, Tokenizer **out, char *err, size_t errlen) {
  *out = NULL;
  uint8_t *buf;
  size_t size;
  int rc = rt_read_file(path, &buf, &size, err, errlen);
  if (rc) return rc;
  if (err) err[0] = 0;
  rc = tokenizer_load_json((const char *)buf, size, path, out, err, errlen);
  free(buf);
  return rc;
}

void tokenizer_free(Tokenizer *t) {
  if (!t) return;
  bm_free(&t->vocab);
  bm_free(&t->cache);
  free(t->merges.tab);
  for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
  pcre2_match_data_free(t->md);
  for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
  free(t->added);
  free(t->dec_off);
  free(t->dec_len);
  free(t->dec_bytes);
  free(t->cache_ids);
  free(t->sym);
  free(t->heap);
  free(t->piece);
  free(t);
}

int64_t tokenizer_vocab_size(const Tokenizer *t) { return t->vocab_size; }

bool tokenizer_adds_prefix_space(const Tokenizer *t) {
  for (int k = 0; k < t->n_steps; k++)
    if (t->steps[k].prefix_space) return true;
  return false;
}

int64_t tokenizer_token_id(const Tokenizer *t, const char *content) {
  size_t n = strlen(content);
  for (int i = 0; i < t->n_added; i++)
    if (t->added[i].len == n && !memcmp(t->added[i].content, content, n)) return t->added[i].id;
  uint32_t to_cp[256];
  int16_t from_cp[512];
  byte_level_map(to_cp, from_cp);
  uint8_t *buf = malloc(n + 1);
  int64_t k = buf ? from_byte_level(from_cp, (const uint8_t *)content, n, buf) : -1;
  const BmEntry *e = k > 0 ? bm_get(&t->vocab, buf, (size_t)k) : NULL;
  free(buf);
  return e ? (int64_t)e->val : -1;
}

int64_t tokenizer_default_eot(const Tokenizer *t) {
  const char *names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>", "<eos>"};
  for (int k = 0; k < 5; k++)
    for (int i = 0; i < t->n_added; i++)
      if (!strcmp((const char *)t->added[i].content, names[k])) return t->added[i].id;
  return -1;
}

int tokids_push(TokIds *v, uint32_t id) {
  if (v->n == v->cap) {
    int64_t nc = v->cap ? v->cap * 2 : 4096;
    uint32_t *p = realloc(v->ids, (size_t)nc * sizeof *p);
    if (!p) return -1;
    v->ids = p;
    v->cap = nc;
  }
  v->ids[v->n++] = id;
  return 0;
}

void tokids_free(TokIds *v) {
  free(v->ids);
  memset(v, 0, sizeof *v);
}

/* ---- BPE ---- */

static bool cand_less(const struct Cand *x, const struct Cand *y) {
  return x->rank < y->rank || (x->rank == y->rank && x->left < y->left);
}

static void heap_push(Tokenizer *t, size_t *n, struct Cand c) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!cand_less(&c, &t->heap[p])) break;
    t->heap[i] = t->heap[p];
    i = p;
  }
  t->heap[i] = c;
}

static struct Cand heap_pop(Tokenizer *t, size_t *n) {
  struct Cand top = t->heap[0], last = t->heap[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && cand_less(&t->heap[c + 1], &t->heap[c])) c++;
    if (!cand_less(&t->heap[c], &last)) break;
    t->heap[i] = t->heap[c];
    i = c;
  }
  if (*n) t->heap[i] = last;
  return top;
}

static void push_pair(Tokenizer *t, size_t *nh, int left) {
  int right = t->sym[left].next;
  if (right < 0) return;
  const PairEntry *e = pair_get(&t->merges, t->sym[left].id, t->sym[right].id);
  if (e) heap_push(t, nh, (struct Cand){e->rank, left, right, t->sym[left].id, t->sym[right].id});
}

/* Merges the bytes of one word; appends its ids. */
static int bpe_word(Tokenizer *t, const uint8_t *w, size_t n, TokIds *out) {
  if (t->ignore_merges) {
    const BmEntry *e = bm_get(&t->vocab, w, n);
    if (e) return tokids_push(out, e->val);
  }
  if (n == 1) return tokids_push(out, t->byte_id[w[0]]);
  const BmEntry *c = n <= CACHE_WORD_MAX ? bm_get(&t->cache, w, n) : NULL;
  if (c) {
    for (uint32_t k = 0; k < c->val >> 24; k++)
      if (tokids_push(out, t->cache_ids[(c->val & 0xFFFFFF) + k])) return -1;
    return 0;
  }
  if (grow((void **)&t->sym, &t->sym_cap, n, sizeof *t->sym) || grow((void **)&t->heap, &t->heap_cap, n, sizeof *t->heap))
    return -1;
  for (size_t i = 0; i < n; i++) t->sym[i] = (struct Sym){t->byte_id[w[i]], (int)i - 1, i + 1 < n ? (int)i + 1 : -1};
  size_t nh = 0;
  for (size_t i = 0; i + 1 < n; i++) push_pair(t, &nh, (int)i);
  while (nh) {
    struct Cand c = heap_pop(t, &nh);
    struct Sym *l = &t->sym[c.left];
    if (l->id != c.a || l->next != c.right || t->sym[c.right].id != c.b) continue;   /* stale */
    l->id = pair_get(&t->merges, c.a, c.b)->id;
    int gone = c.right;
    l->next = t->sym[gone].next;
    if (l->next >= 0) t->sym[l->next].prev = c.left;
    t->sym[gone].id = UINT32_MAX;   /* dead: no candidate matches it again */
    if (l->prev >= 0) push_pair(t, &nh, l->prev);
    push_pair(t, &nh, c.left);
  }
  int64_t first = out->n;
  for (int i = 0; i >= 0; i = t->sym[i].next)
    if (tokids_push(out, t->sym[i].id)) return -1;
  uint32_t count = (uint32_t)(out->n - first);
  if (n <= CACHE_WORD_MAX && count < 256) {
    if (t->cache_n + count > CACHE_IDS_MAX) {   /* start over rather than evict */
      bm_clear(&t->cache);
      t->cache_n = 0;
    }
    if (!grow((void **)&t->cache_ids, &t->cache_cap, t->cache_n + count, sizeof *t->cache_ids) &&
        bm_put(&t->cache, w, n, count << 24 | (uint32_t)t->cache_n) == 0) {
      memcpy(t->cache_ids + t->cache_n, out->ids + first, count * sizeof *t->cache_ids);
      t->cache_n += count;
    }
  }
  return 0;
}

/* A piece through pre-tokenizer steps k.. ; at the end, BPE. */
static int pre_tokenize(Tokenizer *t, int k, const uint8_t *s, size_t n, TokIds *out, char *err, size_t errlen) {
  if (n == 0) return 0;
  if (k == t->n_steps) return bpe_word(t, s, n, out);
  const PreStep *st = &t->steps[k];
  uint8_t *own = NULL;
  if (st->prefix_space && s[0] != ' ') {
    if (!(own = malloc(n + 1))) return -1;
    own[0] = ' ';
    memcpy(own + 1, s, n);
    s = own, n++;
  }
  int rc = 0;
  if (!st->re) {
    rc = pre_tokenize(t, k + 1, s, n, out, err, errlen);
  } else {
    size_t pos = 0;   /* end of the last piece */
    for (size_t at = 0; at <= n && !rc;) {
      int m = pcre2_match(st->re, s, n, at, PCRE2_NO_UTF_CHECK, t->md, NULL);
      if (m == PCRE2_ERROR_NOMATCH) break;
      if (m < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(m, msg, sizeof msg);
        seterr(err, errlen, "%s: pre_tokenizer regex failed: %s", t->name, (const char *)msg);
        rc = 2;
        break;
      }
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {   /* an empty match: step over one character */
        at = b + 1;
        while (at < n && (s[at] & 0xC0) == 0x80) at++;
        continue;
      }
      if (b > pos) rc = pre_tokenize(t, k + 1, s + pos, b - pos, out, err, errlen);   /* the gap: a piece too */
      if (!rc) rc = pre_tokenize(t, k + 1, s + b, e - b, out, err, errlen);
      pos = at = e;
    }
    if (!rc && pos < n) rc = pre_tokenize(t, k + 1, s + pos, n - pos, out, err, errlen);
  }
  free(own);
  return rc;
}

size_t tokenizer_cut(const Tokenizer *t, const uint8_t *p, size_t n, size_t max) {
  if (n <= max || max < 2 || t->cut_unsafe) return n;
  for (size_t i = max; i < n; i++) {
    uint8_t c = p[i] | 0x20;
    if (p[i - 1] == '\n' && p[i - 2] >= 0x21 && p[i - 2] <= 0x7E && c >= 'a' && c <= 'z') return i;
  }
  return n;
}

int tokenizer_encode(Tokenizer *t, const uint8_t *text, size_t n, TokIds *out, char *err, size_t errlen) {
  int64_t bad = utf8_invalid_at(text, n);
  if (bad >= 0) {
    seterr(err, errlen, "the text is not valid UTF-8 at byte %" PRId64 " (0x%02x); convert it first (e.g. iconv -f "
           "latin1 -t utf-8)", bad, text[bad]);
    return 2;
  }
  size_t seg = 0;   /* start of the text not yet encoded */
  int rc = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if (!t->added_first[text[i]]) continue;
    int best = -1;
    for (int a = 0; a < t->n_added; a++) {
      const AddedToken *tok = &t->added[a];
      if (tok->len <= n - i && !memcmp(text + i, tok->content, tok->len) && (best < 0 || tok->len > t->added[best].len))
        best = a;
    }
    if (best < 0) continue;
    rc = pre_tokenize(t, 0, text + seg, i - seg, out, err, errlen);
    if (!rc && tokids_push(out, t->added[best].id)) rc = -1;
    seg = i + t->added[best].len;
    i = seg - 1;
  }
  if (!rc) rc = pre_tokenize(t, 0, text + seg, n - seg, out, err, errlen);
  if (rc < 0) {
    seterr(err, errlen, "%s: out of memory while encoding", t->name);
    rc = 1;
  }
  return rc;
}

int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, int64_t n, uint8_t **buf, size_t *len, size_t *cap,
                     char *err, size_t errlen) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t id = ids[i];
    if ((int64_t)id >= t->vocab_size || t->dec_off[id] < 0) {
      seterr(err, errlen, "token %" PRIu32 " at position %" PRId64 " is not in %s (vocabulary of %" PRId64 "); was the "
             "shard made with another tokenizer?", id, i, t->name, t->vocab_size);
      return 2;
    }
    uint32_t k = t->dec_len[id];
    if (grow((void **)buf, cap, *len + k, 1)) {
      seterr(err, errlen, "out of memory decoding");
      return 1;
    }
    memcpy(*buf + *len, t->dec_bytes + t->dec_off[id], k);
    *len += k;
  }
  return 0;
}
