"""Unit tests of the rlhost_env SDK with plain CPython (no host): tool schemas from type hints
and docstrings, datasets, rubrics, the environment flavours, parsers and answer extraction.
Run: python3 -m unittest discover -s sdk/python/tests"""

import json
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Literal, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rlhost_env as rl  # noqa: E402
from rlhost_env.schema import json_schema, parse_docstring  # noqa: E402


class Schemas(unittest.TestCase):
    def test_a_typed_function_gives_the_rust_sdk_schema_shape(self):
        @rl.tool(arguments_description="Arguments of the `calculator` tool.")
        def calculator(expression: str) -> int:
            """Evaluate an integer expression.

            Args:
                expression: An integer expression with + - * / and parentheses,
                    e.g. "(12 + 3) * 4".
            """
            return 0

        self.assertEqual(calculator.name, "calculator")
        self.assertEqual(calculator.description, "Evaluate an integer expression.")
        # Key order matters: the prompt shows the schema as JSON text.
        self.assertEqual(
            json.dumps(calculator.parameters, separators=(",", ":")),
            '{"type":"object","properties":{"expression":{"type":"string","description":'
            '"An integer expression with + - * / and parentheses, e.g. \\"(12 + 3) * 4\\"."}},'
            '"required":["expression"],"description":"Arguments of the `calculator` tool."}',
        )

    def test_types_defaults_and_optional_arguments(self):
        @rl.tool
        def search(query: str, limit: int = 5, mode: Literal["fast", "exact"] = "fast",
                   tags: Optional[list[str]] = None, weights: dict[str, float] | None = None):
            """Search the notes."""

        p = search.parameters
        self.assertEqual(p["required"], ["query"])
        self.assertEqual(p["properties"]["limit"], {"type": "integer", "default": 5})
        self.assertEqual(p["properties"]["mode"], {"type": "string", "enum": ["fast", "exact"], "default": "fast"})
        self.assertEqual(p["properties"]["tags"], {"type": ["array", "null"], "items": {"type": "string"}, "default": None})
        self.assertEqual(json_schema(int | str | None), {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]})
        self.assertEqual(json_schema(Optional[int]), {"type": ["integer", "null"]})
        self.assertNotIn("description", p)

    def test_untyped_or_variadic_functions_are_refused(self):
        def untyped(x):
            pass

        def variadic(*args: int):
            pass

        with self.assertRaisesRegex(TypeError, "no type hint"):
            rl.tool(untyped)
        with self.assertRaisesRegex(TypeError, r"\*args"):
            rl.tool(variadic)
        with self.assertRaisesRegex(TypeError, "no JSON Schema"):
            json_schema(complex)

    def test_docstring_sections(self):
        summary, args = parse_docstring(
            """Find things
            in the index.

            More detail here.

            Args:
                a (int): the first
                    and only.
                b: second.

            Returns:
                nothing.
            """
        )
        self.assertEqual(summary, "Find things in the index.")
        self.assertEqual(args, {"a": "the first and only.", "b": "second."})


def _calc(expression: str) -> int:
    """Add two numbers.

    Args:
        expression: like "1+2".
    """
    a, b = expression.split("+")
    if b.strip() == "0":
        raise rl.PluginError("adding zero is boring")
    return int(a) + int(b)


