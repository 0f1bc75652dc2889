#!/usr/bin/env bash
# loom train --val-data / --val-every / --val-tokens, --log FILE.jsonl, the ETA, and loom plot:
# the validation loss is the forward loss of the val tokens (equal to 'loom eval' of the final
# weights), the same on the reference executor, the cpu backend and dp/tp meshes, and it does
# not change training (losses bitwise equal with and without it); the log has one line per
# step, also after a resume; the plot draws what the log holds; bad input is refused.
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
SPEC=models/gpt2-tiny.json   # batch 2 x seq 32, vocabulary 256

expect_exit 0 "byte-level shards with --val-frac" "$LOOM" data data/shakespeare.txt --val-frac 0.05 -o "$TMP/sh"
TRAIN=$TMP/sh_train_000000.bin VAL=$TMP/sh_val_000000.bin
run_train() { "$LOOM" train $SPEC --data "$TRAIN" --steps 8 --lr 3e-3 --warmup 2 "$@"; }

expect_exit 0 "cpu: --val-data --val-every 3 --log" run_train --val-data "$VAL" --val-every 3 --log "$TMP/cpu.jsonl" --out "$TMP/cpu.st"
expect_stdout_contains "| val "
expect_stdout_contains "| eta "
check "the log has one line per step (8)" [ "$(wc -l < "$TMP/cpu.jsonl")" = 8 ]
vals=$(grep -o '"step":[0-9]*,"loss":[^,]*,"val_loss"' "$TMP/cpu.jsonl" | grep -o '"step":[0-9]*' | tr -d '"step:' | tr '\n' ' ')
check "validation at steps 3, 6 and the last (got: $vals)" [ "$vals" = "3 6 8 " ]
check "every line names step, loss, lr, grad_norm, tokens_per_s, max_rss_mb, time" \
  sh -c "grep -c '\"lr\":.*\"grad_norm\":.*\"tokens_per_s\":.*\"max_rss_mb\":.*\"time\":' '$TMP/cpu.jsonl' | grep -qx 8"

# validation changes nothing in training
expect_exit 0 "cpu without validation" run_train --out "$TMP/noval.st"
expect_exit 0 "  losses bitwise equal with and without validation" "$ST_DIFF" "$TMP/cpu.st" "$TMP/noval.st" --rtol 0 --only losses,wte.weight,grad_norms

# the validation loss is the forward loss: one window (--val-tokens 64) = loom eval of the final weights
expect_exit 0 "cpu: --val-tokens 64 (one micro-batch)" run_train --val-data "$VAL" --val-tokens 64 --log "$TMP/one.jsonl" --out "$TMP/one.st"
last_val=$(tail -1 "$TMP/one.jsonl" | grep -o '"val_loss":[^,]*' | cut -d: -f2)
expect_exit 0 "loom eval of the final weights on the val shard's first batch" "$LOOM" eval $SPEC --weights "$TMP/one.st" \
  --tokens "$VAL" --batches 1
eval_loss=$(grep -o 'loss [0-9.]*' "$OUT" | head -1 | cut -d' ' -f2)
check "val_loss $last_val = eval loss $eval_loss (to 1e-5)" awk -v a="$last_val" -v b="$eval_loss" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }'
# three windows (--val-tokens 192) = loom eval --batches 3: the mean over the same batches
expect_exit 0 "cpu: --val-tokens 192 (three micro-batches)" run_train --val-data "$VAL" --val-tokens 192 --log "$TMP/three.jsonl" --out "$TMP/three.st"
last_val=$(tail -1 "$TMP/three.jsonl" | grep -o '"val_loss":[^,]*' | cut -d: -f2)
expect_exit 0 "loom eval --batches 3 of the final weights" "$LOOM" eval $SPEC --weights "$TMP/three.st" --tokens "$VAL" --batches 3
eval_loss=$(grep -o 'loss [0-9.]*' "$OUT" | head -1 | cut -d' ' -f2)
check "val_loss $last_val = eval loss $eval_loss over 3 batches (to 1e-5)" awk -v a="$last_val" -v b="$eval_loss" 'BEGIN { d = a - b; exit !(d < 1e-5 && d > -1e-5) }'

