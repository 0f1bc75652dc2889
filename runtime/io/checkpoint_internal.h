/* runtime/io/checkpoint_internal.h — what checkpoint.c (whole checkpoints) and
 * checkpoint_shards.c (one shard per rank) share: the file and folder helpers of the commit
 * protocol and the DONE marker. */
#ifndef LOOM_RUNTIME_CHECKPOINT_INTERNAL_H
#define LOOM_RUNTIME_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t step;
  uint64_t size[3];     /* model.safetensors, optimizer.safetensors, state.json */
  uint32_t crc[3];
  int n_shards;         /* a sharded checkpoint: state.json and n_shards shard files (0: whole) */
  uint64_t *sh_size;    /* [n_shards] (malloc'd; ckpt_done_free) */
  uint32_t *sh_crc;
} Done;

int ckpt_file_digest(const char *path, uint64_t *size, uint32_t *crc, char *err, size_t errlen);
char *ckpt_pjoin(const char *a, const char *b);   /* a "/" b, malloc'd (NULL: out of memory) */
int ckpt_is_dir(const char *p);
int ckpt_fsync_dir(const char *dir, char *err, size_t errlen);
int ckpt_remove_step_dir(const char *dir, char *err, size_t errlen);
int ckpt_write_text(const char *path, const char *text, char *err, size_t errlen);
int ckpt_read_done(const char *dir, Done *d, char *err, size_t errlen);
void ckpt_done_free(Done *d);
/* checkpoint_shards.c: the shards of a sharded step folder into c->shards (memory-mapped,
   each checked against DONE's size and CRC-32C). */
struct Checkpoint;
int ckpt_load_shards(const char *stepdir, const Done *d, struct Checkpoint *c, char *err, size_t errlen);
/* "shard-RRRRR-of-WWWWW.safetensors" into out (n bytes). */
void ckpt_shard_name(int rank, int world, char *out, size_t n);

#endif
