#!/usr/bin/env python3
"""Tokenizer goldens: loom's tokens must be the Hugging Face `tokenizers` package's.

    python3 -m venv /tmp/venv-tok && /tmp/venv-tok/bin/pip install tokenizers
    /tmp/venv-tok/bin/python tests/tokenizer/gen_goldens.py build/tok_textgen

1. Runs tok_textgen (tests/tokenizer/textgen.c, built with loom) for the documents: ~3.9 MB of
   English, code, many scripts, emoji, numbers and whitespace runs, with edge cases first.
   The text is not checked in: the C generator makes it again in the test.
2. Trains two small byte-level BPE tokenizers on it with `tokenizers` itself and writes them:
     gpt2-style.json    ByteLevel pre-tokenizer (GPT-2's regex), <|endoftext|>, 2,000 tokens
     llama3-style.json  Split with Llama 3's regex, then ByteLevel(use_regex=False),
                        ignore_merges, <|begin_of_text|> and <|end_of_text|>, 3,000 tokens
   and gpt2-prefix.json, gpt2-style.json with add_prefix_space=true.
3. Encodes every document with each (encode(text, add_special_tokens=False)) and writes
   NAME.golden: per document its token count and the FNV-1a 64 hash of the ids as
   little-endian uint32 (so ~40 bytes a document, not the ids), and for the edge-case
   documents the ids themselves (a failing test then shows where it differs).
"""
import struct
import subprocess
import sys
from pathlib import Path

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

DOCS = 600
EDGE = 16   # TEXTGEN_EDGE in textgen.h
HERE = Path(__file__).resolve().parent
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def fnv1a64(ids):
    h = 1469598103934665603
    for b in struct.pack("<%dI" % len(ids), *ids):
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def train(tok, docs, vocab, specials):
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs[EDGE:], trainer=trainer)
    tok.decoder = decoders.ByteLevel()
    return tok


def main():
    gen = sys.argv[1] if len(sys.argv) > 1 else "build/tok_textgen"
    raw = subprocess.run([gen, str(DOCS)], check=True, capture_output=True).stdout
    docs = [d.decode("utf-8") for d in raw.split(b"\0")[:DOCS]]
    print(f"{len(docs)} documents, {len(raw) - DOCS} bytes")

    gpt2 = Tokenizer(models.BPE())
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    gpt2 = train(gpt2, docs, 2000, ["<|endoftext|>"])
    llama = Tokenizer(models.BPE(ignore_merges=True))
    llama.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama = train(llama, docs, 3000, ["<|begin_of_text|>", "<|end_of_text|>"])
    prefix = Tokenizer.from_str(gpt2.to_str().replace('"add_prefix_space":false', '"add_prefix_space":true'))
    assert prefix.pre_tokenizer.add_prefix_space

    for name, tok in (("gpt2-style", gpt2), ("llama3-style", llama), ("gpt2-prefix", prefix)):
        (HERE / f"{name}.json").write_text(tok.to_str() + "\n")
        lines = [f"# {name}.json: tokens of tok_textgen's documents by tokenizers {tokenizers.__version__}"
                 " (gen_goldens.py)", f"docs {DOCS}"]
        total = 0
        for d, text in enumerate(docs):
            ids = tok.encode(text, add_special_tokens=False).ids
            total += len(ids)
            lines.append(f"{d} {len(ids)} {fnv1a64(ids):016x}")
            if d < EDGE:
                lines.append("ids " + " ".join(map(str, ids)))
        (HERE / f"{name}.golden").write_text("\n".join(lines) + "\n")
        print(f"{name}: {tok.get_vocab_size()} tokens, {total} tokens over the documents")


if __name__ == "__main__":
    main()
