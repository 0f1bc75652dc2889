/* tests/fuzz/fuzz_tokenizer.c — Hugging Face tokenizer.json (runtime/io/tokenizer.c): the
 * input is a tokenizer.json, the line "@@loom-fuzz-text@@", then a text.  tokenizer_load
 * reads the JSON from a file, as `loom data --tokenizer` does; an accepted tokenizer encodes
 * the text.  Invariants: a refusal has a message; valid UTF-8 text is encoded (only invalid
 * UTF-8 is refused); every id is below the vocabulary size; decoding gives the text back
 * (with the pieces' prefix spaces when add_prefix_space is set: then the text is contained
 * in order); tokenizer_cut returns an offset inside the text. */
#include "runtime/io/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

static const char SEP[] = "\n@@loom-fuzz-text@@\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *sep = NULL;
  size_t k = sizeof SEP - 1;
  for (size_t i = 0; i + k <= size && !sep; i++)
    if (!memcmp(data + i, SEP, k)) sep = data + i;
  size_t json_n = sep ? (size_t)(sep - data) : size;
  const uint8_t *text = sep ? sep + k : data + size;
  size_t text_n = (size_t)(data + size - text);
  char *path = fuzz_write("tokenizer.json", data, json_n);
  char err[1024] = "";
  Tokenizer *t = NULL;
  if (tokenizer_load(path, &t, err, sizeof err)) {
    fuzz_check_message("tokenizer_load", err);
    free(path);
    return 0;
  }
  free(path);
  TokIds ids = {0};
  err[0] = 0;
  int rc = tokenizer_encode(t, text, text_n, &ids, err, sizeof err);
  bool valid = utf8_invalid_at(text, text_n) < 0;
  if (rc) {
    fuzz_check_message("tokenizer_encode", err);
    if (valid) fuzz_fail("valid UTF-8 text refused: %s", err);
  } else {
    if (!valid) fuzz_fail("invalid UTF-8 accepted");
    for (int64_t i = 0; i < ids.n; i++)
      if ((int64_t)ids.ids[i] >= tokenizer_vocab_size(t))
        fuzz_fail("id %u at %lld outside the vocabulary of %lld", ids.ids[i], (long long)i,
                  (long long)tokenizer_vocab_size(t));
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    if (tokenizer_decode(t, ids.ids, ids.n, &buf, &len, &cap, err, sizeof err)) fuzz_fail("decode failed: %s", err);
    if (!tokenizer_adds_prefix_space(t)) {
      if (len != text_n || (len && memcmp(buf, text, len))) fuzz_fail("decode(encode(text)) != text");
    } else {
      size_t j = 0;   /* the text is a subsequence of the decoded bytes */
      for (size_t i = 0; i < len && j < text_n; i++)
        if (buf[i] == text[j]) j++;
      if (j != text_n) fuzz_fail("decode(encode(text)) lost bytes of the text");
    }
    free(buf);
    size_t cut = tokenizer_cut(t, text, text_n, text_n / 2);
    if (cut > text_n) fuzz_fail("tokenizer_cut %zu past the text's %zu bytes", cut, text_n);
  }
  tokids_free(&ids);
  tokenizer_free(t);
  return 0;
}
