# tests/cli/hostile_inputs.sh — issue 29 section 4: counts too large to run, files that are
# not files, and an IR too long to print in quadratic time.  Every case exits 2 within a
# bound of time (HOSTILE_TIMEOUT seconds, default 60: the sanitizer build on two busy cores;
# the release build takes under 4 s for each), names the key or flag, and no sanitizer
# reports anything.  The messages' other corrections (did-you-mean for flags and commands,
# a compiled executable naming itself, no empty error line) are checked at the end.
# usage: bash tests/cli/hostile_inputs.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

SPEC=models/gpt2-tiny.json
K=tests/golden/gpt2-tiny/tokens.bin
W=tests/golden/gpt2-tiny/weights.safetensors
LIMIT=${HOSTILE_TIMEOUT:-60}

# hostile WHAT KEY CMD...: exit 2 within LIMIT seconds (else timeout's KILL: 137), the key named, no crash.
hostile() {
  local what=$1 key=$2
  shift 2
  expect_exit 2 "$what" timeout -s KILL "$LIMIT" "$@"
  expect_stderr_contains "$key"
}
train() { echo "$LOOM" train "$SPEC" --data $K -q --steps 1; }

# ---- counts given as flags
hostile "--steps 1e18" 'key "steps" (--steps)' $(train) --steps 1e18
hostile "--grad-accum 2147483647" 'key "grad_accum" (--grad-accum)' $(train) --grad-accum 2147483647
hostile "--val-tokens 9000000000000000000" "--val-tokens" $(train) --val-data $K --val-tokens 9000000000000000000
expect_stderr_contains "hold 300 tokens"
# 4096 ranks as threads of 64 sequences each: 24 MB a rank, 99 GB in all (one sequence a
# rank fits: 2.8 MB a rank since validation keeps each rank's logits, not the whole batch's)
hostile "--mesh dp=4096 --batch 262144" 'key "mesh" (--mesh)' $(train) --mesh dp=4096 --batch 262144
expect_stderr_matches "4096 ranks .* GB in all, and this machine has"
hostile "--batch 1000000" 'key "batch" (--batch)' $(train) --batch 1000000
expect_stderr_matches "GB in all, and this machine has [0-9.]+ [KMGT]?B"
hostile "--batch x --seq past a BLAS int" 'key "batch" (--batch)' $(train) --batch 2147483647 --seq 2

# ---- counts in a config
config() {   # config NAME 'sed expression' [SOURCE]: a copy of a model with one value changed
  sed "$2" "${3:-$SPEC}" >"$TMP/$1.json"
}
config layers1e9 's/"n_layer": 2/"n_layer": 1000000000/'
hostile "n_layer 1e9" 'key "model.n_layer": 1000000000' "$LOOM" ir "$TMP/layers1e9.json"
config layers65536 's/"n_layer": 2/"n_layer": 65536/'
hostile "n_layer 65536 (ir)" 'key "model.n_layer": 65536' "$LOOM" ir "$TMP/layers65536.json"
hostile "n_layer 65536 (train)" 'key "model.n_layer": 65536' $(train | sed "s#$SPEC#$TMP/layers65536.json#")
config vocab 's/"vocab_size": 256/"vocab_size": 2147483647/'
hostile "vocab_size 2^31-1" 'key "vocab_size"' $(train | sed "s#$SPEC#$TMP/vocab.json#")
expect_stderr_matches "TB in all, and this machine has"
config embd 's/"n_embd": 64/"n_embd": 1073741824/'
hostile "n_embd 2^30" 'key "model.n_embd": 1073741824' "$LOOM" ir "$TMP/embd.json"
hostile "n_embd 2^30 (train)" 'key "model.n_embd"' $(train | sed "s#$SPEC#$TMP/embd.json#")
config experts 's/"num_local_experts": 4/"num_local_experts": 1000000000/' models/mixtral-tiny.json
hostile "num_local_experts 1e9" 'key "model.num_local_experts": 1000000000' "$LOOM" ir "$TMP/experts.json"
config experts_mem 's/"num_local_experts": 4/"num_local_experts": 60000/; s/"intermediate_size": 96/"intermediate_size": 9600/' \
  models/mixtral-tiny.json
hostile "num_local_experts 60000 (train: memory)" 'key "num_local_experts" of the model' \
  $(train | sed "s#$SPEC#$TMP/experts_mem.json#")