# the same validation losses on every backend and layout
for layout in "--backend ref" "--mesh dp=2" "--mesh tp=2" "--mesh dp=2,tp=2 --zero 1" "--mesh dp=2 --backend ref" \
              "--mesh cp=2" "--mesh cp=2,dp=2 --zero 3"; do
  name=$(echo "$layout" | tr -c 'a-z0-9' '_')
  expect_exit 0 "$layout: validation" run_train --val-data "$VAL" --val-every 3 --log "$TMP/$name.jsonl" $layout
  a=$(grep -o '"val_loss":[^,]*' "$TMP/cpu.jsonl" | cut -d: -f2 | tr '\n' ' ')
  b=$(grep -o '"val_loss":[^,]*' "$TMP/$name.jsonl" | cut -d: -f2 | tr '\n' ' ')
  check "  val losses ($b) within 1e-4 of the cpu backend's ($a)" awk -v a="$a" -v b="$b" \
    'BEGIN { n = split(a, x, " "); m = split(b, y, " "); if (n != m || n != 3) exit 1; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d > 1e-4 || d < -1e-4) exit 1 } }'
done

# expert parallelism: a mixture of experts' validation at ep=2 is one rank's
moe() { "$LOOM" train models/mixtral-tiny.json --data "$TRAIN" --val-data "$VAL" --steps 4 --val-every 2 "$@"; }
expect_exit 0 "mixtral-tiny on one rank with validation" moe --log "$TMP/moe1.jsonl"
expect_exit 0 "mixtral-tiny --mesh ep=2 with validation" moe --mesh ep=2 --log "$TMP/moe2.jsonl"
a=$(grep -o '"val_loss":[^,]*' "$TMP/moe1.jsonl" | cut -d: -f2 | tr '\n' ' ')
b=$(grep -o '"val_loss":[^,]*' "$TMP/moe2.jsonl" | cut -d: -f2 | tr '\n' ' ')
check "  ep=2 val losses ($b) within 1e-4 of one rank's ($a)" awk -v a="$a" -v b="$b" \
  'BEGIN { n = split(a, x, " "); m = split(b, y, " "); if (n != m || n != 2) exit 1; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d > 1e-4 || d < -1e-4) exit 1 } }'

# pipelines: every chunk's forward for one micro-batch at a time, on every schedule, both
# backends; the same validation losses as one rank (the 4-layer model)
P=models/gpt2-tiny-4l.json
pp_run() { "$LOOM" train $P --data "$TRAIN" --val-data "$VAL" --steps 4 --val-every 2 --grad-accum 4 "$@"; }
close() { awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " "); if (n != m || n != 2) exit 1;
  for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d > 1e-5 || d < -1e-5) exit 1 } }'; }
expect_exit 0 "4-layer model on one rank" pp_run --log "$TMP/pp1.jsonl"
want=$(grep -o '"val_loss":[^,]*' "$TMP/pp1.jsonl" | cut -d: -f2 | tr '\n' ' ')
for be in cpu ref; do
  for sch in afab 1f1b interleaved zb-h1 dualpipev; do
    expect_exit 0 "$be pp=2 $sch: validation" pp_run --mesh pp=2 --pp-schedule $sch --backend $be --log "$TMP/pp.jsonl"
    got=$(grep -o '"val_loss":[^,]*' "$TMP/pp.jsonl" | cut -d: -f2 | tr '\n' ' ')
    check "  val losses ($got) within 1e-5 of one rank's ($want)" close "$want" "$got"
  done
done
expect_exit 0 "cpu pp=2,dp=2 --zero 1 with validation" pp_run --mesh pp=2,dp=2 --zero 1 --log "$TMP/pp.jsonl"
got=$(grep -o '"val_loss":[^,]*' "$TMP/pp.jsonl" | cut -d: -f2 | tr '\n' ' ')
check "  val losses ($got) within 1e-5 of one rank's ($want)" close "$want" "$got"
peaks=$(grep -o 'stash peak per pp rank, predicted / measured (bytes):.*' "$OUT" | cut -d: -f2)
check "  the stash peaks stay the training steps' (predicted = measured:$peaks)" \
  awk -v p="$peaks" 'BEGIN { n = split(p, x, " "); if (n != 6) exit 1; exit !(x[1] == x[3] && x[4] == x[6]) }'

