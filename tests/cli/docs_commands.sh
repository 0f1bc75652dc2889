#!/usr/bin/env bash
# Every loom command shown in README.md and docs/*.md, checked so an example cannot go stale:
#  - each `loom SUBCOMMAND ...` line of a fenced code block names a real subcommand, and every
#    --flag it uses is one `loom SUBCOMMAND --help` documents; paths under models/, tests/,
#    data/ and bench/ that it names exist;
#  - the README's "A few first steps" block runs for real, as written (in a temporary folder,
#    with ./build/loom meaning the loom under test).
LOOM=$(realpath "$1")
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
SRC=$PWD

# the command lines of every fenced block (continuations joined), as "file:line<TAB>command"
python3 - README.md docs/*.md > "$tmp/cmds" <<'PY'
import re, sys
for path in sys.argv[1:]:
    lines = open(path).read().split('\n'); fence = False; i = 0
    while i < len(lines):
        l = lines[i]
        if l.lstrip().startswith('```'): fence = not fence; i += 1; continue
        if fence:
            start = i; cmd = l
            while cmd.rstrip().endswith('\\') and i + 1 < len(lines): i += 1; cmd = cmd.rstrip()[:-1] + ' ' + lines[i].strip()
            cmd = re.sub(r'\s#\s.*$', '', cmd)                  # trailing comments
            for part in re.split(r'\|\||&&|\||;|\$\(', cmd):
                m = re.match(r'\s*(?:\$ )?(?:\S*/)?loom\s+(.*)$', part)
                if m and not part.strip().startswith('#'): print(f"{path}:{start + 1}\t{m.group(1).strip()}")
        i += 1
PY
n=$(wc -l < "$tmp/cmds")
[ "$n" -gt 40 ] && ok "$n loom command lines found in README.md and docs/" || bad "only $n command lines found"
declare -A helptext
while IFS=$'\t' read -r where cmd; do
  sub=${cmd%% *}
  case "$sub" in --help|--version|-h|*:) continue ;; esac   # *: a line of output ("loom diff: ...")
  if [ -z "${helptext[$sub]+x}" ]; then
    if h=$("$LOOM" "$sub" --help 2>&1); then helptext[$sub]=$h; else helptext[$sub]=__NONE__; fi
  fi
  if [ "${helptext[$sub]}" = __NONE__ ]; then bad "$where: 'loom $sub' is not a command: $cmd"; continue; fi
  problems=""
  for f in $(grep -o -- '\(^\| \)--[a-z][a-z0-9-]*' <<< "$cmd" | tr -d ' '); do
    grep -q -- "$f\b" <<< "${helptext[$sub]}" || problems+=" $f (not in 'loom $sub --help')"
  done
  for p in $(grep -o '\(^\| \)\(models\|tests\|data\|bench\)/[A-Za-z0-9_./-]*[A-Za-z0-9_]' <<< "$cmd"); do
    [ -e "$SRC/$p" ] || problems+=" $p (no such file)"
  done
  [ -z "$problems" ] && pass=$((pass + 1)) || bad "$where: loom $cmd:$problems"
done < "$tmp/cmds"
echo "ok   every command line checked against its --help ($pass so far)"

# Every relative link of README.md and docs/*.md names a file that exists.
broken=$(python3 - README.md docs/*.md <<'PY'
import os, re, sys
for path in sys.argv[1:]:
    text = re.sub(r'```.*?```', '', open(path).read(), flags=re.S)
    for target in re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', text):
        if re.match(r'[a-z]+:', target): continue
        if not os.path.exists(os.path.join(os.path.dirname(path), target)): print(f"{path}: {target}")
PY
)
[ -z "$broken" ] && ok "every relative link in README.md and docs/ resolves" || bad "broken links: $broken"

# The README's first steps, run as written.
mkdir -p "$tmp/run/build" "$tmp/run/models" && ln -s "$LOOM" "$tmp/run/build/loom"
cp -r "$SRC/models/." "$tmp/run/models/" && cp -r "$SRC/data" "$tmp/run/data"
awk '/^A few first steps/{f=1} f&&/^```sh/{g=1; next} g&&/^```/{exit} g' README.md > "$tmp/steps.sh"
[ "$(grep -c loom "$tmp/steps.sh")" -ge 3 ] || bad "README: no 'A few first steps' block found"
if (cd "$tmp/run" && LOOM_QUIET_PROGRESS=1 bash -e "$tmp/steps.sh") > "$tmp/steps.log" 2>&1; then
  ok "README's first steps run as written ($(grep -c loom "$tmp/steps.sh") commands)"
else
  bad "README's first steps"; tail -20 "$tmp/steps.log"
fi
echo "docs_commands: $pass passed, $fail failed"
[ $fail -eq 0 ]
