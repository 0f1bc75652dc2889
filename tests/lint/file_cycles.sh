#!/usr/bin/env bash
# tests/lint/file_cycles.sh BUILD_DIR — no two source files of loom's libraries and commands
# call each other, directly or around a longer loop (issue 30: a file split off from another
# does not call back into it; what both need moves down into a file both use).
#
# The graph is read from the compiled objects, not from #include lines: file A depends on
# file B when A's object uses a symbol B's object defines (nm).  tsort (coreutils) orders the
# files and names every loop it has to break; any loop fails the test with its files.
# Known loops being worked off are listed in tests/lint/file_cycles.allow (one per line: the
# loop's files, sorted, space-separated); a loop not listed fails, and so does a listed one
# that is gone (so the list stays true).
set -euo pipefail
build=${1:?usage: file_cycles.sh BUILD_DIR}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Every object of the project's own libraries and of the two binaries, named by its source.
objs=()
for d in "$build"/CMakeFiles/loom_{ir,runtime,exec,frontend,passes,codegen,driver,tools_common}.dir \
         "$build"/CMakeFiles/loom.dir "$build"/CMakeFiles/loom-train.dir; do
  [ -d "$d" ] || continue
  while IFS= read -r o; do objs+=("$o"); done < <(find "$d" -name '*.c.o')
done
[ ${#objs[@]} -gt 50 ] || { echo "file_cycles: only ${#objs[@]} objects under $build (build first)"; exit 1; }

for o in "${objs[@]}"; do
  src=${o#*.dir/}; src=${src%.o}
  nm "$o" | awk -v f="$src" '$1 == "U" { print "U", $2, f; next } NF == 3 && $2 ~ /^[TDBRC]$/ { print "D", $3, f }'
done > "$tmp/syms"

# edges "user definer" for every undefined symbol some other project file defines
awk '$1 == "D" { def[$2] = $3; next } { use[NR] = $2 " " $3 }
     END { for (i in use) { split(use[i], a, " "); if ((a[1] in def) && def[a[1]] != a[2]) print a[2], def[a[1]] } }' \
  "$tmp/syms" | sort -u > "$tmp/edges"

# tsort prints each loop it breaks as "tsort: -: input contains a loop:" and the loop's members.
tsort "$tmp/edges" > /dev/null 2> "$tmp/loops" || true
awk '/input contains a loop/ { if (n) print line; line = ""; n = 0; next }
     { sub(/^tsort: /, ""); line = line (n ? " " : "") $0; n++ }
     END { if (n) print line }' "$tmp/loops" |
  while read -r l; do echo "$l" | tr ' ' '\n' | sort | tr '\n' ' ' | sed 's/ $//'; echo; done | sort -u > "$tmp/found"

allow="$here/file_cycles.allow"
grep -v '^#' "$allow" 2>/dev/null | sed '/^$/d' | sort -u > "$tmp/allowed" || true
fail=0
while read -r l; do
  [ -n "$l" ] || continue
  if ! grep -qxF "$l" "$tmp/allowed"; then
    echo "FAIL a loop between files: $l"
    # the edges inside the loop, to show who calls whom
    for f in $l; do for g in $l; do grep -xF "$f $g" "$tmp/edges" | sed 's/^/    uses: /' || true; done; done
    fail=1
  fi
done < "$tmp/found"
while read -r l; do
  [ -n "$l" ] || continue
  grep -qxF "$l" "$tmp/found" || { echo "FAIL tests/lint/file_cycles.allow lists a loop that is gone: $l"; fail=1; }
done < "$tmp/allowed"
echo "$(wc -l < "$tmp/edges") file dependencies among ${#objs[@]} objects; $(grep -c . "$tmp/found" || true) loops, $(grep -c . "$tmp/allowed" || true) allowed"
exit $fail
