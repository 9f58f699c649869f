#!/usr/bin/env python3
"""The peer of `scripts/bench-rl.sh`: TRL's GRPOTrainer on the same tiny model and the same
arith prompts as `host rl`, on the CPU, timed.

  trl-grpo-peer.py --model DIR --prompts results.jsonl --steps N [--batch 32 --group 8
                   --max-tokens 48 --temperature 1 --lr 3e-4 --threads 2]

--prompts is a `host eval -s` results.jsonl: each record's `prompt` messages become one
conversational prompt. The reward is 1 when the last \\boxed{} of the completion equals the value
of the question's expression (integers, + - *), else 0 — the arith rubric's `correct` on these
integer answers. Settings mirror configs/arith/rl: no KL (beta 0), no reference model, one
optimiser step per generation batch, AdamW, the same group size, batch, max tokens and
temperature. Prints one JSON line: {"steps", "seconds", "step_seconds", "rollouts_per_s",
"completion_tokens_mean", "reward_first", "reward_last"}; the timer covers `trainer.train()`
only (not imports or loading).
"""

import argparse
import json
import re
import time


def answer(question):
    m = re.search(r"What is ([0-9 +*-]+)\?", question)
    return eval(m.group(1)) if m else None  # noqa: S307 (digits and + - * only)


def boxed(text):
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip() if found else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="/tmp/trl-grpo-peer")
    args = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for line in open(args.prompts):
        r = json.loads(line)
        question = next(m["content"] for m in r["prompt"] if m["role"] == "user")
        rows.append({"prompt": [{"role": m["role"], "content": m["content"]} for m in r["prompt"]],
                     "answer": str(answer(question))})
    data = Dataset.from_list(rows)

    def correct(completions, answer, **_):
        out = []
        for c, a in zip(completions, answer):
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(1.0 if boxed(text) == a else 0.0)
        return out

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.config.use_cache = True
    cfg = GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_completion_length=args.max_tokens,
        temperature=args.temperature,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
        # TRL turns activation checkpointing on by default, which also turns the KV cache off
        # in generation (every new token recomputes the whole sequence). The tiny model needs
        # no memory saving: off, so the peer generates with its cache.
        gradient_checkpointing=False,
    )

    class Clock(TrainerCallback):
        def __init__(self):
            self.marks = []
            self.rewards = []

        def on_step_end(self, *_, **__):
            self.marks.append(time.perf_counter())

            self.lengths = []

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "reward" in logs:
                self.rewards.append(logs["reward"])
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    clock = Clock()
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=correct, args=cfg,
                          train_dataset=data, callbacks=[clock])
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    marks = [start] + clock.marks
    steps = [b - a for a, b in zip(marks, marks[1:])]
    print(json.dumps({
        "steps": len(steps),
        "seconds": seconds,
        "step_seconds": steps,
        "rollouts_per_s": args.batch * len(steps) / seconds,
        "completion_tokens_mean": sum(clock.lengths) / len(clock.lengths) if clock.lengths else None,
        "reward_first": clock.rewards[0] if clock.rewards else None,
        "reward_last": clock.rewards[-1] if clock.rewards else None,
    }))


if __name__ == "__main__":
    main()
