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

/* The decode graph (loom sample): module @<name> with the parameters, a KV cache per layer
   (state kv_cache.l<N>.k and .v, [B,tmax,KV,Dh], zeros) and
     func @decode(%tokens: i32[B,T], %positions: i32[B,T]) -> (f32[B,T,V] logits)
   which writes the new tokens' keys and values at their positions and attends each new
   token to the cache up to its own position (the spec's batch and seq are B and T). */
int frontend_build_decode(const RunSpec *spec, const char *name, int64_t tmax, Module **out, char *err, size_t errlen);

/* A module name from a file path: "models/gpt2-124M.json" -> "gpt2-124M". */
void frontend_module_name(const char *path, char *buf, size_t n);

#endif
