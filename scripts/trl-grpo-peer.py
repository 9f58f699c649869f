#!/usr/bin/env python3
"""The peer of `scripts/bench-rl.sh`: TRL's GRPOTrainer on the same tiny model and the same
arith prompts as `host rl`, on the CPU, timed.

  trl-grpo-peer.py --model DIR --prompts results.jsonl --steps N [--batch 32 --group 8
                   --max-tokens 48 --temperature 1 --lr 3e-4 --threads 2]
                   [--tools --max-turns 3 --python-tool subprocess|exec]

--prompts is a `host eval -s` results.jsonl: each record's `prompt` messages become one
conversational prompt (--in-order: taken in file order, batch / group a step, as
scripts/bench-rl-prompts.py lays out the questions host rl draws). Settings mirror configs/arith/rl: no KL (beta 0), no reference model, one
optimiser step per generation batch, AdamW, the same group size, batch, max tokens and
temperature.

Single turn (default): the reward is 1 when the last \\boxed{} of the completion equals the value
of the question's expression (integers, + - *), else 0 — the arith rubric's `correct` on these
integer answers.

--tools: the arith environment's multi-turn tool workload in TRL's tools mode. The records'
`tools` (the environment's own `python` tool schema) become one Python function passed as
`GRPOTrainer(tools=[python])`; TRL renders it into the prompt with the model's chat template,
parses `<tool_call>` JSON out of each completion, runs the function, appends the result as a
tool message and generates again, up to `max_tool_calling_iterations = max_turns - 1` times (the
environment answers tool calls in turns 1 .. max_turns-1 and ends the rollout at turn
max_turns). `--max-tokens` bounds each turn (`generation_kwargs.max_new_tokens`), as the
environment's `max_tokens` does; TRL's `max_completion_length` bounds the whole multi-turn
completion and is set high enough never to bind. The reward is the environment's: `correct` (the
first \\boxed{} of the last assistant message, else its last number, equals the answer) - 0.1 x
tool results containing "error". Three things make rlhost's own model folder work in TRL's tools
mode, each checked at start-up (see `tool_tokenizer`): the exact tool schema the environment
sends, a response parser for the template's wire format (Qwen3's hermes `<tool_call>` JSON), and
a prefix-preserving variant of the chat template (only the rendering of earlier assistant turns
differs, which TRL never renders into a model input: its turns continue from token ids).

Prints one JSON line: {"steps", "seconds", "step_seconds", "rollouts_per_s",
"completion_tokens_mean", "reward_first", "reward_last", "correct_mean"} plus, with --tools,
"tool_calls_per_step" (tool messages in each step's conversations), "tool_calls" (TRL's logged
count), "turns_mean", "tool_calls_executed", "tool_seconds", "tool_failures",
"prompt_matches_host"; the timer covers `trainer.train()` only (not imports or loading).
"""

import argparse
import json
import re
import subprocess
import sys
import time

# The arith environment's python tool (plugins/libs/math-env/src/tool.rs): a cell run like a
# Jupyter cell in a fresh interpreter (a trailing expression is printed), 10 s, and the first
# 1000 characters of the stripped stderr if there is any, else of the stripped stdout.
DRIVER = r'''
import ast, sys, textwrap, traceback

def jupyterize(s):
    s = textwrap.dedent(s)
    tree = ast.parse(s, mode="exec")
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body.pop()
        body = ast.unparse(ast.Module(tree.body, []))
        return body + "\n_ = " + ast.unparse(last.value) + "\nif _ is not None: print(_)"
    return s

def run(src):
    try:
        code = jupyterize(src)
    except SyntaxError as e:
        sys.stderr.write(str(e))
        return
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<string>", "exec"), ns)
    except SystemExit as e:
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)

run(sys.argv[1])
'''
TIMEOUT_S = 10
TIMEOUT_TEXT = "Error: Code execution timed out after 10 seconds"
OUTPUT_CHARS = 1000


def result_text(stdout, stderr):
    err = stderr.strip()[:OUTPUT_CHARS]
    return err if err else stdout.strip()[:OUTPUT_CHARS]


