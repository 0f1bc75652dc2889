/* tools/cmd_data.c — `loom data`: text files to llm.c token shards (byte-level, or a Hugging
   Face tokenizer.json), a train/val split, shards of a given size, and --decode back to text. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/io/textdata.h"
#include "runtime/io/tokenizer.h"
#include "runtime/io/tokens.h"
#include "tools/tools.h"

static const char help[] =
  "usage: loom data TEXT... -o OUT [--tokenizer tokenizer.json] [--val-frac F] [--shard-tokens N]\n"
  "       loom data --decode SHARD.bin [--tokenizer tokenizer.json] [-o TEXT]\n"
  "\n"
  "Turns UTF-8 text files into llm.c token shards (the files `loom train --data` reads).\n"
  "\n"
  "  --tokenizer T.json  a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3 and\n"
  "                      tokenizers trained like them); tokens are identical to the `tokenizers`\n"
  "                      package's encode(text, add_special_tokens=False).  Every file is one\n"
  "                      document and starts with the end-of-text token (llm.c's convention).\n"
  "                      Shards hold uint16 tokens (magic 20240520) when the vocabulary fits in\n"
  "                      65,536 ids, else uint32 (magic 20240801).\n"
  "                      Without --tokenizer: byte-level tokens (token = byte, vocabulary 256),\n"
  "                      files concatenated as they are.\n"
  "  --eot TOKEN         the end-of-text token's text (default: the tokenizer's <|endoftext|>,\n"
  "                      <|end_of_text|>, </s>, <|im_end|> or <eos>); 'none' for no separator\n"
  "  --val-frac F        the first F of the tokens (0 <= F < 1) go to OUT_val_000000.bin,\n"
  "                      the rest to OUT_train_000000.bin, ...\n"
  "  --shard-tokens N    at most N tokens per shard (OUT_train_000000.bin, _000001.bin, ...)\n"
  "  -o, --out OUT       the shard to write, or with --val-frac or --shard-tokens the prefix\n"
  "                      of the shards' names (a trailing .bin is dropped from it)\n"
  "  --decode SHARD      write a shard's text (to standard output, or -o FILE)\n"
  "  -q, --quiet         no progress line\n"
  "  -h, --help          show this help\n"
  "\n"
  "A progress line on standard error shows the megabytes read and the rate.  Text must be\n"
  "valid UTF-8 (a refusal names the file and the byte).  Tokens are held in memory (4 bytes\n"
  "each) until the shards are written.\n"
  "\n"
  "examples:\n"
  "  loom data data/shakespeare.txt -o shakespeare.bin\n"
  "  loom data books/*.txt --tokenizer tokenizer.json --val-frac 0.01 --shard-tokens 100000000 -o books\n"
  "  loom data --decode books_val_000000.bin --tokenizer tokenizer.json | head\n";

/* Largest chunk of one file encoded at once (see tokenizer_cut). */
#define CHUNK (4u << 20)

static void progress(bool quiet, double t0, double bytes, double total, int64_t tokens, bool last) {
  if (quiet) return;
  double dt = seconds_now() - t0;
  fprintf(stderr, "\rloom data: %.1f / %.1f MB, %lld tokens, %.1f MB/s%s", bytes / 1e6, total / 1e6,
          (long long)tokens, dt > 0 ? bytes / 1e6 / dt : 0.0, last ? "\n" : "");
  fflush(stderr);
}

static int write_shards(const char *prefix, const char *split, const uint32_t *ids, int64_t n, int64_t per,
                        int token_bytes, char *err, size_t errlen) {
  int64_t count = 0;
  for (int64_t at = 0, k = 0; at < n; at += per, k++) {
    char path[4200];
    snprintf(path, sizeof path, "%s_%s_%06lld.bin", prefix, split, (long long)k);
    int64_t m = n - at < per ? n - at : per;
    int rc = tok_write(path, ids + at, m, token_bytes, err, errlen);
    if (rc) return rc;
    printf("wrote %s: %lld tokens\n", path, (long long)m);
    count++;
  }
  return 0;
}

