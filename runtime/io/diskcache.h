/* runtime/io/diskcache.h — loom's on-disk cache of compiled code, shared by the CUDA backend
 * (NVRTC's cubins, runtime/cuda/nvrtc.c) and the CPU backend (LLVM's object code,
 * runtime/cpu/jit.c).
 *
 * Where: LOOM_CACHE_DIR, else $XDG_CACHE_HOME/loom, else ~/.cache/loom; LOOM_CACHE_DIR=off
 * (or empty) turns caching off.  An entry is one file named by its key (64 hex digits of a
 * SHA-256 of everything the result depends on), holding
 *   magic 8 | flags 8 | payload length 8 | SHA-256 of the payload 32 | key 32 | payload,
 * written atomically (a temporary file, fsync, rename): a reader sees a whole entry or none,
 * and an entry whose checksum or key does not match is a miss, never an error.
 *
 * Many processes that need one entry at once (the ranks of a mesh on one machine, each
 * compiling the same program) take the entry's lock (dc_lock, an flock on
 * locks/KEY.lock in the cache folder): the first compiles and writes, the rest wait and
 * read, so a node compiles a program once, not once a rank.  A lock held by a process that
 * died is released by the kernel. */
#ifndef LOOM_DISKCACHE_H
#define LOOM_DISKCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t h[8];
  uint64_t len;
  unsigned char buf[64];
  size_t nbuf;
} Sha256;

void sha_init(Sha256 *s);
void sha_update(Sha256 *s, const void *data, size_t n);
void sha_final(Sha256 *s, unsigned char out[32]);
void dc_hex(const unsigned char *d, size_t n, char *out);   /* out: 2n + 1 chars */

/* The cache folder that would be used (not created), or "" when caching is off. */
void dc_dir(char *out, size_t n);
/* DIR/HEX(key)SUFFIX; 0 on success, 1 when it does not fit. */
int dc_path(const char *dir, const unsigned char key[32], const char *suffix, char *out, size_t n);
/* Reads an entry: 0 and a malloc'd payload (NUL-terminated beyond n) when the file is whole,
   has this magic and belongs to key; 1 otherwise (missing, damaged, another key). */
int dc_read(const char *path, const char magic[8], const unsigned char key[32], unsigned char **payload, size_t *n,
            unsigned *flags);
/* Writes an entry atomically; failures are silent (the cache is an optimization). */
void dc_write(const char *dir, const char *path, const char magic[8], const unsigned char key[32],
              const unsigned char *payload, size_t n, unsigned flags);
/* Takes the entry's lock (blocking): a descriptor to give dc_unlock, or -1 when locking is
   not possible here (then the caller compiles without it). */
int dc_lock(const char *dir, const unsigned char key[32]);
void dc_unlock(int fd);
int dc_mkdirs(const char *dir);

#endif
