# tests/cli/bad_inputs.sh — every bad input gives exit code 2, a message naming the file
# and the problem, and no crash (no sanitizer report).  The bad files are made in a
# temporary directory from the good ones with shell tools.
# usage: bash tests/cli/bad_inputs.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

SPEC=models/gpt2-tiny.json
G=tests/golden/gpt2-tiny
W=$G/weights.safetensors
K=$G/tokens.bin
HLEN=$(od -An -t u8 -N8 $W | tr -d ' ')   # the weights' JSON header length

# bad CASE-NAME FILE-SUBSTRING MESSAGE-SUBSTRING CMD...: exit 2, file named, message given.
bad() {
  local what=$1 file=$2 msg=$3
  shift 3
  expect_exit 2 "$what" "$@"
  expect_stderr_contains "$file"
  expect_stderr_contains "$msg"
}
eval_with() {   # eval_with WEIGHTS TOKENS [SPEC]
  echo "$LOOM" eval "${3:-$SPEC}" --weights "$1" --tokens "$2"
}

# ---- run specs
printf '{\n  "model": {"model_type": "gpt2", "n_embd": 64,,\n    "n_head": 4}\n}\n' >"$TMP/broken.json"
bad "broken JSON spec" "broken.json:2:" "invalid JSON" "$LOOM" ir "$TMP/broken.json"
sed 's/"batch": 2/"bacth": 2/' $SPEC >"$TMP/typo.json"
bad "unknown run-spec key" "typo.json" 'did you mean "batch"' "$LOOM" ir "$TMP/typo.json"
sed 's/"n_head": 4/"n_head": "twelve"/' $SPEC >"$TMP/twelve.json"
bad "n_head \"twelve\"" "twelve.json" 'model.n_head' "$LOOM" ir "$TMP/twelve.json"
expect_stderr_contains '"twelve"'
sed 's/"model_type": "gpt2"/"model_type": "mixtral"/' $SPEC >"$TMP/mixtral.json"
bad "model_type mixtral with GPT-2's keys" "mixtral.json" "hidden_size" "$LOOM" ir "$TMP/mixtral.json"
bad "missing model file" "nosuch.json" "cannot open" "$LOOM" ir "$TMP/nosuch.json"
printf '{"model": "nosuch_config.json", "batch": 2}\n' >"$TMP/refers.json"
bad "spec naming a missing config.json" "nosuch_config.json" "" "$LOOM" ir "$TMP/refers.json"
mkdir "$TMP/adir.json"
bad "a directory given as the spec" "adir.json" "" "$LOOM" ir "$TMP/adir.json"
expect_stderr_matches "folder|directory"
bad "a directory given to eval" "$TMP" "" $(eval_with $W $K "$TMP")
expect_stderr_matches "folder|directory"
bad "a directory given as the weights" "$TMP" "" $(eval_with "$TMP" $K)
expect_stderr_matches "folder|directory"
bad "a directory given as the tokens" "$TMP" "" $(eval_with $W "$TMP")
expect_stderr_matches "folder|directory"
: >"$TMP/empty.json"
bad "empty spec file" "empty.json" "invalid JSON" "$LOOM" ir "$TMP/empty.json"
printf '\x00\x01\x02binary' >"$TMP/binary.json"
bad "binary spec file" "binary.json:1:" "invalid JSON" "$LOOM" ir "$TMP/binary.json"

