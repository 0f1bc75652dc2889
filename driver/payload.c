/* driver/payload.c — compiled executables: the runner binary with the trained program
   appended.  Nothing needs a C compiler: `loom compile` copies the runner and appends. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/io/safetensors.h"
#include "driver/driver.h"

static const char magic[8] = {'L', 'O', 'O', 'M', 'P', 'A', 'Y', '1'};

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

int payload_write(const char *runner, const char *out, const void *const *parts, const size_t *sizes, int n_parts,
                  char *err, size_t errlen) {
  uint8_t *bin = NULL;
  size_t n = 0;
  int rc = rt_read_file(runner, &bin, &n, err, errlen);
  if (rc) {
    char msg[IR_ERR_LEN];
    snprintf(msg, sizeof msg, "%s", err);
    snprintf(err, errlen, "cannot read the training runner: %s (it is built next to loom as loom-train)", msg);
    return EXIT_RUN;
  }
  /* A runner that already carries a payload (a compiled executable) is cut back to the bare runner. */
  if (n >= 24 && !memcmp(bin + n - 24, magic, 8) && get_u64(bin + n - 16) <= n) n = (size_t)get_u64(bin + n - 16);
  RtAtomic a;
  uint8_t trailer[24], len[8];
  size_t total = 8;
  for (int i = 0; i < n_parts; i++) total += 8 + sizes[i];
  memcpy(trailer, magic, 8);
  put_u64(trailer + 8, n);
  put_u64(trailer + 16, total);
  rc = rt_atomic_open(&a, out, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, bin, n, err, errlen);
  put_u64(len, (uint64_t)n_parts);
  if (!rc) rc = rt_atomic_write(&a, len, 8, err, errlen);
  for (int i = 0; i < n_parts && !rc; i++) {   /* each part: u64 size, bytes */
    put_u64(len, sizes[i]);
    rc = rt_atomic_write(&a, len, 8, err, errlen);
    if (!rc) rc = rt_atomic_write(&a, parts[i], sizes[i], err, errlen);
  }
  if (!rc) rc = rt_atomic_write(&a, trailer, sizeof trailer, err, errlen);
  if (!rc && fchmod(fileno(a.fp), 0755)) {
    snprintf(err, errlen, "%s: cannot make it executable: %s", out, strerror(errno));
    rc = EXIT_RUN;
  }
  if (!rc) rc = rt_atomic_commit(&a, err, errlen);
  else rt_atomic_abort(&a);
  free(bin);
  return rc;
}

int payload_parse(Payload *p, const uint8_t *bin, size_t n, char *err, size_t errlen) {
  p->n_parts = 0;
  uint64_t off, size;
  if (n < 24 || memcmp(bin + n - 24, magic, 8) || (off = get_u64(bin + n - 16)) > n - 24 ||
      (size = get_u64(bin + n - 8)) != n - 24 - off || size < 8) {
    snprintf(err, errlen, "this executable carries no compiled model: it is the bare runner that 'loom compile' "
             "copies, or the file was changed after compiling; make one with 'loom compile SPEC -o EXE'");
    return EXIT_USAGE;
  }
  const uint8_t *at = bin + off, *end = bin + off + size;
  uint64_t count = get_u64(at);
  at += 8;
  for (uint64_t i = 0; i < count; i++) {
    uint64_t len;
    if (p->n_parts == PAYLOAD_MAX_PARTS || end - at < 8 || (len = get_u64(at)) > (uint64_t)(end - at - 8)) {
      p->n_parts = 0;
      snprintf(err, errlen, "the compiled model in this executable is damaged; compile it again");
      return EXIT_RUN;
    }
    p->parts[p->n_parts] = at + 8;
    p->sizes[p->n_parts++] = (size_t)len;
    at += 8 + len;
  }
  return 0;
}

int payload_read_self(Payload *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  int rc = rt_read_file("/proc/self/exe", &p->file, &p->file_size, err, errlen);
  if (rc) return EXIT_RUN;
  if ((rc = payload_parse(p, p->file, p->file_size, err, errlen))) {
    free(p->file);
    p->file = NULL;
  }
  return rc;
}
