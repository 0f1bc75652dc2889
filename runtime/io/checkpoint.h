/* Training checkpoints that a killed or crashed writer can never leave looking valid.
 *
 * Layout: SAVE_DIR/step_00000012/{model.safetensors, optimizer.safetensors, state.json, DONE}
 * (the step is zero-padded to 8 digits; larger steps simply have more).
 *
 * Commit protocol (ckpt_save): the three files are written and fsync'd in
 * SAVE_DIR/step_00000012.tmp.<pid>/, that folder is fsync'd and renamed to step_00000012,
 * SAVE_DIR is fsync'd, and only then is DONE written (atomically, fsync'd). DONE records
 * the step and, for each file, its byte size and CRC-32C (Castagnoli polynomial, reflected,
 * init and final xor 0xFFFFFFFF: the checksum of ext4, iSCSI and TFRecord) over the whole
 * file. A folder without DONE is an unfinished write; a file that disagrees with DONE was
 * damaged later. Readers trust nothing else.
 *
 * Functions return 0 on success, 2 for bad input (incomplete or corrupt checkpoint, bad
 * arguments) and 1 for I/O or memory failure, with a one-line message in err (if not NULL).
 */
#ifndef LOOM_RUNTIME_CHECKPOINT_H
#define LOOM_RUNTIME_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/io/safetensors.h"

/* One f32 tensor to save; data holds prod(shape) floats (may be NULL when that is 0). */
typedef struct {
  const char *name;
  int rank;
  int64_t shape[ST_MAX_RANK];
  const float *data;
} CkptTensor;

/* Writes a checkpoint of STEP under SAVE_DIR (created, with its parents, if needed).
 * params -> model.safetensors (names as given, e.g. HF names), state -> optimizer.safetensors
 * (e.g. "adam_m.wte.weight"), state_json (must be valid JSON text) -> state.json.
 * An existing folder for the same step is replaced. */
int ckpt_save(const char *save_dir, int64_t step, const CkptTensor *params, int n_params,
              const CkptTensor *state, int n_state, const char *state_json, char *err,
              size_t errlen);

/* PATH is a save dir or a step folder. For a save dir, picks the newest step_<digits> folder
 * that has a DONE marker; *.tmp.* and other names are ignored. Writes the folder's path
 * into stepdir (n bytes) and its step into *step. Returns 2 with a message when no complete
 * checkpoint exists. On success err is "" or, when newer folders without DONE were skipped,
 * a one-line note naming them that the caller may print as a warning. */
int ckpt_latest(const char *path, char *stepdir, size_t n, int64_t *step, char *err,
                size_t errlen);
/* The same among the steps below `below` (a fallback past a damaged newer one).  step_*
 * entries that are symbolic links are skipped (noted in err), and a step folder passed itself
 * whose DONE records another step than its name is refused (2). */
int ckpt_latest_below(const char *path, int64_t below, char *stepdir, size_t n, int64_t *step, char *err,
                      size_t errlen);

typedef struct Checkpoint {
  StFile params, state; /* model.safetensors, optimizer.safetensors */
  char *state_json;     /* NUL-terminated contents of state.json */
  int64_t step;         /* as recorded in DONE */
  int n_shards;         /* a sharded checkpoint (ckpt_save_shards): params and state empty, */
  StFile *shards;       /* the writer's ranks' shards, memory-mapped */
} Checkpoint;

/* Loads and verifies a step folder: refuses (2) when DONE is missing or damaged, when a
 * file's size or CRC-32C differs from DONE, or when a file fails st_read validation or
 * state.json is not JSON. On failure *out is zeroed. */
int ckpt_load(const char *stepdir, Checkpoint *out, char *err, size_t errlen);
void ckpt_free(Checkpoint *c); /* safe on a zeroed Checkpoint; zeroes it */