# ---- weights (safetensors)
head -c 1000 $W >"$TMP/short_header.safetensors"
bad "weights truncated inside the header" "short_header.safetensors" "truncated" $(eval_with "$TMP/short_header.safetensors" $K)
head -c 400000 $W >"$TMP/cut_data.safetensors"
bad "weights truncated inside the data" "cut_data.safetensors" "truncated" $(eval_with "$TMP/cut_data.safetensors" $K)
head -c 5 $W >"$TMP/tiny.safetensors"
bad "weights of 5 bytes" "tiny.safetensors" "shorter than the 8-byte header" $(eval_with "$TMP/tiny.safetensors" $K)
cp $W "$TMP/hostile.safetensors"
poke "$TMP/hostile.safetensors" 0 '\xff\xff\xff\xff\xff\xff\xff\x7f'
bad "hostile header length 2^63-1" "hostile.safetensors" "over the 100 MB limit" $(eval_with "$TMP/hostile.safetensors" $K)
cp $W "$TMP/hostile2.safetensors"
poke "$TMP/hostile2.safetensors" 0 '\xff\xff\xff\xff\xff\xff\xff\xff'
bad "hostile header length 2^64-1" "hostile2.safetensors" "over the 100 MB limit" $(eval_with "$TMP/hostile2.safetensors" $K)
cp $W "$TMP/badjson.safetensors"
poke "$TMP/badjson.safetensors" 8 '['
bad "weights header that is not JSON" "badjson.safetensors" "not valid JSON" $(eval_with "$TMP/badjson.safetensors" $K)
st_edit_header $W "$TMP/offsets_clash.safetensors" 's/"data_offsets":\[65536,81920\]/"data_offsets":[65532,81916]/'
bad "weights with overlapping offsets" "offsets_clash.safetensors" "overlap" $(eval_with "$TMP/offsets_clash.safetensors" $K)
st_edit_header $W "$TMP/huge_offsets.safetensors" 's/"data_offsets":\[0,65536\]/"data_offsets":[9223372036854710271,9223372036854775807]/'
bad "weights with offsets near 2^63" "huge_offsets.safetensors" "" $(eval_with "$TMP/huge_offsets.safetensors" $K)
st_edit_header $W "$TMP/missing.safetensors" 's/"ln_f.bias"/"ln_f.bxas"/'
bad "weights missing a tensor" "missing.safetensors" "has no tensor 'ln_f.bias'" $(eval_with "$TMP/missing.safetensors" $K)
st_edit_header $W "$TMP/shape.safetensors" 's/"ln_f.bias":{"dtype":"F32","shape":\[64\]/"ln_f.bias":{"dtype":"F32","shape":[8,8]/'
bad "weights with a wrong shape" "shape.safetensors" "tensor 'ln_f.bias' is [8,8] but the model needs [64]" \
  $(eval_with "$TMP/shape.safetensors" $K)
st_edit_header $W "$TMP/dtype.safetensors" 's/"ln_f.bias":{"dtype":"F32","shape":\[64\]/"ln_f.bias":{"dtype":"I32","shape":[64]/'
bad "weights with an integer tensor" "dtype.safetensors" "ln_f.bias" $(eval_with "$TMP/dtype.safetensors" $K)
st_edit_header $W "$TMP/llama_names.safetensors" 's/"wte.weight"/"model.embed_tokens.weight"/'
bad "weights for another model" "llama_names.safetensors" "has no tensor 'wte.weight'" \
  $(eval_with "$TMP/llama_names.safetensors" $K)
bad "weights file missing" "nosuch.safetensors" "nosuch.safetensors" $(eval_with "$TMP/nosuch.safetensors" $K)

