/* tests/fuzz/fuzz_safetensors.c — st_read, the safetensors reader every weights file, --init
 * and checkpoint goes through.  Invariants: a refusal has a message; a file it accepts has
 * tensors whose bytes lie inside the file (every byte is read here, so ASan sees any that
 * does not), whose byte counts match dtype x shape, and which st_find finds by name. */
#include "runtime/io/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *path = fuzz_write("w.safetensors", data, size);
  char err[1024] = "";
  StFile f;
  if (st_read(path, &f, err, sizeof err)) {
    fuzz_check_message("st_read", err);
  } else {
    unsigned sum = 0;
    for (int i = 0; i < f.n; i++) {
      const StTensor *t = &f.tensors[i];
      int64_t n = st_numel(t->rank, t->shape);
      if (n < 0 || (uint64_t)n * (uint64_t)st_dtype_size(t->dtype) != (uint64_t)t->nbytes)
        fuzz_fail("tensor %s: %llu bytes for %lld elements of %s", t->name, (unsigned long long)t->nbytes, (long long)n,
                  st_dtype_name(t->dtype));
      const uint8_t *p = t->data;
      for (uint64_t b = 0; b < t->nbytes; b++) sum += p[b];
      if (st_find(&f, t->name) == NULL) fuzz_fail("st_find does not find tensor %s", t->name);
    }
    if (sum == 0xFFFFFFFFu) fprintf(stderr, " ");   /* keep the reads */
    st_close(&f);
  }
  free(path);
  return 0;
}