def run_subprocess(code):
    """A fresh `python -I` per call, killed after 10 s: the environment's contract (fresh
    interpreter, timeout, the trainer cannot be harmed by the model's code), and what verifiers'
    original `python` tool did."""
    try:
        out = subprocess.run([sys.executable, "-I", "-c", DRIVER, code], capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return TIMEOUT_TEXT
    return result_text(out.stdout, out.stderr)


def run_exec(code):
    """In the trainer's own process: exec with captured output and a SIGALRM deadline. Cheaper
    than a subprocess, but the model's code shares the trainer's interpreter (it could exit it,
    change its modules, or leak state between calls)."""
    import contextlib
    import io
    import signal

    ns = {}
    exec(compile(DRIVER.rsplit("run(sys.argv[1])", 1)[0], "<driver>", "exec"), ns)  # noqa: S102
    out, err = io.StringIO(), io.StringIO()

    def expire(*_):
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            ns["run"](code)
    except TimeoutError:
        return TIMEOUT_TEXT
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return result_text(out.getvalue(), err.getvalue())


class ToolStats:
    calls = 0
    seconds = 0.0


def make_python_tool(schema, backend):
    """The environment's `python` tool for TRL: a callable TRL runs by name, which is also the
    environment's exact JSON schema (transformers renders a dict tool as given, where a plain
    function would be converted from its docstring and lose the schema's own description)."""
    run = run_subprocess if backend == "subprocess" else run_exec

    def python(code: str) -> str:
        """Evaluates Python code like a Jupyter notebook cell, returning output and/or the last expression value.

        Args:
            code: A block of Python code
        """
        t0 = time.perf_counter()
        try:
            return run(code)
        finally:
            ToolStats.calls += 1
            ToolStats.seconds += time.perf_counter() - t0

    class SchemaTool(dict):
        __name__ = schema["function"]["name"]

        def __call__(self, **kwargs):
            return python(**kwargs)

    assert schema["function"]["name"] == "python", schema
    return SchemaTool(schema)


def env_schema(record):
    """The tool schema of a `host eval -s` record in OpenAI's shape, as the engine renders it."""
    tools = record.get("tools") or []
    if len(tools) != 1:
        sys.exit(f"trl-grpo-peer: expected the arith environment's one python tool, got {tools!r}")
    t = tools[0]
    params = t["parameters"]
    if isinstance(params, str):
        params = json.loads(params)
    return {"type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": params}}


def tool_tokenizer(tok):
    """Makes rlhost's own tokenizer usable by TRL's tools mode, without changing any token the
    model sees:

    - response parsing: TRL only knows the templates it ships; rlhost's writes Qwen3's wire format
      (`<think>` blocks, hermes `<tool_call>` JSON, `<|im_end|>`), so TRL's own Qwen3 parser is
      set, as TRL's error message asks for unknown templates;
    - prefix preservation: like Qwen3's, rlhost's template renders the empty `<think>` block only on
      the last assistant turn, so `[user, assistant]` is not a prefix of `[user, assistant, tool]`
      and TRL would refuse it. The variant renders it on every assistant turn after the question
      (what TRL's own `qwen3_training.jinja` does to Qwen3's). TRL renders assistant turns only to
      cut the tool result's suffix (a dummy conversation); prompts and tool suffixes are identical
      (checked against host's token ids by the caller).
    """
    from trl import chat_template_utils as ctu

    if ctu._SUPPORTS_RESPONSE_TEMPLATE:
        tok.response_template = ctu.qwen3_template
    else:
        tok.response_schema = ctu.qwen3_schema
    old = "{%- if loop.index0 > query.index and (loop.last or reasoning) -%}"
    template = tok.chat_template
    if old not in template:
        sys.exit("trl-grpo-peer: the model's chat template is not rlhost's (host model init); "
                 "cannot make it prefix-preserving")
    tok.chat_template = template.replace(old, "{%- if loop.index0 > query.index -%}")
    if not ctu.supports_tool_calling(tok) or not ctu.is_chat_template_prefix_preserving(tok):
        sys.exit("trl-grpo-peer: the patched chat template fails TRL's tool checks")
    # The tool suffix TRL will compute must be what the original template writes after a turn.
    return tok


def answer(question):
    m = re.search(r"What is ([0-9 +*-]+)\?", question)
    return eval(m.group(1)) if m else None  # noqa: S307 (digits and + - * only)


def boxed(text):
    found = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return found[-1].strip() if found else None


def first_boxed_or_last_number(text):
    """The arith rubric's answer: the first \\boxed{} of the message, else the whole message
    (math-verify then reads its last number)."""
    m = re.search(r"\\boxed\{([^{}]*)\}", text)
    if m:
        return m.group(1).strip()
    nums = re.findall(r"-?\d+", text)
    return nums[-1] if nums else None


