#!/usr/bin/env bash
# loom data --tokenizer: shards from a Hugging Face tokenizer.json (the test tokenizers of
# tests/tokenizer/), an end-of-text token before every document, the token counts of the
# goldens (identical to `tokenizers`), --val-frac and --shard-tokens, uint32 shards when the
# vocabulary needs them, --decode back to the text, training on the result, and refusals.
LOOM=${1:-}
ST_DIFF=${2:-}
. "$(dirname "$0")/lib.sh"
GEN=$(dirname "$LOOM")/tok_textgen
TOK=tests/tokenizer/gpt2-style.json

# Documents 16..19 of the goldens' text, one file each.
for d in 16 17 18 19; do
  "$GEN" --doc $d > "$TMP/doc$d.txt" || { fail "tok_textgen did not run ($GEN)"; finish; }
done
docs="$TMP/doc16.txt $TMP/doc17.txt $TMP/doc18.txt $TMP/doc19.txt"

expect_exit 0 "four documents tokenized" "$LOOM" data --tokenizer $TOK $docs -o "$TMP/a.bin"
expect_stdout_contains "vocabulary 2000, uint16"
expect_stderr_contains "MB/s"
want=$(awk '$1 >= 16 && $1 <= 19 { n += $2 } END { print n + 4 }' tests/tokenizer/gpt2-style.golden)
got=$(od -An -t d4 -j 8 -N 4 "$TMP/a.bin" | tr -d ' ')
check "token count $got = the goldens' $want (tokenizers) + 4 end-of-text tokens" [ "$got" = "$want" ]
check "uint16 shard (magic 20240520)" [ "$(od -An -t d4 -N 4 "$TMP/a.bin" | tr -d ' ')" = 20240520 ]
eot=$(od -An -t u2 -j 1024 -N 2 "$TMP/a.bin" | tr -d ' ')
check "the shard starts with <|endoftext|> (id $eot)" [ "$eot" = 0 ]

# --decode gives the documents back, each after <|endoftext|>
for d in 16 17 18 19; do printf '<|endoftext|>'; cat "$TMP/doc$d.txt"; done > "$TMP/expected.txt"
expect_exit 0 "--decode" "$LOOM" data --decode "$TMP/a.bin" --tokenizer $TOK -o "$TMP/decoded.txt"
check "decoded text is the input with the separators" cmp -s "$TMP/decoded.txt" "$TMP/expected.txt"
"$LOOM" data --decode "$TMP/a.bin" --tokenizer $TOK > "$TMP/stdout.txt" 2> /dev/null
check "--decode without -o writes standard output" cmp -s "$TMP/stdout.txt" "$TMP/expected.txt"

# Llama 3's pre-tokenizer, its <|end_of_text|> as the default separator
expect_exit 0 "llama3-style tokenizer" "$LOOM" data -q --tokenizer tests/tokenizer/llama3-style.json $docs -o "$TMP/l.bin"
want=$(awk '$1 >= 16 && $1 <= 19 { n += $2 } END { print n + 4 }' tests/tokenizer/llama3-style.golden)
got=$(od -An -t d4 -j 8 -N 4 "$TMP/l.bin" | tr -d ' ')
check "llama3-style: $got tokens = the goldens' $want" [ "$got" = "$want" ]
check "-q: no progress line" [ ! -s "$ERR" ]
expect_exit 0 "--eot none" "$LOOM" data -q --tokenizer $TOK $docs --eot none -o "$TMP/n.bin"
got=$(od -An -t d4 -j 8 -N 4 "$TMP/n.bin" | tr -d ' ')
want=$(od -An -t d4 -j 8 -N 4 "$TMP/a.bin" | tr -d ' ')
check "--eot none: 4 tokens fewer ($got against $want)" [ "$got" = "$((want - 4))" ]

# --val-frac and --shard-tokens
expect_exit 0 "--val-frac 0.1 --shard-tokens 1000" "$LOOM" data -q --tokenizer $TOK $docs --val-frac 0.1 --shard-tokens 1000 -o "$TMP/s.bin"
total=$(od -An -t d4 -j 8 -N 4 "$TMP/a.bin" | tr -d ' ')
sum=0 ok=1
for f in "$TMP"/s_val_*.bin "$TMP"/s_train_*.bin; do
  c=$(od -An -t d4 -j 8 -N 4 "$f" | tr -d ' ')
  sum=$((sum + c))
  [ "$c" -le 1000 ] || ok=0
