#!/usr/bin/env bash
# tests/cli/gpu_cost.sh — `loom ir --target cuda --cost` (codegen/cuda/cost.c): the totals of a
# small hand-written module checked against counts made by hand below, GPT-2's GEMM FLOPs
# against the 6·N·tokens formula, the launch count of a step with gradient accumulation, and
# the refusals.
LOOM=$1
. "$(dirname "$0")/lib.sh"

cat > "$TMP/cost.ir" <<'IR'
module @cost {
  mesh dp=1 tp=1 cp=1 pp=1 ep=1

  func @main(%x: bf16[2,4,8], %w: bf16[8,16], %g: f32[16], %b: f32[16]) -> (f32[2,4,16], f32[16]) {
    %y = matmul %x, %w : bf16[2,4,16]
    %n = layernorm %y, %g, %b {eps=1e-05} : bf16[2,4,16]
    %c = cast %n : f32[2,4,16]
    %e = exp %c : f32[2,4,16]
    %s = reduce_sum %e {dims=[0,1]} : f32[16]
    return %e, %s
  }

  func @other(%a: f32[64], %q: bf16[1,8,2,16], %k: bf16[1,8,2,16], %v: bf16[1,8,2,16]) -> (bf16[64], bf16[1,8,2,16]) {
    %h = cast %a : bf16[64]
    %o = attention %q, %k, %v {scale=0.25, causal=true} : bf16[1,8,2,16]
    return %h, %o
  }
}
IR
# By hand (no @grad_step: every function once):
#   matmul   batch 2 (shared weight), M 4, N 16, K 8: 2*2*4*16*8 = 2048 FLOP; bytes x 64*2 + w 128*2
#            + y 128*2 = 640                                                          gemm
#   layernorm y 256 + g 64 + b 64 + n 256 = 640 bytes                                  norm
#   the fused cast, exp and column sum: n 256 in, e 128*4 + s 16*4 out = 832 bytes    reduce
#   cast f32[64] -> bf16[64]: 256 + 128 = 384 bytes                                    cast
#   causal attention B 1 T 8 H 2 D 16 S 8: 4*1*2*8*8*16/2 = 4096 FLOP; q k v o 4*512 = 2048 bytes
#   5 launches, 6144 FLOP, 4544 bytes, 1856 of them outside gemm and attention
expect_exit 0 "--cost --json of a hand-written module" "$LOOM" ir "$TMP/cost.ir" --passes=verify,lower --target cuda --cost --json
cp "$OUT" "$TMP/cost.json"
check "the totals are the hand counts" python3 - "$TMP/cost.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
want = {"gemm": (1, 2048, 640), "norm": (1, 0, 640), "reduce": (1, 0, 832), "cast": (1, 0, 384),
        "attention": (1, 4096, 2048)}
for k, v in c["categories"].items():
    got = (v["launches"], v["flops"], v["bytes"])
    if got != want.get(k, (0, 0, 0)):
        sys.exit(f"{k}: {got}, want {want.get(k, (0, 0, 0))}")
assert (c["launches"], c["flops"], c["bytes"], c["bytes_outside_gemm_attention"]) == (5, 6144, 4544, 1856), c
# the bound of the attention step: its bytes over the H100's 3.35 TB/s (above its FLOPs at 989.5 TFLOP/s)
a = [s for s in c["steps"] if s["category"] == "attention"][0]
assert abs(a["bound_us"] - 2048 / 3.35e12 * 1e6) < 1e-9, a
PY

# GPT-2 (gpt2-tiny: L 2, D 64, V 256, MLP 4D; batch 2 x seq 32): the GEMMs of a step do
# 6·N·tokens FLOPs, N the weights of every matmul (the tied lm_head included)
L=2 D=64 V=256 tok=$((2 * 32))
N=$((L * 12 * D * D + V * D))
expect_exit 0 "gpt2-tiny --cost --json" "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --batch 2 --seq 32 --cost --json
cp "$OUT" "$TMP/tiny.json"
check "gpt2-tiny: the GEMMs' FLOPs = 6·N·tokens = $((6 * N * tok))" python3 -c "
import json, sys
c = json.load(open('$TMP/tiny.json'))
sys.exit(0 if c['categories']['gemm']['flops'] == $((6 * N * tok)) else 'got %d' % c['categories']['gemm']['flops'])"

# two micro-batches: the first's @grad_step (it writes the gradients: codegen/cuda/lower_grads.c),
# the second's, @optimizer_step's once; the first writes them with as many launches or fewer
# (its fills of the gradients no GEMM writes, merged, and the optimizer's fills gone)
expect_exit 0 "gpt2-tiny --grad-accum 2 --cost" "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --grad-accum 2 --cost
check "launches a step = @grad_step.first's steps + @grad_step's + @optimizer_step's" awk '
  $1 == "@grad_step.first" { f++ } $1 == "@grad_step" { g++ } $1 == "@optimizer_step" { o++ }
  / loom_fill_.*\$grad/ && $1 != "@grad_step.first" { bad++ } /^launches a step:/ { n = $4 }
  END { if (f == 0 || g == 0 || o == 0 || n != f + g + o || f > g + 2 || bad) { print f, g, o, n, bad; exit 1 } }' "$OUT"