# a config.json the spec names: the key without the spec's "model." and the config's path
printf '{"model": "layers.json", "batch": 2, "seq": 32}\n' >"$TMP/refers.json"
sed -n '/"model": {/,/^  }/p' "$TMP/layers65536.json" | sed '1s/.*/{/; $s/.*/}/' >"$TMP/layers.json"
hostile "n_layer 65536 in a named config.json" "layers.json: key \"n_layer\": 65536" "$LOOM" ir "$TMP/refers.json"
# the compiled executable bounds its own flags
expect_exit 0 "compile a tiny executable" "$LOOM" compile "$SPEC" --data $K -o "$TMP/exe" -q
hostile "compiled executable: --steps 99999999999" "--steps 99999999999" "$TMP/exe" --steps 99999999999

# ---- files that are not files: a FIFO must be refused, not waited on
mkfifo "$TMP/fifo" "$TMP/fifo.ir"
hostile "a FIFO as the training data" "$TMP/fifo: cannot read: not a regular file" "$LOOM" train "$SPEC" --data "$TMP/fifo" -q --steps 1
hostile "a FIFO as the validation data" "$TMP/fifo" $(train) --val-data "$TMP/fifo"
hostile "a FIFO as the weights" "$TMP/fifo: cannot read: not a regular file" "$LOOM" eval "$SPEC" --weights "$TMP/fifo" --tokens $K
hostile "a FIFO as the tokens" "$TMP/fifo: cannot read" "$LOOM" eval "$SPEC" --weights $W --tokens "$TMP/fifo"
hostile "a FIFO as --init" "$TMP/fifo" $(train) --init "$TMP/fifo"
hostile "a FIFO as the spec" "$TMP/fifo: not a regular file" "$LOOM" ir "$TMP/fifo"
hostile "a FIFO as an IR file" "$TMP/fifo.ir: not a regular file" "$LOOM" ir "$TMP/fifo.ir"
hostile "a FIFO as text for loom data" "$TMP/fifo" "$LOOM" data "$TMP/fifo" -o "$TMP/x.bin"
printf '{"model": "fifo", "batch": 2}\n' >"$TMP/names_fifo.json"
hostile "a FIFO as the spec's model" "fifo: not a regular file" "$LOOM" ir "$TMP/names_fifo.json"

# ---- a 200,000-op IR prints in linear time (naming every value scanned every earlier name:
# 20k ops took 2 s, 200k over a minute)
awk 'BEGIN { n = 200000
  print "module @long {\n  mesh dp=1 tp=1 cp=1 pp=1 ep=1\n\n  func @f(%x: f32[4]) -> (f32[4]) {"
  print "    %v0 = scale %x {by=2} : f32[4]"
  for (i = 1; i < n; i++) printf "    %%v%d = scale %%v%d {by=2} : f32[4]\n", i, i - 1
  printf "    return %%v%d\n  }\n}\n", n - 1 }' >"$TMP/long.ir"
expect_exit 0 "a 200,000-op IR file printed" timeout -s KILL "$LIMIT" "$LOOM" ir "$TMP/long.ir" --passes=verify
check "  it printed every op" [ "$(grep -c ' = scale ' "$OUT")" -eq 200000 ]
# names taken again get the smallest free suffix, as before (x, x.1, x.2 ...)
printf 'module @dup {\n  mesh dp=1 tp=1 cp=1 pp=1 ep=1\n\n  func @f(%%x: f32[4]) -> (f32[4]) {\n    %%x.1 = scale %%x {by=2} : f32[4]\n    %%a = scale %%x.1 {by=2} : f32[4]\n    return %%a\n  }\n}\n' >"$TMP/dup.ir"
expect_exit 0 "an IR with dotted names round-trips" "$LOOM" ir "$TMP/dup.ir" --passes=verify
expect_stdout_contains "%x.1 = scale %x"

# ---- messages
expect_exit 2 "a misspelt flag" "$LOOM" train "$SPEC" --stpes 3
expect_stderr_contains "unknown option '--stpes'; did you mean '--steps'?"
expect_exit 2 "a misspelt flag of eval" "$LOOM" eval "$SPEC" --wieghts $W
expect_stderr_contains "did you mean '--weights'?"
expect_exit 2 "a misspelt command" "$LOOM" trian
expect_stderr_contains "unknown command 'trian'; did you mean 'train'?"
expect_exit 2 "a flag far from every flag" "$LOOM" train "$SPEC" --zzzzzzzz 3
expect_stderr_lacks "did you mean"
expect_exit 2 "a compiled executable names itself" "$TMP/exe" --stpes 3
expect_stderr_contains "$TMP/exe: error: unknown option '--stpes'; did you mean '--steps'?"
expect_stderr_lacks "loom train"
no_empty_error() { ! grep -qE 'error: *$' "$ERR"; }
check "  no empty 'error:' line" no_empty_error
expect_exit 2 "a value error names the flag as typed" "$LOOM" train "$SPEC" --data $K --grad-accum 0
expect_stderr_contains "--grad-accum"

finish
