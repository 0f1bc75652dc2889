/* llm.c token shards (training data).
 *
 * Layout: 256 little-endian int32 (1024 bytes): [0] magic, [1] version, [2] token count;
 * then count little-endian tokens. Magic 20240520 / version 1: uint16 tokens (GPT-2);
 * magic 20240801 / version 7: uint32 tokens (Llama-3).
 *
 * Functions return 0 on success, 2 for a malformed file or bad input, 1 for I/O or memory
 * failure, with a one-line message in err (if err is not NULL).
 */
#ifndef LOOM_RUNTIME_TOKENS_H
#define LOOM_RUNTIME_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define TOK_HEADER_BYTES 1024
#define TOK_MAGIC_U16 20240520
#define TOK_VERSION_U16 1
#define TOK_MAGIC_U32 20240801
#define TOK_VERSION_U32 7

typedef struct {
  char *path;
  int token_bytes;      /* 2 or 4 */
  int64_t count;        /* number of tokens */
  uint8_t *data;        /* count*token_bytes bytes of little-endian tokens */
  uint8_t *file;        /* the whole file (data points into it); owned, freed by tok_close */
} TokShard;

/* Reads the whole file and validates header and size. On failure *out is left zeroed. */
int tok_open(const char *path, TokShard *out, char *err, size_t errlen);

/* Token i; the caller keeps 0 <= i < s->count. Byte-wise so it works at any alignment
 * and host byte order. */
static inline uint32_t tok_get(const TokShard *s, int64_t i) {
  const uint8_t *p = s->data + i * s->token_bytes;
  if (s->token_bytes == 2) return (uint32_t)p[0] | (uint32_t)p[1] << 8;
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tok_close(TokShard *s);  /* safe on a zeroed TokShard; zeroes it */

/* Writes n tokens with token_bytes 2 or 4, atomically (temp file, fsync, rename). Returns 2
 * without touching PATH if a token does not fit in token_bytes or n exceeds the int32 count. */
int tok_write(const char *path, const uint32_t *tokens, int64_t n, int token_bytes, char *err,
              size_t errlen);

/* Returns 2 naming the position and value of the first token >= vocab, else 0. */
int tok_check_vocab(const TokShard *s, int64_t vocab, char *err, size_t errlen);

#endif
