/* Training data loader. See data.h for the exact window order. */
#include "runtime/io/data.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/io/seterr.h"


int data_open(DataLoader *d, const char *const *paths, int n_paths, int64_t B, int64_t T,
              int64_t vocab, char *err, size_t errlen) {
  memset(d, 0, sizeof *d);
  if (n_paths < 1 || !paths) {
    seterr(err, errlen, "data: no token shards given; pass at least one llm.c .bin file");
    return 2;
  }
  /* B*T+1 must fit an llm.c shard (int32 count), which also keeps every index in range. */
  if (B < 1 || T < 1 || B > INT32_MAX / T) {
    seterr(err, errlen, "data: batch %" PRId64 " x sequence %" PRId64 " is not a usable window; "
           "both must be positive and their product below %d", B, T, INT32_MAX);
    return 2;
  }
  if (vocab < 1) {
    seterr(err, errlen, "data: vocabulary size must be positive, not %" PRId64, vocab);
    return 2;
  }
  d->shards = calloc((size_t)n_paths, sizeof *d->shards);
  if (!d->shards) {
    seterr(err, errlen, "data: out of memory for %d shards", n_paths);
    return 1;
  }
  d->n_shards = n_paths;
  d->B = B;
  d->T = T;
  int64_t need = B * T + 1; /* one window plus the last target */
  for (int i = 0; i < n_paths; i++) {
    int rc = tok_open(paths[i], &d->shards[i], err, errlen);
    if (!rc) rc = tok_check_vocab(&d->shards[i], vocab, err, errlen);
    if (!rc && d->shards[i].count < need) {
      seterr(err, errlen, "%s: shard holds %" PRId64 " tokens but one batch needs B*T+1 = %"
             PRId64 " (batch %" PRId64 ", sequence %" PRId64 "); use a smaller --batch or "
             "--seq, or more data in this shard", paths[i], d->shards[i].count, need, B, T);
      rc = 2;
    }
    if (rc) {
      data_close(d);
      return rc;
    }
  }
  return 0;
}

void data_next(DataLoader *d, int32_t *inputs, int32_t *targets) {
  int64_t n = d->B * d->T;
  /* Move on before taking the window, so a window never straddles two shards. Every shard
   * holds at least n+1 tokens (checked at open), so pos 0 of any shard always fits. */
  if (d->pos + n + 1 > d->shards[d->shard].count) {
    d->shard = (d->shard + 1) % d->n_shards;
    d->pos = 0;
  }
  const TokShard *s = &d->shards[d->shard];
  for (int64_t i = 0; i < n; i++) {
    inputs[i] = (int32_t)tok_get(s, d->pos + i);
    targets[i] = (int32_t)tok_get(s, d->pos + i + 1);
  }
  d->pos += n;
}

void data_get_position(const DataLoader *d, int *shard, int64_t *pos) {
  *shard = d->shard;
  *pos = d->pos;
}

int data_set_position(DataLoader *d, int shard, int64_t pos, char *err, size_t errlen) {
  if (shard < 0 || shard >= d->n_shards) {
    seterr(err, errlen, "data: saved position names shard %d but %d shard%s given; resume "
           "with the same data files as the run that saved it", shard, d->n_shards,
           d->n_shards == 1 ? " is" : "s are");
    return 2;
  }
  if (pos < 0 || pos > d->shards[shard].count) {
    seterr(err, errlen, "%s: saved position %" PRId64 " is outside this shard of %" PRId64
           " tokens; resume with the same data files as the run that saved it",
           d->shards[shard].path, pos, d->shards[shard].count);
    return 2;
  }
  d->shard = shard;
  d->pos = pos;
  return 0;
}

void data_close(DataLoader *d) {
  if (!d) return;
  for (int i = 0; d->shards && i < d->n_shards; i++) tok_close(&d->shards[i]);
  free(d->shards);
  memset(d, 0, sizeof *d);
}
