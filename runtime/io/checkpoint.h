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

typedef struct {
  StFile params, state; /* model.safetensors, optimizer.safetensors */
  char *state_json;     /* NUL-terminated contents of state.json */
  int64_t step;         /* as recorded in DONE */
} Checkpoint;

/* Loads and verifies a step folder: refuses (2) when DONE is missing or damaged, when a
 * file's size or CRC-32C differs from DONE, or when a file fails st_read validation or
 * state.json is not JSON. On failure *out is zeroed. */
int ckpt_load(const char *stepdir, Checkpoint *out, char *err, size_t errlen);
void ckpt_free(Checkpoint *c); /* safe on a zeroed Checkpoint; zeroes it */

/* Keeps the newest KEEP (>= 1) complete checkpoints in SAVE_DIR and deletes older complete
 * ones (DONE first, so a crash mid-delete leaves an ignored incomplete folder, never a
 * complete-looking partial one). Folders without DONE and other files are left alone. */
int ckpt_prune(const char *save_dir, int keep, char *err, size_t errlen);

/* CRC-32C (Castagnoli) of n bytes, continuing from crc (0 to start): the checksum in DONE.
 * ckpt_crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t ckpt_crc32c(uint32_t crc, const void *data, size_t n);

#endif
