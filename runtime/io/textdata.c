/* Byte-level text shards. See textdata.h. */
#include "runtime/io/textdata.h"

#include "runtime/io/safetensors.h" /* rt_read_file */
#include "runtime/io/tokens.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/io/seterr.h"


/* Widens bytes to the uint32 tokens tok_write takes. what names the input in messages. */
static int write_bytes(const uint8_t *bytes, size_t n, const char *what, const char *out_path,
                       int64_t *n_tokens, char *err, size_t errlen) {
  if (n == 0) {
    seterr(err, errlen, "%s: no text to write (%s is empty); give at least one non-empty "
           "text file", out_path, what);
    return 2;
  }
  if (n > INT32_MAX) {
    seterr(err, errlen, "%s: %zu bytes of text exceed the %d tokens an llm.c shard holds; "
           "split the text over several shards", out_path, n, INT32_MAX);
    return 2;
  }
  uint32_t *tok = malloc(n * sizeof *tok);
  if (!tok) {
    seterr(err, errlen, "%s: out of memory for %zu tokens", out_path, n);
    return 1;
  }
  for (size_t i = 0; i < n; i++) tok[i] = bytes[i];
  int rc = tok_write(out_path, tok, (int64_t)n, 2, err, errlen);
  free(tok);
  if (!rc && n_tokens) *n_tokens = (int64_t)n;
  return rc;
}

int text_bytes_to_shard(const uint8_t *bytes, size_t n, const char *out_path,
                        int64_t *n_tokens, char *err, size_t errlen) {
  if (n > 0 && !bytes) {
    seterr(err, errlen, "%s: text pointer is NULL", out_path);
    return 2;
  }
  return write_bytes(bytes, n, "the text given", out_path, n_tokens, err, errlen);
}

int text_to_shard(const char *const *paths, int n, const char *out_path, int64_t *n_tokens,
                  char *err, size_t errlen) {
  if (n < 1 || !paths) {
    seterr(err, errlen, "%s: no text files given", out_path);
    return 2;
  }
  uint8_t *all = NULL;
  size_t len = 0;
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    uint8_t *buf;
    size_t size;
    if ((rc = rt_read_file(paths[i], &buf, &size, err, errlen))) break;
    if (size > INT32_MAX - len) { /* checked here so we never hold more than a shard's worth */
      seterr(err, errlen, "%s: the text files up to %s exceed the %d tokens an llm.c shard "
             "holds; split them over several shards", out_path, paths[i], INT32_MAX);
      rc = 2;
    } else if (size > 0) {
      uint8_t *na = realloc(all, len + size);
      if (!na) {
        seterr(err, errlen, "%s: out of memory reading %s", out_path, paths[i]);
        rc = 1;
      } else {
        all = na;
        memcpy(all + len, buf, size);
        len += size;
      }
    }
    free(buf);
  }
  if (!rc) rc = write_bytes(all, len, n == 1 ? paths[0] : "every input file", out_path,
                            n_tokens, err, errlen);
  free(all);
  return rc;
}
