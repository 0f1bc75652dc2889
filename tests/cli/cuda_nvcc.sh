#!/usr/bin/env bash
# The CUDA kernels (codegen/cuda/kernels/*.cuh) as CUDA C++ compiled by nvcc: the translation
# units loom emits (every kernel family, with the templates instantiated as the lowering
# does) for GPT-2 in fp32, Llama in bf16 (tensor-core attention, RMS norm), the attention
# blocks of context parallelism, the KV-cache kernels and the mixture-of-experts kernels, each
# built for sm_90a (and sm_80 where tensor cores are used) with -Werror on what nvcc warns about. Catches what NVRTC would
# refuse at run time, before anyone reaches a GPU. Needs nvcc (else SKIP, said so).
LOOM=$1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$NVCC" ]; then echo "SKIP nvcc not found (set NVCC): the CUDA kernels were not compiled"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

emit() {   # name, then loom ir arguments
  local name=$1; shift
  if "$LOOM" ir "$@" --target=cuda --emit=cuda -o "$tmp/$name.cu" > "$tmp/log" 2>&1; then return 0; fi
  bad "$name: loom ir $* --emit=cuda"; cat "$tmp/log"; return 1
}
emit gpt2-fp32 models/gpt2-tiny.json --passes=train,lower
emit llama-bf16 models/llama-tiny.json --passes=train,lower --precision bf16
emit attn_block tests/cuda_emu/attn_block.ir --passes=verify,lower
emit decode tests/cuda_emu/decode.ir --passes=verify,fuse,memory-plan
emit moe tests/cuda_emu/moe.ir --passes=verify,fuse,memory-plan

# every family file must reach the translation units (a family left out of cuda_emit_prelude)
for f in codegen/cuda/kernels/*.cuh; do
  first=$(grep -m1 -v '^\s*$' "$f")
  grep -qF -- "$first" "$tmp/gpt2-fp32.cu" && ok "$(basename "$f") is in the emitted translation unit" ||
    bad "$(basename "$f"): its first line is not in the emitted translation unit (codegen/cuda/lower.c cuda_emit_prelude)"
done

# sm_80 only where the kernels differ by architecture (mma.sync tensor-core paths)
for tu in gpt2-fp32:sm_90a llama-bf16:sm_80,sm_90a attn_block:sm_90a decode:sm_90a moe:sm_80,sm_90a; do
  archs=${tu#*:}; tu=${tu%%:*}
  [ -f "$tmp/$tu.cu" ] || continue
  for arch in ${archs//,/ }; do
    if "$NVCC" -std=c++17 -arch=$arch -Werror all-warnings -c -x cu "$tmp/$tu.cu" -o "$tmp/$tu-$arch.o" > "$tmp/nvcc.log" 2>&1; then
      ok "$tu: nvcc -arch=$arch compiles $(grep -c '__global__' "$tmp/$tu.cu") kernels"
    else
      bad "$tu: nvcc -arch=$arch"; head -30 "$tmp/nvcc.log"
    fi
  done
done
echo "cuda_nvcc: $pass passed, $fail failed"
[ $fail -eq 0 ]
