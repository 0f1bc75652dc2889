#!/usr/bin/env bash
# Collectives and memory per rank against the Ultra-Scale Playbook's formulas, on GPT-2 124M
# (N = 124,439,808 parameters, so Psi = 4N bytes of f32 gradients) with dp=2:
#  - plain DP all-reduces Psi of gradients once per optimizer step (in buckets); in a ring
#    one rank sends 2(n-1)/n Psi = Psi: with two micro-batches after the last of them (in
#    @optimizer_step), with one in the backward (@grad_step, the same buckets and bytes);
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

z0=$(run 0 --collectives --grad-accum 2) z1=$(run 1 --collectives) z2=$(run 2 --collectives) z3=$(run 3 --collectives)
# plain DP: the 148 gradients' all-reduces go in buckets of at most 25 MB (the default
# bucket_mb; wte's 154 MB gradient is a bucket alone); --bucket-mb 0 keeps one per gradient
read -r n0 s0 <<< "$(echo "$z0" | awk '$1 == "@optimizer_step" && $2 == "all_reduce" && $3 == "dp" {print substr($4, 2), $(NF-1)}')"
[ "$s0" = "$PSI" ] && [ "${n0:-0}" -ge 19 ] && [ "${n0:-999}" -lt 148 ] &&
  ok "plain DP: the 148 gradients in $n0 bucketed all-reduces (25 MB), one rank sends Psi = $PSI bytes" || { bad "plain DP: $n0 all-reduces sent $s0, want Psi = $PSI in 19..147"; echo "$z0"; }
u0=$(run 0 --collectives --grad-accum 2 --bucket-mb 0 | awk '$1 == "@optimizer_step" && $2 == "all_reduce" && $3 == "dp" {print $4, $(NF-1)}')
[ "$u0" = "x148 $PSI" ] && ok "plain DP with --bucket-mb 0: 148 all-reduces, the same $PSI bytes" || bad "unbucketed: got '$u0'"
u1=$(run 0 --collectives --grad-accum 2 --bucket-mb 1000 | awk '$1 == "@optimizer_step" && $2 == "all_reduce" && $3 == "dp" {print substr($4, 2)}')
[ "$u1" = "$(( (148 + 14) / 15 ))" ] && ok "plain DP with --bucket-mb 1000: $u1 all-reduces (15 gradients at most per bucket)" || bad "1000 MB buckets: got '$u1' all-reduces, want $(( (148 + 14) / 15 ))"
# one micro-batch: the same buckets in the backward (and the loss's 4 bytes), none after it
g1=$(run 0 --collectives)
read -r gn gs0 <<< "$(echo "$g1" | awk '$1 == "@grad_step" && $2 == "all_reduce" && $3 == "dp" {print substr($4, 2), $(NF-1)}')"
[ "$gs0" = "$((PSI + 4))" ] && [ "$gn" = "$((n0 + 1))" ] && ! echo "$g1" | grep -q "@optimizer_step  all_reduce      dp" &&
  ok "plain DP, one micro-batch: the $n0 buckets all-reduced in the backward (Psi + the loss's 4 bytes), none in @optimizer_step" ||
  { bad "plain DP, one micro-batch: @grad_step x$gn $gs0 bytes, want x$((n0 + 1)) $((PSI + 4))"; echo "$g1"; }
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

# dp=2 x tp=2 with ZeRO-1 (the issue's case).  Local batch 1 x 1024 tokens x D=768 floats:
# A = 3,145,728 bytes per activation.  Tensor parallel (Megatron): 2 all-reduces of A per
# layer in the forward (after the attention and MLP row-parallel matmuls) and 2 in the
# backward (before the column-parallel backward), plus one for the vocabulary-parallel
# embedding each way and the vocabulary-parallel loss's row statistics (max, sum, target
# logit: B*T floats each; the [B,T,V] logits are never gathered).  ZeRO-1 over dp moves the
# same bytes as plain DP of the tp-local gradients.
A=$((1024 * 768 * 4)) ROW=$((1024 * 4)) L=12
dt() { "$LOOM" ir models/gpt2-124M.json --passes=train --mesh dp=2,tp=2 --batch 2 --zero "$@"; }
t1=$(dt 1 --collectives) t0=$(dt 0 --collectives --grad-accum 2)
fwd=$(echo "$t1" | awk '$1 == "@forward" && $2 == "all_reduce" && $3 == "tp" {print $4, $(NF-1)}')
want_fwd="x$((2 * L + 1 + 3)) $(((2 * L + 1) * A + 3 * ROW))"
[ "$fwd" = "$want_fwd" ] && ok "dp2 x tp2: forward tp all-reduces $fwd bytes = 2 per layer x 12 + embedding (A each) + 3 loss statistics" ||
  { bad "dp2 x tp2 forward: got '$fwd', want '$want_fwd'"; echo "$t1"; }
