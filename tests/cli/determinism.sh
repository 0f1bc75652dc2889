#!/usr/bin/env bash
# Results do not depend on the thread count (README "Determinism"): every tiny model, in
# f32 and bf16, the bench model at 512 tokens, and dp=2 x tp=2 meshes train with --threads
# 1, 2 and 3 on the cpu backend and must write bitwise the same final parameters, losses and
# gradient norms.
#
# The batch is raised to 8 x 64 (512 tokens) so that the GEMMs are big enough to be cut into
# several tiles (runtime/cpu/cpu_gemm.h) and the builtins and JIT kernels split across threads;
# at the specs' 2 x 32 most of the work runs on one thread whatever --threads says.  Before
# loom tiled its GEMMs itself, this test failed on AMD EPYC (Zen) with Debian's OpenBLAS
# 0.3.21, whose threaded sgemm gives other bits for 1 and 2 threads.
#
# The mesh splits --threads among its 4 ranks (at least one each), so 1, 2 and 3 all mean
# one thread a rank; 8 and 12 (2 and 3 a rank) are run as well, so that each rank's GEMMs
# and kernels really split.
LOOM=$1 ST_DIFF=$2
. "$(dirname "$0")/lib.sh"

same_bits() {   # what, flags... : trains with each thread count in $THREADS, compares with the first
  local what=$1 first="" t
  shift
  for t in $THREADS; do
    run "$LOOM" train "$@" -q --threads "$t" --out "$TMP/t$t.st"
    if [ "$RC" -ne 0 ] || crashed; then
      fail "$what: the run with --threads $t failed"
      show_last
      return
    fi
    if [ -z "$first" ]; then first=$t; continue; fi
    if cmp -s "$TMP/t$first.st" "$TMP/t$t.st"; then
      pass "$what: --threads $t gives the bits of --threads $first"
    else
      fail "$what: --threads $t changes the result" \
        "$("$ST_DIFF" "$TMP/t$t.st" "$TMP/t$first.st" --rtol 0 2>&1 | grep -m 3 -e FAIL -e differ)"
    fi
  done
}

# 512 tokens a step need more than the goldens' shards hold: bytes of the demo text (ASCII,
# inside every tiny vocabulary).
head -c 20000 data/shakespeare.txt > "$TMP/text.txt"
expect_exit 0 "a byte-level shard of the demo text" "$LOOM" data "$TMP/text.txt" -o "$TMP/text.bin"
D=(--data "$TMP/text.bin")

THREADS="1 2 3"
for m in gpt2-tiny llama-tiny llama-tiny-tied mixtral-tiny qwen3-moe-tiny; do
  spec=tests/golden/$m/train_spec.json
  same_bits "$m f32" $spec --backend cpu "${D[@]}" --steps 2 --batch 8 --seq 64
  same_bits "$m bf16" $spec --backend cpu "${D[@]}" --steps 2 --batch 8 --seq 64 --precision bf16
done
# The bench model's shapes (D 256, MLP 1024, vocabulary 4096; batch 2 x 256 = 512 tokens):
# [512,256]x[256,768], the [4096,512]x[512,256] lm_head weight gradient, ...
same_bits "bench-gpt2-small f32, 512 tokens" models/bench-gpt2-small.json --backend cpu "${D[@]}" --steps 1 --batch 2
spec=tests/golden/llama-tiny/train_spec.json
same_bits "llama-tiny dp=2 x tp=2, ZeRO-1, sequence parallel" $spec --backend cpu "${D[@]}" --steps 2 --batch 8 --seq 64 \
  --mesh dp=2,tp=2 --zero 1 --sequence-parallel true
THREADS="1 8 12"
same_bits "llama-tiny dp=2 x tp=2 (several threads a rank)" $spec --backend cpu "${D[@]}" --steps 2 --batch 8 --seq 64 \
  --mesh dp=2,tp=2
same_bits "llama-tiny cp=2 ring attention (several threads a rank)" $spec --backend cpu "${D[@]}" --steps 2 --batch 8 --seq 64 \
  --mesh cp=2
same_bits "mixtral-tiny ep=2 x dp=2 (several threads a rank)" tests/golden/mixtral-tiny/train_spec.json --backend cpu \
  "${D[@]}" --steps 2 --batch 8 --seq 64 --mesh ep=2,dp=2
spec=tests/golden/gpt2-tiny/train_spec.json
same_bits "gpt2-tiny dp=2 x tp=2 (several threads a rank)" $spec --backend cpu "${D[@]}" --steps 2 --batch 8 --seq 64 \
  --mesh dp=2,tp=2
finish
