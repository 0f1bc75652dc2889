#!/usr/bin/env bash
# tests/cli/export.sh — Hugging Face folders (runtime/exec/hf_export.c): `loom train --out DIR/` and
# `loom export CHECKPOINT -o DIR`.
#   - the folder holds config.json, generation_config.json, metrics.json and a
#     model.safetensors with the model's tensors only (metadata format pt), bitwise the
#     parameters --out W.safetensors writes for the same run; --dtype bf16 rounds them;
#     --tokenizer is copied; GPT-2 and Llama, one rank and a dp x tp mesh;
#   - loom export of the run's checkpoint writes the same weights and metrics;
#   - refusals: --dtype without a folder, a checkpoint whose spec is not found, bad flags;
#   - with LOOM_TEST_PYTHON (a python with torch and transformers): transformers loads the
#     folder with from_pretrained and its logits equal loom eval's within 1e-4 (else SKIP).
LOOM=$1 ST_DIFF=$2
. "$(dirname "$0")/lib.sh"
"$LOOM" data data/shakespeare.txt -o "$TMP/d.bin" > /dev/null 2>&1

header() {   # safetensors file -> "name dtype" lines and the metadata, from its JSON header
  python3 -c "
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
print('meta', json.dumps(h.pop('__metadata__', None), sort_keys=True))
for k in sorted(h): print(k, h[k]['dtype'])
" "$1"
}