gs=$(echo "$t1" | awk '$1 == "@grad_step" && $2 == "all_reduce" && $3 == "tp" {print $4, $(NF-1)}')
want_gs="x$((2 * L + 1 + 3 + 2 * L + 1 + 2)) $(((4 * L + 2) * A + 5 * ROW))"
[ "$gs" = "$want_gs" ] && ok "dp2 x tp2: micro-batch step (forward + backward) tp all-reduces $gs bytes: 2 per layer each way" ||
  { bad "dp2 x tp2 grad_step: got '$gs', want '$want_gs'"; echo "$t1"; }
! echo "$t1" | grep -v "@forward" | grep -q "all_gather .* tp " &&
  ok "dp2 x tp2: no tp all-gather in training (logits stay vocabulary-split)" || bad "a tp all-gather in training"
dp0=$(echo "$t0" | awk '$1 == "@optimizer_step" && $2 == "all_reduce" && $3 == "dp" {print $(NF-1)}')
rs=$(echo "$t1" | awk '$1 == "@optimizer_step" && $2 == "reduce_scatter" && $3 == "dp" {print $(NF-1)}')
ag=$(echo "$t1" | awk '$1 == "@optimizer_step" && $2 == "all_gather" && $3 == "dp" {print $(NF-1)}')
[ -n "$dp0" ] && [ $((rs + ag)) = "$dp0" ] &&
  ok "dp2 x tp2: ZeRO-1 sends $rs + $ag = $dp0 bytes over dp, as plain DP's gradient all-reduce" ||
  { bad "dp2 x tp2 ZeRO-1 dp bytes: $rs + $ag vs $dp0"; echo "$t0"; }

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
# tp=2 memory per rank: split weights halve; norms, row-parallel biases and the position
# table stay whole; the vocabulary (50257) is padded to 50258 to split.
D=768 F=3072 V=50258
split=$((L * (D * 3 * D + 3 * D + D * D + D * F + F + F * D) + V * D))
whole=$((L * (4 * D + 2 * D) + 1024 * D + 2 * D))
want=$((4 * (split / 2 + whole)))
got=$("$LOOM" ir models/gpt2-124M.json --passes=train,lower --mesh tp=2 --batch 2 --memory --target cuda | grep parameters | sed -n 's/.*(\([0-9]*\) bytes).*/\1/p')
[ "$got" = "$want" ] && ok "tp=2 memory per rank: parameters $got bytes = split weights / 2 + whole norms, biases, positions" ||
  bad "tp=2 parameters: got $got, want $want"
# tp=2 with sequence parallel and a batch of one sequence (loom plan's dp = 1 references)
# partitions as a batch of two does: every collective moves half the bytes (the optimizer
# step's the same), and the weight gradients stay split like their weights.  A batch of one
# used to keep the flattened [1,T,D] -> [T,D] activation split over the tokens, so each
# weight gradient came out as a partial sum: 12 all_to_alls in the backward, the whole
# gradients all-reduced at the optimizer step and held whole on every rank.
sp() { "$LOOM" ir tests/golden/llama-tiny/train_spec.json --passes=train,lower --grad-accum 1 --mesh tp=2 --sequence-parallel true --batch "$@"; }
c1=$(sp 1 --collectives) c2=$(sp 2 --collectives)
half=$(echo "$c2" | awk '$5 == "payload" {print $1, $2, $3, $4, ($1 == "@optimizer_step" ? $6 : $6 / 2)}')
one=$(echo "$c1" | awk '$5 == "payload" {print $1, $2, $3, $4, $6}')
g1=$(sp 1 --memory | awk '$1 == "gradients" {print substr($(NF-1), 2)}') g2=$(sp 2 --memory | awk '$1 == "gradients" {print substr($(NF-1), 2)}')
[ -n "$one" ] && [ "$one" = "$half" ] && [ -n "$g1" ] && [ "$g1" = "$g2" ] &&
  ok "tp=2 + sequence parallel, batch 1: batch 2's collectives at half the bytes, gradients $g1 bytes a rank as at batch 2" ||
  { bad "tp=2 + sp, batch 1 against batch 2 (gradients $g1 vs $g2 bytes)"; diff <(echo "$one") <(echo "$half"); }
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
