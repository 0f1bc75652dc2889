/* Training data loader over llm.c token shards.
 *
 * The order in which windows are taken is part of the training result (goldens, resume),
 * so it is fixed exactly:
 *   a cursor (shard, pos) starts at (0, 0);
 *   data_next first moves to the next shard at pos 0 (wrapping after the last) when the
 *   current one has fewer than B*T+1 tokens left from pos, then takes
 *   inputs = tokens[pos, pos+B*T) and targets = tokens[pos+1, pos+B*T+1) of that shard,
 *   row-major [B, T], and advances pos by B*T.
 * Every shard is read into memory at open (tokens.h) and checked against the vocabulary.
 *
 * Functions return 0 on success, 2 for bad input (a shard or an argument is wrong) and 1
 * for I/O or memory failure, with a one-line message in err (if err is not NULL).
 */
#ifndef LOOM_RUNTIME_DATA_H
#define LOOM_RUNTIME_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/io/tokens.h"

typedef struct {
  TokShard *shards;
  int n_shards;
  int64_t B, T;
  int shard;   /* cursor: the shard the next window is taken from (before a possible move) */
  int64_t pos; /* and the token offset in it */
} DataLoader;

/* Opens every shard, checks every token < vocab and that each shard holds at least B*T+1
 * tokens. On failure nothing stays open and *d is zeroed. */
int data_open(DataLoader *d, const char *const *paths, int n_paths, int64_t B, int64_t T,
              int64_t vocab, char *err, size_t errlen);

/* Fills B*T inputs and B*T targets (row-major [B, T]) and advances the cursor. */
void data_next(DataLoader *d, int32_t *inputs, int32_t *targets);

/* The cursor as data_next will see it next; save it in a checkpoint to resume. */
void data_get_position(const DataLoader *d, int *shard, int64_t *pos);

/* Restores a saved cursor: 0 <= shard < n_shards and 0 <= pos <= that shard's count
 * (a pos too close to the end is valid: data_next then moves on, as it would have).
 * Returns 2 with a message otherwise, leaving the cursor unchanged. */
int data_set_position(DataLoader *d, int shard, int64_t pos, char *err, size_t errlen);

void data_close(DataLoader *d); /* safe on a zeroed DataLoader; zeroes it */

#endif
