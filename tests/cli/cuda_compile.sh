#!/usr/bin/env bash
# loom compile --backend cuda --arch: the executable carries the lowered program and a cubin
# NVRTC made at compile time (no GPU needed to build it).  Without a GPU the executable says
# it needs one (exit 2); with one it trains 2 steps.  Needs NVRTC (else SKIP).
LOOM=$1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export LOOM_CACHE_DIR=$tmp/cache
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null || { echo "FAIL loom data"; exit 1; }
if "$LOOM" compile models/gpt2-tiny.json --backend cuda --arch sm_90a --data "$tmp/d.bin" -o "$tmp/exe" > "$tmp/log" 2>&1; then
  # several NVRTC programs (the attention kernels each alone): a bundle of their cubins
  bytes=$(sed -n 's/.*(\([0-9]*\) programs).*a \([0-9]*\)-byte bundle of cubins.*/\1 \2/p' "$tmp/log")
  if [ "${bytes%% *}" -gt 1 ] 2>/dev/null && [ "${bytes##* }" -gt 1000 ] && "$tmp/exe" --info | grep -q '"backend":"cuda","arch":"sm_90a"'; then
    ok "compile --backend cuda --arch sm_90a: ${bytes%% *} programs, a ${bytes##* }-byte bundle of cubins embedded, --info names cuda and sm_90a"
  else
    bad "cubin size '$bytes' or --info"; cat "$tmp/log"; "$tmp/exe" --info
  fi
  if command -v nvidia-smi > /dev/null && nvidia-smi > /dev/null 2>&1; then
    if "$tmp/exe" --steps 2 > "$tmp/run" 2>&1 && grep -q '^done' "$tmp/run"; then ok "the executable trains on this GPU"
    elif grep -q 'were compiled for sm_90a' "$tmp/run"; then ok "another GPU here: refused by architecture: $(tail -1 "$tmp/run" | cut -c1-120)"
    else bad "run on the GPU"; cat "$tmp/run"; fi
  else
    "$tmp/exe" --steps 2 > "$tmp/run" 2>&1; rc=$?
    [ $rc -eq 2 ] && grep -q 'NVIDIA GPU' "$tmp/run" && ok "no GPU here: exit 2, $(tail -1 "$tmp/run" | cut -c1-110)..." || { bad "no GPU: exit $rc"; cat "$tmp/run"; }
  fi
elif grep -q 'NVRTC not available' "$tmp/log"; then
  echo "SKIP compile --backend cuda: NVRTC is not installed here"
else
  bad "compile --backend cuda --arch sm_90a"; cat "$tmp/log"
fi
"$LOOM" compile models/gpt2-tiny.json --arch sm_80 -o "$tmp/x" > "$tmp/log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q 'backend cuda' "$tmp/log" && ok "--arch without --backend cuda: exit 2" || { bad "--arch alone: exit $rc"; cat "$tmp/log"; }
"$LOOM" compile models/gpt2-tiny.json --backend cuda --arch gfx90a -o "$tmp/x" > "$tmp/log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q 'sm_90a' "$tmp/log" && ok "--arch gfx90a: exit 2, names the form it takes" || { bad "bad arch: exit $rc"; cat "$tmp/log"; }
"$LOOM" train models/gpt2-tiny.json --arch sm_80 > "$tmp/log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q 'loom compile' "$tmp/log" && ok "train --arch: exit 2, points to loom compile" || { bad "train --arch: exit $rc"; cat "$tmp/log"; }
if ! command -v nvidia-smi > /dev/null; then
  g=tests/golden/gpt2-tiny
  "$LOOM" eval models/gpt2-tiny.json --weights $g/weights.safetensors --tokens $g/tokens.bin --backend cuda > "$tmp/log" 2>&1; rc=$?
  [ $rc -eq 2 ] && grep -q 'backend cuda' "$tmp/log" && ok "eval --backend cuda without a GPU: exit 2" || { bad "eval cuda: exit $rc"; cat "$tmp/log"; }
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