for case in "gpt2-tiny|" "llama-tiny|" "llama-tiny|--mesh dp=2,tp=2" "gpt2-tiny|--mesh tp=2"; do
  m=${case%%|*}; mesh=${case#*|}; tag="$m${mesh:+ $mesh}"
  d=$TMP/$m-$(echo "$mesh" | tr ' =,' '___')
  rm -rf "$d"
  run "$LOOM" train models/$m.json --data "$TMP/d.bin" --steps 3 -q $mesh --out "$d/hf/" --save-dir "$d/ck" --save-every 3
  [ "$RC" = 0 ] || { fail "$tag: train --out DIR/ failed" "$(tail -3 "$ERR")"; continue; }
  "$LOOM" train models/$m.json --data "$TMP/d.bin" --steps 3 -q $mesh --out "$d/w.st" > /dev/null 2>&1
  check "$tag: the folder has config.json, generation_config.json, metrics.json, model.safetensors" \
    test -s "$d/hf/config.json" -a -s "$d/hf/generation_config.json" -a -s "$d/hf/metrics.json" -a -s "$d/hf/model.safetensors"
  header "$d/hf/model.safetensors" > "$TMP/h"
  header "$d/w.st" | grep -v -E '^(losses|grad_norms|lrs|val_losses|meta) ' > "$TMP/w"
  check "  model.safetensors: the model's tensors only (F32), metadata format pt" sh -c "
    grep -q '^meta {\"format\": \"pt\"}' '$TMP/h' && grep -v '^meta' '$TMP/h' | diff - '$TMP/w' > /dev/null"
  names=$(grep -v '^meta' "$TMP/h" | cut -d' ' -f1)
  check "  its weights are bitwise those of --out W.safetensors" sh -c "'$ST_DIFF' '$d/hf/model.safetensors' '$d/w.st' --rtol 0 $(echo $names) > /dev/null"
  check "  metrics.json: 3 losses, equal to W.safetensors' losses" python3 -c "
import json, struct
m = json.load(open('$d/hf/metrics.json'))
b = open('$d/w.st', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
o, e = h['losses']['data_offsets']
ls = struct.unpack('<3f', b[8 + n + o:8 + n + e])
assert len(m['losses']) == 3 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(m['losses'], ls)), (m['losses'], ls)"
  check "  config.json is the model's, torch_dtype float32" python3 -c "
import json
c = json.load(open('$d/hf/config.json')); s = json.load(open('models/$m.json'))
s = s.get('model', s)
assert c['torch_dtype'] == 'float32' and all(c[k] == s[k] for k in s), c"
  run "$LOOM" export "$d/ck" -o "$d/ex" --spec models/$m.json
  check "  loom export of its checkpoint: the same weights and metrics" sh -c "
    cmp -s '$d/hf/model.safetensors' '$d/ex/model.safetensors' && cmp -s '$d/hf/metrics.json' '$d/ex/metrics.json'"
done

d=$TMP/gpt2-tiny-
run "$LOOM" export "$d/ck" -o "$TMP/bf" --dtype bf16 --tokenizer tests/tokenizer/gpt2-style.json
bf16_ok() {
  python3 -c "
import json, struct
b = open('$TMP/bf/model.safetensors', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
h.pop('__metadata__')
assert h and all(v['dtype'] == 'BF16' for v in h.values())" || return 1
  # bf16 keeps 8 bits of mantissa: every element within 2^-8 of its f32 value, relative to the tensor's largest
  "$ST_DIFF" "$TMP/bf/model.safetensors" "$d/hf/model.safetensors" --rtol 0.004 > /dev/null || return 1
  python3 -c "import json; assert json.load(open('tests/tokenizer/gpt2-style.json')) == json.load(open('$TMP/bf/tokenizer.json'))"
}
check "--dtype bf16: every tensor BF16, within 2^-8 of the f32 weights; tokenizer.json copied" bf16_ok

expect_exit 2 "--dtype bf16 with --out W.safetensors" "$LOOM" train models/gpt2-tiny.json --data "$TMP/d.bin" --steps 1 -q \
  --out "$TMP/x.st" --dtype bf16
expect_stderr_contains "give --out DIR/"
expect_exit 2 "--dtype fp8" "$LOOM" export "$d/ck" -o "$TMP/y" --dtype fp8
expect_stderr_contains "--dtype takes f32 or bf16"
# A checkpoint carries its model config (state.json's settings.model): exported from another
# folder, where the spec path it records (models/M.json) is a FIFO that would block whoever
# opened it, it writes the same config.json and weights without opening that path.
mkdir -p "$TMP/elsewhere/models" && cp -r "$d/ck" "$TMP/elsewhere/ck" && mkfifo "$TMP/elsewhere/models/$m.json"
(cd "$TMP/elsewhere" && timeout 60 "$LOOM" export ck -o out > "$TMP/o" 2> "$TMP/e"; echo $? > "$TMP/rc")
check "a checkpoint exports from its own config, never opening the spec path it records (a FIFO there)" sh -c "
  [ \$(cat '$TMP/rc') = 0 ] && cmp -s '$TMP/elsewhere/out/config.json' '$d/ex/config.json' &&
  cmp -s '$TMP/elsewhere/out/model.safetensors' '$d/ex/model.safetensors'"
# one without it (an older loom's): exit 2, asks for --spec
python3 - "$TMP/elsewhere/ck" <<'PY'
import glob, json, os, sys
# drop settings.model from state.json, and put DONE's size and CRC-32C of it right
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8): c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF
for step in glob.glob(os.path.join(sys.argv[1], 'step_*')):
    p = os.path.join(step, 'state.json'); s = json.load(open(p)); s['settings'].pop('model', None)
    b = json.dumps(s).encode(); open(p, 'wb').write(b)
    dp = os.path.join(step, 'DONE'); d = json.load(open(dp))
    d['files']['state.json'] = {'bytes': len(b), 'crc32c': '%08x' % crc32c(b)}
    json.dump(d, open(dp, 'w'))
PY
rm -f "$TMP/elsewhere/models/$m.json"
(cd "$TMP/elsewhere" && "$LOOM" export ck -o out2 > "$TMP/o" 2> "$TMP/e"; echo $? > "$TMP/rc")
check "a checkpoint without its model config: exit 2, asks for --spec" sh -c "
  [ \$(cat '$TMP/rc') = 2 ] && grep -q 'give --spec' '$TMP/e'"

if [ -n "${LOOM_TEST_PYTHON:-}" ]; then
  for m in gpt2-tiny llama-tiny; do
    d=$TMP/$m-
    "$LOOM" eval models/$m.json --weights "$d/hf/model.safetensors" --tokens "$TMP/d.bin" --batch 2 --seq 16 \
      --out "$TMP/$m-eval.st" > /dev/null 2>&1
    check "transformers loads $m's folder; its logits equal loom eval's within 1e-4" "$LOOM_TEST_PYTHON" -c "
import json, struct, numpy as np, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained('$d/hf', torch_dtype=torch.float32).eval()
b = open('$TMP/d.bin', 'rb').read()
toks = np.frombuffer(b[1024:1024 + 2 * 33], dtype=np.uint16).astype(np.int64)[:32].reshape(2, 16)
with torch.no_grad(): got = model(torch.tensor(toks)).logits.numpy()
e = open('$TMP/$m-eval.st', 'rb').read(); n = struct.unpack('<Q', e[:8])[0]; h = json.loads(e[8:8 + n])
o, f = h['logits']['data_offsets']
want = np.frombuffer(e[8 + n + o:8 + n + f], dtype=np.float32).reshape(got.shape)
err = np.abs(got - want).max() / np.abs(want).max()
assert err < 1e-4, err
"
  done
else
  echo "SKIP transformers loading the folders: set LOOM_TEST_PYTHON to a python with torch and transformers"
fi
finish
