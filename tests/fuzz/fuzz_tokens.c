/* tests/fuzz/fuzz_tokens.c — llm.c token shards: tok_open, then the data loader as `loom
 * train --data` uses it (data_open with a vocabulary of 256, batch 2 x seq 3, and as many
 * windows as the shard holds plus a wrap).  Invariants: a refusal has a message; an accepted
 * shard's tokens are all readable (count * token_bytes inside the file) and every window the
 * loader hands out holds tokens below the vocabulary, targets shifted by one. */
#include "runtime/io/data.h"
#include "runtime/io/tokens.h"
#include "tests/fuzz/fuzz_util.h"

enum { B = 2, T = 3, VOCAB = 256 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *path = fuzz_write("t.bin", data, size);
  char err[1024] = "";
  TokShard s;
  if (tok_open(path, &s, err, sizeof err)) {
    fuzz_check_message("tok_open", err);
    free(path);
    return 0;
  }
  if (s.token_bytes != 2 && s.token_bytes != 4) fuzz_fail("token_bytes %d", s.token_bytes);
  if ((uint64_t)s.count * (uint64_t)s.token_bytes + TOK_HEADER_BYTES > size)
    fuzz_fail("%lld tokens of %d bytes do not fit a %zu-byte file", (long long)s.count, s.token_bytes, size);
  uint64_t sum = 0;
  for (int64_t i = 0; i < s.count; i++) sum += tok_get(&s, i);
  int vocab_ok = tok_check_vocab(&s, VOCAB, err, sizeof err) == 0;
  if (!vocab_ok) fuzz_check_message("tok_check_vocab", err);
  tok_close(&s);

  DataLoader dl;
  const char *paths[1] = {path};
  err[0] = 0;
  if (data_open(&dl, paths, 1, B, T, VOCAB, err, sizeof err)) {
    fuzz_check_message("data_open", err);
  } else {
    if (!vocab_ok) fuzz_fail("data_open accepted a shard with a token >= %d", VOCAB);
    int32_t in[B * T], tg[B * T];
    int64_t windows = dl.shards[0].count / (B * T) + 2;
    for (int64_t w = 0; w < windows && w < 4096; w++) {
      data_next(&dl, in, tg);
      for (int k = 0; k < B * T; k++) {
        if (in[k] < 0 || in[k] >= VOCAB || tg[k] < 0 || tg[k] >= VOCAB)
          fuzz_fail("window %lld: token %d / target %d outside the vocabulary", (long long)w, in[k], tg[k]);
        if (k % T < T - 1 && tg[k] != in[k + 1]) fuzz_fail("window %lld: targets are not the inputs shifted", (long long)w);
      }
    }
    data_close(&dl);
  }
  if (sum == UINT64_MAX) fprintf(stderr, " ");
  free(path);
  return 0;
}
