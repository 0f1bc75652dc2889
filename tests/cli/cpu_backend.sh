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
# The object-code cache (runtime/cpu/jit.c, runtime/io/diskcache.h): the first run compiles
# and keeps the object code, the second loads it (and says so) with the same bits; a damaged
# entry is a miss, never an error; LOOM_CACHE_DIR=off keeps nothing; two runs started together
# on an empty cache compile once (the entry's lock), the other waits and loads.
c=$tmp/jitcache; m=models/gpt2-tiny.json
"$LOOM" data data/shakespeare.txt -o "$tmp/d.bin" > /dev/null 2>&1
jrun() { LOOM_CACHE_DIR=$1 "$LOOM" train $m --data "$tmp/d.bin" --steps 3 --batch 2 --out "$2" > "$3" 2>&1; }
jrun "$c" "$tmp/j1.st" "$tmp/j1.log"; jrun "$c" "$tmp/j2.st" "$tmp/j2.log"
n_o=$(find "$c" -maxdepth 1 -name '*.o' | wc -l)
! grep -q 'from the cache' "$tmp/j1.log" && grep -q '^JIT-compiled .* (object code from the cache)' "$tmp/j2.log" &&
  [ "$n_o" = 1 ] && cmp -s "$tmp/j1.st" "$tmp/j2.st" &&
  ok "JIT cache: the first run compiles and keeps 1 entry, the second loads it, bitwise the same result" ||
  { bad "JIT cache: first/second run ($n_o entries)"; cat "$tmp/j1.log" "$tmp/j2.log" | grep -i jit; }
f=$(find "$c" -maxdepth 1 -name '*.o' | head -1)
[ -n "$f" ] && printf 'XXXX' | dd of="$f" bs=1 seek=200 conv=notrunc 2> /dev/null
jrun "$c" "$tmp/j3.st" "$tmp/j3.log"; rc=$?
[ $rc = 0 ] && ! grep -q 'from the cache' "$tmp/j3.log" && cmp -s "$tmp/j1.st" "$tmp/j3.st" &&
  ok "JIT cache: a damaged entry is compiled again (no error), same result" || { bad "JIT cache: damaged entry (exit $rc)"; tail -3 "$tmp/j3.log"; }
jrun off "$tmp/j4.st" "$tmp/j4.log"; jrun "" "$tmp/j5.st" "$tmp/j5.log"
! grep -q 'from the cache' "$tmp/j4.log" "$tmp/j5.log" && cmp -s "$tmp/j1.st" "$tmp/j4.st" &&
  ok "JIT cache: LOOM_CACHE_DIR=off (or empty) compiles every time" || bad "JIT cache: off"
c2=$tmp/jitcache2
jrun "$c2" "$tmp/k1.st" "$tmp/k1.log" & jrun "$c2" "$tmp/k2.st" "$tmp/k2.log" & wait
hits=$(cat "$tmp/k1.log" "$tmp/k2.log" | grep -c '(object code from the cache)')
[ "$hits" = 1 ] && cmp -s "$tmp/k1.st" "$tmp/k2.st" &&
  ok "JIT cache: of two runs started together on an empty cache one compiles, the other waits and loads" ||
  bad "JIT cache: two runs at once: $hits loaded from the cache (1 expected)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
