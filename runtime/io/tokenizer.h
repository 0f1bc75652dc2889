/* runtime/io/tokenizer.h — Hugging Face tokenizer.json: byte-level BPE (GPT-2, Llama 3).
 *
 * What is read (anything else is refused with the key that is not supported):
 *   model:          {"type": "BPE", "vocab": {token: id}, "merges": ["a b", ...] or [["a","b"], ...],
 *                    "ignore_merges", "byte_fallback" (no effect: every byte is in the vocab)}
 *   pre_tokenizer:  ByteLevel {add_prefix_space, use_regex (GPT-2's pattern)}, Split {pattern
 *                    {Regex | String}, behavior "Isolated", invert false}, or a Sequence of them
 *   normalizer:     null
 *   added_tokens:   [{id, content, special, ...}]: matched in the text before pre-tokenization,
 *                    leftmost-longest, as the `tokenizers` package does
 * Encoding follows `tokenizers`' Tokenizer.encode(text, add_special_tokens=False): the text is
 * cut at added tokens; each other segment goes through the pre-tokenizer steps in order
 * (every regex match is a piece and so is every gap between matches), each piece is mapped to
 * bytes and merged by BPE, lowest merge rank first (leftmost on ties).  Regexes run in PCRE2
 * with Unicode properties (PCRE2_UCP; `tokenizers` uses Oniguruma, and the goldens, which
 * hold U+0085, U+00A0, U+3000 and friends, find no difference).  Input must be valid UTF-8
 * (a refusal names the byte offset).
 *
 * Functions return 0 on success, 2 for bad input (a malformed or unsupported tokenizer file,
 * text that is not UTF-8, an id outside the vocabulary), 1 for I/O or memory failure, with a
 * one-line message in err (if err is not NULL).
 */
#ifndef LOOM_RUNTIME_TOKENIZER_H
#define LOOM_RUNTIME_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

/* A growable list of token ids (free ids when done). */
typedef struct {
  uint32_t *ids;
  int64_t n, cap;
} TokIds;

int tokenizer_load(const char *path, Tokenizer **out, char *err, size_t errlen);
/* The same from JSON text in memory; name is used in messages. */
int tokenizer_load_json(const char *json, size_t n, const char *name, Tokenizer **out, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t);   /* safe on NULL */

/* The highest id + 1 (vocabulary and added tokens). */
int64_t tokenizer_vocab_size(const Tokenizer *t);
/* Whether a ByteLevel step adds a space before pieces (add_prefix_space): then decoding gives
   the text with those spaces. */
bool tokenizer_adds_prefix_space(const Tokenizer *t);
/* The id of an added token's content (or a vocabulary entry's, in the byte-level alphabet),
   or -1. */
int64_t tokenizer_token_id(const Tokenizer *t, const char *content);
/* Whether an added token named like an end-of-text marker exists: the first of
   <|endoftext|>, <|end_of_text|>, </s>, <|im_end|>, <eos>; -1 when none. */
int64_t tokenizer_default_eot(const Tokenizer *t);

/* Appends the ids of UTF-8 text to out.  The tokenizer keeps a cache of words, so one
   Tokenizer is used by one thread at a time. */
int tokenizer_encode(Tokenizer *t, const uint8_t *text, size_t n, TokIds *out, char *err, size_t errlen);
/* Where a long text may be cut into pieces encoded one by one with the same ids as the whole:
   the first offset >= max with a visible ASCII character and '\n' before it and an ASCII
   letter after (neither GPT-2's nor Llama 3's pre-tokenizer regex matches across it; tested
   on the goldens), or n: always n unless every regex step is GPT-2's, Llama 3's or Qwen2's
   pattern, no ByteLevel step adds a prefix space and no added token holds a newline.
   Lets `loom data` encode a large file in chunks and report progress. */
size_t tokenizer_cut(const Tokenizer *t, const uint8_t *text, size_t n, size_t max);
/* Byte offset of the first invalid UTF-8 sequence in text[0, n), or -1 when it is valid. */
int64_t utf8_invalid_at(const uint8_t *text, size_t n);

/* The bytes of token ids[0, n) (added tokens as their content), appended to *buf (malloc'd,
   grown; *len its length, *cap its capacity). */
int tokenizer_decode(const Tokenizer *t, const uint32_t *ids, int64_t n, uint8_t **buf, size_t *len, size_t *cap,
                     char *err, size_t errlen);

int tokids_push(TokIds *v, uint32_t id);
void tokids_free(TokIds *v);

#endif