class Environments(unittest.TestCase):
    def tool_env(self):
        return rl.ToolEnv(
            name="adder",
            tools=[_calc],
            max_turns=2,
            system_prompt="Use the tool.",
            dataset=[{"question": "1+2?", "answer": "3"}],
            rubric=rl.Rubric([lambda_named("calls", lambda completion: rl.count_tool_calls(completion))], weights=[0.0]),
        )

    def test_tool_calls_are_answered_in_order_with_errors_the_model_can_read(self):
        env = self.tool_env()
        rows, total = env.dataset("train", 0, 10)
        self.assertEqual(total, 1)
        self.assertEqual(rows[0]["id"], "train-0")
        messages, state = env.initial_prompt(rows[0], env.parse_env_args("{}"))
        self.assertEqual([m["role"] for m in messages], ["system", "user"])
        call = lambda i, name, args: {"id": i, "type": "function", "function": {"name": name, "arguments": args}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            call("a", "_calc", '{"expression": "1+2"}'),
            call("b", "_calc", '{"expression": "1+0"}'),
            call("c", "_calc", '{"expr": "1"}'),
            call("d", "_calc", "{not json"),
            call("e", "nope", "{}"),
            call("f", "_calc", '{"expression": 5}'),
            call("g", "_calc", '{"expression": "x+1"}'),
        ]})
        new, state, done = env.step(messages, state)
        self.assertFalse(done)
        self.assertEqual(state, {"turns": 1})
        self.assertEqual([m["tool_call_id"] for m in new], list("abcdefg"))
        contents = [m["content"] for m in new]
        self.assertEqual(contents[0], "3")
        self.assertEqual(contents[1], "error: adding zero is boring")
        self.assertEqual(contents[2], "error: invalid input: invalid arguments for `_calc`: missing field `expression`")
        self.assertTrue(contents[3].startswith("error: invalid input: invalid arguments for `_calc`: Expecting"), contents[3])
        self.assertEqual(contents[4], 'error: unknown tool "nope"')
        self.assertEqual(contents[5], "error: invalid input: invalid arguments for `_calc`: `expression` must be string")
        self.assertTrue(contents[6].startswith("error: invalid literal"), contents[6])
        # The turn limit ends the episode even with tool calls.
        messages += new
        messages.append({"role": "assistant", "content": "", "tool_calls": [call("h", "_calc", '{"expression": "2+2"}')]})
        new, state, done = env.step(messages, state)
        self.assertTrue(done)
        self.assertEqual(new[0]["content"], "4")
        metrics = env.score_rollout(rows[0], messages + new, state, False)
        self.assertEqual(metrics, [("calls", 8.0)])

    def test_a_reply_without_tool_calls_ends_the_episode(self):
        env = self.tool_env()
        rows, _ = env.dataset("train", 0, 1)
        messages, state = env.initial_prompt(rows[0], {})
        messages.append({"role": "assistant", "content": "3"})
        self.assertEqual(env.step(messages, state), ([], {"turns": 1}, True))

    def test_env_args_are_checked(self):
        env = rl.SingleTurnEnv(name="x", dataset=[], env_args={"hard": False})
        self.assertEqual(env.parse_env_args('{"hard": true}'), {"hard": True})
        self.assertEqual(env.parse_env_args(""), {"hard": False})
        with self.assertRaisesRegex(rl.InvalidArgs, "unknown argument.*colour.*takes: hard"):
            env.parse_env_args('{"colour": 1}')
        with self.assertRaisesRegex(rl.InvalidArgs, "JSON object"):
            env.parse_env_args("[1]")

    def test_unknown_splits_and_info(self):
        env = rl.SingleTurnEnv(
            name="x", dataset=[{"question": "q", "answer": "a", "info": {"k": 1}}],
            datasets={"dev": rl.Dataset.generated(3, lambda i: {"question": str(i), "answer": str(i)})},
            sampling_args={"temperature": 0.7, "stop": ["</answer>"]},
            rewards={"rlhost/math-verify": "^0.1"},
        )
        with self.assertRaises(rl.UnknownSplit):
            env.dataset("test", 0, 1)
        rows, total = env.dataset("dev", 2, 10)
        self.assertEqual((total, [r["question"] for r in rows]), (3, ["2"]))
        self.assertEqual(env.dataset("dev", 7, 2), ([], 3))
        self.assertEqual(env.dataset("train", 0, 1)[0][0]["info"], {"k": 1})
        info = env.info()
        self.assertEqual(info["splits"], ["train", "dev"])
        self.assertEqual(info["sampling"], {"temperature": 0.7, "top_p": None, "top_k": None, "max_tokens": None, "stop": ["</answer>"]})
        self.assertEqual(info["rewards"], [("rlhost/math-verify", "^0.1")])
        with self.assertRaisesRegex(ValueError, "unknown sampling"):
            rl.SingleTurnEnv(name="x", sampling_args={"temprature": 1})

    def test_multi_turn_hooks(self):
        class Twice(rl.MultiTurnEnv):
            def is_completed(self, messages, state):
                return state.get("asked", False)

            def env_response(self, messages, state):
                return [{"role": "user", "content": "Are you sure?"}], {**state, "asked": True}

        env = Twice(name="twice", max_turns=5, dataset=[{"question": "q", "answer": "a"}])
        messages, state = env.initial_prompt(env.dataset("train", 0, 1)[0][0], {})
        messages.append({"role": "assistant", "content": "a"})
        new, state, done = env.step(messages, state)
        self.assertEqual((new[0]["content"], done), ("Are you sure?", False))
        new, state, done = env.step(messages + new + [{"role": "assistant", "content": "yes"}], state)
        self.assertEqual((new, done, state["turns"]), ([], True, 2))


def lambda_named(name, fn):
    fn.__name__ = name
    return fn


