#!/usr/bin/env bash
# The cpu backend from the command line: the LLVM IR it emits, the two backends agreeing
# on a training run, and compiled executables of both kinds.
LOOM=$1 ST_DIFF=$2
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
spec=tests/golden/llama-tiny/train_spec.json

n=$("$LOOM" ir models/gpt2-tiny.json --passes=train,lower --emit=llvm | grep -c '^define')
[ "$n" -gt 20 ] && ok "--emit=llvm prints the kernels as LLVM IR ($n functions)" || bad "--emit=llvm: $n functions"
"$LOOM" ir models/gpt2-tiny.json --passes=train,lower --emit=llvm-opt | grep -q '<8 x float>' &&
  ok "--emit=llvm-opt shows vectorized loops (<8 x float>)" || bad "--emit=llvm-opt"
"$LOOM" ir models/gpt2-tiny.json --emit=llvm > "$tmp/log" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "fuse" "$tmp/log" && ok "--emit=llvm without fuse: exit 2 and says to fuse" || { bad "--emit without fuse: $rc"; cat "$tmp/log"; }

"$LOOM" train $spec -q --steps 4 --backend ref --out "$tmp/ref.st" > /dev/null 2>&1
"$LOOM" train $spec -q --steps 4 --backend cpu --threads 2 --out "$tmp/cpu.st" > /dev/null 2>&1
"$ST_DIFF" "$tmp/cpu.st" "$tmp/ref.st" --rtol 1e-5 > "$tmp/diff" 2>&1 && ok "4 steps: cpu and reference backends agree within 1e-5 ($(tail -1 "$tmp/diff" | grep -o '[0-9]* tensors'))" || { bad "cpu vs ref"; cat "$tmp/diff"; }
"$LOOM" train $spec -q --steps 4 --backend cpu --threads 1 --out "$tmp/cpu1.st" > /dev/null 2>&1
cmp -s "$tmp/cpu.st" "$tmp/cpu1.st" && ok "the cpu backend gives bitwise the same result with 1 and 2 threads" || bad "thread count changes the result"

for b in cpu ref; do
  "$LOOM" compile $spec -q --steps 4 --backend $b -o "$tmp/exe-$b" > /dev/null 2>&1 &&
    "$tmp/exe-$b" -q --out "$tmp/exe-$b.st" > "$tmp/log" 2>&1 && cmp -s "$tmp/exe-$b.st" "$tmp/$( [ $b = cpu ] && echo cpu || echo ref).st" &&
    ok "compiled with --backend $b: the executable reproduces loom train bit for bit" || { bad "compiled $b"; cat "$tmp/log"; }
done
"$tmp/exe-cpu" --info | grep -q '"backend":"cpu"' && ok "--info names the backend" || bad "--info"
printf 'garbage' >> "$tmp/exe-cpu"
"$tmp/exe-cpu" -q > "$tmp/log" 2>&1; rc=$?
[ $rc -ne 0 ] && ! grep -q -e AddressSanitizer -e "runtime error" "$tmp/log" && ok "a damaged executable is refused (exit $rc): $(head -1 "$tmp/log" | cut -c1-120)" || { bad "damaged exe: exit $rc"; cat "$tmp/log"; }
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
