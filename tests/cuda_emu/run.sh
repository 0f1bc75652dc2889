#!/usr/bin/env bash
# The CUDA backend on the emulated device (see emu.h): loom's own NVRTC, driver and cuBLASLt
# calls go to the test doubles built beside it, and the CUDA translation unit runs as host
# code.  Runs tests/gpu/test_train.sh (the GPU session's training and golden checks) in its
# emulated mode, then longer sequences against the CPU backend, the same bits with the
# threads of every block run in reverse order, a compiled executable's embedded module, and a
# CPU mesh's checkpoint resumed on CUDA.
#   bash tests/cuda_emu/run.sh LOOM ST_DIFF LIBCUDA LIBNVRTC LIBCUBLASLT
# Not a GPU check: speed, registers and the memory model stay owed to tests/gpu/run.sh.
LOOM=$1 ST_DIFF=$2
export LOOM_LIBCUDA=$3 LOOM_LIBNVRTC=$4 LOOM_LIBCUBLASLT=$5
for f in "$LOOM_LIBCUDA" "$LOOM_LIBNVRTC" "$LOOM_LIBCUBLASLT"; do
  [ -f "$f" ] || { echo "FAIL: $f not built"; exit 1; }
done
command -v "${LOOM_EMU_CXX:-g++}" > /dev/null || { echo "SKIPPED: no C++ compiler for the emulated device"; exit 0; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# the suite's shared cache under ctest (CMakeLists.txt), else one of our own
export LOOM_CACHE_DIR=${LOOM_CACHE_DIR:-$tmp/cache} TMPDIR=$tmp
pass=0 fail=0
# memo OUT [VAR=value...] LOOM ARGS...: `env VAR=value... LOOM ARGS --out OUT`, run once per
# distinct command: the checks below that compare against the same program share its run
memo() {
  local out=$1 key; shift
  key=$(printf '%s\0' "$@" | md5sum | cut -c1-32)
  [ -s "$tmp/memo-$key.st" ] || env "$@" --out "$tmp/memo-$key.st" || return 1
  cp "$tmp/memo-$key.st" "$out"
}
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null
LOOM_EMULATED=1 bash tests/gpu/test_train.sh "$(dirname "$LOOM")" "$LOOM" "$ST_DIFF" && ok "tests/gpu/test_train.sh on the emulated device" ||
  bad "tests/gpu/test_train.sh on the emulated device"

# loom check on the emulated device: every golden's forward, gradients and 3 training steps
# on cuda, at the default tolerances (README "Golden folders"); qwen3-moe-tiny is a mixture of
# experts (mixtral-tiny's checks follow below)
# (llama3-tiny: llama3 RoPE scaling; qwen2-tiny: q/k/v biases; qwen3-tiny: q/k norms;
# mistral-tiny: the sliding window in the flash kernels, fp32 and bf16)
for g in gpt2-tiny llama-tiny llama-tiny-tied qwen3-moe-tiny llama3-tiny qwen2-tiny qwen3-tiny mistral-tiny; do
  "$LOOM" check tests/golden/$g --backend cuda > "$tmp/check" 2>&1 &&
    ok "loom check tests/golden/$g --backend cuda: $(grep -E '^cuda ' "$tmp/check" | tr -s ' ' | cut -c1-150)" ||
    { bad "loom check tests/golden/$g --backend cuda"; cat "$tmp/check"; }
done

"$LOOM" check tests/golden/mistral-tiny --backend cuda --precision bf16 > "$tmp/check" 2>&1 &&
  ok "loom check tests/golden/mistral-tiny --backend cuda --precision bf16 (the tensor-core kernels' window)" ||
  { bad "loom check tests/golden/mistral-tiny --backend cuda --precision bf16"; cat "$tmp/check"; }

# Greedy sampling on the device with Mistral's window (attention_cached, kernels/decode.cuh
# i[6]): 40 new tokens after a 17-byte prompt = transformers' generate (generate.json)
g=tests/golden/mistral-tiny
python3 -c "import json; c = json.load(open('$g/generate.json'))['cases'][1]
open('$tmp/mprompt', 'w').write(c['prompt']); print(' '.join(map(str, c['new_ids'])))" > "$tmp/mwant"
"$LOOM" sample $g/config.json --weights $g/weights.safetensors --prompt "$(cat "$tmp/mprompt")" --max-new-tokens 40 \
  --temperature 0 --ids --backend cuda > "$tmp/mgot" 2> "$tmp/mlog" && cmp -s "$tmp/mgot" "$tmp/mwant" &&
  ok "mistral-tiny greedy sampling on cuda (window 8 over 57 positions) = transformers' generate" ||
  { bad "mistral-tiny greedy sampling on cuda"; cat "$tmp/mgot" "$tmp/mlog"; }

# The CPU benchmark's model (head size 64, vocabulary 4096) in bf16 at seq 128: one step's
# gradients within 2e-2 of the CPU backend (the tensor-core attention at head size 64)
"$LOOM" train models/bench-gpt2-small.json --steps 1 --batch 1 --seq 64 --data "$tmp/d.bin" --out "$tmp/w.st" > "$tmp/log" 2>&1 ||
  cat "$tmp/log"
sed 's/"precision": *"fp32"/"precision": "bf16"/' models/bench-gpt2-small.json > "$tmp/bench16.json"
for b in cpu cuda; do
  memo "$tmp/bench_$b.st" "$LOOM" eval "$tmp/bench16.json" --weights "$tmp/w.st" --tokens "$tmp/d.bin" --batch 1 --seq 128 \
    --grads --backend $b > "$tmp/log" 2>&1 || cat "$tmp/log"
done
"$ST_DIFF" "$tmp/bench_cuda.st" "$tmp/bench_cpu.st" --rtol 2e-2 > "$tmp/diff" 2>&1 &&
  ok "bench-gpt2-small bf16 seq 128: logits, loss and every gradient within 2e-2 of the CPU backend" ||
  { bad "bench-gpt2-small bf16 against the CPU"; grep FAIL "$tmp/diff" | head -5; }

# 4096 rows (batch 64 x seq 64): the bias gradients' column sums have few outputs and long
# columns, so their fused kernels split the reduction in parts (two kernels each)
for b in cpu cuda; do
  "$LOOM" eval models/gpt2-tiny.json --weights tests/golden/gpt2-tiny/weights.safetensors --tokens "$tmp/d.bin" --batch 64 \
    --seq 64 --grads --backend $b --out "$tmp/rows_$b.st" > "$tmp/log" 2>&1 || cat "$tmp/log"
done
"$ST_DIFF" "$tmp/rows_cuda.st" "$tmp/rows_cpu.st" --rtol 1e-4 > "$tmp/diff" 2>&1 &&
  ok "gpt2-tiny batch 64 x seq 64 (split reductions): every gradient within 1e-4 of the CPU backend" ||
  { bad "gpt2-tiny batch 64 x seq 64"; grep FAIL "$tmp/diff" | head -5; }

# A padded vocabulary on CUDA (as the GPU benchmark may run GPT-2: 50257 -> 50304).  The
# tied Llama's 250 -> 288 leaves threads of the loss kernel with masked logits only.
for m in gpt2-tiny llama-tiny-tied; do
  g=tests/golden/$m
  if "$LOOM" train $g/train_spec.json -q --backend cuda --vocab-multiple 96 --out "$tmp/vm.st" > "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/vm.st" $g/train.safetensors --rtol 1e-4 > "$tmp/diff" 2>&1; then
    ok "$m --vocab-multiple 96 on CUDA: within 1e-4 of PyTorch"
  else
    bad "$m --vocab-multiple 96 on CUDA"; cat "$tmp/log"; grep FAIL "$tmp/diff" | head
  fi
done

# The attention kernels alone against a double-precision reference (attention.cc), built
# on a translation unit loom emits (the templates are its prelude's).
"$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target=cuda --emit=cuda -o "$tmp/tu.cu" > "$tmp/log" 2>&1 || cat "$tmp/log"
sed 's/extern __shared__ float loom_smem\[\];/float *loom_smem = (float *)loom_emu_dyn_smem();/' "$tmp/tu.cu" > "$tmp/tu_emu.cu"
if "${LOOM_EMU_CXX:-g++}" -std=c++17 -O1 -ffp-contract=off -w -Itests/cuda_emu -include tests/cuda_emu/emu.h \
     -DTU="\"$tmp/tu_emu.cu\"" tests/cuda_emu/attention.cc -o "$tmp/attention" > "$tmp/log" 2>&1 &&
   "$tmp/attention" > "$tmp/att" 2>&1; then
  ok "attention kernels (tensor cores and CUDA cores, bf16 and f16, sliding windows; the one-pass dq from the forward's saved L2 and O; the Hopper wgmma forward (setmaxnreg, the two consumers' ping-pong on named barriers, its wgmmas in their turns), dq and dk dv; the emulated named barriers' misuses refused) within 2e-5 of a double reference"
  sed 's/^/     /' "$tmp/att"
else
  bad "attention kernels"; cat "$tmp/log" "$tmp/att" 2> /dev/null | head -20
fi
if "${LOOM_EMU_CXX:-g++}" -std=c++17 -O1 -ffp-contract=off -w -Itests/cuda_emu -include tests/cuda_emu/emu.h \
     -DTU="\"$tmp/tu_emu.cu\"" -DLOOM_ATTN_SPLIT=0 -DATT_TOL=5e-3 tests/cuda_emu/attention.cc -o "$tmp/attention0" \
     > "$tmp/log" 2>&1 && "$tmp/attention0" > "$tmp/att" 2>&1; then
  ok "attention kernels with LOOM_CUDA_ATTN_ROUND=1's rounding (P, dS rounded once, as FlashAttention; the tensor-core kernels, the only ones it changes) within 5e-3"
else
  bad "attention kernels, rounded P"; cat "$tmp/log" "$tmp/att" 2> /dev/null | head -20
fi

# The forward's saved log-sum-exp (codegen/cuda/lower_attn.c, docs/attention.md): an
# attention on tensor cores whose gradient is in the same function saves L2 and O, and dq runs
# one pass from them.  Against the unfused program (LOOM_CUDA_NO_ATTN_LSE=1: dq's two passes):
# bf16 within the goldens' 2e-2 (llama-tiny: D 16, GQA; mistral-tiny: a window; a GPT-2 shape
# at D 64, seq 128; attention.cc holds D 128's kernels to the two-pass ones), fp32 the same bits
# (f32 attention keeps the CUDA cores' path).
n_saved=$("$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target=cuda --precision bf16 --cost 2>&1 | grep -c 'saved L2 and O')
n_two=$(LOOM_CUDA_NO_ATTN_LSE=1 "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --target=cuda --precision bf16 --cost 2>&1 |
  grep -c 'saved L2 and O')
[ "$n_saved" = 2 ] && [ "$n_two" = 0 ] && ok "gpt2-tiny bf16: both attention gradients read the forward's L2 and O (none with LOOM_CUDA_NO_ATTN_LSE=1)" ||
  bad "gpt2-tiny bf16: $n_saved attention gradients read saved L2 and O (2 expected), $n_two with LOOM_CUDA_NO_ATTN_LSE=1 (0)"
lse_pair() {   # name, tolerance, command...: the command's $tmp/lse_{1,0}.st with and without the saved L2
  local name=$1 tol=$2; shift 2
  memo "$tmp/lse_1.st" "$@" > "$tmp/log" 2>&1 && memo "$tmp/lse_0.st" LOOM_CUDA_NO_ATTN_LSE=1 "$@" >> "$tmp/log" 2>&1 &&
    "$ST_DIFF" "$tmp/lse_1.st" "$tmp/lse_0.st" --rtol $tol > "$tmp/diff" 2>&1 &&
    ok "$name: saved L2 and O against two passes, within --rtol $tol (largest rel_err $(awk '$1 == "PASS" && $6 + 0 > m { m = $6 + 0 } END { print m + 0 }' "$tmp/diff"))" ||
    { bad "$name: saved L2 and O against two passes (--rtol $tol)"; tail -5 "$tmp/log"; grep FAIL "$tmp/diff" | head -5; }
}
lse_pair "llama-tiny bf16, 2 steps" 2e-2 "$LOOM" train tests/golden/llama-tiny/train_spec.json --backend cuda --precision bf16 \
  --steps 2 -q
g=tests/golden/mistral-tiny
python3 -c "import json; print(json.dumps({'model': json.load(open('$g/config.json')), 'precision': 'bf16'}))" > "$tmp/mistral16.json"
lse_pair "mistral-tiny bf16 (window 8), gradients" 2e-2 "$LOOM" eval "$tmp/mistral16.json" --weights $g/weights.safetensors \
  --tokens $g/tokens.bin --batch 2 --seq 32 --grads --backend cuda
lse_pair "llama-tiny fp32, 2 steps" 0 "$LOOM" train tests/golden/llama-tiny/train_spec.json --backend cuda --steps 2 -q
lse_pair "bench-gpt2-small bf16 seq 128 (D 64), gradients" 2e-2 \
  "$LOOM" eval "$tmp/bench16.json" --weights "$tmp/w.st" --tokens "$tmp/d.bin" --batch 1 --seq 128 --grads --backend cuda

# LOOM_CUDA_WGMMA=1: the Hopper forward, dq and dk dv (kernels/attention_sm90.cuh: wgmma, TMA
# tensor copies from the maps the runtime encodes through the fake driver's
# cuTensorMapEncodeTiled, mbarriers, on the emulator's reading of the PTX ISA) in every layer of the D 64
# model, against the default mma.sync kernels: the same bits (attention.cc: the same arithmetic)
n_wg=$(LOOM_CUDA_WGMMA=1 "$LOOM" ir "$tmp/bench16.json" --passes=train,lower --target=cuda --cost 2>&1 |
  grep -c 'loom_attn_fwd_wg_\|loom_attn_dq_wg_\|loom_attn_dkdv_wg_')
if [ "$n_wg" = 12 ] && memo "$tmp/wg_1.st" LOOM_CUDA_WGMMA=1 "$LOOM" eval "$tmp/bench16.json" --weights "$tmp/w.st" \
     --tokens "$tmp/d.bin" --batch 1 --seq 128 --grads --backend cuda > "$tmp/log" 2>&1 &&
   memo "$tmp/wg_0.st" "$LOOM" eval "$tmp/bench16.json" --weights "$tmp/w.st" --tokens "$tmp/d.bin" --batch 1 --seq 128 \
     --grads --backend cuda >> "$tmp/log" 2>&1 && "$ST_DIFF" "$tmp/wg_1.st" "$tmp/wg_0.st" --rtol 0 > "$tmp/diff" 2>&1; then
  ok "bench-gpt2-small bf16 seq 128 with LOOM_CUDA_WGMMA=1 (4 wgmma forwards, 4 wgmma dq, 4 wgmma dk dv): logits, loss and every gradient the same bits as the mma.sync kernels'"
else
  bad "bench-gpt2-small bf16 with LOOM_CUDA_WGMMA=1 ($n_wg wgmma kernels, 12 expected) against the mma.sync kernels"
  tail -5 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
fi
# a driver without cuTensorMapEncodeTiled (before CUDA 12): refused at load, saying what to do
notmap=$(dirname "$LOOM_LIBCUDA")/libloom_fake_cuda_notmap.so
if [ ! -f "$notmap" ]; then
  bad "a driver without cuTensorMapEncodeTiled: $notmap is not built (CMakeLists.txt builds it beside the fake driver)"
elif LOOM_LIBCUDA=$notmap LOOM_CUDA_WGMMA=1 timeout 120 "$LOOM" eval "$tmp/bench16.json" --weights "$tmp/w.st" \
     --tokens "$tmp/d.bin" --batch 1 --seq 128 --grads --out "$tmp/notmap.st" --backend cuda > "$tmp/log" 2>&1; then
  bad "LOOM_CUDA_WGMMA=1 on a driver without cuTensorMapEncodeTiled ran"
elif grep -q 'lacks cuTensorMapEncodeTiled.*update the driver, or lower without LOOM_CUDA_WGMMA' "$tmp/log"; then
  ok "LOOM_CUDA_WGMMA=1 on a driver without cuTensorMapEncodeTiled: refused at load, naming the step and the fix"
else
  bad "LOOM_CUDA_WGMMA=1 on a driver without cuTensorMapEncodeTiled: no clear message"; tail -3 "$tmp/log"
fi

# Context parallelism's kernels alone (attn_block.cc: the attention blocks against a double
# reference, every rank and kv_shift, in both thread orders; rope at global positions),
# built on the translation unit of attn_block.ir, whose wrappers instantiate the templates
# as the lowering does for rope, attention_block and attention_block_grad.
"$LOOM" ir tests/cuda_emu/attn_block.ir --passes=verify,lower --target=cuda --emit=cuda -o "$tmp/ab.cu" > "$tmp/log" 2>&1 ||
  cat "$tmp/log"
sed 's/extern __shared__ float loom_smem\[\];/float *loom_smem = (float *)loom_emu_dyn_smem();/' "$tmp/ab.cu" > "$tmp/ab_emu.cu"
if ! grep -q 'loom_attnblk_dkdv_bbff_64(LoomArgs a) { loom_attnblk_dkdv<loom_sbf16, loom_sbf16, loom_sf32, loom_sf32, 64>' \
     "$tmp/ab_emu.cu"; then
  bad "attn_block.ir: no wrapper loom_attnblk_dkdv_bbff_64 (bf16 dout and q, f32 k and v) in its translation unit"
elif "${LOOM_EMU_CXX:-g++}" -std=c++17 -O1 -ffp-contract=off -w -Itests/cuda_emu -include tests/cuda_emu/emu.h \
       -DTU="\"$tmp/ab_emu.cu\"" tests/cuda_emu/attn_block.cc -o "$tmp/attn_block" > "$tmp/log" 2>&1 &&
     "$tmp/attn_block" > "$tmp/ab" 2>&1; then
  ok "context parallelism's attention blocks (f32, bf16, mixed) within 2e-5 of a double reference, the same bits in reverse thread order; its rope"
  sed 's/^/     /' "$tmp/ab"
else
  bad "attention blocks (context parallelism)"; cat "$tmp/log" "$tmp/ab" 2> /dev/null | head -20
fi

# Generation with a KV cache: decode.ir's @decode (a decode step as frontend_build_decode
# writes it for loom sample) lowers for CUDA, and the kernels of rope_at, kv_write and
# attention_cached alone (decode.cc) against a double reference, the same bits in reverse
# thread order, positions outside the cache failing the launch; built on decode.ir's
# translation unit, whose wrappers instantiate the templates as the lowering does.
if "$LOOM" ir tests/cuda_emu/decode.ir --passes=verify,fuse,memory-plan --target=cuda --emit=cuda -o "$tmp/dec.cu" \
     > "$tmp/log" 2>&1; then
  ok "decode.ir (kv_write, rope_at, attention_cached in a Llama decode step; bf16) lowers for CUDA: $(grep -c '__global__' "$tmp/dec.cu") kernels"
else
  bad "decode.ir does not lower for CUDA"; cat "$tmp/log"
fi
sed 's/extern __shared__ float loom_smem\[\];/float *loom_smem = (float *)loom_emu_dyn_smem();/' "$tmp/dec.cu" > "$tmp/dec_emu.cu"
if ! grep -q 'loom_attn_cached_ffff(LoomArgs a) { loom_attn_cached<loom_sf32, loom_sf32, loom_sf32, loom_sf32>' "$tmp/dec_emu.cu" ||
   ! grep -q 'loom_kv_write_bb(LoomArgs a) { loom_kv_write<loom_sbf16, loom_sbf16>' "$tmp/dec_emu.cu"; then
  bad "decode.ir: no wrappers loom_attn_cached_ffff and loom_kv_write_bb in its translation unit"
elif "${LOOM_EMU_CXX:-g++}" -std=c++17 -O1 -ffp-contract=off -w -Itests/cuda_emu -include tests/cuda_emu/emu.h \
       -DTU="\"$tmp/dec_emu.cu\"" tests/cuda_emu/decode.cc -o "$tmp/decode" > "$tmp/log" 2>&1 &&
     "$tmp/decode" > "$tmp/dec" 2>&1; then
  ok "KV-cache kernels (rope_at, kv_write, attention_cached; f32, bf16, mixed; GQA) against a double reference, the same bits in reverse thread order"
  sed 's/^/     /' "$tmp/dec"
else
  bad "KV-cache kernels (decode.cc)"; cat "$tmp/log" "$tmp/dec" 2> /dev/null | head -30
fi

# Mixture of experts (kernels of kernels/moe.cuh): mixtral-tiny (4 experts, top-2, the
# load-balancing loss) on CUDA against PyTorch's goldens: the forward within 1e-5, the
# gradients of every parameter (a stack of experts as its per-expert tensors, the hub's names)
# within 1e-4, the same bits with every block's threads in reverse order; 3 AdamW steps
# (grad_accum 2, clipping) within 1e-4; bf16 against the CPU backend's bf16 within 2e-2 (the
# losses of the 3 steps, and one step's logits, loss and gradients of the program that rounds
# where the CPU does, LOOM_CUDA_FUSE_BF16=0); a capacity that drops
# assignments within 1e-5 of the CPU backend; a checkpoint (expert stacks and their AdamW
# moments by expert) resumed bitwise; greedy sampling as the CPU's.
g=tests/golden/mixtral-tiny
worst() { awk '$1 == "PASS" || $1 == "FAIL" { if ($6 + 0 > m) m = $6 + 0 } END { printf "%.1e", m }' "$1"; }
names=loss,$(grep -ao '"grad\.[^"]*"' $g/grads.safetensors | tr -d '"' | paste -sd,)
moe_eval() { "$LOOM" eval models/mixtral-tiny.json --backend cuda --weights $g/weights.safetensors --tokens $g/tokens.bin \
               --grads --out "$1" > "$tmp/log" 2>&1 || cat "$tmp/log"; }
moe_eval "$tmp/moe.st"
if "$ST_DIFF" "$tmp/moe.st" $g/expected.safetensors --rtol 1e-5 --only logits,loss > "$tmp/fwd" 2>&1 &&
   "$ST_DIFF" "$tmp/moe.st" $g/grads.safetensors --rtol 1e-4 --only "$names" > "$tmp/diff" 2>&1; then
  ok "mixtral-tiny on CUDA: logits and loss within $(worst "$tmp/fwd") (1e-5), the loss and gradients of all $(($(grep -c '^PASS' "$tmp/diff") - 1)) parameters (one per expert) within $(worst "$tmp/diff") (1e-4) of PyTorch"
else
  bad "mixtral-tiny eval on CUDA against PyTorch"; grep -v '^PASS' "$tmp/fwd" "$tmp/diff" | head -8
fi
LOOM_EMU_ORDER=reverse moe_eval "$tmp/moe_rev.st"
"$ST_DIFF" "$tmp/moe_rev.st" "$tmp/moe.st" --rtol 0 > "$tmp/diff" 2>&1 &&
  ok "mixtral-tiny on CUDA: the same bits with every block's threads run in reverse order" ||
  { bad "mixtral-tiny in reverse thread order"; grep FAIL "$tmp/diff" | head -5; }
if "$LOOM" train $g/train_spec.json -q --backend cuda --out "$tmp/moe_train.st" > "$tmp/log" 2>&1 &&
   "$ST_DIFF" "$tmp/moe_train.st" $g/train.safetensors --rtol 1e-4 > "$tmp/diff" 2>&1; then
  ok "mixtral-tiny on CUDA: 3 AdamW steps within $(worst "$tmp/diff") (1e-4) of PyTorch ($(grep -c '^PASS' "$tmp/diff") tensors: parameters, losses, norms, lrs)"
else
  bad "mixtral-tiny training on CUDA against PyTorch"; cat "$tmp/log"; grep -v '^PASS' "$tmp/diff" | head -8
fi
sed '0,/{/s/{/{"precision": "bf16", /' models/mixtral-tiny.json > "$tmp/moe16.json"
for b in cpu cuda; do
  "$LOOM" train $g/train_spec.json -q --precision bf16 --backend $b --out "$tmp/moe16_$b.st" > "$tmp/log" 2>&1 || cat "$tmp/log"
  LOOM_CUDA_FUSE_BF16=0 "$LOOM" eval "$tmp/moe16.json" --backend $b --weights $g/weights.safetensors --tokens $g/tokens.bin --grads \
    --out "$tmp/moe16e_$b.st" > "$tmp/log" 2>&1 || cat "$tmp/log"
done
if "$ST_DIFF" "$tmp/moe16_cuda.st" "$tmp/moe16_cpu.st" --rtol 2e-2 --only losses > "$tmp/diff" 2>&1 &&
   "$ST_DIFF" "$tmp/moe16e_cuda.st" "$tmp/moe16e_cpu.st" --rtol 2e-2 > "$tmp/diff2" 2>&1; then
  ok "mixtral-tiny bf16 on CUDA (its grouped matmuls on tensor cores): 3 steps' losses within $(worst "$tmp/diff"), one step's logits, loss and gradients within $(worst "$tmp/diff2") (2e-2) of the CPU backend's bf16"
else
  bad "mixtral-tiny bf16 on CUDA against the CPU backend"; grep -v '^PASS' "$tmp/diff" "$tmp/diff2" | head -8
fi
for b in cpu cuda; do   # capacity 16 of 128 assignments on 4 experts: drops in every layer
  "$LOOM" train $g/train_spec.json -q --capacity-factor 0.5 --backend $b --out "$tmp/moecap_$b.st" > "$tmp/log" 2>&1 ||
    cat "$tmp/log"
done
"$ST_DIFF" "$tmp/moecap_cuda.st" "$tmp/moecap_cpu.st" --rtol 1e-5 > "$tmp/diff" 2>&1 &&
  ok "mixtral-tiny --capacity-factor 0.5 (dropped assignments) on CUDA: 3 steps within $(worst "$tmp/diff") (1e-5) of the CPU backend" ||
  { bad "mixtral-tiny with a capacity on CUDA against the CPU backend"; grep -v '^PASS' "$tmp/diff" | head -5; }
# LOOM_CUDA_MOE_GEMM=batched (codegen/cuda/lower_moe.c): with a capacity, each expert matmul
# (forward, data and weight gradient) as one strided-batched cuBLASLt GEMM over the groups
# padded to [experts, capacity, ...].  A capacity of experts/k drops nothing (a token picks an
# expert once), so the model is PyTorch's: mixtral-tiny's eval and qwen3-moe-tiny's `loom
# check` (forward, gradients, 3 AdamW steps) against the goldens, with a spec.json that adds
# the capacity; then capacity 0.5 (drops in every layer) within 1e-5 of the grouped kernels,
# bf16 within 2e-2 of them, the count of batched GEMMs, the label when there is no capacity,
# and a bad value refused.  (Not bitwise: cuBLASLt's sums are not the tiles' order.)
sed '0,/{/s/{/{"capacity_factor": 2, /' models/mixtral-tiny.json > "$tmp/moecap2.json"
sed '0,/{/s/{/{"precision": "bf16", /' "$tmp/moecap2.json" > "$tmp/moecap2_16.json"
qd=$tmp/qwen3-moe-cap; cp -r tests/golden/qwen3-moe-tiny "$qd"; rm "$qd/config.json"
python3 -c "import json; json.dump({'model': json.load(open('tests/golden/qwen3-moe-tiny/config.json')), 'capacity_factor': 4}, open('$qd/spec.json', 'w'))"
n_b=$(LOOM_CUDA_MOE_GEMM=batched "$LOOM" ir "$tmp/moecap2.json" --passes=train,lower --target=cuda --cost 2>&1 | grep -c 'cublasLtMatmul .*(batched: 4 experts x capacity 64)')
n_q=$(LOOM_CUDA_MOE_GEMM=batched "$LOOM" ir "$qd/spec.json" --passes=train,lower --target=cuda --cost 2>&1 | grep -c 'cublasLtMatmul .*(batched: 8 experts x capacity')
n_d=$(LOOM_CUDA_MOE_GEMM=batched "$LOOM" ir models/mixtral-tiny.json --passes=train,lower --target=cuda --cost 2>&1 | grep -c 'loom_gmm.*needs a capacity_factor')
LOOM_CUDA_MOE_GEMM=fast "$LOOM" ir "$tmp/moecap2.json" --passes=train,lower --target=cuda --cost > "$tmp/log" 2>&1; rc=$?
[ "$n_b" = 18 ] && [ "$n_q" -gt 0 ] && [ "$n_d" = 18 ] && [ $rc = 2 ] && grep -q 'LOOM_CUDA_MOE_GEMM=fast: set it to grouped' "$tmp/log" &&
  ok "LOOM_CUDA_MOE_GEMM=batched: mixtral-tiny's 18 expert matmuls as batched GEMMs at capacity 64 ($n_q in qwen3-moe-tiny), dropless ones grouped with the reason in the label, a bad value refused (exit 2)" ||
  { bad "LOOM_CUDA_MOE_GEMM=batched lowering: $n_b batched (18), $n_q qwen3, $n_d dropless notes (18), exit $rc (2)"; cat "$tmp/log"; }
LOOM_CUDA_MOE_GEMM=batched "$LOOM" eval "$tmp/moecap2.json" --backend cuda --weights $g/weights.safetensors --tokens $g/tokens.bin \
  --grads --out "$tmp/moeb.st" > "$tmp/log" 2>&1 || cat "$tmp/log"
if "$ST_DIFF" "$tmp/moeb.st" $g/expected.safetensors --rtol 1e-5 --only logits,loss > "$tmp/fwd" 2>&1 &&
   "$ST_DIFF" "$tmp/moeb.st" $g/grads.safetensors --rtol 1e-4 --only "$names" > "$tmp/diff" 2>&1 &&
   "$ST_DIFF" "$tmp/moeb.st" "$tmp/moe.st" --rtol 1e-5 > "$tmp/diff2" 2>&1; then
  ok "mixtral-tiny batched at capacity 64 (nothing dropped): logits and loss within $(worst "$tmp/fwd") (1e-5), gradients within $(worst "$tmp/diff") (1e-4) of PyTorch, everything within $(worst "$tmp/diff2") (1e-5) of the grouped kernels"
else
  bad "mixtral-tiny LOOM_CUDA_MOE_GEMM=batched eval against PyTorch and the grouped kernels"; grep -v '^PASS' "$tmp/fwd" "$tmp/diff" "$tmp/diff2" | head -8
fi
LOOM_CUDA_MOE_GEMM=batched "$LOOM" check "$qd" --backend cuda > "$tmp/check" 2>&1 &&
  ok "loom check qwen3-moe-tiny with capacity_factor 4 (nothing dropped), LOOM_CUDA_MOE_GEMM=batched: $(grep -E '^cuda ' "$tmp/check" | tr -s ' ' | cut -c1-150)" ||
  { bad "loom check qwen3-moe-tiny with LOOM_CUDA_MOE_GEMM=batched"; cat "$tmp/check"; }
LOOM_CUDA_MOE_GEMM=batched "$LOOM" train $g/train_spec.json -q --capacity-factor 0.5 --backend cuda --out "$tmp/moecapb.st" > "$tmp/log" 2>&1 ||
  cat "$tmp/log"
LOOM_CUDA_MOE_GEMM=batched "$LOOM" train $g/train_spec.json -q --capacity-factor 2 --precision bf16 --backend cuda \
  --out "$tmp/moecapb16.st" > "$tmp/log" 2>&1 || cat "$tmp/log"
if "$ST_DIFF" "$tmp/moecapb.st" "$tmp/moecap_cuda.st" --rtol 1e-5 > "$tmp/diff" 2>&1 &&
   "$ST_DIFF" "$tmp/moecapb16.st" "$tmp/moe16_cuda.st" --rtol 2e-2 --only losses > "$tmp/diff2" 2>&1; then
  ok "mixtral-tiny batched, 3 steps: capacity 0.5 (drops) within $(worst "$tmp/diff") (1e-5) of the grouped kernels; bf16 losses within $(worst "$tmp/diff2") (2e-2) of theirs"
else
  bad "mixtral-tiny LOOM_CUDA_MOE_GEMM=batched training against the grouped kernels"; grep -v '^PASS' "$tmp/diff" "$tmp/diff2" | head -8
fi
run=("$LOOM" train $g/train_spec.json -q --backend cuda)
"${run[@]}" --save-dir "$tmp/ck-moe" --save-every 1 > /dev/null 2>&1
rm -rf "$tmp/ck-moe/step_00000003"
if "${run[@]}" --resume "$tmp/ck-moe" --out "$tmp/moe_resumed.st" > "$tmp/log" 2>&1 &&
   cmp -s "$tmp/moe_train.st" "$tmp/moe_resumed.st" &&
   grep -qa '"model.layers.1.block_sparse_moe.experts.3.w2.weight"' "$tmp/ck-moe/step_00000002/model.safetensors" &&
   grep -qa 'experts.3.w2.weight"' "$tmp/ck-moe/step_00000002/optimizer.safetensors"; then
  ok "mixtral-tiny on CUDA: resumed at step 2 of 3 from a checkpoint in per-expert names, bitwise equal to the uninterrupted run"
else
  bad "mixtral-tiny on CUDA: resume"; cat "$tmp/log"; ls "$tmp/ck-moe" 2> /dev/null
fi
for b in cpu cuda; do
  "$LOOM" sample $g/train_spec.json --weights $g/weights.safetensors --prompt "Hello" --max-new-tokens 8 --temperature 0 \
    --ids --backend $b > "$tmp/ids_$b" 2> "$tmp/log" || cat "$tmp/log"
done
[ -s "$tmp/ids_cuda" ] && cmp -s "$tmp/ids_cpu" "$tmp/ids_cuda" &&
  ok "loom sample --backend cuda, mixtral-tiny: the CPU backend's greedy ids ($(cat "$tmp/ids_cuda"))" ||
  bad "loom sample --backend cuda, mixtral-tiny: '$(cat "$tmp/ids_cuda")', the CPU's '$(cat "$tmp/ids_cpu")'"

# The mixture-of-experts kernels alone: moe.ir (routing with a capacity, bf16 rows with f32
# routing weights, 6 groups on 3 experts) lowers for CUDA, and moe.cc holds the kernels of
# kernels/moe.cuh to references written from ir/interp_moe.c (exact for the routing and the
# permutations), the same bits in reverse thread order and on smaller grids, bad indices,
# positions and counts failing the launch; built on moe.ir's translation unit.
if "$LOOM" ir tests/cuda_emu/moe.ir --passes=verify,fuse,memory-plan --target=cuda --emit=cuda -o "$tmp/moe.cu" \
     > "$tmp/log" 2>&1; then
  ok "moe.ir (topk .. grouped_matmul_wgrad: a capacity, bf16 with f32 routing, 6 groups on 3 experts) lowers for CUDA: $(grep -c '__global__' "$tmp/moe.cu") kernels"
else
  bad "moe.ir does not lower for CUDA"; cat "$tmp/log"
fi
sed 's/extern __shared__ float loom_smem\[\];/float *loom_smem = (float *)loom_emu_dyn_smem();/' "$tmp/moe.cu" > "$tmp/moe_emu.cu"
if ! grep -q 'loom_moe_dispatch_bfb(LoomArgs a) { loom_moe_dispatch<loom_sbf16, loom_sf32, loom_sbf16>' "$tmp/moe_emu.cu" ||
   ! grep -q 'loom_gmm_bbb_n(LoomArgs a) { loom_grouped_mm<loom_sbf16, loom_sbf16, loom_sbf16, false>' "$tmp/moe_emu.cu"; then
  bad "moe.ir: no wrappers loom_moe_dispatch_bfb and loom_gmm_bbb_n in its translation unit"
elif "${LOOM_EMU_CXX:-g++}" -std=c++17 -O1 -ffp-contract=off -w -Itests/cuda_emu -include tests/cuda_emu/emu.h \
       -DTU="\"$tmp/moe_emu.cu\"" tests/cuda_emu/moe.cc -o "$tmp/moe" > "$tmp/log" 2>&1 &&
     "$tmp/moe" > "$tmp/moe_out" 2>&1; then
  ok "mixture-of-experts kernels (routing, permutations, grouped matmuls; f32, bf16, mixed) against references, the same bits in reverse thread order"
  sed 's/^/     /' "$tmp/moe_out"
else
  bad "mixture-of-experts kernels (moe.cc)"; cat "$tmp/log" "$tmp/moe_out" 2> /dev/null | head -30
fi

# loom sample --backend cuda: greedy decoding of the whole decode program on the device gives
# transformers' greedy generate, token for token (tests/golden/M/generate.json)
for m in gpt2-tiny llama-tiny; do
  g=tests/golden/$m
  python3 -c "
import json, sys
for c in json.load(open('$g/generate.json'))['cases']:
    print(c['max_new_tokens'], ' '.join(map(str, c['new_ids'])), c['prompt'].encode().hex(), sep='|')" > "$tmp/cases"
  while IFS='|' read -r max want hex; do
    prompt=$(python3 -c "import sys; sys.stdout.write(bytes.fromhex('$hex').decode())")
    got=$("$LOOM" sample $g/train_spec.json --weights $g/weights.safetensors --prompt "$prompt" --max-new-tokens "$max" \
          --temperature 0 --ids --backend cuda 2> "$tmp/log")
    if [ "$got" = "$want" ]; then ok "loom sample --backend cuda, $m, prompt '$(echo "$prompt" | head -1)': transformers' greedy ids"
    else bad "loom sample --backend cuda, $m: got '$got', want '$want'"; cat "$tmp/log"; fi
  done < "$tmp/cases"
done

# Longer sequences than the goldens': several attention tiles per row and per block
# (forward tiles of 64 queries x 64 keys, backward 32 keys), causal tiles skipped.
for ms in gpt2-tiny:64 llama-tiny:128; do
  m=${ms%:*} T=${ms#*:}
  run() { "$LOOM" eval models/$m.json --weights tests/golden/$m/weights.safetensors --tokens "$tmp/d.bin" --seq $T --batch 2 \
            --grads --out "$1" "${@:2}" > "$tmp/log" 2>&1 || cat "$tmp/log"; }
  run "$tmp/cpu.st" --backend cpu
  run "$tmp/cuda.st" --backend cuda
  "$ST_DIFF" "$tmp/cuda.st" "$tmp/cpu.st" --rtol 1e-4 > "$tmp/diff" 2>&1 &&
    ok "$m seq $T: logits, loss and every gradient within 1e-4 of the CPU backend" ||
    { bad "$m seq $T against the CPU"; grep FAIL "$tmp/diff" | head -5; }
  sed '0,/{/s/{/{"precision": "bf16", /' models/$m.json > "$tmp/bf16.json"
  run16() { "$LOOM" eval "$tmp/bf16.json" --weights tests/golden/$m/weights.safetensors --tokens "$tmp/d.bin" --seq $T \
              --batch 2 --grads --out "$1" "${@:2}" > "$tmp/log" 2>&1 || cat "$tmp/log"; }
  run16 "$tmp/cpu16.st" --backend cpu
  LOOM_CUDA_FUSE_BF16=0 run16 "$tmp/cuda16.st" --backend cuda   # rounding where the CPU rounds
  "$ST_DIFF" "$tmp/cuda16.st" "$tmp/cpu16.st" --rtol 2e-2 > "$tmp/diff" 2>&1 &&
    ok "$m seq $T bf16 (attention on tensor cores): every gradient within 2e-2 of the CPU backend" ||
    { bad "$m seq $T bf16 against the CPU"; grep FAIL "$tmp/diff" | head -5; }
  LOOM_EMU_ORDER=reverse run "$tmp/rev.st" --backend cuda
  LOOM_EMU_ORDER=reverse LOOM_CUDA_FUSE_BF16=0 run16 "$tmp/rev16.st" --backend cuda
  "$ST_DIFF" "$tmp/rev.st" "$tmp/cuda.st" --rtol 0 > "$tmp/diff" 2>&1 &&
    "$ST_DIFF" "$tmp/rev16.st" "$tmp/cuda16.st" --rtol 0 >> "$tmp/diff" 2>&1 &&
    ok "$m seq $T: the same bits (f32, and bf16 on tensor cores) with every block's threads run in reverse order" ||
    { bad "$m seq $T in reverse thread order"; grep FAIL "$tmp/diff" | head -5; }
done

if "$LOOM" compile models/gpt2-tiny.json --backend cuda --data "$tmp/d.bin" -o "$tmp/exe" > "$tmp/log" 2>&1 &&
   "$tmp/exe" --steps 2 > "$tmp/run" 2>&1 && grep -q '^done' "$tmp/run"; then
  ok "loom compile --backend cuda: the executable trains from its embedded module"
else
  bad "compiled executable"; cat "$tmp/log" "$tmp/run" 2> /dev/null | tail -20
fi
# the same executable (compiled for this device, sm_90a) on an sm_80 device: refused, saying how to fix it
LOOM_EMU_CC=80 "$tmp/exe" --steps 1 > "$tmp/run" 2>&1; rc=$?
[ $rc -ne 0 ] && grep -q "compiled for sm_90a.*--arch sm_80" "$tmp/run" &&
  ok "an sm_90a executable on an sm_80 device: exit $rc, $(cut -c1-90 "$tmp/run" | tail -1)..." ||
  { bad "architecture mismatch: exit $rc"; cat "$tmp/run"; }
# Checkpoints on CUDA: stopped after step 2 of 5 and resumed, bitwise equal to the
# uninterrupted run (llama-tiny: two shards, grad_accum 2), f32 and bf16
spec=tests/golden/llama-tiny/train_spec.json
for prec in fp32 bf16; do
  run=("$LOOM" train $spec --steps 5 --precision $prec --backend cuda)
  "${run[@]}" --out "$tmp/full.st" --log "$tmp/full.jsonl" > "$tmp/full.log" 2>&1
  "${run[@]}" --save-dir "$tmp/ck-$prec" --save-every 2 > /dev/null 2>&1
  rm -rf "$tmp/ck-$prec/step_00000004" "$tmp/ck-$prec/step_00000005"
  if "${run[@]}" --resume "$tmp/ck-$prec" --out "$tmp/resumed.st" > "$tmp/log" 2>&1 && cmp -s "$tmp/full.st" "$tmp/resumed.st"; then
    ok "$prec on CUDA: resumed at step 2 of 5, bitwise equal to the uninterrupted run"
  else
    bad "$prec on CUDA: resume"; cat "$tmp/log"
  fi
  [ $prec = fp32 ] || continue
  # The loss read back one step late (runtime/trainer.c, cuda_program_step_issue): the host
  # issues step N+1 before it waits for step N (the emulated driver counts the graph launches
  # issued before the one before was waited for: 0 when every step is waited for before the
  # next; and lands the page-locked copies of the losses only when the host waits).  A Ctrl-C
  # while step 3 of 5 is issued (raised by the driver at the 3rd graph launch) stops after step
  # 3 with its checkpoint; resumed on the synchronous path (LOOM_CUDA_SYNC_STEP=1), the run ends
  # bitwise as the uninterrupted overlapped one (weights, losses, grad norms), and its step
  # lines and metrics (loss, lr, grad norm) are that run's
  # (SIGINT's default restored where env can: loom keeps an ignored SIGINT ignored)
  dflt=(); env --default-signal=INT true 2> /dev/null && dflt=(env --default-signal=INT)
  LOOM_EMU_STATS=1 LOOM_EMU_SIGINT_AT_GRAPH=3 "${dflt[@]}" "${run[@]}" --save-dir "$tmp/ck-int" --log "$tmp/int.jsonl" \
    > "$tmp/int.log" 2>&1
  rc=$?
  lines() { grep -o 'step *[0-9]*/5 | loss [^|]*| lr [^|]*| norm [0-9.]*' "$@"; }
  metrics() { grep -o '"step":[0-9]*,"loss":[^,]*,"lr":[^,]*,"grad_norm":[^,]*' "$@"; }
  if [ $rc = 130 ] && grep -q "stopped by SIGINT after step 3 of 5" "$tmp/int.log" && [ -d "$tmp/ck-int/step_00000003" ] &&
     [ ! -e "$tmp/ck-int/step_00000004" ] &&
     grep -q "^loom-emu: 2 graph launches issued before the host waited for the one before" "$tmp/int.log" &&
     LOOM_CUDA_SYNC_STEP=1 "${run[@]}" --resume "$tmp/ck-int" --log "$tmp/int.jsonl" --out "$tmp/int.st" >> "$tmp/int.log" 2>&1 &&
     cmp -s "$tmp/full.st" "$tmp/int.st" && [ "$(lines "$tmp/full.log" | wc -l)" = 5 ] &&
     diff <(lines "$tmp/full.log") <(lines "$tmp/int.log") > /dev/null &&
     [ "$(metrics "$tmp/full.jsonl" | wc -l)" = 5 ] && diff <(metrics "$tmp/full.jsonl") <(metrics "$tmp/int.jsonl") > /dev/null; then
    ok "fp32 on CUDA: step N+1 issued before step N's wait ($(grep -o '2 graph launches issued before[^;]*' "$tmp/int.log")); Ctrl-C at step 3 of 5 saved step 3, resumed synchronously to the overlapped run's bits, step lines and metrics"
  else
    bad "fp32 on CUDA: the loss one step late (exit $rc)"; tail -n 8 "$tmp/int.log"
  fi
done

# Validation (--val-data) on CUDA: @forward's loss, as the CPU backend's
"$LOOM" data data/shakespeare.txt --val-frac 0.05 -o "$tmp/sp" > /dev/null
for b in cpu cuda; do
  "$LOOM" train models/gpt2-tiny.json --backend $b --data "$tmp/sp_train_000000.bin" --val-data "$tmp/sp_val_000000.bin" \
    --steps 2 --val-tokens 128 --log "$tmp/val_$b.jsonl" > "$tmp/log" 2>&1 || cat "$tmp/log"
done
a=$(grep -o '"val_loss":[^,]*' "$tmp/val_cpu.jsonl" | cut -d: -f2 | tr '\n' ' ')
b=$(grep -o '"val_loss":[^,]*' "$tmp/val_cuda.jsonl" | cut -d: -f2 | tr '\n' ' ')
if [ -n "$a" ] && awk -v a="$a" -v b="$b" 'BEGIN { n = split(a, x, " "); if (split(b, y, " ") != n) exit 1;
    for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d > 1e-4 || d < -1e-4) exit 1 } }'; then
  ok "validation loss on CUDA ($b) within 1e-4 of the CPU backend's ($a)"
