/* runtime/io/checkpoint_files.c — the file and folder helpers of the checkpoint commit
 * protocol (CRC-32C, digests, durable folders, atomic text files, shard names) and the
 * checkpoint names of experts.  checkpoint.c (whole checkpoints), checkpoint_shards.c (one
 * shard per rank) and the training loop call down into this file; it calls none of them. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/io/checkpoint.h"
#include "runtime/io/checkpoint_internal.h"
#include "runtime/io/seterr.h"

/* ---- CRC-32C ----------------------------------------------------------------------------
 * Chosen over FNV-1a-64 because a CRC detects every burst error up to 32 bits and every
 * 1-3 bit error at these lengths with certainty, and slicing-by-8 runs at several GB/s
 * without special instructions. The 8 KB table is built on the stack per call (a few
 * microseconds), so there is no shared mutable state; callers pass large chunks. */
uint32_t ckpt_crc32c(uint32_t crc, const void *data, size_t n) {
  uint32_t t[8][256];
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    t[0][i] = c;
  }
  for (int s = 1; s < 8; s++)
    for (int i = 0; i < 256; i++) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  const uint8_t *p = data;
  crc = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                         (uint32_t)p[3] << 24);
    uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                  (uint32_t)p[7] << 24;
    crc = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
          t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
  }
  for (; n > 0; p++, n--) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xFF];
  return ~crc;
}

/* Size and CRC-32C of a whole file, read in bounded chunks (checkpoints can be GBs). */
int ckpt_file_digest(const char *path, uint64_t *size, uint32_t *crc, char *err,
                       size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    return 1;
  }
  enum { CHUNK = 1 << 20 };
  uint8_t *buf = malloc(CHUNK);
  if (!buf) {
    fclose(f);
    seterr(err, errlen, "%s: out of memory", path);
    return 1;
  }
  *size = 0;
  *crc = 0;
  size_t got;
  while ((got = fread(buf, 1, CHUNK, f)) > 0) {
    *crc = ckpt_crc32c(*crc, buf, got);
    *size += got;
  }
  int bad = ferror(f);
  free(buf);
  fclose(f);
  if (bad) {
    seterr(err, errlen, "%s: read failed after %" PRIu64 " bytes", path, *size);
    return 1;
  }
  return 0;
}

/* ---- path and directory helpers ------------------------------------------------------ */

char *ckpt_pjoin(const char *a, const char *b) {
  size_t la = strlen(a), n = la + strlen(b) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s%s%s", a, la && a[la - 1] == '/' ? "" : "/", b);
  return p;
}

int ckpt_is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Makes a rename or a new entry in DIR durable. Some filesystems refuse fsync on a
 * directory (EINVAL); that is not an error. */
int ckpt_fsync_dir(const char *dir, char *err, size_t errlen) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    seterr(err, errlen, "%s: cannot open directory to fsync: %s", dir, strerror(errno));
    return 1;
  }
  int rc = 0;
  if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
    seterr(err, errlen, "%s: fsync of directory failed: %s", dir, strerror(errno));
    rc = 1;
  }
  close(fd);
  return rc;
}

/* mkdir -p: creates DIR and its missing parents. */
int ckpt_mkdir_p(const char *dir, char *err, size_t errlen) {
  char *p = strdup(dir);
  if (!p) {
    seterr(err, errlen, "%s: out of memory", dir);
    return 1;
  }
  int rc = 0;
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s != 0) continue;
    char c = *s;
    *s = 0;
    if (mkdir(p, 0777) != 0 && !(errno == EEXIST && ckpt_is_dir(p))) {
      seterr(err, errlen, "%s: cannot create directory %s: %s; check --save-dir and its "
             "permissions", dir, p, strerror(errno));
      rc = 1;
      break;
    }
    *s = c;
    if (c == 0) break;
  }
  free(p);
  return rc;
}

/* Deletes a step folder (it holds only files). DONE goes first and is made durable, so a
 * crash part-way leaves an incomplete folder that readers skip, never a complete-looking
 * folder with files missing. */
int ckpt_remove_step_dir(const char *dir, char *err, size_t errlen) {
  char *done = ckpt_pjoin(dir, "DONE");
  if (!done) {
    seterr(err, errlen, "%s: out of memory", dir);
    return 1;
  }
  int had = unlink(done) == 0;
  free(done);
  if (had && ckpt_fsync_dir(dir, err, errlen)) return 1;
  DIR *d = opendir(dir);
  if (!d) {
    seterr(err, errlen, "%s: cannot open directory to delete it: %s", dir, strerror(errno));
    return 1;
  }
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *p = ckpt_pjoin(dir, e->d_name);
    if (!p || unlink(p) != 0) {
      seterr(err, errlen, "%s: cannot delete %s: %s", dir, e->d_name,
             p ? strerror(errno) : "out of memory");
      rc = 1;
    }
    free(p);
  }
  closedir(d);
  if (!rc && rmdir(dir) != 0) {
    seterr(err, errlen, "%s: cannot delete directory: %s", dir, strerror(errno));
    rc = 1;
  }
  return rc;
}

int ckpt_write_text(const char *path, const char *text, char *err, size_t errlen) {
  RtAtomic a;
  int rc = rt_atomic_open(&a, path, err, errlen);
  if (!rc) rc = rt_atomic_write(&a, text, strlen(text), err, errlen);
  if (!rc) rc = rt_atomic_commit(&a, err, errlen);
  rt_atomic_abort(&a);
  return rc;
}

void ckpt_shard_name(int rank, int world, char *out, size_t n) {
  snprintf(out, n, "shard-%05d-of-%05d.safetensors", rank, world);
}

int rt_expert_name(const char *name, int64_t e, char *buf, size_t n) {
  const char *at = NULL;
  for (const char *p = strstr(name, ".experts."); p; p = strstr(p + 1, ".experts.")) at = p;
  if (!at) return -1;
  int w = snprintf(buf, n, "%.*s.experts.%lld.%s.weight", (int)(at - name), name, (long long)e, at + 9);
  return w < 0 || (size_t)w >= n ? -1 : 0;
}
