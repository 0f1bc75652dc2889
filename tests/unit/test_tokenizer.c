/* Unit tests for runtime/io/tokenizer: token-for-token identity with the Hugging Face
 * `tokenizers` package (tests/tokenizer/NAME.golden, made by gen_goldens.py from the documents
 * of tests/tokenizer/textgen.h), decode(encode(text)) == text, and refusals of bad files. */
#include "runtime/io/tokenizer.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/tokenizer/textgen.h"
#include "tests/unit/check.h"

static uint64_t fnv1a64(const uint32_t *ids, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; i++)
    for (int b = 0; b < 4; b++) h = (h ^ ((ids[i] >> (8 * b)) & 0xFF)) * 1099511628211ull;
  return h;
}

/* Every document of NAME.golden: count and hash (and ids for the edge cases) must be equal,
   and decoding gives the text back. */
static void golden(const char *name, bool roundtrip) {
  char path[256];
  snprintf(path, sizeof path, "tests/tokenizer/%s.json", name);
  Tokenizer *t;
  char err[1024] = "";
  int rc = tokenizer_load(path, &t, err, sizeof err);
  CHECK(rc == 0, "%s", err);
  if (rc) return;
  snprintf(path, sizeof path, "tests/tokenizer/%s.golden", name);
  FILE *f = fopen(path, "r");
  CHECK(f != NULL, "cannot open %s", path);
  if (!f) return;
  static char line[1 << 20], text[1 << 16];
  int docs = 0, bad = 0, checked = 0, cuts = 0;
  double bytes = 0, secs = 0;
  TokIds ids = {0};
  uint8_t *dec = NULL;
  size_t dec_cap = 0;
  while (fgets(line, sizeof line, f)) {
    int d;
    long long count;
    uint64_t hash;
    if (line[0] == '#') continue;
    if (sscanf(line, "docs %d", &docs) == 1) continue;
    if (!strncmp(line, "ids", 3)) {   /* the ids of the document just read */
      char *p = line + 3;
      for (int64_t i = 0; i < ids.n; i++) {
        unsigned long want = strtoul(p, &p, 10);
        if (want != ids.ids[i]) {
          fprintf(stderr, "  %s: first difference at token %" PRId64 ": loom %u, tokenizers %lu\n", name, i,
                  ids.ids[i], want);
          break;
        }
      }
      continue;
    }
    if (sscanf(line, "%d %lld %" SCNx64, &d, &count, &hash) != 3) continue;
    size_t n = textgen_doc(d, text, sizeof text);
    ids.n = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    rc = tokenizer_encode(t, (const uint8_t *)text, n, &ids, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &b);
    secs += (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    bytes += (double)n;
    checked++;
    if (rc || ids.n != count || fnv1a64(ids.ids, ids.n) != hash) {
      if (bad++ < 5)
        fprintf(stderr, "  %s: document %d: loom %lld tokens (hash %016" PRIx64 "), tokenizers %lld (%016" PRIx64 ")%s%s\n",
                name, d, (long long)ids.n, fnv1a64(ids.ids, ids.n), count, hash, rc ? ": " : "", rc ? err : "");
      continue;
    }
    /* cut where tokenizer_cut allows: the pieces' ids are the whole text's */
    for (size_t at = 0, k = 0; k < 4 && at < n; k++) {
      size_t cut = tokenizer_cut(t, (const uint8_t *)text, n, at + 1 + n / 5);
      if (cut >= n) break;
      TokIds parts = {0};
      if (tokenizer_encode(t, (const uint8_t *)text, cut, &parts, err, sizeof err) ||
          tokenizer_encode(t, (const uint8_t *)text + cut, n - cut, &parts, err, sizeof err) || parts.n != ids.n ||
          (ids.n && memcmp(parts.ids, ids.ids, sizeof *ids.ids * (size_t)ids.n))) {
        if (bad++ < 5) fprintf(stderr, "  %s: document %d cut at byte %zu encodes differently\n", name, d, cut);
      }
      cuts++;
      tokids_free(&parts);
      at = cut;
    }
    if (!roundtrip) continue;
    size_t len = 0;
    rc = tokenizer_decode(t, ids.ids, ids.n, &dec, &len, &dec_cap, err, sizeof err);
    if (rc || len != n || (n && memcmp(dec, text, n))) {
      if (bad++ < 5) fprintf(stderr, "  %s: document %d does not decode to its text\n", name, d);
    }
  }
  fclose(f);
  CHECK(docs > 0 && checked == docs, "%s: %d of %d documents checked", name, checked, docs);
  CHECK(bad == 0, "%s: %d of %d documents differ from tokenizers'", name, bad, checked);
  CHECK(cuts > 100 || !roundtrip, "%s: only %d cuts tried", name, cuts);
  printf("%s: %d documents, %.1f MB, identical to tokenizers: %s (%.1f MB/s here); %d cuts (tokenizer_cut) change "
         "nothing\n", name, checked, bytes / 1e6, bad ? "NO" : "yes", secs > 0 ? bytes / 1e6 / secs : 0, cuts);
  free(dec);
  tokids_free(&ids);
  tokenizer_free(t);
}

/* A tokenizer JSON that is refused, with a message holding `want`. */
static void refused(const char *json, const char *want) {
  Tokenizer *t = NULL;
  char err[1024] = "";
  int rc = tokenizer_load_json(json, strlen(json), "t.json", &t, err, sizeof err);
  CHECK(rc == 2 && t == NULL && strstr(err, want), "want rc 2 with '%s', got rc %d: %s", want, rc, err);
  tokenizer_free(t);
}

/* A minimal byte-level BPE: the 256 bytes, merges "a b" -> "ab", "ab c" -> "abc". */
static char *mini(const char *extra_vocab, const char *merges, const char *pre, const char *added) {
  size_t cap = 1 << 16, k = 0;
  char *s = malloc(cap);
  k += (size_t)snprintf(s + k, cap - k, "{\"added_tokens\": [%s], \"normalizer\": null, \"pre_tokenizer\": %s, "
                        "\"model\": {\"type\": \"BPE\", \"vocab\": {", added, pre);
  /* bytes_to_unicode, written out as \u escapes */
  int extra = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = printable ? b : 256 + extra++;
    k += (size_t)snprintf(s + k, cap - k, "%s\"\\u%04x\": %d", b ? ", " : "", cp, b);
  }
  snprintf(s + k, cap - k, "%s}, \"merges\": [%s]}}", extra_vocab, merges);
  return s;
}

