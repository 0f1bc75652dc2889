/* tests/fuzz/fuzz_spec.c — Hugging Face configs and run specs: spec_load (either form) and
 * spec_validate, as `loom ir|train SPEC` read them, and config_load on the same bytes (a
 * config named by a spec's "model").  A spec that validates and describes a small model is
 * built into IR (frontend_build), which must then verify: the frontend must refuse what it
 * cannot build, not hand the passes a malformed module.  Invariant: every refusal has a
 * message. */
#include "frontend/build.h"
#include "frontend/config.h"
#include "tests/fuzz/fuzz_util.h"

static RunSpec spec;   /* large (paths): not on the stack */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *path = fuzz_write("spec.json", data, size);
  char err[IR_ERR_LEN] = "";
  ModelConfig cfg;
  if (config_load(path, &cfg, err, sizeof err)) fuzz_check_message("config_load", err);
  err[0] = 0;
  if (spec_load(path, &spec, err, sizeof err)) {
    fuzz_check_message("spec_load", err);
  } else if (spec_validate(&spec, err, sizeof err)) {
    fuzz_check_message("spec_validate", err);
  } else {
    const ModelConfig *c = &spec.model;
    /* small enough to build in a fuzzing iteration (the graph's size grows with layers) */
    if (c->n_layer <= 4 && c->hidden <= 4096 && c->vocab_size <= 65536 && c->n_head <= 64 &&
        config_param_count(c) <= 50000000) {
      Module *m = NULL;
      err[0] = 0;
      if (frontend_build(&spec, "fuzz", &m, err, sizeof err)) {
        fuzz_check_message("frontend_build", err);
      } else if (verify_module(m, err, sizeof err)) {
        fuzz_fail("a validated spec built a module that does not verify: %s", err);
      }
      module_free(m);
    }
  }
  free(path);
  return 0;
}
