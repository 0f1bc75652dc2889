#!/usr/bin/env bash
# loom ir --emit=cuda writes one translation unit that nvcc compiles as it is (NVRTC is
# checked by tests/unit/test_cuda_codegen.c).  No GPU is needed; without nvcc the compile
# check says SKIP.
LOOM=$1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for prec in fp32 bf16; do
  if "$LOOM" ir models/llama-tiny.json --passes=train,lower --target=cuda --precision $prec --emit=cuda -o "$tmp/k.cu" > "$tmp/log" 2>&1; then
    n=$(grep -c '__global__' "$tmp/k.cu")
    ok "$prec: --emit=cuda writes $n kernels"
  else
    bad "$prec: --emit=cuda"; cat "$tmp/log"; continue
  fi
  NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
  if [ -z "$NVCC" ]; then
    echo "SKIP $prec: nvcc not found: the translation unit was not compiled here"
  elif "$NVCC" -arch=sm_80 -cubin -o "$tmp/k.cubin" "$tmp/k.cu" > "$tmp/log" 2>&1; then
    ok "$prec: nvcc compiles it as it is for sm_80"
  else
    bad "$prec: nvcc"; head -20 "$tmp/log"
  fi
done
"$LOOM" ir models/llama-tiny.json --passes=train,lower --emit=cuda > "$tmp/log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "target=cuda" "$tmp/log" && ok "--emit=cuda without --target=cuda: exit 2 and says what to add" || { bad "no target: exit $rc"; cat "$tmp/log"; }
# Without a GPU, --backend cuda says so (exit 2) and the default backend is cpu.
if ! command -v nvidia-smi > /dev/null; then
  "$LOOM" train tests/golden/gpt2-tiny/train_spec.json -q --backend cuda > "$tmp/log" 2>&1; rc=$?
  [ $rc -eq 2 ] && grep -q "backend cuda" "$tmp/log" && ok "--backend cuda without a GPU: exit 2: $(head -1 "$tmp/log" | cut -c1-110)" || { bad "--backend cuda without GPU: exit $rc"; cat "$tmp/log"; }
  "$LOOM" train tests/golden/gpt2-tiny/train_spec.json --steps 1 > "$tmp/log" 2>&1 && grep -q "cpu backend" "$tmp/log" &&
    ok "without a GPU the default backend is cpu" || { bad "default backend"; cat "$tmp/log"; }
else
  echo "SKIP: a GPU is present: tests/gpu/run.sh checks --backend cuda"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
