/* tests/unit/splitmix.h — the unit tests' random numbers: splitmix64 from a fixed seed, so a
 * failure repeats (test_ir.c, test_interp.c: one stream per executable). */
#ifndef LOOM_TESTS_UNIT_SPLITMIX_H
#define LOOM_TESTS_UNIT_SPLITMIX_H

#include <stdint.h>

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static __attribute__((unused)) uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static __attribute__((unused)) double urand(void) { return (double)(rng() >> 11) / 9007199254740992.0; }   /* [0,1) */

#endif