else
  bad "validation loss on CUDA ($b) against the CPU backend's ($a)"
fi

# A checkpoint of a dp=2 ZeRO-3 CPU mesh resumes on CUDA (another layout: one device), and
# the 4 steps end within 1e-5 of one CPU rank's (a constant lr, so the legs share it)
lt=("$LOOM" train tests/golden/llama-tiny/train_spec.json -q --batch 4 --min-lr 0.01 --warmup 0 --allow-changes)
if "${lt[@]}" --steps 2 --mesh dp=2 --zero 3 --save-dir "$tmp/ck" > "$tmp/log" 2>&1 &&
   "${lt[@]}" --steps 4 --backend cuda --resume "$tmp/ck" --out "$tmp/resumed.st" >> "$tmp/log" 2>&1 &&
   "${lt[@]}" --steps 4 --backend cpu --out "$tmp/one.st" >> "$tmp/log" 2>&1 &&
   "$ST_DIFF" "$tmp/resumed.st" "$tmp/one.st" --rtol 1e-5 > "$tmp/diff" 2>&1; then
  ok "a dp=2 ZeRO-3 checkpoint resumes on CUDA: 4 steps within 1e-5 of one CPU rank's"
else
  bad "resuming a mesh checkpoint on CUDA"; tail -5 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
