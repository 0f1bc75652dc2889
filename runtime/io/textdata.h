/* Plain text -> llm.c token shard with byte-level tokens (vocabulary 256: token = byte).
 *
 * No tokenizer is needed, so any text can be trained on at once; the shard is an ordinary
 * uint16 llm.c shard (magic 20240520, version 1) that data_open reads with vocab 256.
 * Written atomically (tok_write). Returns 0, 2 for bad input (empty text, too long), 1 for
 * I/O or memory failure, with a one-line message in err (if not NULL).
 */
#ifndef LOOM_RUNTIME_TEXTDATA_H
#define LOOM_RUNTIME_TEXTDATA_H

#include <stddef.h>
#include <stdint.h>

#define TEXT_VOCAB 256

/* Concatenates the files in order (no separator) and writes them as one shard.
 * *n_tokens (if not NULL) receives the token count. */
int text_to_shard(const char *const *paths, int n, const char *out_path, int64_t *n_tokens,
                  char *err, size_t errlen);

/* The same for text already in memory. */
int text_bytes_to_shard(const uint8_t *bytes, size_t n, const char *out_path,
                        int64_t *n_tokens, char *err, size_t errlen);

#endif
