/* runtime/exec/host.c — the process the execution layer runs in: a monotonic clock, the peak
   resident memory, the malloc settings the cpu backend wants; a string helper. */
#include <malloc.h>
#include <string.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "runtime/exec/exec.h"

double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}


void cpu_run_setup(char **argv) {
  (void)argv;
#ifdef M_MMAP_THRESHOLD
  if (!getenv("GLIBC_TUNABLES")) {
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
#endif
}

double peak_rss_mib(void) {
  struct rusage ru;
  return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : -1;
}

bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}