# ---- token shards
cp $K "$TMP/magic.bin"
poke "$TMP/magic.bin" 0 '\x01\x02\x03\x04'
bad "token file with a bad magic" "magic.bin" "magic number 67305985" $(eval_with $W "$TMP/magic.bin")
head -c 1100 $K >"$TMP/cut.bin"
bad "token file truncated" "cut.bin" "truncated" $(eval_with $W "$TMP/cut.bin")
head -c 100 $K >"$TMP/stub.bin"
bad "token file shorter than its header" "stub.bin" "header" $(eval_with $W "$TMP/stub.bin")
head -c 1024 $K >"$TMP/few.bin"
poke "$TMP/few.bin" 8 '\x0a\x00\x00\x00'   # 10 tokens
tail -c +1025 $K | head -c 20 >>"$TMP/few.bin"
bad "token file too short for B*T+1" "few.bin" "holds 10 tokens, but batch 2 x seq 32 needs 65" $(eval_with $W "$TMP/few.bin")
cp $K "$TMP/vocab.bin"
poke "$TMP/vocab.bin" $((1024 + 2 * 5)) '\x2c\x01'   # token 300 at position 5; V = 256
bad "token id out of the vocabulary" "vocab.bin" "token 300 at position 5" $(eval_with $W "$TMP/vocab.bin")
cp $K "$TMP/vocab_target.bin"
poke "$TMP/vocab_target.bin" $((1024 + 2 * 64)) '\xff\xff'   # the last target (position 64)
bad "last target out of the vocabulary" "vocab_target.bin" "token 65535 at position 64" $(eval_with $W "$TMP/vocab_target.bin")
cp $K "$TMP/u32ver.bin"
poke "$TMP/u32ver.bin" 4 '\x07\x00\x00\x00'   # u16 magic with the u32 version
bad "token file with a mismatched version" "u32ver.bin" "version" $(eval_with $W "$TMP/u32ver.bin")
bad "token file missing" "nosuch.bin" "nosuch.bin" $(eval_with $W "$TMP/nosuch.bin")

# ---- IR files
printf 'module @m {\n  func @f(%%x: f32[4]) -> (f32[4]) {\n    %%y = neg %%x f32[4]\n    return %%y\n  }\n}\n' >"$TMP/syntax.ir"
bad "IR file with a syntax error" "syntax.ir:3:17: error: expected ':'" "found 'f32'" "$LOOM" ir "$TMP/syntax.ir"
expect_stderr_contains "    %y = neg %x f32[4]"   # the line, with a caret under it
printf 'module @m {\n  func @f(%%a: f32[4,8], %%b: f32[8]) -> (f32[4,8]) {\n    %%y = add %%a, %%b : f32[4,8]\n    return %%y\n  }\n}\n' >"$TMP/verify.ir"
bad "IR file with a verifier error" "verify.ir:3:" "op 'add': operands 0 and 1 differ" "$LOOM" ir "$TMP/verify.ir"
: >"$TMP/empty.ir"
bad "empty IR file" "empty.ir:1:1:" "expected 'module'" "$LOOM" ir "$TMP/empty.ir"
printf 'module @m {\n' >"$TMP/unterminated.ir"
bad "unterminated IR file" "unterminated.ir:2:1:" "end of file" "$LOOM" ir "$TMP/unterminated.ir"
printf 'module @m {\n}\n\x00trailing' >"$TMP/nul.ir"
bad "IR file with a NUL byte" "nul.ir" "NUL" "$LOOM" ir "$TMP/nul.ir"
bad "IR file missing" "nosuch.ir" "cannot open" "$LOOM" ir "$TMP/nosuch.ir"
mkdir "$TMP/adir.ir"
bad "a directory given as the IR file" "adir.ir" "" "$LOOM" ir "$TMP/adir.ir"
expect_stderr_matches "folder|directory"
# Sizes whose element count overflows int64 must be an error, not undefined behaviour.
printf 'module @m {\n  func @f(%%x: f32[4]) -> (f32[4611686018427387904,4]) {\n    %%y = reshape %%x : f32[4611686018427387904,4]\n    return %%y\n  }\n}\n' >"$TMP/overflow.ir"
bad "IR whose element count overflows int64" "overflow.ir:2:" "" "$LOOM" ir "$TMP/overflow.ir"
printf 'module @m {\n  func @f(%%x: f32[99999999999999999999]) -> (f32[4]) {\n    return %%x\n  }\n}\n' >"$TMP/bigint.ir"
bad "IR with a dimension beyond int64" "bigint.ir:2:19:" "integer out of range" "$LOOM" ir "$TMP/bigint.ir"
printf 'module @m {\n  func @f(%%x: f32[1,2,3,4,5,6,7,8,9]) -> (f32[4]) {\n    return %%x\n  }\n}\n' >"$TMP/rank9.ir"
bad "IR with rank 9" "rank9.ir:2:" "too many dimensions" "$LOOM" ir "$TMP/rank9.ir"
long=$(head -c 5000 /dev/zero | tr '\0' 'a')
printf 'module @m {\n  func @f(%%x: f32[4]) -> (f32[4]) {\n    %%%s = frob %%x : f32[4]\n    return %%x\n  }\n}\n' "$long" >"$TMP/longname.ir"
bad "IR with a 5000-character name and an unknown op" "longname.ir:3:" "unknown op 'frob'" "$LOOM" ir "$TMP/longname.ir"

