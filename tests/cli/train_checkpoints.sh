#!/usr/bin/env bash
# Resume and the save dir (issue 29, section 3; docs/checkpoints.md): changed settings refused
# (exit 2, listed) or taken with --allow-changes; a damaged newest checkpoint skipped for the
# older one (bitwise the uninterrupted run); a dead writer's step_N.tmp.<pid> removed; one
# writer per save dir (a second run exits 2 naming the first's pid; a dead one's lock taken
# over); a step_* symbolic link skipped or refused; state.json's data.shard range-checked
# as 64 bits (2^32 is not shard 0).
LOOM=$1
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
spec=tests/golden/gpt2-tiny/train_spec.json
export LOOM_THREADS=1
# The reference executor: what is checked here (settings, fallback, locks, paths) does not
# depend on the backend, and it starts in a fraction of a second where the cpu backend JITs
# for seconds (424 s under the sanitizers with cpu, 6 s with ref in a Release build)
tr=("$LOOM" train $spec --backend ref -q)
"${tr[@]}" --steps 3 --out "$TMP/full3.st" > /dev/null 2>&1 || fail "the uninterrupted 3-step run"
"${tr[@]}" --steps 3 --save-dir "$TMP/ck" --save-every 1 > /dev/null 2>&1 || fail "the run with checkpoints"

# 1. settings that differ from the checkpoint's
rm -rf "$TMP/c1" && cp -r "$TMP/ck" "$TMP/c1" && rm -rf "$TMP/c1/step_00000003"
expect_exit 2 "resume with other --steps, --lr and --seed: refused" "${tr[@]}" --steps 5 --lr 0.02 --seed 7 --resume "$TMP/c1"
expect_stderr_contains "--steps 3 -> 5"
expect_stderr_contains "--lr 0.01 -> 0.02"
expect_stderr_contains "--seed 1337 -> 7"
expect_stderr_contains "--allow-changes"
expect_exit 0 "the same with --allow-changes: resumed" "$LOOM" train $spec --backend ref --steps 5 --lr 0.02 --seed 7 --resume "$TMP/c1" \
  --allow-changes --save-dir "$TMP/c1b"
expect_stdout_contains "note: --allow-changes: continuing with changed settings: --steps 3 -> 5, --lr 0.01 -> 0.02"
expect_exit 0 "the same settings: resumed without a word about settings" "$LOOM" train $spec --backend ref --steps 3 --resume "$TMP/c1" \
  --out "$TMP/r.st"
check "  and bitwise the uninterrupted run" cmp -s "$TMP/r.st" "$TMP/full3.st"
check "  it saved on into the folder it resumed from (no --save-dir)" test -f "$TMP/c1/step_00000003/DONE"

# 2. a damaged newest checkpoint: the older one, with a note naming the skipped one and why
rm -rf "$TMP/c2" && cp -r "$TMP/ck" "$TMP/c2" && rm -rf "$TMP/c2/step_00000003"
poke "$TMP/c2/step_00000002/model.safetensors" 300 'XYZ'
expect_exit 0 "a damaged newest checkpoint (step 2): falls back to step 1" "$LOOM" train $spec --backend ref --steps 3 --resume "$TMP/c2" \
  --save-dir "$TMP/c2b" --out "$TMP/r2.st"
expect_stdout_contains "note: skipped a damaged checkpoint: $TMP/c2/step_00000002/model.safetensors is corrupt: checksum mismatch"
expect_stdout_contains "resumed from $TMP/c2/step_00000001 (step 1)"
check "  and the run is bitwise the uninterrupted one" cmp -s "$TMP/r2.st" "$TMP/full3.st"
rm -rf "$TMP/c2/step_00000001"
expect_exit 2 "a damaged checkpoint with nothing older: refused" "${tr[@]}" --steps 3 --resume "$TMP/c2"
expect_stderr_contains "no checkpoint here loads: $TMP/c2/step_00000002/model.safetensors is corrupt"

# 3. step_N.tmp.<pid> of a process that has ended: removed at the next save; a live one's kept
rm -rf "$TMP/c3" && mkdir -p "$TMP/c3"
sh -c 'exit 0' & dead=$!
wait $dead
mkdir -p "$TMP/c3/step_00000005.tmp.$dead" "$TMP/c3/step_00000006.tmp.$$"
touch "$TMP/c3/step_00000005.tmp.$dead/model.safetensors"
expect_exit 0 "a run saving into a folder with unfinished checkpoint folders" "$LOOM" train $spec --backend ref --steps 1 --save-dir "$TMP/c3"
check "  the one of an ended process is removed" test ! -e "$TMP/c3/step_00000005.tmp.$dead"
expect_stdout_contains "note: removed $TMP/c3/step_00000005.tmp.$dead, an unfinished checkpoint of process $dead"
check "  the one of a live process is left alone" test -d "$TMP/c3/step_00000006.tmp.$$"

