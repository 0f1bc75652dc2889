/* frontend/build.h — from a run spec to an IR module.
 *
 *   build.c  the forward graphs of GPT-2 and Llama with their loss, parameters named as
 *            in Hugging Face checkpoints and initialized GPT-2 style
 */
#ifndef LOOM_FRONTEND_BUILD_H
#define LOOM_FRONTEND_BUILD_H

#include "frontend/config.h"
#include "ir/ir.h"

/* Builds module @<name> with the parameters and
     func @forward(%tokens: i32[B,T], %targets: i32[B,T]) -> (f32[B,T,V] logits, f32[] loss)
   where loss is the mean cross-entropy over all B*T positions. */
int frontend_build(const RunSpec *spec, const char *name, Module **out, char *err, size_t errlen);

/* A module name from a file path: "models/gpt2-124M.json" -> "gpt2-124M". */
void frontend_module_name(const char *path, char *buf, size_t n);

#endif