# --log across a resume: the lines after the checkpoint are dropped, then appended again
expect_exit 0 "run with checkpoints every 3 steps and --log" run_train --save-dir "$TMP/ck" --save-every 3 --log "$TMP/r.jsonl"
rm -rf "$TMP/ck/step_00000008" "$TMP/ck/step_00000006"
expect_exit 0 "resume from step 3 with the same --log" run_train --resume "$TMP/ck" --log "$TMP/r.jsonl"
steps=$(grep -o '"step":[0-9]*' "$TMP/r.jsonl" | cut -d: -f2 | tr '\n' ' ')
check "the log holds steps 1..8 once each (got: $steps)" [ "$steps" = "1 2 3 4 5 6 7 8 " ]
l1=$(grep -o '"loss":[^,]*' "$TMP/r.jsonl" | tr '\n' ' ')
l2=$(grep -o '"loss":[^,]*' "$TMP/cpu.jsonl" | tr '\n' ' ')
check "and the losses of the uninterrupted run" [ "$l1" = "$l2" ]

# MFU: the model FLOPs of a step (loom ir --flops, @grad_step x grad_accum) / step time / peak
expect_exit 0 "--peak-tflops 2 --grad-accum 2" run_train --peak-tflops 2 --grad-accum 2 --log "$TMP/mfu.jsonl"
expect_stdout_contains "| mfu "
"$LOOM" ir $SPEC --passes=train --flops > "$TMP/flops" 2>&1
fl=$(awk '$1 == "@grad_step" { print $2 }' "$TMP/flops")
line=$(sed -n 5p "$TMP/mfu.jsonl")
mfu=$(echo "$line" | grep -o '"mfu":[^,]*' | cut -d: -f2)
ms=$(echo "$line" | grep -o '"step_ms":[^,]*' | cut -d: -f2)
check "mfu $mfu = 2 x $fl FLOP / $ms ms / 2 TFLOP/s (to 1e-6)" awk -v m="$mfu" -v f="$fl" -v t="$ms" \
  'BEGIN { want = 2 * f / (t / 1000) / 2e12; d = (m - want) / want; exit !(f > 0 && d < 1e-6 && d > -1e-6) }'
# under pipeline parallelism: every chunk's functions x micro-batches, over the pp ranks: a
# rank's share of the step's model FLOPs is half of the one-rank step's at pp=2
"$LOOM" data data/shakespeare.txt -o "$TMP/shk.bin" > /dev/null 2>&1
for pp in 1 2; do
  expect_exit 0 "llama-tiny-4l --mesh pp=$pp --peak-tflops 1" "$LOOM" train models/llama-tiny-4l.json --data "$TMP/shk.bin" \
    --steps 2 --batch 4 --grad-accum 4 --mesh pp=$pp --peak-tflops 1 -q --log "$TMP/mfu-pp$pp.jsonl"
  l=$(sed -n 2p "$TMP/mfu-pp$pp.jsonl")
  m=$(echo "$l" | grep -o '"mfu":[^,]*' | cut -d: -f2) t=$(echo "$l" | grep -o '"step_ms":[^,]*' | cut -d: -f2)
  eval "f$pp=\$(awk -v m=\"$m\" -v t=\"$t\" 'BEGIN { printf \"%.6e\", m * t / 1000 * 1e12 }')"
done
check "pp=2: a rank's step FLOPs ($f2) are half of one rank's ($f1), to 1e-5" awk -v a="$f1" -v b="$f2" \
  'BEGIN { d = (2 * b - a) / a; exit !(a > 0 && d < 1e-5 && d > -1e-5) }'
expect_exit 2 "--peak-tflops 0" run_train --peak-tflops 0
expect_stderr_contains "--peak-tflops takes"