# 4. one writer per save dir: a second run exits 2 naming the first's pid; a dead holder's lock is taken over
"$LOOM" train $spec --backend ref --steps 1000000 --save-dir "$TMP/c4" > "$TMP/first.out" 2>&1 &
first=$!
for i in $(seq 1200); do grep -q '^step ' "$TMP/first.out" 2> /dev/null && break; sleep 0.05; done
expect_exit 2 "a second run writing the same --save-dir" "$LOOM" train $spec --backend ref --steps 2 --save-dir "$TMP/c4"
expect_stderr_contains "$TMP/c4 is in use: process $first is writing checkpoints there"
kill -TERM $first
wait $first
check "  the first run, stopped by SIGTERM, exits 143" test $? = 143
check "  its lock file still names it" grep -qx "$first" "$TMP/c4/loom.lock"
expect_exit 0 "the first run gone, its lock is taken over" "${tr[@]}" --steps 2 --save-dir "$TMP/c4"
check "  the lock file names the new holder" test "$(cat "$TMP/c4/loom.lock")" != "$first"

# 5. a step_* folder that is a symbolic link: skipped when scanning, refused when named
rm -rf "$TMP/c5" && cp -r "$TMP/ck" "$TMP/c5" && rm -rf "$TMP/c5/step_00000003"
ln -s step_00000001 "$TMP/c5/step_00000009"
expect_exit 0 "a save dir with a symbolic link step_00000009 -> step_00000001" "$LOOM" train $spec --backend ref --steps 3 \
  --resume "$TMP/c5" --save-dir "$TMP/c5b"
expect_stdout_contains "skipped step_00000009, a symbolic link"
expect_stdout_contains "resumed from $TMP/c5/step_00000002 (step 2)"
expect_exit 2 "the link named as --resume: refused" "${tr[@]}" --steps 3 --resume "$TMP/c5/step_00000009"
expect_stderr_contains "the folder's name says step 9 but its DONE records step 1"

# 6. data.shard read as 64 bits: 2^32 is refused, not taken for shard 0 (state.json rewritten
#    with DONE's size and CRC-32C put right, so only the value is wrong)
rm -rf "$TMP/c6" && cp -r "$TMP/ck" "$TMP/c6" && rm -rf "$TMP/c6/step_00000003" "$TMP/c6/step_00000001"
python3 - "$TMP/c6/step_00000002" <<'PY'
import json, os, sys
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8): c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF
d = sys.argv[1]
s = json.load(open(os.path.join(d, 'state.json'))); s['data']['shard'] = 2**32
b = json.dumps(s).encode(); open(os.path.join(d, 'state.json'), 'wb').write(b)
done = json.load(open(os.path.join(d, 'DONE')))
done['files']['state.json'] = {'bytes': len(b), 'crc32c': '%08x' % crc32c(b)}
json.dump(done, open(os.path.join(d, 'DONE'), 'w'))
PY
expect_exit 2 "state.json's data.shard 2^32" "${tr[@]}" --steps 3 --resume "$TMP/c6"
expect_stderr_contains "data position shard 4294967296"

# 7. every output checked before step 1: exit 2 naming the flag, no step run
for a in "--out $TMP/none/x.safetensors" "--out $TMP/none/hf/" "--log $TMP/none/l.jsonl" "--trace-out $TMP/none/t.json" \
         "--save-dir /proc/loom-none/ck"; do
  # shellcheck disable=SC2086
  expect_exit 2 "${a%% *} in a folder that does not exist" "$LOOM" train $spec --backend ref --steps 2 $a
  expect_stderr_contains "${a#* }"
  check "  refused before step 1" sh -c "! grep -q '^step ' '$OUT'"
done
# --out DIR/ is written whole or not at all: a failure part-way (the tokenizer to copy is
# missing) leaves no folder
expect_exit 2 "--out DIR/ whose tokenizer cannot be copied" "$LOOM" train $spec --backend ref -q --steps 1 --out "$TMP/hf/" \
  --tokenizer "$TMP/no-tokenizer.json"
check "  no folder left behind (neither DIR nor its temporary)" sh -c "! ls -d '$TMP'/hf* 2> /dev/null | grep -q ."
# --log writes whole lines: with the file size limited to 2 KB (ulimit -f; SIGXFSZ ignored, so
# the write fails with EFBIG as on a full disk) a line that does not fit is cut back off
(trap '' XFSZ; ulimit -f 2; "$LOOM" train $spec --backend ref -q --steps 100 --log "$TMP/full.jsonl" > "$TMP/full.out" 2> "$TMP/full.err")
RC=$? OUT=$TMP/full.out ERR=$TMP/full.err LAST="--log at a 2 KB file size limit"
if [ $RC = 1 ]; then pass "--log on a write failure: exit 1"; else fail "--log on a write failure: exit $RC"; show_last; fi
expect_stderr_contains "cannot write the metrics log (disk full?); it holds the whole lines of the steps before"
check "  the log ends with a whole line, every line JSON" python3 -c "
import json; b = open('$TMP/full.jsonl', 'rb').read(); assert b and b.endswith(b'\\n'), b[-40:]
[json.loads(l) for l in b.decode().splitlines()]"
finish