static int decode(const char *shard, const char *tok_path, const char *out, char *err, size_t errlen) {
  TokShard s;
  Tokenizer *t = NULL;
  int rc = tok_open(shard, &s, err, errlen);
  if (!rc && tok_path) rc = tokenizer_load(tok_path, &t, err, errlen);
  uint32_t *ids = rc ? NULL : malloc(sizeof *ids * (size_t)(s.count + 1));
  if (!rc && !ids) {
    snprintf(err, errlen, "out of memory for %lld tokens", (long long)s.count);
    rc = 1;
  }
  uint8_t *text = NULL;
  size_t len = 0, cap = 0;
  for (int64_t i = 0; !rc && i < s.count; i++) ids[i] = tok_get(&s, i);
  if (!rc && t) {
    rc = tokenizer_decode(t, ids, s.count, &text, &len, &cap, err, errlen);
    if (rc == 2) {
      size_t k = strlen(err);
      snprintf(err + k, errlen - k, " (in %s)", shard);
    }
  } else if (!rc) {
    if (!(text = malloc((size_t)s.count + 1))) rc = 1;
    for (int64_t i = 0; !rc && i < s.count; i++) {
      if (ids[i] > 255) {
        snprintf(err, errlen, "%s: token %u at position %lld is not a byte; this shard was made with a tokenizer: "
                 "decode it with --tokenizer tokenizer.json", shard, ids[i], (long long)i);
        rc = 2;
      }
      text[len++] = (uint8_t)ids[i];
    }
  }
  if (!rc) {
    FILE *f = out ? fopen(out, "wb") : stdout;
    if (!f || (len && fwrite(text, 1, len, f) != len) || (out ? fclose(f) : fflush(f))) {
      snprintf(err, errlen, "cannot write %s", out ? out : "standard output");
      rc = 1;
    }
  }
  free(text);
  free(ids);
  tokenizer_free(t);
  tok_close(&s);
  return rc;
}

static int encode_files(const char *const *inputs, int n, const char *tok_path, const char *eot_name, bool quiet,
                        TokIds *ids, int64_t *vocab, char *err, size_t errlen) {
  Tokenizer *t = NULL;
  int rc = tokenizer_load(tok_path, &t, err, errlen);
  if (rc) return rc;
  *vocab = tokenizer_vocab_size(t);
  int64_t eot = -1;
  if (eot_name && strcmp(eot_name, "none")) {
    if ((eot = tokenizer_token_id(t, eot_name)) < 0) {
      snprintf(err, errlen, "--eot '%s' is not a token of %s; name one of its added tokens, or 'none'", eot_name, tok_path);
      rc = 2;
    }
  } else if (!eot_name && (eot = tokenizer_default_eot(t)) < 0) {
    snprintf(err, errlen, "%s has no end-of-text token (<|endoftext|>, <|end_of_text|>, </s>, <|im_end|>, <eos>) to put "
             "between documents; name one with --eot TOKEN, or give --eot none", tok_path);
    rc = 2;
  }
  double total = 0, done = 0, t0 = seconds_now(), last = t0;
  for (int i = 0; i < n && !rc; i++) {
    struct stat st;   /* stat, not open: a FIFO would block here (rt_read_file refuses it) */
    if (!stat(inputs[i], &st) && S_ISREG(st.st_mode)) total += (double)st.st_size;
  }
  for (int i = 0; i < n && !rc; i++) {
    uint8_t *buf;
    size_t size;
    if ((rc = rt_read_file(inputs[i], &buf, &size, err, errlen))) break;
    if (eot >= 0 && tokids_push(ids, (uint32_t)eot)) rc = 1;
    for (size_t at = 0; at < size && !rc;) {
      size_t m = tokenizer_cut(t, buf + at, size - at, CHUNK);
      rc = tokenizer_encode(t, buf + at, m, ids, err, errlen);
      if (rc == 2) {   /* name the file and the byte in it */
        int64_t bad = utf8_invalid_at(buf + at, m);
        if (bad >= 0)
          snprintf(err, errlen, "%s: not valid UTF-8 at byte %lld (0x%02x); convert the file to UTF-8 (e.g. iconv -f "
                   "latin1 -t utf-8)", inputs[i], (long long)(at + (size_t)bad), buf[at + (size_t)bad]);
      }
      at += m;
      done += (double)m;
      if (seconds_now() - last > 0.5) progress(quiet, t0, done, total, ids->n, false), last = seconds_now();
    }
    free(buf);
  }
  if (!rc) progress(quiet, t0, done, total, ids->n, true);
  if (rc == 1 && !err[0]) snprintf(err, errlen, "out of memory");
  tokenizer_free(t);
  return rc;
}