fi

# The fused programs against the unfused below: S steps of 2 micro-batches each (the goldens'
# grad_accum), enough for each to accumulate, update and read its updated weights
S=2
# Gradients accumulated in the GEMM (cuBLASLt beta = 1 into the f32 gradient) and cast +
# accumulate as one kernel (codegen/cuda/lower.c, "gradient accumulation") against the
# unfused program (LOOM_CUDA_NO_ACC_FUSION=1): 2 steps with 2 micro-batches, fp32 bit for bit
# (the same arithmetic); bf16 (the default, LOOM_CUDA_FUSE_BF16: the product is no longer rounded to bf16
# before it is added) with loom check's bf16 rule: losses and gradient norms within 2e-2, parameters within 2e-2
# plus 2 x steps x lr (AdamW moves a parameter by about lr whatever its gradient's size)
for m in gpt2-tiny llama-tiny; do
  for p in fp32 bf16; do
    tol=$([ $p = fp32 ] && echo "0" || echo "2e-2 --atol 0.06")
    if memo "$tmp/acc-f.st" "$LOOM" train tests/golden/$m/train_spec.json --backend cuda \
         --precision $p --steps $S -q > "$tmp/log" 2>&1 &&
       LOOM_CUDA_NO_ACC_FUSION=1 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda --precision $p --steps $S -q \
         --out "$tmp/acc-u.st" >> "$tmp/log" 2>&1 &&
       "$ST_DIFF" "$tmp/acc-f.st" "$tmp/acc-u.st" --only losses,grad_norms --rtol "${tol%% *}" > "$tmp/diff" 2>&1 &&
       "$ST_DIFF" "$tmp/acc-f.st" "$tmp/acc-u.st" --rtol $tol >> "$tmp/diff" 2>&1; then
      ok "$m $p: gradients accumulated in the GEMM and in the cast, $S steps within ${tol%% *} of the unfused program"
    else
      bad "$m $p: fused gradient accumulation against the unfused program"; tail -3 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
    fi
  done
