/* tests/unit/files.h — the file helpers of the unit tests that write and read files of their
 * own (test_safetensors, test_tokens, test_textdata).  A failure here is the scaffolding's,
 * not the code's under test: it ends the run (exit 1) with a message. */
#ifndef LOOM_TESTS_UNIT_FILES_H
#define LOOM_TESTS_UNIT_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Writes n bytes of data to the file p (created or truncated). */
static __attribute__((unused)) void put_file(const char *p, const void *data, size_t n) {
  FILE *f = fopen(p, "wb");
  if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", p);
    exit(1);
  }
}

/* n zeroed bytes (at least one). */
static __attribute__((unused)) void *xalloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return p;
}

/* The file p's bytes (a zero after them; *n 0 if it could not be read whole); free() them. */
static __attribute__((unused)) uint8_t *get_file(const char *p, size_t *n) {
  FILE *f = fopen(p, "rb");
  if (!f) {
    fprintf(stderr, "cannot read %s\n", p);
    exit(1);
  }
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = xalloc(*n + 1);
  if (fread(b, 1, *n, f) != *n) *n = 0;
  fclose(f);
  return b;
}

#endif
