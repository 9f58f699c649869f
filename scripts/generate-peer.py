#!/usr/bin/env python3
"""The peer of `host bench generate`: Hugging Face transformers `generate` on the same model
folder, greedy, a fixed number of new tokens, after one warm-up call.

  generate-peer.py --model DIR --batch B --prompt-len L --new-tokens N --threads T --repeats R
                   [--dtype float32|bfloat16] [--device cpu|cuda:N]

Prompts are the same token ids rlhost uses (row r, position i: (r * 131 + i * 17 + 3) % 500).
On CUDA the attention is SDPA's and each timed call ends with a synchronize.
Prints JSON {"seconds": [per repeat], "tokens": B * N}.
"""

import argparse
import json
import time

import torch
from transformers import Qwen3ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    for k in ("batch", "prompt-len", "new-tokens", "threads", "repeats"):
        ap.add_argument(f"--{k}", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cuda = a.device.startswith("cuda")
    extra = {"attn_implementation": "sdpa"} if cuda else {}
    model = Qwen3ForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype), **extra)
    model.to(a.device).eval()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ids = torch.tensor([[(r * 131 + i * 17 + 3) % 500 for i in range(a.prompt_len)] for r in range(a.batch)],
                       device=a.device)
    kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
              eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(ids))
    with torch.inference_mode():
        model.generate(ids, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})
        sync()
        seconds = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            sync()
            seconds.append(time.perf_counter() - t)
            assert out.shape[1] == a.prompt_len + a.new_tokens
    print(json.dumps({"seconds": seconds, "tokens": a.batch * a.new_tokens}))


if __name__ == "__main__":
    main()
