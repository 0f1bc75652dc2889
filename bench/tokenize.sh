#!/usr/bin/env bash
# bench/tokenize.sh — tokenization throughput: `loom data --tokenizer` against the Hugging Face
# `tokenizers` Python package, same tokenizer, same text, same machine (bench/README.md).
#
#   PYTHON=/tmp/venv-tok/bin/python bash bench/tokenize.sh
#
# Text: data/shakespeare.txt (1.1 MB) and the 584 mixed documents of tests/tokenizer/textgen.h
# (English, code, many scripts, emoji, whitespace runs; 1 to 12 KB each), each a file of its
# own, all repeated REPEAT times (default 8: 4,680 files, ~40 MB); every file is one document.  Per tokenizer of tests/tokenizer/ and per
# run (RUNS, default 3) it prints MB/s of:
#   loom       loom data --tokenizer T FILES -o out.bin (reading, encoding, writing the shard;
#              one thread), the rate of its progress line
#   hf encode  Tokenizer.encode(doc) per document, one thread (the same work as loom)
#   hf batch   Tokenizer.encode_batch(docs): tokenizers' own threads (every core)
# and checks that loom's shard holds the same ids as tokenizers'.
set -euo pipefail
cd "$(dirname "$0")/.."
LOOM=${LOOM:-build/loom}
GEN=${GEN:-$(dirname "$LOOM")/tok_textgen}
PYTHON=${PYTHON:-python3}
REPEAT=${REPEAT:-8}
RUNS=${RUNS:-3}
"$PYTHON" -c 'import tokenizers' 2> /dev/null || { echo "bench/tokenize.sh: PYTHON=$PYTHON has no tokenizers (pip install tokenizers)" >&2; exit 2; }
[ -x "$LOOM" ] && [ -x "$GEN" ] || { echo "bench/tokenize.sh: build loom first ($LOOM, $GEN)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
files=()
for r in $(seq "$REPEAT"); do
  cp data/shakespeare.txt "$tmp/shakespeare_$r.txt"; files+=("$tmp/shakespeare_$r.txt")
  for d in $(seq 16 599); do "$GEN" --doc "$d" > "$tmp/doc_${r}_$d.txt"; files+=("$tmp/doc_${r}_$d.txt"); done
done
mb=$(cat "${files[@]}" | wc -c | awk '{ printf "%.1f", $1 / 1e6 }')
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) cores; ${mb} MB in ${#files[@]} files"
for tok in tests/tokenizer/gpt2-style.json tests/tokenizer/llama3-style.json; do
  for run in $(seq "$RUNS"); do
    t0=$(date +%s.%N)
    "$LOOM" data --tokenizer "$tok" "${files[@]}" -o "$tmp/out.bin" > /dev/null 2> "$tmp/progress"
    t1=$(date +%s.%N)
    loom_rate=$(tr '\r' '\n' < "$tmp/progress" | tail -1 | sed 's/.*tokens, \(.*\) MB\/s/\1/')
    wall=$(awk -v a="$t0" -v b="$t1" -v mb="$mb" 'BEGIN { printf "%.1f", mb / (b - a) }')
    hf=$("$PYTHON" - "$tok" "$tmp/out.bin" "${files[@]}" << 'PY'
import struct, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [open(f, encoding="utf-8", newline="").read() for f in sys.argv[3:]]
mb = sum(len(d.encode()) for d in docs) / 1e6
eot = tok.token_to_id("<|endoftext|>")
if eot is None:
    eot = tok.token_to_id("<|end_of_text|>")
t = time.perf_counter()
one = [tok.encode(d, add_special_tokens=False).ids for d in docs]
t_one = time.perf_counter() - t
t = time.perf_counter()
batch = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
t_batch = time.perf_counter() - t
ids = []
for d in one:
    ids += [eot] + d
raw = open(sys.argv[2], "rb").read()
n = struct.unpack_from("<i", raw, 8)[0]
same = n == len(ids) and list(struct.unpack_from("<%dH" % n, raw, 1024)) == ids and batch == one
print(f"{mb / t_one:.1f} {mb / t_batch:.1f} {'identical' if same else 'DIFFERENT'}")
PY
)
    read -r hf_one hf_batch same <<< "$hf"
    printf '%-20s run %d: loom %6s MB/s (wall %s) | hf encode %6s MB/s | hf batch %6s MB/s | ids %s\n' \
      "$(basename "$tok" .json)" "$run" "$loom_rate" "$wall" "$hf_one" "$hf_batch" "$same"
  done
done