/* ---- sharded checkpoints (checkpoint_shards.c): every rank of a multi-process mesh writes
 * its own pieces ---------------------------------------------------------------------------
 *
 * Layout: SAVE_DIR/step_00000012/{shard-00000-of-00004.safetensors, ..., state.json, DONE}.
 * A shard holds the pieces its rank owns (a piece replicated over some axes is written by the
 * rank of coordinate 0 on them, so every element is in exactly one shard), f32, under the
 * globals' names, shaped as the piece; its __metadata__ says where each piece sits in the
 * whole tensor: "loom.mesh" (dp,tp,cp,pp,ep sizes) and "loom.coord" (the writer's
 * coordinates) for the file, and per tensor N "loom.split.N" (per mesh axis, the dim it
 * splits + 1, 0 for none) and, for a stack of experts, "loom.experts.N" (how many).  DONE
 * lists state.json and every shard with its size and CRC-32C, and "shards": the count.
 * Commit protocol: rank 0 makes SAVE_DIR/step_X.tmp.<rank 0's pid>/, every rank writes and
 * fsyncs its shard there, rank 0 gathers their sizes and checksums, writes state.json,
 * renames the folder and writes DONE last: a folder is complete only when every rank wrote.
 * The ranks meet through `gather` (all[r*bytes..] = rank r's mine[bytes], every rank calling
 * it the same number of times); every rank returns rank 0's verdict.  A rank that failed to
 * gather its pieces still calls it, with n = -1, so that the others fail too. */
typedef int (*CkptAllGather)(void *arg, const void *mine, void *all, size_t bytes, char *err, size_t errlen);
int ckpt_save_shards(const char *save_dir, int64_t step, int rank, int world, const StTensor *pieces, int n,
                     const char *const *meta_keys, const char *const *meta_values, int n_meta, const char *state_json,
                     CkptAllGather gather, void *arg, char *err, size_t errlen);

/* From a sharded checkpoint, any writer's layout: tensor `name`'s elements [w0, w0 + count)
   of the whole tensor (row-major over its IR dims) into out, or (ckpt_shards_read_piece) the
   piece of placement dst on a mesh of sizes mesh at coordinates coord (dst->n floats).
   2 with a message when the shards lack the tensor or do not cover what is asked. */
#include "runtime/program.h"
int ckpt_shards_read_range(const Checkpoint *c, const char *name, int64_t w0, int64_t count, float *out, char *err,
                           size_t errlen);
int ckpt_shards_read_piece(const Checkpoint *c, const char *name, const RtGlobal *dst, const int64_t mesh[5],
                           const int coord[5], float *out, char *err, size_t errlen);
/* A stack of experts' view "P.experts.<e>.X" (rt_expert_name): the stack tensor's name (into
   stack, n bytes), e, and the elements per expert; 0, or -1 when no stack of the shards has it. */
int ckpt_shards_expert(const Checkpoint *c, const char *view, char *stack, size_t n, int64_t *e, int64_t *per);

/* Keeps the newest KEEP (>= 1) complete checkpoints in SAVE_DIR and deletes older complete
 * ones (DONE first, so a crash mid-delete leaves an ignored incomplete folder, never a
 * complete-looking partial one). Folders without DONE and other files are left alone. */
int ckpt_prune(const char *save_dir, int keep, char *err, size_t errlen);

/* The checkpoint name of expert e of a stack of experts "P.experts.X": "P.experts.<e>.X.weight"
   (any prefix such as "adam_m." kept; ir_expert_name's copy).  0, or -1 when it does not fit. */
int rt_expert_name(const char *name, int64_t e, char *buf, size_t n);

/* ---- the save dir (checkpoint_dir.c) ---- */
/* One run writes a save dir at a time: ckpt_lock creates SAVE_DIR (with its parents) and
 * takes an exclusive flock on SAVE_DIR/loom.lock, writing this pid into it.  2 with a
 * message naming the holder's pid when another live process holds it (a dead holder's lock is
 * gone with it), or when the folder cannot be made or written.  *fd: keep it open while
 * writing; ckpt_unlock closes it. */
#define CKPT_LOCK_NAME "loom.lock"
/* mkdir -p: DIR and its missing parents (checkpoint.c). */
int ckpt_mkdir_p(const char *dir, char *err, size_t errlen);
int ckpt_lock(const char *save_dir, int *fd, char *err, size_t errlen);
void ckpt_unlock(int fd);
/* Removes the step_N.tmp.<pid> and step_N.old.<pid> folders of processes that no longer
 * exist (a killed writer's); a note per folder on log (may be NULL).  Returns how many. */
#include <stdio.h>
int ckpt_clean_tmp(const char *save_dir, FILE *log);

/* CRC-32C (Castagnoli) of n bytes, continuing from crc (0 to start): the checksum in DONE.
 * ckpt_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t ckpt_crc32c(uint32_t crc, const void *data, size_t n);

#endif