done

# The bf16 weight copies (codegen/cuda/lower_fuse.c: AdamW writes each parameter's bf16 copy,
# the steps read it instead of casting; the runtime writes the copies after every load) against
# the casts (LOOM_CUDA_NO_WEIGHT_COPIES=1): 2 steps of 2 micro-batches bit for bit (the same
# rounding of the same values), on one device and on a dp=2 mesh (ZeRO-1 and 3 keep the
# casts: their gathers write the parameters); --cost counts no cast launch left.  The unfused
# side also keeps cross-entropy's two launches (LOOM_CUDA_NO_XENT_FUSION=1): on the dp=2 mesh
# the fused classifier takes a rank's slice of the seed
for mf in "llama-tiny:" "gpt2-tiny:--mesh dp=2"; do
  m=${mf%%:*} fl=${mf#*:}
  # shellcheck disable=SC2086
  if LOOM_LIBNCCL=$(dirname "$LOOM_LIBCUDA")/libloom_fake_nccl.so LOOM_EMU_DEVICES=2 "$LOOM" train \
       tests/golden/$m/train_spec.json --backend cuda --precision bf16 --steps $S --batch 4 -q $fl --out "$tmp/wc-f.st" \
       > "$tmp/log" 2>&1 &&
     LOOM_LIBNCCL=$(dirname "$LOOM_LIBCUDA")/libloom_fake_nccl.so LOOM_EMU_DEVICES=2 LOOM_CUDA_NO_WEIGHT_COPIES=1 \
       LOOM_CUDA_NO_XENT_FUSION=1 "$LOOM" \
       train tests/golden/$m/train_spec.json --backend cuda --precision bf16 --steps $S --batch 4 -q $fl \
       --out "$tmp/wc-u.st" >> "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/wc-f.st" "$tmp/wc-u.st" --rtol 0 > "$tmp/diff" 2>&1 &&
     "$LOOM" ir tests/golden/$m/train_spec.json --passes=train,lower --target cuda --precision bf16 --batch 4 $fl --cost \
       2>&1 | grep -Eq '^cast +0 '; then
    ok "$m bf16 ${fl:-one device}: parameters' bf16 copies written by AdamW, $S steps bit for bit the casting program, no cast launched"
  else
    bad "$m bf16 ${fl:-one device}: bf16 weight copies against the casts"; tail -3 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
done

# Norms from saved statistics (codegen/cuda/lower_fuse.c: the forward saves (mean, rstd), the
# gradient reads them and sums dw, db in the same launch, adding them to the f32 gradients where
# they are only accumulated, and adds the residual stream's gradient to dx where an add follows:
# llama-tiny fp32 has 4) against the two-launch gradient (LOOM_CUDA_NO_NORM_STATS=1): fp32 bit for
# bit (the same arithmetic), bf16 as fused by default (LOOM_CUDA_FUSE_BF16; dw and dx no longer rounded to bf16
# before they are added) with loom check's bf16 rule
for mp in gpt2-tiny:fp32 llama-tiny:fp32 gpt2-tiny:bf16; do
  m=${mp%%:*} p=${mp##*:}
  tol=$([ $p = fp32 ] && echo "0" || echo "2e-2 --atol 0.06")
  if memo "$tmp/ns-f.st" "$LOOM" train tests/golden/$m/train_spec.json --backend cuda \
       --precision $p --steps $S -q > "$tmp/log" 2>&1 &&
     LOOM_CUDA_NO_NORM_STATS=1 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda \
       --precision $p --steps $S -q --out "$tmp/ns-u.st" >> "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/ns-f.st" "$tmp/ns-u.st" --only losses,grad_norms --rtol "${tol%% *}" > "$tmp/diff" 2>&1 &&
     "$ST_DIFF" "$tmp/ns-f.st" "$tmp/ns-u.st" --rtol $tol >> "$tmp/diff" 2>&1; then
    ok "$m $p: norms from saved statistics (one gradient launch, dw accumulated in it), $S steps within ${tol%% *} of the two-launch program"
  else
    bad "$m $p: norms from saved statistics against the two-launch program"; tail -3 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
done

# The fused classifier (codegen/cuda/lower_fuse.c: cross-entropy's forward and gradient in one
# pass over the logits, the loss rows moved out of the gradient's way) against the two launches
# (LOOM_CUDA_NO_XENT_FUSION=1): 2 steps bit for bit (the same arithmetic), a padded vocabulary
# (masked logits) in bf16, Llama in fp32
for mp in "gpt2-tiny:bf16:--vocab-multiple 96" "llama-tiny:fp32:"; do
  m=${mp%%:*} rest=${mp#*:} p=${rest%%:*} vm=${rest#*:}
  # shellcheck disable=SC2086
  if "$LOOM" train tests/golden/$m/train_spec.json --backend cuda --precision $p $vm --steps $S -q --out "$tmp/xe-f.st" \
       > "$tmp/log" 2>&1 &&
     LOOM_CUDA_NO_XENT_FUSION=1 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda --precision $p $vm --steps $S -q \
       --out "$tmp/xe-u.st" >> "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/xe-f.st" "$tmp/xe-u.st" --rtol 0 > "$tmp/diff" 2>&1 &&
     "$LOOM" ir tests/golden/$m/train_spec.json --passes=train,lower --target cuda --precision $p $vm --cost 2>&1 |
       grep -q 'loom_xent_fused'; then
    ok "$m $p $vm: cross-entropy forward and gradient in one pass (loom_xent_fused), $S steps bit for bit the two launches"
  else
    bad "$m $p: the fused classifier against the two launches"; tail -3 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
done

# GEMM epilogues (codegen/cuda/lower_gemm.c, "GEMM epilogues" and "bias gradients"; the
# cuBLASLt double computes BIAS, GELU_AUX_BIAS, BGRADA (gpt2-tiny's 10 bias gradients),
# DGELU_BGRAD (its 2 GELU backwards) and beta = 1 with C the residual): gradients and 2 training steps against
# the unfused program (LOOM_CUDA_NO_EPILOGUE=1), fp32 within 1e-5 (the additions' order
# differs), bf16 (fused by default: LOOM_CUDA_FUSE_BF16) with loom check's bf16 rule (the product is no longer
# rounded before the bias and the residual are added); the vocabulary padded (--vocab-multiple 96: the mask is the
# lm_head GEMM's bias) for GPT-2
for mp in gpt2-tiny:fp32 gpt2-tiny:bf16 llama-tiny:fp32 llama-tiny:bf16; do
  m=${mp%%:*} p=${mp##*:}
  tol=$([ $p = fp32 ] && echo "1e-5" || echo "2e-2 --atol 0.06")
  vm=$([ $m = gpt2-tiny ] && echo "--vocab-multiple 96" || echo "")
  # shellcheck disable=SC2086
  if memo "$tmp/epi-f.st" "$LOOM" train tests/golden/$m/train_spec.json --backend cuda \
       --precision $p $vm --steps $S -q > "$tmp/log" 2>&1 &&
     LOOM_CUDA_NO_EPILOGUE=1 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda --precision $p $vm --steps $S -q \
       --out "$tmp/epi-u.st" >> "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/epi-f.st" "$tmp/epi-u.st" --only losses,grad_norms --rtol "${tol%% *}" > "$tmp/diff" 2>&1 &&
     "$ST_DIFF" "$tmp/epi-f.st" "$tmp/epi-u.st" --rtol $tol >> "$tmp/diff" 2>&1; then
    ok "$m $p: GEMMs with bias, GELU and residual epilogues, $S steps within ${tol%% *} of the unfused program"
  else
    bad "$m $p: GEMM epilogues against the unfused program"; tail -3 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
done

# A tied embedding's gradient of whole pieces (codegen/cuda/lower_gemm.c, "whole leaves": the
# lm_head's dW added into the f32 gradient by its GEMM, the embedding's rows by its kernel; no
# fill, sum, cast or accumulate) against LOOM_CUDA_NO_TIED_GRAD=1: fp32 within 1e-5 (g + a + b
# for g + (a + b): the same bits at the first micro-batch, not at the second), bf16 (the pieces
# no longer rounded before they are added: the default LOOM_CUDA_FUSE_BF16) with loom check's bf16 rule;
# and the embedding with the positions' add in one kernel (codegen/cuda/lower_fuse.c) bit for bit
# LOOM_CUDA_NO_EMBED_POS=1 (the same add, rounded once); a padded vocabulary in bf16, the tied
# Llama (no positions) in fp32
for mp in "gpt2-tiny:fp32:" "gpt2-tiny:bf16:--vocab-multiple 96" "llama-tiny-tied:fp32:"; do
  m=${mp%%:*} rest=${mp#*:} p=${rest%%:*} vm=${rest#*:}
  tol=$([ $p = fp32 ] && echo "1e-5" || echo "2e-2 --atol 0.06")
  want=$([ $m = gpt2-tiny ] && echo 2 || echo 1)
  # shellcheck disable=SC2086
  if memo "$tmp/tied-f.st" "$LOOM" train tests/golden/$m/train_spec.json --backend cuda \
       --precision $p $vm --steps $S -q > "$tmp/log" 2>&1 &&
     LOOM_CUDA_NO_TIED_GRAD=1 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda \
       --precision $p $vm --steps $S -q --out "$tmp/tied-u.st" >> "$tmp/log" 2>&1 &&
     LOOM_CUDA_NO_EMBED_POS=1 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda \
       --precision $p $vm --steps $S -q --out "$tmp/tied-e.st" >> "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/tied-f.st" "$tmp/tied-u.st" --only losses,grad_norms --rtol "${tol%% *}" > "$tmp/diff" 2>&1 &&
     "$ST_DIFF" "$tmp/tied-f.st" "$tmp/tied-u.st" --rtol $tol >> "$tmp/diff" 2>&1 &&
     "$ST_DIFF" "$tmp/tied-f.st" "$tmp/tied-e.st" --rtol 0 >> "$tmp/diff" 2>&1 &&
     [ "$("$LOOM" ir tests/golden/$m/train_spec.json --passes=train,lower --target cuda --precision $p \
          $vm --cost | grep '^@grad_step ' | grep -c 'embedding_grad (+= a gradient)\|embedding_pos')" = "$want" ]; then
    ok "$m $p $vm: the tied embedding's gradient added in place ($S steps within ${tol%% *} of the pieces summed), the positions added by the embedding (bit for bit)"
  else
    bad "$m $p $vm: the tied embedding's gradient or the positions' add against the unfused program"; tail -3 "$tmp/log"
    grep FAIL "$tmp/diff" | head -5
  fi
done

# Slices as views (codegen/cuda/lower_gemm.c, "views": q, k, v's slices of c_attn read in place by
# their GEMMs through a row stride, the bias slices and wpe's rows by any op): 2 steps bit for
# bit those of the program with the copies (LOOM_CUDA_NO_VIEWS=1), fp32 and bf16; the sum
# of the three input-gradient products in their GEMMs ("sums of three products", fp32: the
# same additions in the same order) bit for bit that of the kernel (LOOM_CUDA_NO_SUM3=1); and
# c_attn's gradient pieces added into their parts of the gradient ("gradient trees": fp32,
# and bf16 with LOOM_CUDA_FUSE_BF16=0, where only the bias pieces' steps change) bit for bit
# the pads, sums and accumulate (LOOM_CUDA_NO_TREES=1)
# (the program with every fusion runs once per precision)
fz() { [ "$1" = bf16 ] && echo LOOM_CUDA_FUSE_BF16=0 || echo LOOM_CUDA_X=0; }   # bf16: the CPU's rounding points
for p in fp32 bf16; do
  env "$(fz $p)" "$LOOM" train tests/golden/gpt2-tiny/train_spec.json --backend cuda --precision $p --steps $S -q \
    --out "$tmp/view-v-$p.st" > "$tmp/log-v-$p" 2>&1 || { bad "gpt2-tiny $p with every fusion"; tail -3 "$tmp/log-v-$p"; }
done
for kp in VIEWS:fp32 VIEWS:bf16 SUM3:fp32 TREES:fp32 TREES:bf16; do
  k=${kp%%:*} p=${kp##*:}
  rm -f "$tmp/view-v.st"; cp "$tmp/view-v-$p.st" "$tmp/view-v.st" 2> /dev/null; cp "$tmp/log-v-$p" "$tmp/log" 2> /dev/null
  if [ -s "$tmp/view-v.st" ] &&
     env "$(fz $p)" LOOM_CUDA_NO_$k=1 "$LOOM" train tests/golden/gpt2-tiny/train_spec.json --backend cuda --precision $p --steps $S -q \
       --out "$tmp/view-c.st" >> "$tmp/log" 2>&1 &&
     "$ST_DIFF" "$tmp/view-v.st" "$tmp/view-c.st" --rtol 0 > "$tmp/diff" 2>&1; then
    ok "gpt2-tiny $p: $S steps bit for bit those with LOOM_CUDA_NO_$k=1"
  else
    bad "gpt2-tiny $p: against LOOM_CUDA_NO_$k=1"; tail -3 "$tmp/log"; grep FAIL "$tmp/diff" | head -5
  fi
done

# CUDA graphs (runtime/cuda/cuda_call.c, cuda_step.c): a training step (its 2 micro-batches' @grad_step and
# the @optimizer_step, the tokens moved in and the losses out by device copies) captured once
# into one graph and replayed at every step (the emulated driver records launches, memsets,
# device copies and the cuBLASLt double's GEMMs, and replays them): 3 steps are 3 graph
# launches and no kernel launched one by one but bf16's weight copies after the initialization
# (one launch: lower_fuse.c), steps 2 and 3 issued before the step before was waited for; with
# LOOM_CUDA_STEP_GRAPH=0 each function's graph (9 launches); the results those of the
# step-by-step run (LOOM_CUDA_GRAPH=0, synchronous), bit for bit
for mp in gpt2-tiny:fp32 llama-tiny:bf16; do
  m=${mp%%:*} p=${mp##*:}
  direct=$([ $p = bf16 ] && echo 1 || echo 0)
  if LOOM_EMU_STATS=1 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda --precision $p --steps 3 \
       --out "$tmp/graph.st" > "$tmp/graph.log" 2>&1 &&
     LOOM_EMU_STATS=1 LOOM_CUDA_STEP_GRAPH=0 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda --precision $p \
       --steps 3 --out "$tmp/fgraph.st" > "$tmp/fgraph.log" 2>&1 &&
     LOOM_CUDA_GRAPH=0 "$LOOM" train tests/golden/$m/train_spec.json --backend cuda --precision $p --steps 3 \
       --out "$tmp/nograph.st" > "$tmp/log" 2>&1 &&
     grep -q "loom-emu: $direct kernels launched directly, 3 graph launches replaying [1-9][0-9]* kernels" "$tmp/graph.log" &&
     grep -q "loom-emu: 2 graph launches issued before the host waited for the one before" "$tmp/graph.log" &&
     grep -q "loom-emu: $direct kernels launched directly, 9 graph launches replaying [1-9][0-9]* kernels" "$tmp/fgraph.log" &&
     "$ST_DIFF" "$tmp/graph.st" "$tmp/nograph.st" --rtol 0 > "$tmp/diff" 2>&1 &&
     "$ST_DIFF" "$tmp/fgraph.st" "$tmp/nograph.st" --rtol 0 >> "$tmp/diff" 2>&1 &&
     diff <(grep -o '| loss [0-9][0-9.]* .* | norm [0-9.]*' "$tmp/graph.log") \
       <(grep -o '| loss [0-9][0-9.]* .* | norm [0-9.]*' "$tmp/log") > /dev/null; then
    ok "$m $p: one CUDA graph a step, $(grep -o '3 graph launches.*' "$tmp/graph.log"); bit for bit (and the printed losses) the step-by-step run and the per-function graphs"
  else
    bad "$m $p: CUDA graphs against the step-by-step run"; tail -n 3 "$tmp/graph.log" "$tmp/fgraph.log" "$tmp/log"
    grep FAIL "$tmp/diff" | head -5
  fi
done

# LOOM_PROFILE=1 (events around every launch and library call): the table's launches are those
# `loom ir --cost` counts for the same step, every category has a time, and the run's losses
# are those of a run without the profile, bit for bit
g=tests/golden/gpt2-tiny/train_spec.json
n=$("$LOOM" ir $g --passes=train,lower --target cuda --cost | awk '/^launches a step:/ { print $4 }')
if LOOM_PROFILE=1 "$LOOM" train $g --backend cuda --steps 2 > "$tmp/prof.out" 2> "$tmp/prof.err" &&
   "$LOOM" train $g --backend cuda --steps 2 > "$tmp/noprof.out" 2>&1 &&
   awk -v n="$n" '/^CUDA profile of one step/ { t = 1 } t == 1 && $1 == "total" { tot = $2; ms = $3; t = 2 }
     t == 1 && ($1 == "gemm" || $1 == "attention" || $1 == "norm" || $1 == "loss") { if ($3 + 0 > 0) c++ }
     END { exit !(n > 0 && tot == n && ms > 0 && c == 4) }' "$tmp/prof.err" &&
   diff <(cat "$tmp/prof.out" "$tmp/prof.err" | grep -o '| loss [0-9][0-9.]*') <(grep -o '| loss [0-9][0-9.]*' "$tmp/noprof.out") > /dev/null; then
  ok "LOOM_PROFILE=1 on CUDA: $n launches timed (as --cost counts), the losses unchanged"
  sed -n '/^category/,/^total/p' "$tmp/prof.err" | sed 's/^/     /'
else
  bad "LOOM_PROFILE=1 on CUDA (--cost counts $n launches)"; tail -30 "$tmp/prof.err"
fi

# The GEMM algorithms timed at start-up (LOOM_CUDA_GEMM_TUNE, runtime/cuda/cuda_gemm.c): the
# double's heuristic offers 3 candidates whose last always fails to run.  A fresh cache times
# every shape (passing over the failure), a second run reads every choice from the cache, and
# both train to the same bits as LOOM_CUDA_GEMM_TUNE=0 (the heuristic's first candidate)
tc="$tmp/tune-cache"
for r in 1 2; do
  LOOM_CACHE_DIR=$tc LOOM_CUDA_GEMM_TUNE=verbose "$LOOM" train models/gpt2-tiny.json --backend cuda --steps 3 \
    --data "$tmp/d.bin" --out "$tmp/tune$r.st" > "$tmp/tune$r.log" 2>&1 || cat "$tmp/tune$r.log"
done
LOOM_CUDA_GEMM_TUNE=0 "$LOOM" train models/gpt2-tiny.json --backend cuda --steps 3 --data "$tmp/d.bin" \
  --out "$tmp/tune0.st" > "$tmp/tune0.log" 2>&1 || cat "$tmp/tune0.log"
n1=$(sed -n 's/^cuda: GEMM algorithms: \([0-9]*\) shapes, \1 timed, 0 from the cache$/\1/p' "$tmp/tune1.log")
if [ -n "$n1" ] && [ "$n1" -gt 0 ] && grep -q "^cuda: GEMM algorithms: $n1 shapes, 0 timed, $n1 from the cache$" "$tmp/tune2.log" &&
   [ "$(grep -c ' failed ms; candidate [01]$' "$tmp/tune1.log")" = "$n1" ] &&
   cmp -s "$tmp/tune1.st" "$tmp/tune0.st" && cmp -s "$tmp/tune2.st" "$tmp/tune0.st"; then
  ok "GEMM algorithms timed at start-up: $n1 shapes timed (the failing candidate passed over), then read from the cache; the same bits as untimed"
else
  bad "GEMM algorithm timing (LOOM_CUDA_GEMM_TUNE)"; tail -5 "$tmp/tune1.log" "$tmp/tune2.log"
fi

# bench/gpu_step.sh end to end (its parsing of loom's output), on a tiny model
if EMULATED=1 MODELS="models/gpt2-tiny.json:2:32" STEPS=4 LOOM=$LOOM bash bench/gpu_step.sh > "$tmp/bench" 2>&1 &&
   grep -Eq '^\| gpt2-tiny \| 2 x 32 \| 0\.000 \| [0-9.]+ \| [0-9]+ \| [0-9.]+% \| [0-9.]+ MiB \| [0-9.]+ MiB \(arenas .*\| [0-9.]+ \| [0-9.]+ \|$' "$tmp/bench"; then
  ok "bench/gpu_step.sh runs end to end on the emulated device (its table filled)"
else
  bad "bench/gpu_step.sh on the emulated device"; tail -8 "$tmp/bench"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