done
nval=$(od -An -t d4 -j 8 -N 4 "$TMP/s_val_000000.bin" | tr -d ' ')
check "shards hold at most 1000 tokens each, $sum in all = $total" [ $ok = 1 ] && [ "$sum" = "$total" ]
check "validation holds 10% ($nval of $total)" [ "$nval" = "$(( (total + 5) / 10 ))" ] || [ "$nval" = "$((total / 10))" ]
for f in "$TMP"/s_val_*.bin "$TMP"/s_train_*.bin; do "$LOOM" data --decode "$f" --tokenizer $TOK; done > "$TMP/joined.txt" 2> /dev/null
check "the shards decode, in order, to the same text" cmp -s "$TMP/joined.txt" "$TMP/expected.txt"

# uint32: an added token with id 70000 makes the vocabulary too big for uint16
sed 's/"added_tokens":\[/"added_tokens":[{"id":70000,"content":"<|big|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},/' \
  $TOK > "$TMP/big.json"
printf 'hello <|big|> world' > "$TMP/big.txt"
expect_exit 0 "a vocabulary of 70001" "$LOOM" data -q --tokenizer "$TMP/big.json" "$TMP/big.txt" -o "$TMP/big.bin"
expect_stdout_contains "vocabulary 70001, uint32"
check "uint32 shard (magic 20240801)" [ "$(od -An -t d4 -N 4 "$TMP/big.bin" | tr -d ' ')" = 20240801 ]
check "the added token's id is 70000" od -An -t u4 -j 1024 "$TMP/big.bin" | grep -qw 70000
"$LOOM" data --decode "$TMP/big.bin" --tokenizer "$TMP/big.json" > "$TMP/big.out" 2> /dev/null
check "uint32 shard decodes back" cmp -s "$TMP/big.out" <(printf '<|endoftext|>hello <|big|> world')

# Train a GPT-2 with the tokenizer's vocabulary on the shard (2 steps)
cat > "$TMP/spec.json" << 'JSON'
{"model": {"model_type": "gpt2", "vocab_size": 2000, "n_positions": 32, "n_embd": 32, "n_layer": 1, "n_head": 2},
 "batch": 2, "seq": 32, "steps": 2}
JSON
expect_exit 0 "loom train on the tokenized shard" "$LOOM" train "$TMP/spec.json" --data "$TMP/a.bin" --backend ref
expect_stdout_contains "step     2/2"

# Refusals
printf 'caf\xe9 au lait' > "$TMP/latin1.txt"
expect_exit 2 "Latin-1 text refused" "$LOOM" data --tokenizer $TOK "$TMP/latin1.txt" -o "$TMP/x.bin"
expect_stderr_contains "latin1.txt: not valid UTF-8 at byte 3 (0xe9)"
expect_stderr_contains "iconv"
check "nothing written" [ ! -e "$TMP/x.bin" ]
printf '{"model": ' > "$TMP/broken.json"
expect_exit 2 "tokenizer that is not JSON" "$LOOM" data --tokenizer "$TMP/broken.json" $docs -o "$TMP/x.bin"
expect_stderr_contains "broken.json:1:"
sed 's/"type":"BPE"/"type":"WordPiece"/' $TOK > "$TMP/wp.json"
expect_exit 2 "WordPiece tokenizer" "$LOOM" data --tokenizer "$TMP/wp.json" $docs -o "$TMP/x.bin"
expect_stderr_contains "model type is 'WordPiece'"
expect_exit 2 "--eot that is not a token" "$LOOM" data --tokenizer $TOK $docs --eot '<|nope|>' -o "$TMP/x.bin"
expect_stderr_contains "--eot '<|nope|>' is not a token"
sed 's/"content":"<|endoftext|>"/"content":"<|eot|>"/' $TOK > "$TMP/noeot.json"
expect_exit 2 "tokenizer without an end-of-text token" "$LOOM" data --tokenizer "$TMP/noeot.json" $docs -o "$TMP/x.bin"
expect_stderr_contains "--eot none"
expect_exit 2 "--val-frac 1.5" "$LOOM" data --tokenizer $TOK $docs --val-frac 1.5 -o "$TMP/x.bin"
expect_stderr_contains "0 <= F < 1"
expect_exit 2 "--shard-tokens 0" "$LOOM" data --tokenizer $TOK $docs --shard-tokens 0 -o "$TMP/x.bin"
expect_exit 2 "--decode of a tokenized shard without --tokenizer" "$LOOM" data --decode "$TMP/a.bin"
expect_stderr_contains "decode it with --tokenizer"
expect_exit 2 "--decode with a smaller tokenizer" "$LOOM" data --decode "$TMP/big.bin" --tokenizer $TOK
expect_stderr_contains "token 70000 at position"
expect_exit 2 "--eot without --tokenizer" "$LOOM" data $docs --eot x -o "$TMP/x.bin"
expect_exit 0 "--help" "$LOOM" data --help
expect_stdout_contains "--tokenizer T.json"
finish
