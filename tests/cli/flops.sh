#!/usr/bin/env bash
# loom ir --flops: a training step's model FLOPs, counted from the IR, equal the usual
# formula 6·N·tokens + 12·L·T·D·tokens (N: the weights of every matmul, tied lm_head
# included, embeddings not), for GPT-2 124M and the Llama-1B-shaped model; a tp=2 rank
# does half of it.
LOOM=$1
pass=0 fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
got() { "$LOOM" ir "$@" --flops | awk '$1 == "@grad_step" {print $2}'; }

# GPT-2 124M: L 12, D 768, V 50257, batch 8 x seq 1024
L=12 D=768 V=50257 T=1024 tok=$((8 * 1024))
N=$((L * 12 * D * D + V * D))
want=$((6 * N * tok + 12 * L * T * D * tok))
g=$(got models/gpt2-124M.json --passes=train)
[ "$g" = "$want" ] && ok "GPT-2 124M grad_step: $g FLOP = 6N·tokens + 12LTD·tokens (N = $N)" || bad "GPT-2 124M: got '$g', want $want"

# Llama-1B-shaped: L 16, D 2048, 32 heads and 8 KV heads of 64, MLP 8192, V 128256 (tied), batch 4 x seq 2048
L=16 D=2048 KVD=$((8 * 64)) I=8192 V=128256 T=2048 tok=$((4 * 2048))
N=$((L * (2 * D * D + 2 * D * KVD + 3 * D * I) + V * D))
want=$((6 * N * tok + 12 * L * T * D * tok))
g=$(got models/llama-1B.json --passes=train)
[ "$g" = "$want" ] && ok "Llama-1B grad_step: $g FLOP = 6N·tokens + 12LTD·tokens (N = $N)" || bad "Llama-1B: got '$g', want $want"

# tensor parallel: each of 2 ranks does half (vocabulary-parallel lm_head included); GPT-2's
# vocabulary, padded from 50257 to 50258 rows for tp=2, costs a little more
full=$(got models/llama-1B.json --passes=train)
half=$(got models/llama-1B.json --passes=train --mesh tp=2)
[ $((half * 2)) = "$full" ] && ok "Llama-1B tp=2: $half FLOP per rank, half of $full" || bad "tp=2: $half per rank vs $full"
half=$(got models/gpt2-124M.json --passes=train --mesh tp=2)
want=$(( (6999559372800 + 6 * 8192 * 768) / 2 ))
[ "$half" = "$want" ] && ok "GPT-2 124M tp=2: $half FLOP per rank = half of the step with 50258 vocabulary rows" || bad "GPT-2 tp=2: $half, want $want"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
