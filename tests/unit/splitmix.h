/* tests/unit/splitmix.h — the unit tests' random numbers: splitmix64 from a fixed seed, so a
 * failure repeats.  splitmix_next / splitmix_u01 advance a state of the caller's (one stream
 * a case: test_gradcheck.c); rng / urand one stream per executable (test_ir.c, test_interp.c,
 * the cpu tests), from SPLITMIX_SEED, which a test defines before the include to keep the
 * data its seed has always given. */
#ifndef LOOM_TESTS_UNIT_SPLITMIX_H
#define LOOM_TESTS_UNIT_SPLITMIX_H

#include <stdint.h>

static inline uint64_t splitmix_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/* [0,1): the top 53 bits over 2^53 */
static inline double splitmix_u01(uint64_t *s) { return (double)(splitmix_next(s) >> 11) / 9007199254740992.0; }

#ifndef SPLITMIX_SEED
#define SPLITMIX_SEED 0x243F6A8885A308D3ull
#endif
static __attribute__((unused)) uint64_t rng_state = SPLITMIX_SEED;
static __attribute__((unused)) uint64_t rng(void) { return splitmix_next(&rng_state); }
static __attribute__((unused)) double urand(void) { return splitmix_u01(&rng_state); }   /* [0,1) */

#endif
