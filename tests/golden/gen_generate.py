#!/usr/bin/env python3
"""The greedy-generation goldens: transformers' greedy `generate` on the tiny models.

Run with a Python that has torch and transformers (4.40 or later), from anywhere:
    python3 tests/golden/gen_generate.py              # gpt2-tiny llama-tiny
    python3 tests/golden/gen_generate.py M...         # those golden folders (the issue 33 families:
                                                      # llama3-tiny qwen2-tiny qwen3-tiny mistral-tiny,
                                                      # transformers >= 4.51, eager attention)

For the tiny models M = gpt2-tiny and llama-tiny this loads the golden
folder's config.json and weights.safetensors into transformers' AutoModelForCausalLM,
encodes the prompt as bytes (the tiny models' 256-token vocabulary is bytes), runs
`generate(do_sample=False, max_new_tokens=N)` (it stops early at the config's
eos_token_id) and writes tests/golden/M/generate.json: the prompt, its ids, the new ids
and the versions used.  tests/cli/sample.sh checks that `loom sample --temperature 0`
gives the same ids, token for token.  Re-running gives the same file.  (llama-tiny-tied is
left out: its config's head_dim and rope_parameters need a newer transformers than the
4.44 that runs on Debian's torch 1.13, which would silently build another model.)
"""

import json
import os
import shutil
import sys
import tempfile

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
PROMPTS = ["Hello", "ROMEO:\nWhat light"]
MAX_NEW = 40

torch.set_num_threads(1)


def run(model_dir, eager=False):
    tmp = tempfile.mkdtemp()
    try:
        shutil.copy(os.path.join(model_dir, "config.json"), os.path.join(tmp, "config.json"))
        shutil.copy(os.path.join(model_dir, "weights.safetensors"), os.path.join(tmp, "model.safetensors"))
        kw = {"attn_implementation": "eager"} if eager else {}   # Mistral's window: transformers' mask
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32, **kw)
    finally:
        shutil.rmtree(tmp)
    model.eval()
    out = []
    for prompt in PROMPTS:
        ids = list(prompt.encode("utf-8"))
        x = torch.tensor([ids], dtype=torch.long)
        with torch.no_grad():
            g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW,
                               pad_token_id=model.config.eos_token_id, output_scores=True,
                               return_dict_in_generate=True)
        # the smallest gap between the chosen token's logit and the next one, over the steps:
        # how far float rounding (another CPU's GEMM kernels) is from changing a choice
        gap = min(float(t.topk(2).values[0, 0] - t.topk(2).values[0, 1]) for t in g.scores)
        out.append({"prompt": prompt, "prompt_ids": ids, "max_new_tokens": MAX_NEW,
                    "new_ids": g.sequences[0, len(ids):].tolist(), "smallest_logit_gap": round(gap, 6)})
    return out


def main():
    names = sys.argv[1:] or ["gpt2-tiny", "llama-tiny"]
    for m in names:
        d = os.path.join(GOLDEN, m)
        res = {"model": m, "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
               "cases": run(d, eager=bool(sys.argv[1:]))}
        with open(os.path.join(d, "generate.json"), "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        print(m, [len(c["new_ids"]) for c in res["cases"]], file=sys.stderr)


if __name__ == "__main__":
    main()
