# tests/cli/cli_ir.sh — `loom ir`: pipelines and their hooks (print, dump, verify, time),
# -o and reading the output back, --passes errors, shape overrides, every model spec.
# usage: bash tests/cli/cli_ir.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

BIG=models/gpt2-124M.json
N_DEFAULT=5   # verify,canonicalize,cse,dce,verify

# The IR a command printed, fed back in, must print identically (round trip through a file).
reads_back() {   # FILE.ir: `loom ir FILE --passes=verify` prints FILE minus its comment lines
  "$LOOM" ir "$1" --passes=verify >"$TMP/.rb" 2>"$TMP/.rberr" && grep -v '^#' "$1" | cmp -s - "$TMP/.rb"
}

# ---- the default pipeline on every model spec, and the text reads back
for spec in models/*.json; do
  name=$(basename "$spec" .json)
  expect_exit 0 "loom ir $spec" "$LOOM" ir "$spec"
  cp "$OUT" "$TMP/$name.ir"
  check "  the output of $name starts with 'module @$name {'" grep -q "^module @$name {" "$TMP/$name.ir"
  check "  the output of $name reads back identically" reads_back "$TMP/$name.ir"
  # The default pipeline has nothing left to do on its own output.
  run "$LOOM" ir "$TMP/$name.ir"
  check "  the default pipeline is a fixpoint on $name" cmp -s "$OUT" "$TMP/$name.ir"
done

# ---- timing of the biggest spec the tests build (printed, not asserted)
t0=$(date +%s%N)
"$LOOM" ir $BIG >/dev/null 2>&1
t1=$(date +%s%N)
echo "INFO loom ir $BIG took $(((t1 - t0) / 1000000)) ms (this build)"

# ---- --print-ir-after-all: one header per pass on stderr; stdout stays clean IR
expect_exit 0 "loom ir $BIG --print-ir-after-all" "$LOOM" ir $BIG --print-ir-after-all
n=$(grep -c '^# ----- IR after ' "$ERR")
check "  $n 'IR after' headers on stderr, one per pass ($N_DEFAULT)" [ "$n" -eq $N_DEFAULT ]
i=1
for p in verify canonicalize cse dce verify; do
  expect_stderr_contains "# ----- IR after $p (pass $i of $N_DEFAULT) -----"
  i=$((i + 1))
done
check "  every header is followed by a whole module" [ "$(grep -c '^module @gpt2-124M {' "$ERR")" -eq $N_DEFAULT ]
check "  stdout holds only the final module" [ "$(grep -c '^module @' "$OUT")" -eq 1 ]
cp "$OUT" "$TMP/after_all.ir"
check "  stdout equals the output without the option" cmp -s "$TMP/after_all.ir" "$TMP/gpt2-124M.ir"
# The last dump on stderr is the final module.
awk '/^# ----- IR after verify \(pass 5 of 5\)/ { on = 1; next } on' "$ERR" >"$TMP/last_dump.ir"
check "  the last dump on stderr equals stdout" cmp -s "$TMP/last_dump.ir" "$TMP/after_all.ir"

# ---- --print-ir-after=NAME
expect_exit 0 "loom ir --print-ir-after=cse" "$LOOM" ir $BIG --print-ir-after=cse
check "  exactly one 'IR after' header" [ "$(grep -c '^# ----- IR after ' "$ERR")" -eq 1 ]
expect_stderr_contains "# ----- IR after cse (pass 3 of $N_DEFAULT) -----"
expect_stderr_lacks "IR after dce"
expect_exit 0 "loom ir --print-ir-after=verify (the pass runs twice)" "$LOOM" ir $BIG --print-ir-after=verify
check "  two headers, one per run" [ "$(grep -c '^# ----- IR after verify' "$ERR")" -eq 2 ]
expect_exit 0 "loom ir --print-ir-after=cse,dce" "$LOOM" ir $BIG --print-ir-after=cse,dce
check "  two headers (cse and dce)" [ "$(grep -c '^# ----- IR after \(cse\|dce\)' "$ERR")" -eq 2 ]
expect_exit 0 "loom ir --print-ir-after=cse --print-ir-after=dce (repeated)" "$LOOM" ir $BIG --print-ir-after=cse --print-ir-after=dce
check "  two headers (cse and dce)" [ "$(grep -c '^# ----- IR after \(cse\|dce\)' "$ERR")" -eq 2 ]

# ---- --dump-dir: numbered files that sort in pipeline order and each read back
expect_exit 0 "loom ir --dump-dir" "$LOOM" ir $BIG --dump-dir "$TMP/dumps"
files=$(cd "$TMP/dumps" && ls | tr '\n' ' ')
check "  dump files are 00-input 01-verify 02-canonicalize 03-cse 04-dce 05-verify (got: $files)" \
  [ "$files" = "00-input.ir 01-verify.ir 02-canonicalize.ir 03-cse.ir 04-dce.ir 05-verify.ir " ]
for f in "$TMP"/dumps/*.ir; do
  expect_exit 0 "  $(basename "$f") parses and verifies" "$LOOM" ir "$f" --passes=verify
  check "  $(basename "$f") reads back identically" reads_back "$f"
done
grep -v '^#' "$TMP/dumps/05-verify.ir" >"$TMP/last.ir"
check "  the last dump equals the final output" cmp -s "$TMP/last.ir" "$TMP/gpt2-124M.ir"
check "  the input dump differs from the final output (the passes changed something)" \
  sh -c "! grep -v '^#' '$TMP/dumps/00-input.ir' | cmp -s - '$TMP/last.ir'"
expect_exit 0 "loom ir --dump-dir=DIR into an existing directory" "$LOOM" ir models/gpt2-tiny.json --dump-dir="$TMP/dumps" --passes=dce
check "  wrote 01-dce.ir" [ -f "$TMP/dumps/01-dce.ir" ]
expect_exit 1 "loom ir --dump-dir under a missing parent" "$LOOM" ir models/gpt2-tiny.json --dump-dir "$TMP/no/such/dir"
expect_stderr_contains "cannot create dump directory"
# a mesh: one file per rank per pass once the program is partitioned, headed by the rank
expect_exit 0 "loom ir --dump-dir on dp=2 x tp=2" "$LOOM" ir models/gpt2-tiny.json --passes=train --mesh dp=2,tp=2 --dump-dir "$TMP/mesh"
check "  before shard one file per pass (05-optimizer.ir)" [ -f "$TMP/mesh/05-optimizer.ir" ]
check "  after shard 4 files per pass (06-shard.rank0..3.ir)" [ "$(ls "$TMP/mesh" | grep -c '^06-shard\.rank[0-3]\.ir$')" -eq 4 ]
check "  rank 2's file says dp=1 tp=0" grep -q '^# rank 2 of 4: dp=1 tp=0' "$TMP/mesh/06-shard.rank2.ir"
expect_exit 0 "  a rank's dump parses and verifies" "$LOOM" ir "$TMP/mesh/06-shard.rank3.ir" --passes=verify

# ---- --time-passes
expect_exit 0 "loom ir --time-passes" "$LOOM" ir $BIG --time-passes
for p in verify canonicalize cse dce; do expect_stderr_matches "^# pass $p +[0-9.]+ ms"; done
expect_stderr_matches "^# total +[0-9.]+ ms"
check "  stdout is unchanged" cmp -s "$OUT" "$TMP/gpt2-124M.ir"

# ---- --verify-each
expect_exit 0 "loom ir --verify-each" "$LOOM" ir $BIG --verify-each --passes=canonicalize,cse,dce
check "  same output as the default pipeline" cmp -s "$OUT" "$TMP/gpt2-124M.ir"

# ---- -o, then feed the file back
expect_exit 0 "loom ir -o FILE" "$LOOM" ir models/llama-tiny.json -o "$TMP/o.ir"
check "  nothing on stdout" [ ! -s "$OUT" ]
check "  FILE equals what stdout would hold" cmp -s "$TMP/o.ir" "$TMP/llama-tiny.ir"
expect_exit 0 "loom ir FILE --passes=cse,dce on the written file" "$LOOM" ir "$TMP/o.ir" --passes=cse,dce
check "  reads back identically" cmp -s "$OUT" "$TMP/o.ir"
expect_exit 1 "loom ir -o into a missing directory" "$LOOM" ir models/llama-tiny.json -o "$TMP/no/such/o.ir"
expect_stderr_contains "cannot write"

# ---- --passes
expect_exit 2 "loom ir --passes=nosuchpass" "$LOOM" ir $BIG --passes=nosuchpass
expect_stderr_contains "unknown pass 'nosuchpass'"
expect_stderr_contains "known passes: "
for p in verify canonicalize cse dce; do expect_stderr_matches "known passes: .*\\b$p\\b"; done
expect_exit 2 "loom ir --passes=cse,,dce (empty name)" "$LOOM" ir $BIG --passes=cse,,dce
expect_stderr_contains "empty"
expect_exit 0 "loom ir --passes=dce" "$LOOM" ir models/gpt2-tiny.json --passes=dce
expect_exit 0 "loom ir --passes verify (separate argument)" "$LOOM" ir models/gpt2-tiny.json --passes verify
cat >"$TMP/small.ir" <<'EOF'
module @small {
  param $w : f32[4,4] = normal(0.02)
  func @f(%x: f32[4,4]) -> (f32[4,4]) {
    %a = matmul %x, $w : f32[4,4]
    %b = matmul %x, $w : f32[4,4]
    %c = reshape %b : f32[4,4]
    %dead = exp %a : f32[4,4]
    %y = add %a, %c : f32[4,4]
    return %y
  }
}
EOF
expect_exit 0 "loom ir FILE.ir with the default pipeline" "$LOOM" ir "$TMP/small.ir"
expect_stdout_contains "    %y = add %a, %a : f32[4,4]"
check "  two ops left of five (cse, canonicalize, dce)" [ "$(grep -c '^    %' "$OUT")" -eq 2 ]

# ---- the text form round-trips at every stage of the training pipeline too (when the
#      passes exist): every dump of every pass reads back identically.
if "$LOOM" ir --list-passes | grep -q '^  autodiff ' && "$LOOM" ir --list-passes | grep -q '^  optimizer '; then
  for spec in models/gpt2-tiny.json models/llama-tiny-tied.json; do
    name=$(basename "$spec" .json)
    expect_exit 0 "loom ir $spec through autodiff and optimizer, dumped" "$LOOM" ir "$spec" \
      --passes=verify,autodiff,optimizer,canonicalize,cse,dce,verify --dump-dir "$TMP/train-$name"
    bad_dumps=""
    for f in "$TMP/train-$name"/*.ir; do reads_back "$f" || bad_dumps="$bad_dumps $(basename "$f")"; done
    check "  all $(ls "$TMP/train-$name" | wc -l) dumps read back identically${bad_dumps:+ (not:$bad_dumps)}" [ -z "$bad_dumps" ]
  done
else
  echo "INFO autodiff/optimizer passes not present: training-pipeline round trips skipped"
fi

# ---- --batch / --seq change the shapes
expect_exit 0 "loom ir --batch 2 --seq 16" "$LOOM" ir $BIG --batch 2 --seq 16
expect_stdout_contains "func @forward(%tokens: i32[2,16], %targets: i32[2,16]) -> (f32[2,16,50257], f32[])"
expect_stdout_contains "%logits = matmul %ln_f, \$wte.weight {tb=true} : f32[2,16,50257]"
check "  no value keeps the spec's [8,1024]" sh -c "! grep -q '8,1024' '$OUT'"
expect_exit 0 "loom ir --batch=3 --seq=5 on llama" "$LOOM" ir models/llama-tiny.json --batch=3 --seq=5
expect_stdout_contains "func @forward(%tokens: i32[3,5], %targets: i32[3,5]) -> (f32[3,5,256], f32[])"
expect_exit 0 "loom ir --seq 8 --seq 4 (the last wins)" "$LOOM" ir models/gpt2-tiny.json --seq 8 --seq 4
expect_stdout_contains "%tokens: i32[2,4]"
expect_exit 2 "loom ir --seq beyond GPT-2's learned positions" "$LOOM" ir models/gpt2-tiny.json --seq 65
expect_stderr_contains "seq"
expect_exit 2 "loom ir --batch abc" "$LOOM" ir models/gpt2-tiny.json --batch abc
expect_stderr_contains "batch"

# At dp=4 each rank broadcasts the biases and the position embedding straight to its part
# of the batch (canonicalize: shard_slice(broadcast(x)) -> broadcast), not to the whole
# mesh's batch and then slices it.
run "$LOOM" ir models/gpt2-tiny.json --passes=train --mesh dp=4 --batch 8
check "dp=4: no broadcast to the global batch followed by a shard_slice (every broadcast is to a rank's [2,32,...])" \
  sh -c "grep -q 'broadcast .*: f32\[2,32,64\]<dp:s0>' '$OUT' && ! grep -q 'broadcast .*: f32\[8,32,' '$OUT'"
check "dp=4: a training program's @forward returns each rank's logits [2,32,256] and the loss (validation reads only the loss; no gather of the whole batch's logits)" \
  grep -q 'func @forward(.*) -> (f32\[2,32,256\]<dp:s0>, f32\[\])' "$OUT"

finish