static int data_main(int argc, char **argv, const char **inputs) {
  const char *out = NULL, *v, *tok_path = NULL, *eot = NULL, *decode_path = NULL;
  double val_frac = 0;
  long long shard_tokens = 0;
  bool quiet = false, split = false;
  int n = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    char *end;
    if (arg_flag(argv[i], "-h") || arg_flag(argv[i], "--help")) { fputs(help, stdout); return EXIT_OK; }
    if (arg_flag(argv[i], "-q") || arg_flag(argv[i], "--quiet")) { quiet = true; continue; }
    if ((r = arg_value(argc, argv, &i, "-o", &v)) || (r = arg_value(argc, argv, &i, "--out", &v))) {
      if (r < 0) return usage_error("data", "-o needs the output file");
      out = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--tokenizer", &v))) {
      if (r < 0) return usage_error("data", "--tokenizer needs a Hugging Face tokenizer.json");
      tok_path = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--eot", &v))) {
      if (r < 0 || !*v) return usage_error("data", "--eot needs a token's text (such as '<|endoftext|>') or 'none'");
      eot = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--decode", &v))) {
      if (r < 0) return usage_error("data", "--decode needs a token shard");
      decode_path = v;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--val-frac", &v))) {
      val_frac = r < 0 ? -1 : strtod(v, &end);
      if (r < 0 || !*v || *end || !(val_frac >= 0 && val_frac < 1))
        return usage_error("data", "--val-frac takes the fraction of tokens for validation, 0 <= F < 1 (such as 0.01)");
      split = true;
      continue;
    }
    if ((r = arg_value(argc, argv, &i, "--shard-tokens", &v))) {
      shard_tokens = r < 0 ? -1 : strtoll(v, &end, 10);
      if (r < 0 || !*v || *end || shard_tokens < 1 || shard_tokens > INT32_MAX)
        return usage_error("data", "--shard-tokens takes the tokens per shard, 1 to %d (such as 100000000)", INT32_MAX);
      split = true;
      continue;
    }
    if (argv[i][0] == '-' && argv[i][1]) return unknown_option("data", argv[i], help);
    inputs[n++] = argv[i];
  }
  char err[IR_ERR_LEN] = "";
  if (decode_path) {
    if (n) return usage_error("data", "--decode takes one shard and no text files (got '%s')", inputs[0]);
    return report(decode(decode_path, tok_path, out, err, sizeof err), err);
  }
  if (!n) return usage_error("data", "no text files given");
  if (!out) return usage_error("data", "no output: give -o SHARD.bin");
  if (eot && !tok_path) return usage_error("data", "--eot needs --tokenizer (byte-level shards have no end-of-text token)");
  TokIds ids = {0};
  int64_t vocab = TEXT_VOCAB;
  int rc = 0;
  if (!tok_path && !split) {   /* byte-level, one shard: as before */
    int64_t count;
    rc = text_to_shard(inputs, n, out, &count, err, sizeof err);
    if (!rc) printf("wrote %s: %lld tokens (byte-level, vocabulary 256)\n", out, (long long)count);
    return report(rc, err);
  }
  if (tok_path) {
    rc = encode_files(inputs, n, tok_path, eot, quiet, &ids, &vocab, err, sizeof err);
  } else {
    for (int i = 0; i < n && !rc; i++) {
      uint8_t *buf;
      size_t size;
      if ((rc = rt_read_file(inputs[i], &buf, &size, err, sizeof err))) break;
      for (size_t k = 0; k < size && !rc; k++)
        if (tokids_push(&ids, buf[k])) rc = 1, snprintf(err, sizeof err, "out of memory");
      free(buf);
    }
  }
  int token_bytes = vocab <= 65536 ? 2 : 4;
  int64_t n_val = (int64_t)llround(val_frac * (double)ids.n), n_train = ids.n - n_val;
  if (!rc && (n_train < 1 || (val_frac > 0 && n_val < 1))) {
    snprintf(err, sizeof err, "%lld tokens cannot be split with --val-frac %g into a non-empty validation and training "
             "set; give more text or another fraction", (long long)ids.n, val_frac);
    rc = 2;
  }
  if (!rc && !split && ids.n > INT32_MAX) {
    snprintf(err, sizeof err, "%lld tokens exceed the %d an llm.c shard holds; give --shard-tokens N to write several "
             "shards", (long long)ids.n, INT32_MAX);
    rc = 2;
  }
  if (!rc && !split) {
    rc = tok_write(out, ids.ids, ids.n, token_bytes, err, sizeof err);
    if (!rc) printf("wrote %s: %lld tokens (%s, vocabulary %lld, uint%d)\n", out, (long long)ids.n, tok_path,
                    (long long)vocab, token_bytes * 8);
  } else if (!rc) {
    char prefix[4096];
    snprintf(prefix, sizeof prefix, "%s", out);
    if (ends_with(prefix, ".bin")) prefix[strlen(prefix) - 4] = 0;
    int64_t per = shard_tokens ? shard_tokens : INT32_MAX;
    if (n_val) rc = write_shards(prefix, "val", ids.ids, n_val, per, token_bytes, err, sizeof err);
    if (!rc) rc = write_shards(prefix, "train", ids.ids + n_val, n_train, per, token_bytes, err, sizeof err);
    if (!rc) printf("%lld tokens: %lld validation, %lld training (vocabulary %lld, uint%d)\n", (long long)ids.n,
                    (long long)n_val, (long long)n_train, (long long)vocab, token_bytes * 8);
  }
  tokids_free(&ids);
  return report(rc, err);
}

int cmd_data(int argc, char **argv) {
  const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);   /* every argument could be a file */
  if (!inputs) return report(EXIT_RUN, "out of memory");
  int rc = data_main(argc, argv, inputs);
  free(inputs);
  return rc;
}
