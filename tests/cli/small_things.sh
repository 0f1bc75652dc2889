# tests/cli/small_things.sh — issue 29 section 5's small things: --out DIR/'s config.json
# carries special token ids that fit the vocabulary; `loom ir --memory` says the batch x seq
# its figures are for; `loom plan` says its MFU is an upper bound while the hardware's
# efficiencies are 1; `loom train --help` says the CUDA mesh runs pipelines; `loom check`
# takes a one-element loss [1] for the scalar; --trace-out on one rank is refused, not ignored;
# the planned/measured arena lines only with --verbose.
# usage: bash tests/cli/small_things.sh PATH-TO-LOOM [PATH-TO-ST_DIFF]   (from the repository root)
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"

K=tests/golden/gpt2-tiny/tokens.bin
# a GPT-2 of 300 tokens without bos/eos (transformers would take GPT2Config's 50256), and one
# whose config names 50256 itself: both written as null; gpt2-tiny's own ids (0) are kept
sed 's/"bos_token_id": 0,//; s/"eos_token_id": 0,//; s/"vocab_size": 256/"vocab_size": 300/' models/gpt2-tiny.json >"$TMP/noids.json"
sed 's/"eos_token_id": 0/"eos_token_id": 50256/' models/gpt2-tiny.json >"$TMP/bigeos.json"
ids() { python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('bos_token_id','absent'), c.get('eos_token_id','absent'))" "$1"; }
expect_exit 0 "--out DIR/ of a GPT-2 without bos/eos ids" "$LOOM" train "$TMP/noids.json" --data $K --steps 1 -q --out "$TMP/a/"
check "  config.json: bos and eos null (not GPT2Config's 50256)" [ "$(ids "$TMP/a/config.json")" = "None None" ]
expect_exit 0 "--out DIR/ of a config with eos 50256 and 256 tokens" "$LOOM" train "$TMP/bigeos.json" --data $K --steps 1 -q --out "$TMP/b/"
check "  config.json: bos 0 kept, eos null" [ "$(ids "$TMP/b/config.json")" = "0 None" ]
check "  generation_config.json: no eos" bash -c "! grep -q eos_token_id '$TMP/b/generation_config.json'"
expect_exit 0 "--out DIR/ of gpt2-tiny" "$LOOM" train models/gpt2-tiny.json --data $K --steps 1 -q --out "$TMP/c/"
check "  config.json: its ids kept" [ "$(ids "$TMP/c/config.json")" = "0 0" ]

expect_exit 0 "loom ir --memory" "$LOOM" ir models/gpt2-tiny.json --passes=train,lower --memory --batch 3
expect_stdout_contains "for batch 3 x seq 32 per micro-batch"
expect_exit 0 "loom plan" "$LOOM" plan models/gpt2-tiny.json --gpus 2
expect_stdout_contains "MFU is an upper bound (and step time a lower one)"
expect_exit 0 "loom train --help" "$LOOM" train --help
expect_stdout_contains "cuda with a mesh (dp, tp, sp, cp, ep, ZeRO, pp)"
# --trace-out: refused before step 1 where nothing would be written; a cpu mesh writes it
expect_exit 2 "--trace-out on one rank" "$LOOM" train models/gpt2-tiny.json --data $K --steps 1 -q --trace-out "$TMP/t1.json"
expect_stderr_contains "--trace-out $TMP/t1.json: the measured timeline is recorded for a mesh or a pipeline"
check "  nothing trained" bash -c "! grep -q '^step ' '$OUT'"
expect_exit 0 "--trace-out on a cpu mesh" "$LOOM" train models/gpt2-tiny.json --data $K --steps 1 -q --mesh dp=2 --trace-out "$TMP/t2.json"
check "  the timeline is written" [ -s "$TMP/t2.json" ]
# the planned and measured arenas: only with --verbose
expect_exit 0 "loom train without --verbose" "$LOOM" train models/gpt2-tiny.json --data $K --steps 1
check "  no 'planned arena' lines" bash -c "! grep -q 'planned arena' '$OUT'"
expect_exit 0 "loom train --verbose" "$LOOM" train models/gpt2-tiny.json --data $K --steps 1 --verbose
expect_stdout_contains "memory @grad_step: planned arena"
# loom check: a golden whose loss is [1] (numpy.ascontiguousarray of a scalar) is the scalar
cp -r tests/golden/gpt2-tiny "$TMP/g"
st_edit_header tests/golden/gpt2-tiny/expected.safetensors "$TMP/g/expected.safetensors" 's/"loss":{"dtype":"F32","shape":\[\]/"loss":{"dtype":"F32","shape":[1]/'
check "  the golden's loss is now [1]" grep -q '"loss":{"dtype":"F32","shape":\[1\]' "$TMP/g/expected.safetensors"
expect_exit 0 "loom check of a golden whose loss is [1]" "$LOOM" check "$TMP/g" --backend cpu --precision fp32
finish
