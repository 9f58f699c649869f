#!/usr/bin/env python3
"""Hugging Face transformers as the reference for rlhost's Qwen3 (parity tests).

  create  --out DIR --seed N [--untied]      a tiny random Qwen3ForCausalLM, save_pretrained
  create-lora --model DIR --out DIR --seed N --rank R --alpha A --targets q_proj,...
              [--target-modules JSON] [--extra JSON]
                                             a PEFT LoRA adapter on it, A and B random (B not
                                             zero, unlike a fresh one), save_pretrained;
                                             --target-modules: LoraConfig's target_modules as
                                             JSON ("all-linear", a regex, a list), over
                                             --targets; --extra: more LoraConfig fields (JSON
                                             object; use_bdlora's value is a BdLoraConfig's)
  lora-fields                                peft's version and LoraConfig's fields (JSON)
  run     --model DIR --inputs FILE --out F [--adapter DIR]
                                             logits, greedy continuation and log-probs (with a
                                             PEFT adapter loaded by peft's PeftModel)
  tokenize --model DIR --inputs FILE --out F AutoTokenizer: ids, decodings, chat renders

`tokenize` inputs are JSON {"texts": [...], "conversations": [{"messages", "tools", "kwargs"}]};
its output is JSON {"ids", "decoded", "decoded_skip", "renders", "render_ids"}.

`inputs` is JSON: {"input_ids": [[...]], "attention_mask": [[...]], "position_ids": [[...]],
"prompt": [...], "new_tokens": N, "targets": [[...]], "temperature": T}. The output is a
safetensors file with `logits`, `greedy` and `logprobs` (float32 / int64).
"""

import argparse
import json

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM


def create(args):
    torch.manual_seed(args.seed)
    cfg = Qwen3Config(
        vocab_size=512, hidden_size=192, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=48, intermediate_size=512, rms_norm_eps=1e-6,
        rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=not args.untied,
        torch_dtype="float32", bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    model = Qwen3ForCausalLM(cfg)
    # Norm weights start at one in HF; perturb them so a wrong norm cannot hide.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(args.out, safe_serialization=True)


def create_lora(args):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    targets = json.loads(args.target_modules) if args.target_modules else args.targets.split(",")
    extra = json.loads(args.extra) if args.extra else {}
    if extra.get("use_bdlora") is not None:
        from peft.tuners.lora.config import BdLoraConfig

        extra["use_bdlora"] = BdLoraConfig(**extra["use_bdlora"])
    cfg = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, target_modules=targets,
                     init_lora_weights=False, task_type="CAUSAL_LM", **extra)
    get_peft_model(model, cfg).save_pretrained(args.out)


def lora_fields(args):
    import dataclasses

    import peft
    from peft import LoraConfig

    print(json.dumps({"version": peft.__version__, "fields": [f.name for f in dataclasses.fields(LoraConfig)]}))


def run(args):
    with open(args.inputs) as f:
        inp = json.load(f)
    model = Qwen3ForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    model.eval()
    out = {}
    with torch.no_grad():
        ids = torch.tensor(inp["input_ids"])
        mask = torch.tensor(inp["attention_mask"])
        pos = torch.tensor(inp["position_ids"])
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
        out["logits"] = logits.contiguous()
        targets = torch.tensor(inp["targets"])
        lp = torch.log_softmax(logits / inp["temperature"], dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        out["logprobs"] = lp.contiguous()
        prompt = torch.tensor([inp["prompt"]])
        gen = model.generate(
            prompt, max_new_tokens=inp["new_tokens"], min_new_tokens=inp["new_tokens"],
            do_sample=False, eos_token_id=None, pad_token_id=0,
        )
        out["greedy"] = gen[0, prompt.shape[1]:].contiguous()
    save_file(out, args.out)


def tokenize(args):
    from transformers import AutoTokenizer

    with open(args.inputs) as f:
        inp = json.load(f)
    tok = AutoTokenizer.from_pretrained(args.model)
    ids = [tok.encode(t, add_special_tokens=False) for t in inp["texts"]]
    out = {
        "ids": ids,
        "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids],
        "decoded_skip": [tok.decode(i, skip_special_tokens=True) for i in ids],
        "renders": [],
        "render_ids": [],
    }
    for conv in inp["conversations"]:
        text = tok.apply_chat_template(conv["messages"], tools=conv["tools"], tokenize=False, **conv["kwargs"])
        out["renders"].append(text)
        out["render_ids"].append(tok.encode(text, add_special_tokens=False))
    with open(args.out, "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create")
    c.add_argument("--out", required=True)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--untied", action="store_true")
    cl = sub.add_parser("create-lora")
    cl.add_argument("--model", required=True)
    cl.add_argument("--out", required=True)
    cl.add_argument("--seed", type=int, default=0)
    cl.add_argument("--rank", type=int, default=4)
    cl.add_argument("--alpha", type=float, default=8.0)
    cl.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    cl.add_argument("--target-modules")
    cl.add_argument("--extra")
    sub.add_parser("lora-fields")
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--inputs", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--adapter")
    t = sub.add_parser("tokenize")
    t.add_argument("--model", required=True)
    t.add_argument("--inputs", required=True)
    t.add_argument("--out", required=True)
    args = ap.parse_args()
    {"create": create, "create-lora": create_lora, "lora-fields": lora_fields, "run": run,
     "tokenize": tokenize}[args.cmd](args)


if __name__ == "__main__":
    main()