# loom plot
expect_exit 0 "loom plot" "$LOOM" plot "$TMP/cpu.jsonl" -o "$TMP/c.svg" --title 'tiny <run>'
check "  an SVG document" sh -c "head -1 '$TMP/c.svg' | grep -q '<?xml' && tail -1 '$TMP/c.svg' | grep -qx '</svg>'"
check "  three curves (loss, validation, lr) and 3 validation dots" \
  sh -c "[ \$(grep -c '<polyline' '$TMP/c.svg') = 3 ] && [ \$(grep -c '<circle' '$TMP/c.svg') = 4 ]"
check "  a legend and axis labels" sh -c "grep -q 'validation loss' '$TMP/c.svg' && grep -q '>learning rate<' '$TMP/c.svg' && grep -q '>step<' '$TMP/c.svg'"
check "  the title escaped" grep -q 'tiny &lt;run&gt;' "$TMP/c.svg"
pts=$(grep -m1 -o 'points="[^"]*"' "$TMP/c.svg" | tr ' ' '\n' | wc -l)
check "  the loss curve has 8 points ($pts)" [ "$pts" = 8 ]

# refusals
expect_exit 2 "--val-every without --val-data" run_train --val-every 2
expect_stderr_contains "need --val-data"
expect_exit 2 "--val-data that does not exist" run_train --val-data "$TMP/nope.bin"
expect_stderr_contains "nope.bin"
printf 'too short' > "$TMP/small.txt"
"$LOOM" data "$TMP/small.txt" -o "$TMP/small.bin" > /dev/null
expect_exit 2 "a validation shard shorter than one micro-batch" run_train --val-data "$TMP/small.bin"
expect_stderr_contains "a validation shard, --val-data"
expect_exit 2 "--val-tokens 0" run_train --val-data "$VAL" --val-tokens 0
expect_exit 2 "loom compile --val-data (an option of the executable)" "$LOOM" compile $SPEC --data "$TRAIN" --val-data "$VAL" -o "$TMP/exe"
expect_stderr_contains "given to the executable when it runs"

# a compiled executable validates and logs too (cpu, and a dp=2 mesh)
for mesh in "" "--mesh dp=2"; do
  expect_exit 0 "loom compile $mesh" "$LOOM" compile $SPEC --data "$TRAIN" --steps 8 --lr 3e-3 --warmup 2 $mesh -o "$TMP/exe"
  expect_exit 0 "  the executable with --val-data --val-every 3 --log" "$TMP/exe" --val-data "$VAL" --val-every 3 --log "$TMP/exe.jsonl"
  a=$(grep -o '"val_loss":[^,]*' "$TMP/cpu.jsonl" | cut -d: -f2 | tr '\n' ' ')
  b=$(grep -o '"val_loss":[^,]*' "$TMP/exe.jsonl" | cut -d: -f2 | tr '\n' ' ')
  check "  its val losses ($b) within 1e-4 of loom train's ($a)" awk -v a="$a" -v b="$b" \
    'BEGIN { n = split(a, x, " "); m = split(b, y, " "); if (n != m || n != 3) exit 1; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d > 1e-4 || d < -1e-4) exit 1 } }'
done
expect_exit 2 "the executable: --val-every without --val-data" "$TMP/exe" --val-every 3
expect_stderr_contains "need --val-data"
expect_exit 2 "--log into a missing folder: refused before step 1" run_train --log "$TMP/no/such/dir/m.jsonl"
expect_stderr_contains "--log $TMP/no/such/dir/m.jsonl: the folder"
printf '{"step": 1, "loss": 2}\nnot json\n' > "$TMP/bad.jsonl"
expect_exit 2 "loom plot of a damaged log" "$LOOM" plot "$TMP/bad.jsonl" -o "$TMP/x.svg"
expect_stderr_contains "bad.jsonl:2:"
: > "$TMP/empty.jsonl"
expect_exit 2 "loom plot of an empty log" "$LOOM" plot "$TMP/empty.jsonl" -o "$TMP/x.svg"
expect_stderr_contains "no steps in the log"
expect_exit 2 "loom plot without -o" "$LOOM" plot "$TMP/cpu.jsonl"
expect_exit 0 "loom train --help" "$LOOM" train --help
expect_stdout_contains "--val-data SHARD..."
expect_stdout_contains "--log FILE.jsonl"
finish