def same_number(pred, gold):
    if pred is None:
        return False
    try:
        return int(pred.replace(" ", "")) == int(gold)
    except ValueError:
        return False


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
    ap.add_argument("--tools", action="store_true", help="the multi-turn python-tool workload")
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-completion", type=int, default=640,
                    help="with --tools: TRL's bound on a whole multi-turn completion (tokens)")
    ap.add_argument("--python-tool", choices=["subprocess", "exec"], default="subprocess")
    ap.add_argument("--in-order", action="store_true",
                    help="take the prompts in file order, --batch/--group a step (no shuffling)")
    ap.add_argument("--out", default="/tmp/trl-grpo-peer")
    args = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    records = [json.loads(line) for line in open(args.prompts)]
    rows = []
    for r in records:
        question = next(m["content"] for m in r["prompt"] if m["role"] == "user")
        rows.append({"prompt": [{"role": m["role"], "content": m["content"]} for m in r["prompt"]],
                     "answer": str(answer(question))})
    data = Dataset.from_list(rows)

    # Per step (each reward call scores one generation batch): what the rollouts did.
    batches = []

    def correct(completions, answer, **_):
        out = []
        for c, a in zip(completions, answer):
            text = c[-1]["content"] if isinstance(c, list) else c
            out.append(1.0 if boxed(text) == a else 0.0)
        batches.append({"correct": sum(out) / len(out)})
        return out

    def env_reward(completions, answer, **_):
        """The arith rubric: correct - 0.1 x tool results containing "error" (any case)."""
        out, right, calls, turns = [], 0, 0, 0
        for c, a in zip(completions, answer):
            last = next((m for m in reversed(c) if m["role"] == "assistant"), None)
            text = last["content"] if last and isinstance(last.get("content"), str) else ""
            tool_msgs = [m for m in c if m["role"] == "tool"]
            errors = sum(1 for m in tool_msgs if "error" in str(m["content"]).lower())
            ok = same_number(first_boxed_or_last_number(text), a)
            out.append((1.0 if ok else 0.0) - 0.1 * errors)
            right += ok
            calls += len(tool_msgs)
            turns += sum(1 for m in c if m["role"] == "assistant")
        batches.append({"correct": right / len(out), "tool_calls": calls, "turns": turns / len(out)})
        return out

    tok = AutoTokenizer.from_pretrained(args.model)
    tools = None
    prompt_matches = None
    if args.tools:
        tok = tool_tokenizer(tok)
        tools = [make_python_tool(env_schema(records[0]), args.python_tool)]
        # The prompt TRL will feed the model must be the one host rl's engine saw.
        host_ids = records[0]["turns"][0]["prompt_ids"]
        ours = tok.apply_chat_template(rows[0]["prompt"], tools=tools, add_generation_prompt=True,
                                       tokenize=True, return_dict=False)
        prompt_matches = bool(host_ids) and list(ours) == list(host_ids)
        if not prompt_matches:
            print("trl-grpo-peer: WARNING: TRL's rendered prompt differs from host's:\n"
                  f"TRL : {tok.decode(ours)!r}\nhost: {tok.decode(host_ids)!r}", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.config.use_cache = True
    extra = {}
    if args.tools:
        extra = dict(
            max_tool_calling_iterations=args.max_turns - 1,
            # Per turn, like the environment's max_tokens; max_completion_length is the whole
            # multi-turn completion (model turns + tool results) in TRL's tools mode.
            generation_kwargs={"max_new_tokens": args.max_tokens},
        )
    cfg = GRPOConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_completion_length=args.max_completion if args.tools else args.max_tokens,
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
        shuffle_dataset=not args.in_order,
        **extra,
    )

    class Clock(TrainerCallback):
        def __init__(self):
            self.marks = []
            self.rewards = []
            self.lengths = []
            self.tool_calls = []
            self.tool_failures = []

        def on_step_end(self, *_, **__):
            self.marks.append(time.perf_counter())

        def on_log(self, _args, _state, _control, logs=None, **__):
            if not logs:
                return
            if "reward" in logs:
                self.rewards.append(logs["reward"])
            if "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))
            if "tools/call_frequency" in logs:
                self.tool_calls.append(float(logs["tools/call_frequency"]) * args.batch)
            if "tools/failure_frequency" in logs:
                self.tool_failures.append(float(logs["tools/failure_frequency"]))

    clock = Clock()
    trainer = GRPOTrainer(model=model, processing_class=tok,
                          reward_funcs=env_reward if args.tools else correct, args=cfg,
                          train_dataset=data, callbacks=[clock], tools=tools)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    marks = [start] + clock.marks
    steps = [b - a for a, b in zip(marks, marks[1:])]
    result = {
        "steps": len(steps),
        "seconds": seconds,
        "step_seconds": steps,
        "rollouts_per_s": args.batch * len(steps) / seconds,
        "completion_tokens_mean": sum(clock.lengths) / len(clock.lengths) if clock.lengths else None,
        "reward_first": clock.rewards[0] if clock.rewards else None,
        "reward_last": clock.rewards[-1] if clock.rewards else None,
        "correct_mean": sum(b["correct"] for b in batches) / len(batches) if batches else None,
    }
    if args.tools:
        result.update({
            # Tool messages in each step's conversations (what the environment counts as
            # num_tool_calls), and TRL's own logged count (tools/call_frequency x batch).
            "tool_calls_per_step": [b["tool_calls"] for b in batches],
            "turns_mean": sum(b["turns"] for b in batches) / len(batches) if batches else None,
            "tool_calls": clock.tool_calls,
            "tool_calls_executed": ToolStats.calls,
            "tool_seconds": ToolStats.seconds,
            "tool_failures": clock.tool_failures,
            "python_tool": args.python_tool,
            "prompt_matches_host": prompt_matches,
        })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
