/* tools/payload.c — compiled executables: the runner binary with the trained program
   appended.  Nothing needs a C compiler: `loom compile` copies the runner and appends. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/safetensors.h"
#include "tools/tools.h"

static const char magic[8] = {'L', 'O', 'O', 'M', 'P', 'A', 'Y', '1'};

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

int payload_write(const char *runner, const char *out, const char *settings_json, const char *ir_text, char *err,
                  size_t errlen) {
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
  uint8_t trailer[24];
  size_t ls = strlen(settings_json) + 1, li = strlen(ir_text);
  memcpy(trailer, magic, 8);
  put_u64(trailer + 8, n);
  put_u64(trailer + 16, ls + li);
  rc = rt_atomic_open(&a, out, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, bin, n, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, settings_json, ls, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, ir_text, li, err, errlen);
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

int payload_read_self(char **settings, char **ir, char *err, size_t errlen) {
  uint8_t *bin = NULL;
  size_t n = 0;
  int rc = rt_read_file("/proc/self/exe", &bin, &n, err, errlen);
  if (rc) return EXIT_RUN;
  uint64_t off, size;
  if (n < 24 || memcmp(bin + n - 24, magic, 8) || (off = get_u64(bin + n - 16)) > n - 24 ||
      (size = get_u64(bin + n - 8)) != n - 24 - off || !memchr(bin + off, 0, size)) {
    free(bin);
    snprintf(err, errlen, "this executable carries no compiled model: it is the bare runner that 'loom compile' "
             "copies; make a training executable with 'loom compile SPEC -o EXE'");
    return EXIT_USAGE;
  }
  const char *p = (const char *)bin + off;
  size_t ls = strlen(p) + 1;
  *settings = strdup(p);
  *ir = strndup(p + ls, size - ls);
  free(bin);
  if (!*settings || !*ir) {
    snprintf(err, errlen, "out of memory");
    return EXIT_RUN;
  }
  return 0;
}
