#!/usr/bin/env bash
# Collectives and memory per rank against the Ultra-Scale Playbook's formulas, on GPT-2 124M
# (N = 124,439,808 parameters, so Psi = 4N bytes of f32 gradients) with dp=2:
#  - plain DP all-reduces Psi of gradients once per optimizer step; in a ring one rank sends
#    2(n-1)/n Psi = Psi;
#  - ZeRO-1 reduce-scatters the gradients ((n-1)/n Psi) and all-gathers the parameters after
#    the update ((n-1)/n Psi): the same bytes as plain DP;
#  - ZeRO-2 moves the reduce-scatter into the micro-batch step; ZeRO-3 adds parameter
#    all-gathers before every use in forward and backward;
#  - memory per rank: ZeRO-1 divides optimizer state by dp, ZeRO-2 also gradients, ZeRO-3
#    also parameters.
LOOM=$1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
N=124439808 PSI=$((4 * 124439808)) HALF=$((2 * 124439808))
run() { "$LOOM" ir models/gpt2-124M.json --passes=train --mesh dp=2 --batch 2 --zero "$@"; }

z0=$(run 0 --collectives) z1=$(run 1 --collectives) z2=$(run 2 --collectives) z3=$(run 3 --collectives)
s0=$(echo "$z0" | awk '$1 == "@optimizer_step" && $2 == "all_reduce" && $4 == "x148" {print $(NF-1)}')
[ "$s0" = "$PSI" ] && ok "plain DP: 148 gradient all-reduces, one rank sends Psi = $PSI bytes" || { bad "plain DP sent $s0, want $PSI"; echo "$z0"; }
rs1=$(echo "$z1" | awk '$1 == "@optimizer_step" && $2 == "reduce_scatter" {print $(NF-1)}')
ag1=$(echo "$z1" | awk '$1 == "@optimizer_step" && $2 == "all_gather" {print $(NF-1)}')
[ "$rs1" = "$HALF" ] && [ "$ag1" = "$HALF" ] && [ $((rs1 + ag1)) = "$s0" ] &&
  ok "ZeRO-1: reduce-scatter $rs1 + all-gather $ag1 bytes = plain DP's $s0" || { bad "ZeRO-1 bytes $rs1 + $ag1 vs $s0"; echo "$z1"; }
rs2=$(echo "$z2" | awk '$1 == "@grad_step" && $2 == "reduce_scatter" {print $(NF-1)}')
ag2=$(echo "$z2" | awk '$1 == "@optimizer_step" && $2 == "all_gather" {print $(NF-1)}')
[ "$rs2" = "$HALF" ] && [ "$ag2" = "$HALF" ] && ! echo "$z2" | grep -q "@optimizer_step  reduce_scatter" &&
  ok "ZeRO-2: the reduce-scatter ($rs2 bytes) happens in the micro-batch step; parameters all-gathered after the update" ||
  { bad "ZeRO-2"; echo "$z2"; }
fw3=$(echo "$z3" | awk '$1 == "@grad_step" && $2 == "all_gather" {print $4}')
[ -n "$fw3" ] && [ "${fw3#x}" -gt 148 ] && ! echo "$z3" | grep -q "@optimizer_step  all_gather" &&
  ok "ZeRO-3: parameters gathered before each use in forward and backward ($fw3 all-gathers per micro-batch), none after the update" ||
  { bad "ZeRO-3"; echo "$z3"; }

mem() { run "$1" --passes=train,lower --memory --target cuda | grep "$2" | head -1 | sed -n 's/.*(\([0-9]*\) bytes).*/\1/p'; }
for z in 0 1 2 3; do
  p=$(mem $z parameters) g=$(mem $z gradients) o=$(mem $z "optimizer state")
  wp=$PSI wg=$PSI wo=$((2 * PSI))
  [ $z -ge 1 ] && wo=$PSI
  [ $z -ge 2 ] && wg=$HALF
  [ $z -ge 3 ] && wp=$HALF
  [ "$p $g $o" = "$wp $wg $wo" ] && ok "ZeRO-$z memory per rank: parameters $p, gradients $g, optimizer state $o bytes" ||
    bad "ZeRO-$z memory: got $p $g $o, want $wp $wg $wo"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
