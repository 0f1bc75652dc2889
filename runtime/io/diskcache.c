/* runtime/io/diskcache.c — the on-disk cache of compiled code (diskcache.h): SHA-256, the
 * folder, entries written atomically and read with their checksum, per-entry locks. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "runtime/io/diskcache.h"

#define HEADER 88   /* magic 8, flags 8, length 8, payload sha 32, key 32 */

/* ------------------------------------------------------------------ SHA-256 (FIPS 180-4) */

static const uint32_t sha_k[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01,
  0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc,
  0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
  0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08,
  0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
  0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(Sha256 *s, const unsigned char *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
    uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  s->h[0] += a;
  s->h[1] += b;
  s->h[2] += c;
  s->h[3] += d;
  s->h[4] += e;
  s->h[5] += f;
  s->h[6] += g;
  s->h[7] += h;
}

void sha_init(Sha256 *s) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof h0);
  s->len = 0;
  s->nbuf = 0;
}

void sha_update(Sha256 *s, const void *data, size_t n) {
  const unsigned char *p = data;
  s->len += n;
  while (n) {
    size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
    memcpy(s->buf + s->nbuf, p, take);
    s->nbuf += take;
    p += take;
    n -= take;
    if (s->nbuf == 64) {
      sha_block(s, s->buf);
      s->nbuf = 0;
    }
  }
}

void sha_final(Sha256 *s, unsigned char out[32]) {
  uint64_t bits = s->len * 8;
  unsigned char pad = 0x80;
  sha_update(s, &pad, 1);
  unsigned char zero = 0;
  while (s->nbuf != 56) sha_update(s, &zero, 1);
  unsigned char lenb[8];
  for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)(bits >> (56 - 8 * i));
  sha_update(s, lenb, 8);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) out[4 * i + j] = (unsigned char)(s->h[i] >> (24 - 8 * j));
}

void dc_hex(const unsigned char *d, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[d[i] >> 4];
    out[2 * i + 1] = digits[d[i] & 15];
  }
  out[2 * n] = 0;
}

/* ------------------------------------------------------------------ entries */

void dc_dir(char *out, size_t n) {
  const char *d = getenv("LOOM_CACHE_DIR");
  if (d) {
    if (!*d || !strcmp(d, "off")) snprintf(out, n, "%s", "");
    else snprintf(out, n, "%s", d);
    return;
  }
  const char *x = getenv("XDG_CACHE_HOME");
  if (x && *x) {
    snprintf(out, n, "%s/loom", x);
    return;
  }
  const char *home = getenv("HOME");
  if (home && *home) snprintf(out, n, "%s/.cache/loom", home);
  else snprintf(out, n, "%s", "");
}

int dc_path(const char *dir, const unsigned char key[32], const char *suffix, char *out, size_t n) {
  char hex[65];
  dc_hex(key, 32, hex);
  int k = snprintf(out, n, "%s/%s%s", dir, hex, suffix ? suffix : "");
  return k < 0 || (size_t)k >= n;
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

int dc_read(const char *path, const char magic[8], const unsigned char key[32], unsigned char **payload, size_t *n,
            unsigned *flags) {
  FILE *f = fopen(path, "rb");
  if (!f) return 1;
  unsigned char h[HEADER];
  int rc = 1;
  unsigned char *data = NULL;
  if (fread(h, 1, HEADER, f) != HEADER) goto done;
  if (memcmp(h, magic, 8) || memcmp(h + 56, key, 32)) goto done;
  uint64_t len = get_u64(h + 16);
  if (len == 0 || len > ((uint64_t)1 << 34)) goto done;
  data = malloc((size_t)len + 1);
  if (!data) goto done;
  if (fread(data, 1, (size_t)len, f) != len) goto done;
  unsigned char extra;
  if (fread(&extra, 1, 1, f) != 0) goto done;   /* trailing bytes: not ours */
  Sha256 s;
  unsigned char sum[32];
  sha_init(&s);
  sha_update(&s, data, (size_t)len);
  sha_final(&s, sum);
  if (memcmp(sum, h + 24, 32)) goto done;
  data[len] = 0;
  *payload = data;
  *n = (size_t)len;
  if (flags) *flags = h[8];
  data = NULL;
  rc = 0;
done:
  free(data);
  fclose(f);
  return rc;
}

int dc_mkdirs(const char *dir) {
  char p[1024];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return 1;
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0755) && errno != EEXIST) return 1;
    *s = '/';
  }
  if (mkdir(p, 0755) && errno != EEXIST) return 1;
  return 0;
}

void dc_write(const char *dir, const char *path, const char magic[8], const unsigned char key[32],
              const unsigned char *payload, size_t n, unsigned flags) {
  if (dc_mkdirs(dir)) return;
  static int counter;
  char tmp[1300];
  int k = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%d", path, (long)getpid(),
                   __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
  if (k < 0 || (size_t)k >= sizeof tmp) return;
  FILE *f = fopen(tmp, "wb");
  if (!f) return;
  unsigned char h[HEADER];
  memset(h, 0, sizeof h);
  memcpy(h, magic, 8);
  h[8] = (unsigned char)flags;
  put_u64(h + 16, n);
  Sha256 s;
  sha_init(&s);
  sha_update(&s, payload, n);
  sha_final(&s, h + 24);
  memcpy(h + 56, key, 32);
  bool ok = fwrite(h, 1, sizeof h, f) == sizeof h && fwrite(payload, 1, n, f) == n;
  ok = fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  if (fclose(f) != 0) ok = false;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

/* ------------------------------------------------------------------ locks */

/* The lock files live beside the entries (locks/KEY.lock) and are never removed: removing
   one while another process waits on it would let a third take a new lock of the same name
   at the same time.  They are empty. */
int dc_lock(const char *dir, const unsigned char key[32]) {
  char locks[1100], path[1200];
  if (snprintf(locks, sizeof locks, "%s/locks", dir) >= (int)sizeof locks) return -1;
  if (dc_mkdirs(locks) || dc_path(locks, key, ".lock", path, sizeof path)) return -1;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  int r;
  while ((r = flock(fd, LOCK_EX)) != 0 && errno == EINTR) {
  }
  if (r != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

void dc_unlock(int fd) {
  if (fd < 0) return;
  flock(fd, LOCK_UN);
  close(fd);
}