expect_stdout_contains "@grad_step.first x 1, @grad_step x 1, @optimizer_step x 1"
expect_exit 0 "gpt2-tiny --grad-accum 2 --cost, LOOM_CUDA_NO_GRAD_WRITE=1" env LOOM_CUDA_NO_GRAD_WRITE=1 "$LOOM" ir \
  models/gpt2-tiny.json --passes=train,lower --target cuda --grad-accum 2 --cost
check "LOOM_CUDA_NO_GRAD_WRITE=1: 2 x @grad_step's steps + @optimizer_step's (its fills)" awk '
  $1 == "@grad_step" { g++ } $1 == "@optimizer_step" { o++ } $1 == "@optimizer_step" && / loom_fill_/ { z++ }
  /^launches a step:/ { n = $4 } END { if (g == 0 || o == 0 || z == 0 || n != 2 * g + o) { print g, o, z, n; exit 1 } }' "$OUT"
expect_stdout_contains "@grad_step x 2, @optimizer_step x 1"

# with LOOM_CUDA_FUSE_BF16=0 a bf16 program keeps the CPU's rounding points: no epilogue, no
# bf16 product accumulated in its GEMM (the cast and accumulate still one kernel)
LOOM_CUDA_FUSE_BF16=0 expect_exit 0 "gpt2-tiny bf16 --cost, the bf16 fusions off" "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --precision bf16 --cost
check "no GEMM epilogue and no GEMM accumulation in bf16 with LOOM_CUDA_FUSE_BF16=0 (the bias gradients alone)" test "$(grep -c '+ bias\|+ residual\|(+= \$grad\|gelu backward' "$OUT")" = 0