static void small_cases(void) {
  const char *bl = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
  char *j = mini(", \"ab\": 256, \"abc\": 257, \"\\u0120a\": 258", "\"a b\", \"ab c\", [\"\\u0120\", \"a\"]", bl,
                 "{\"id\": 300, \"content\": \"<|endoftext|>\", \"special\": true}");
  Tokenizer *t;
  char err[512] = "";
  CHECK(tokenizer_load_json(j, strlen(j), "mini", &t, err, sizeof err) == 0, "%s", err);
  free(j);
  TokIds ids = {0};
  const char *text = "abc ab<|endoftext|>a a";   /* (a,b) merges before (\u0120,a) */
  CHECK(tokenizer_encode(t, (const uint8_t *)text, strlen(text), &ids, err, sizeof err) == 0, "%s", err);
  uint32_t want[] = {257, ' ', 256, 300, 'a', 258};
  CHECK(ids.n == 6 && !memcmp(ids.ids, want, sizeof want), "got %lld ids", (long long)ids.n);
  CHECK(tokenizer_vocab_size(t) == 301, "vocab %lld", (long long)tokenizer_vocab_size(t));
  CHECK(tokenizer_default_eot(t) == 300, "eot");
  CHECK(tokenizer_token_id(t, "ab") == 256 && tokenizer_token_id(t, "\xc4\xa0" "a") == 258, "token ids");
  ids.n = 0;
  const uint8_t latin1[] = {'a', 0xE9, 'b'};
  CHECK(tokenizer_encode(t, latin1, 3, &ids, err, sizeof err) == 2 && strstr(err, "not valid UTF-8 at byte 1"), "%s", err);
  uint32_t hole = 299;
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  CHECK(tokenizer_decode(t, &hole, 1, &buf, &len, &cap, err, sizeof err) == 2 && strstr(err, "token 299"), "%s", err);
  free(buf);
  tokids_free(&ids);
  tokenizer_free(t);

  refused("{", "not valid JSON");
  refused("{\"model\": {\"type\": \"Unigram\"}}", "model type is 'Unigram'");
  j = mini("", "", bl, "");
  char *p = strstr(j, "\"\\u0021\": 33, ");   /* drop byte '!' */
  memmove(p, p + strlen("\"\\u0021\": 33, "), strlen(p + strlen("\"\\u0021\": 33, ")) + 1);
  refused(j, "lacks byte 0x21");
  free(j);
  j = mini("", "\"a zz\"", bl, "");
  refused(j, "model.merges[0]");
  free(j);
  j = mini("", "", "{\"type\": \"Metaspace\"}", "");
  refused(j, "pre_tokenizer type 'Metaspace' is not supported");
  free(j);
  j = mini("", "", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}", "");
  refused(j, "does not compile");
  free(j);
  j = mini("", "", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\"}", "");
  refused(j, "behavior 'Removed'");
  free(j);
  j = mini("", "", bl, "{\"id\": 5, \"content\": \"x\", \"rstrip\": true}");
  refused(j, "sets rstrip");
  free(j);
}

int main(void) {
  small_cases();
  golden("gpt2-style", true);
  golden("llama3-style", true);
  golden("gpt2-prefix", false);   /* decodes with the prefix spaces it added */
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