# IR that parses but does not verify, through a pipeline that does not start with verify:
# the passes must not run on it (they assume verified IR); exit 2 naming the file.
printf 'module @m {\n  func @f(%%x: f32[2,3]) -> (f32[3,2]) {\n    %%a = transpose %%x {perm=[1,0]} : f32[3,2]\n    %%b = transpose %%a {perm=[700000,0]} : f32[3,2]\n    return %%b\n  }\n}\n' >"$TMP/perm_range.ir"
printf 'module @m {\n  func @f(%%x: f32[2,3]) -> (f32[3,2]) {\n    %%a = transpose %%x {perm=[1]} : f32[3,2]\n    %%b = transpose %%a {perm=[0,1,2,3,4,5,6,7,0,1,2,3]} : f32[3,2]\n    return %%b\n  }\n}\n' >"$TMP/perm_long.ir"
printf 'module @m {\n  func @f(%%x: f32[4], %%y: f32[4]) -> () {\n    accumulate %%x, %%y\n    return\n  }\n}\n' >"$TMP/write_local.ir"
printf 'module @m {\n  func @forward(%%x: f32[4], %%t: i32[4]) -> (f32[4,5], f32[]) {\n    %%y = exp %%x : f32[4,5]\n    %%l = cross_entropy %%y, %%t : f32[]\n    return %%y, %%l\n  }\n}\n' >"$TMP/bad_shapes.ir"
for f in perm_range perm_long write_local; do
  bad "unverified IR ($f) through --passes=canonicalize" "$f.ir:" "error" "$LOOM" ir "$TMP/$f.ir" --passes=canonicalize
done
bad "unverified IR (bad_shapes) through --passes=cse" "bad_shapes.ir:" "error" "$LOOM" ir "$TMP/bad_shapes.ir" --passes=cse
if "$LOOM" ir --list-passes | grep -q '^  autodiff '; then
  bad "unverified IR (bad_shapes) through --passes=autodiff" "bad_shapes.ir:" "error" "$LOOM" ir "$TMP/bad_shapes.ir" --passes=autodiff
fi

# One of several processes a launcher started: refused (loom runs one process; a mesh's ranks
# are its threads), naming the launch, before anything is read or written.  Malformed launch
# variables are named.
expect_exit 2 "loom train as torchrun's rank 1 of 2" env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 "$LOOM" train models/gpt2-tiny.json \
  --data "$TMP/none.bin" --out "$TMP/clobbered.safetensors"
expect_stderr_contains "rank 1 of 2 started by torchrun (RANK=1)"
check "  no output written" test ! -e "$TMP/clobbered.safetensors"
expect_exit 2 "loom train as srun's task 0 of 4" env SLURM_PROCID=0 SLURM_NTASKS=4 "$LOOM" train models/gpt2-tiny.json
expect_stderr_contains "rank 0 of 4 started by slurm (SLURM_PROCID=0)"
expect_exit 2 "loom train as mpirun's rank 3 of 4" env OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4 "$LOOM" train \
  models/gpt2-tiny.json
expect_stderr_contains "started by mpirun"
expect_exit 2 "a malformed WORLD_SIZE" env RANK=0 WORLD_SIZE=two "$LOOM" train models/gpt2-tiny.json
expect_stderr_contains "WORLD_SIZE is 'two', not a whole number"
expect_exit 0 "a launch of one process trains" env RANK=0 WORLD_SIZE=1 "$LOOM" train models/gpt2-tiny.json --steps 1 -q \
  --data tests/golden/gpt2-tiny/tokens.bin --batch 1 --seq 16

finish
