/* driver/share.c — the files loom reads at run time besides its input (the hardware
 * descriptions of models/hardware/, tools/make_golden.py): where an installed loom keeps
 * them, PREFIX/share/loom/ beside PREFIX/bin/loom (CMakeLists.txt's install rules), found
 * from the executable's own path so that a copy of the prefix moved anywhere works; else
 * the source tree it was built from (a loom run from its build folder). */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "driver/driver.h"

#ifndef LOOM_SOURCE_DIR
#define LOOM_SOURCE_DIR "."
#endif

int loom_share_path(const char *rel, char *out, size_t n) {
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;   /* PREFIX/bin */
      snprintf(out, n, "%s/../share/loom/%s", exe, rel);
      if (!access(out, R_OK)) return 0;
    }
  }
  snprintf(out, n, "%s/%s", LOOM_SOURCE_DIR, rel);
  return access(out, R_OK) ? -1 : 0;
}