class Rubrics(unittest.TestCase):
    def test_reward_functions_get_the_arguments_they_name(self):
        seen = {}

        def answer_only(answer):
            seen["answer_only"] = answer
            return True

        def everything(**kwargs):
            seen["everything"] = sorted(kwargs)
            return 0.5

        rubric = rl.Rubric([answer_only, everything], weights=[1.0, 0.25])
        self.assertEqual(rubric.weights(), [("answer_only", 1.0), ("everything", 0.25)])
        env = rl.SingleTurnEnv(name="x", dataset=[{"question": "q", "answer": "42"}], rubric=rubric)
        example = env.dataset("train", 0, 1)[0][0]
        msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
        self.assertEqual(env.score_rollout(example, msgs, {}, False), [("answer_only", 1.0), ("everything", 0.5)])
        self.assertEqual(seen["answer_only"], "42")
        self.assertEqual(seen["everything"], ["answer", "completion", "example", "info", "messages", "parser", "prompt", "state", "task", "truncated"])

    def test_bad_rubrics_are_refused(self):
        with self.assertRaisesRegex(ValueError, "weights"):
            rl.Rubric([len], weights=[1.0, 2.0])
        with self.assertRaisesRegex(ValueError, "twice"):
            rl.Rubric([len, len])
        with self.assertRaisesRegex(ValueError, "lambda"):
            rl.Rubric([lambda: 1])
        with self.assertRaisesRegex(ValueError, "finite"):
            rl.Rubric([len], weights=[float("nan")])
        rubric = rl.Rubric([lambda_named("word", lambda: "many")])
        with self.assertRaisesRegex(rl.PluginError, "not a number"):
            rubric.score()


class Data(unittest.TestCase):
    def test_jsonl_datasets_are_read_lazily_from_the_data_folder(self):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "train.jsonl").write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": "2"}\n')
            Path(d, "bad.jsonl").write_text('{"question": "a"\n')
            ds = rl.Dataset.from_jsonl("train.jsonl", transform=lambda r: {**r, "answer": r["answer"] * 2})
            broken = rl.Dataset.from_jsonl("bad.jsonl")
            rl.host.use_local_data(d)
            try:
                self.assertEqual(len(ds), 2)
                self.assertEqual([r["answer"] for r in ds.page("train", 0, 5)[0]], ["11", "22"])
                with self.assertRaisesRegex(rl.PluginError, "bad.jsonl line 1"):
                    len(broken)
            finally:
                rl.host.use_local_data(None)

    def test_host_functions_outside_the_host_say_so(self):
        with self.assertRaises(rl.host.NotInHost):
            rl.rollout_seed()
        with self.assertRaises(rl.host.NotInHost):
            rl.run_python("print(1)")
        with self.assertRaises(rl.host.NotInHost):
            rl.read_data("x")
        with self.assertRaisesRegex(ValueError, "log level"):
            rl.log("x", level="loud")


class Answers(unittest.TestCase):
    def test_boxed_answers_match_the_rust_sdk(self):
        t = r"First \boxed{1}, then \boxed{\frac{1}{2}} is final."
        self.assertEqual(rl.extract_boxed(t), r"\frac{1}{2}")
        self.assertEqual(rl.extract_boxed(t, last=False), "1")
        self.assertEqual(rl.extract_boxed(r"so \fbox{42}"), "42")
        self.assertEqual(rl.extract_boxed(r"$\boxed 7$"), "7")
        self.assertIsNone(rl.extract_boxed(r"\boxed{1"))
        self.assertIsNone(rl.extract_boxed("no answer here"))
        self.assertIsNone(rl.extract_boxed(r"\boxedx{3}"))
        self.assertEqual(rl.extract_boxed("ответ: \\boxed{π²}"), "π²")

    def test_xml_parser(self):
        p = rl.XMLParser(["think", "answer"])
        self.assertEqual(p.parse("<think>a</think>\n<answer> 42 </answer>"), {"think": "a", "answer": "42"})
        self.assertEqual(p.parse("<answer>unclosed"), {"think": None, "answer": "unclosed"})
        completion = [
            {"role": "assistant", "content": "<answer>1</answer>"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "no tags"},
        ]
        self.assertEqual(p.parse_answer(completion), "1")
        fmt = p.get_format_reward_func()
        self.assertEqual(fmt(completion=completion), 0.25)
        self.assertEqual(fmt(completion=[]), 0.0)


class Rewards(unittest.TestCase):
    def test_reward_function_plugins(self):
        def exact(completion, answer):
            return completion.strip() == answer

        r = rl.RewardFunction(name="exact", funcs=[exact])
        self.assertEqual(r.info()["metrics"], ["exact"])
        self.assertEqual(r.score(" 4 ", "4", {}), [("exact", 1.0)])
        with self.assertRaises(ValueError):
            rl.RewardFunction(name="none", funcs=[])


if __name__ == "__main__":
    unittest.main()
