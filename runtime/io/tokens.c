/* llm.c token shard reader/writer. See tokens.h. */
#include "runtime/io/tokens.h"

#include "runtime/io/safetensors.h" /* rt_read_file, RtAtomic */

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/io/seterr.h"


static int32_t get_le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

static void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int tok_open(const char *path, TokShard *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  uint8_t *buf;
  size_t size;
  int rc = rt_read_file(path, &buf, &size, err, errlen);
  if (rc) return rc;
  rc = 2;
  if (size < TOK_HEADER_BYTES) {
    seterr(err, errlen, "%s: file is %zu bytes, shorter than the %d-byte llm.c shard header; "
           "it is truncated or not a token shard", path, size, TOK_HEADER_BYTES);
    goto fail;
  }
  int32_t magic = get_le32(buf), version = get_le32(buf + 4), count = get_le32(buf + 8);
  int tb;
  if (magic == TOK_MAGIC_U16) {
    tb = 2;
    if (version != TOK_VERSION_U16) goto bad_version;
  } else if (magic == TOK_MAGIC_U32) {
    tb = 4;
    if (version != TOK_VERSION_U32) goto bad_version;
  } else {
    seterr(err, errlen, "%s: magic number %" PRId32 " is not an llm.c token shard's; accepted "
           "are %d (version %d, uint16 tokens) and %d (version %d, uint32 tokens)", path, magic,
           TOK_MAGIC_U16, TOK_VERSION_U16, TOK_MAGIC_U32, TOK_VERSION_U32);
    goto fail;
  }
  if (count < 0) {
    seterr(err, errlen, "%s: header token count is negative (%" PRId32 "); the header is "
           "corrupt", path, count);
    goto fail;
  }
  /* count < 2^31 and tb <= 4, so this fits easily in 64 bits. */
  uint64_t want = TOK_HEADER_BYTES + (uint64_t)count * (uint64_t)tb;
  if ((uint64_t)size != want) {
    seterr(err, errlen, "%s: header says %" PRId32 " tokens of %d bytes, so the file should be %"
           PRIu64 " bytes, but it is %zu (%s)", path, count, tb, want, size,
           (uint64_t)size < want ? "truncated" : "trailing bytes after the last token");
    goto fail;
  }
  if (!(out->path = strdup(path))) {
    rc = 1;
    seterr(err, errlen, "%s: out of memory", path);
    goto fail;
  }
  out->file = buf;
  out->data = buf + TOK_HEADER_BYTES;
  out->token_bytes = tb;
  out->count = count;
  return 0;
bad_version:
  seterr(err, errlen, "%s: magic %" PRId32 " needs version %d but the header has version %"
         PRId32 "; the file is corrupt or from a newer llm.c", path, magic,
         magic == TOK_MAGIC_U16 ? TOK_VERSION_U16 : TOK_VERSION_U32, version);
fail:
  free(buf);
  return rc;
}

void tok_close(TokShard *s) {
  if (!s) return;
  free(s->file);
  free(s->path);
  memset(s, 0, sizeof *s);
}

int tok_write(const char *path, const uint32_t *tokens, int64_t n, int token_bytes, char *err,
              size_t errlen) {
  if (token_bytes != 2 && token_bytes != 4) {
    seterr(err, errlen, "%s: token size must be 2 or 4 bytes, not %d", path, token_bytes);
    return 2;
  }
  if (n < 0 || n > INT32_MAX || (n > 0 && !tokens)) {
    seterr(err, errlen, "%s: cannot write %" PRId64 " tokens; an llm.c shard holds 0 to %d "
           "(split the data over several shards)", path, n, INT32_MAX);
    return 2;
  }
  /* Check every value before creating anything, so a refusal leaves no file behind. */
  for (int64_t i = 0; token_bytes == 2 && i < n; i++)
    if (tokens[i] > UINT16_MAX) {
      seterr(err, errlen, "%s: token %" PRIu32 " at position %" PRId64 " does not fit in 2 "
             "bytes; write this shard with 4-byte tokens (magic %d)", path, tokens[i], i,
             TOK_MAGIC_U32);
      return 2;
    }
  uint8_t hdr[TOK_HEADER_BYTES] = {0};
  put_le32(hdr, token_bytes == 2 ? TOK_MAGIC_U16 : TOK_MAGIC_U32);
  put_le32(hdr + 4, token_bytes == 2 ? TOK_VERSION_U16 : TOK_VERSION_U32);
  put_le32(hdr + 8, (uint32_t)n);
  RtAtomic a;
  int rc = rt_atomic_open(&a, path, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, hdr, sizeof hdr, err, errlen);
  /* Convert to little-endian in chunks so memory stays bounded for large shards. */
  enum { CHUNK = 4096 };
  uint8_t buf[CHUNK * 4];
  for (int64_t i = 0; !rc && i < n; i += CHUNK) {
    int64_t m = n - i < CHUNK ? n - i : CHUNK;
    for (int64_t j = 0; j < m; j++) {
      uint32_t v = tokens[i + j];
      uint8_t *p = buf + j * token_bytes;
      p[0] = (uint8_t)v;
      p[1] = (uint8_t)(v >> 8);
      if (token_bytes == 4) p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
    }
    rc = rt_atomic_write(&a, buf, (size_t)(m * token_bytes), err, errlen);
  }
  if (!rc) rc = rt_atomic_commit(&a, err, errlen);
  rt_atomic_abort(&a);
  return rc;
}

int tok_check_vocab(const TokShard *s, int64_t vocab, char *err, size_t errlen) {
  if (vocab <= 0) {
    seterr(err, errlen, "%s: vocabulary size must be positive, not %" PRId64,
           s->path ? s->path : "?", vocab);
    return 2;
  }
  for (int64_t i = 0; i < s->count; i++) {
    uint32_t t = tok_get(s, i);
    if ((int64_t)t >= vocab) {
      seterr(err, errlen, "%s: token %" PRIu32 " at position %" PRId64 " is outside the model's "
             "vocabulary of %" PRId64 "; was this shard made with another tokenizer?",
             s->path ? s->path : "?", t, i, vocab);
      return 2;
    }
  }
  return 0;
}