# weight gradients accumulated in their GEMM (beta = 1): gpt2-tiny's attn.c_proj, mlp.c_fc
# and mlp.c_proj of 2 layers (c_attn's gradient is a sum of its q, k, v pieces, and wte's the
# embedding's and the lm_head's), and every other narrow gradient cast while it is accumulated
expect_exit 0 "gpt2-tiny bf16 --cost" "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --precision bf16 --cost
check "6 GEMMs accumulate into their f32 weight gradient" test "$(grep -c '(+= \$grad\.h\.[01]\.\(attn\.c_proj\|mlp\.c_fc\|mlp\.c_proj\)\.weight)' "$OUT")" = 6
# (of the 17 narrow gradients, the 5 norms' 10 dw and db are added by the norm gradient's own
# launch, codegen/cuda/lower_fuse.c; the other 7 are cast while accumulated)
check "17 narrow gradients: 7 cast while accumulated, 5 norm gradients add their 10, no cast step left before an accumulate" awk '
  /accumulate \$grad.*\(cast\)/ { n++ } /layernorm_grad .*statistics.*\(\+= \$grad/ { m++ }
  $3 == "cast" { c = 1; next } c && / accumulate \$grad/ { bad++ } { c = 0 }
  END { exit !(n == 7 && m == 5 && !bad) }' "$OUT"
# GEMM epilogues: per layer the q, k, v projections add their bias, attn.c_proj and
# mlp.c_proj their bias and the residual, mlp.c_fc its bias and GELU (2 layers: 12 GEMMs); with
# a padded vocabulary the lm_head adds the mask as its bias (13)
check "12 GEMMs with a bias epilogue: 6 bias, 4 bias + residual, 2 bias + gelu" awk '
  /matmul .* \+ bias, gelu/ { g++; next } /matmul .* \+ bias \+ residual/ { r++; next } /matmul .* \+ bias/ { b++ }
  END { if (b != 6 || r != 4 || g != 2) { print b, r, g; exit 1 } }' "$OUT"
"$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --precision bf16 --vocab-multiple 96 --cost > "$TMP/vm" 2>&1
check "--vocab-multiple 96: the mask is the lm_head GEMM's bias (13 bias epilogues)" test "$(grep -c 'matmul .* + bias' "$TMP/vm")" = 13
# bias gradients in the weight-gradient GEMM (cuBLASLt BGRADA): q, k, v, attn.c_proj and
# mlp.c_proj, 5 a layer; mlp.c_fc's in the GEMM before GELU's backward, which computes that
# backward too (DGELU_BGRAD: 1 a layer); the 12 reduction launches gone, left: the loss's and wpe's
check "10 weight-gradient GEMMs write their bias gradient, 2 GEMMs GELU's backward and its; 2 reductions left" awk '
  /matmul.*, gelu backward, bias gradient/ { d++; next } /matmul.*, bias gradient/ { g++ }
  $1 == "@grad_step.first" && $3 == "reduce" { r++ }
  END { if (g != 10 || d != 2 || r != 2) { print g, d, r; exit 1 } }' "$OUT"
n_fused=$(awk '/^launches a step:/ { print $4 }' "$OUT")
n_unfused=$(LOOM_CUDA_NO_EPILOGUE=1 LOOM_CUDA_NO_ACC_FUSION=1 "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --precision bf16 --cost |
  awk '/^launches a step:/ { print $4 }')
# the q, k, v projections' input gradient: the second GEMM adds the first product, the third
# adds that and writes the sum (2 layers)
check "2 GEMMs finish the sum of three products" test "$(grep -c 'matmul .*(the sum of three)' "$OUT")" = 2
# c_attn's gradients: q, k and v's weight-gradient GEMMs add into their third of the f32
# gradient (a row stride), their bias gradients are accumulated into their third by a step
# each; one pad left in @grad_step (wpe's gradient, the positions past the sequence)
check "6 GEMMs and 6 steps add into a part of c_attn's gradients, 1 pad left" awk '
  /matmul.*\(\+= a part of a gradient\)/ { g++; next } /accumulate into a part of a gradient/ { a++ }
  $1 == "@grad_step.first" && / loom_pad_/ { p++ }
  END { if (g != 6 || a != 6 || p != 1) { print g, a, p; exit 1 } }' "$OUT"
# unfused: each of the 6 GEMMs' cast and accumulate, the 7 casts, the norms' 10 casts and
# accumulates, the 12 epilogues' kernels, the 10 bias reductions, the 2 GELU backward kernels
# and the 2 sums are launches of their own, and per layer c_attn's gradient trees: 6 pads, 3 sum
# kernels and 2 accumulates for the 3 steps; and the tied table's gradient: the embedding's fill,
# the sum kernel and the accumulate (its pieces add into it in place: "whole leaves"); less 2:
# since fuse keeps a group open across a write that touches nothing it reads (passes/fuse.c),
# a layer's unfused adds share a kernel with a neighbour (one launch fewer a layer)
check "the unfused program (LOOM_CUDA_NO_EPILOGUE=1 LOOM_CUDA_NO_ACC_FUSION=1): $n_unfused launches = $n_fused + 2 x 6 + 7 + 2 x 10 + 12 + 10 + 2 + 2 + 2 x 8 + 3 - 2" \
  test "$n_unfused" = $((n_fused + 82))

# slices as views (codegen/cuda/lower_gemm.c): in fp32 the q, k, v weight slices (read by
# their GEMMs through a row stride), the bias slices and wpe's rows are no launches (13 copies
# with LOOM_CUDA_NO_VIEWS=1); in bf16 the weights' bf16 copies (codegen/cuda/lower_fuse.c) live
# as long as the parameters, so their slices are views too (with the casts,
# LOOM_CUDA_NO_WEIGHT_COPIES=1, the 6 weight slices stay: the cast dies before the backward)
n_sl=$("$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --cost | grep -c 'loom_slice')
n_sl_copy=$(LOOM_CUDA_NO_VIEWS=1 "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --cost | grep -c 'loom_slice')
check "fp32: no slice launch ($n_sl), 13 with LOOM_CUDA_NO_VIEWS=1 ($n_sl_copy)" test "$n_sl:$n_sl_copy" = "0:13"
n_sl=$("$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --precision bf16 --cost | grep -c 'loom_slice')
n_sl_cast=$(LOOM_CUDA_NO_WEIGHT_COPIES=1 "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target cuda --precision bf16 \
  --cost | grep -c 'loom_slice')
check "bf16: no slice launch ($n_sl), the 6 weight slices with LOOM_CUDA_NO_WEIGHT_COPIES=1 ($n_sl_cast)" \
  test "$n_sl:$n_sl_cast" = "0:6"

expect_exit 2 "--cost needs the CUDA target" "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --cost
expect_stderr_contains "--target=cuda"
expect_exit 2 "--cost needs the lowered program" "$LOOM" ir models/gpt2-tiny.json --passes=train --target cuda --cost
expect_stderr_contains "add lower to --passes"
expect_exit 2 "--json alone" "$LOOM" ir models/gpt2-tiny.json --json
expect_stderr_contains "--json goes with --cost"
# The memory plan counts the CUDA backend's bf16 weight copies (lower_fuse.c): half the
# parameters' f32 bytes in a bf16 program, none in fp32 or on the cpu target.
cp_b=$("$LOOM" ir models/gpt2-tiny.json --passes=train,lower --memory --target cuda --precision bf16 2>&1 | sed -n 's/^  weight copies .*(\([0-9]*\) bytes.*/\1/p')
par_b=$("$LOOM" ir models/gpt2-tiny.json --passes=train,lower --memory --target cuda --precision bf16 2>&1 | sed -n 's/^  parameters .*(\([0-9]*\) bytes).*/\1/p')
none=0
"$LOOM" ir models/gpt2-tiny.json --passes=train,lower --memory --target cuda 2>&1 | grep -q 'weight copies' && none=1
"$LOOM" ir models/gpt2-tiny.json --passes=train,lower --memory --precision bf16 2>&1 | grep -q 'weight copies' && none=1
check "--memory on cuda bf16 counts the weight copies: $cp_b bytes = half of the parameters' $par_b; none in fp32 or on the cpu" \
  test -n "$cp_b" -a "$cp_b" = "$(( ${par_b:-0} / 2 ))" -a $none = 0

finish
