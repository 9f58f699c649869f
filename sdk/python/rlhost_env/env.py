"""Environments, datasets and rubrics: the concepts verifiers users know, for rlhost plugins.

Messages are OpenAI-style dicts (``{"role": "assistant", "content": "...", "tool_calls": [...]}``
with tool calls as ``{"id", "type": "function", "function": {"name", "arguments"}}``), the
episode state is a JSON-serialisable dict, and metrics are floats named after their reward
functions. The host drives every rollout; these classes only answer its calls.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Iterable, Mapping, Sequence

from .schema import Tool, tool as make_tool

__all__ = [
    "PluginError",
    "InvalidArgs",
    "InvalidInput",
    "UnknownSplit",
    "Dataset",
    "Rubric",
    "Environment",
    "SingleTurnEnv",
    "MultiTurnEnv",
    "ToolEnv",
    "RewardFunction",
    "last_assistant",
    "completion_text",
    "count_tool_calls",
]

# ---- errors -------------------------------------------------------------------------------


class PluginError(Exception):
    """An error the host reports as the plugin's own (the WIT ``plugin-error``); any other
    exception crashes the call, and the host shows its traceback."""

    kind = "internal"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgs(PluginError):
    """The environment arguments are invalid (say which and why)."""

    kind = "invalid-args"


class InvalidInput(PluginError):
    """An input (example, conversation, state) is invalid."""

    kind = "invalid-input"


class UnknownSplit(PluginError):
    """The dataset split does not exist."""

    kind = "unknown-split"


# ---- datasets -----------------------------------------------------------------------------


def _row(raw: Any, split: str, index: int) -> dict:
    if not isinstance(raw, Mapping):
        raise TypeError(f"row {index} of split {split!r} is {type(raw).__name__}, not a dict")
    row = dict(raw)
    info = row.get("info") or {}
    if isinstance(info, str):
        info = json.loads(info) if info.strip() else {}
    prompt = row.get("prompt") or []
    if isinstance(prompt, str):  # a plain-text prompt is a question
        row.setdefault("question", prompt)
        prompt = []
    return {
        "id": str(row.get("id", f"{split}-{index}")),
        "prompt": list(prompt),
        "question": str(row.get("question", "")),
        "answer": str(row.get("answer", "")),
        "info": info,
    }


class Dataset:
    """One split's rows: dicts with ``question`` and ``answer`` (and optionally ``id``, ``info``,
    ``prompt``). Build one from rows, from a JSONL file of the plugin's data folder (read when
    first used, so building the plugin needs no host), or from a function of the row index."""

    def __init__(self, rows: Sequence[Mapping] | None = None, *, loader=None, length=None, row_fn=None, transform=None):
        self._rows = list(rows) if rows is not None else None
        self._loader = loader
        self._length = length
        self._row_fn = row_fn
        self._transform = transform

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping]) -> "Dataset":
        """Rows in memory (a list of dicts, or anything iterable that yields them)."""
        return cls(list(rows))

    @classmethod
    def from_jsonl(cls, path: str, transform: Callable[[dict], dict] | None = None, limit: int | None = None) -> "Dataset":
        """Rows of ``path`` in the plugin's data folder, one JSON object a line, optionally
        mapped by ``transform`` (like ``datasets.Dataset.map``) and cut to ``limit`` rows."""

        def load() -> list:
            from .host import read_text

            rows = []
            for n, line in enumerate(read_text(path).splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise PluginError(f"{path} line {n}: {e}") from None
                    if limit is not None and len(rows) >= limit:
                        break
            return rows

        return cls(loader=load, transform=transform)

    @classmethod
    def generated(cls, length: int, row_fn: Callable[[int], Mapping]) -> "Dataset":
        """``length`` rows made on demand by ``row_fn(index)``."""
        return cls(length=length, row_fn=row_fn)

    def _materialise(self) -> None:
        if self._rows is None and self._loader is not None:
            rows = self._loader()
            self._rows = [self._transform(r) for r in rows] if self._transform else rows
            self._loader = None

    def __len__(self) -> int:
        if self._row_fn is not None:
            return self._length
        self._materialise()
        return len(self._rows)

    def row(self, index: int) -> Mapping:
        """Row ``index`` as given (before normalisation)."""
        if self._row_fn is not None:
            return self._row_fn(index)
        self._materialise()
        return self._rows[index]

    def page(self, split: str, offset: int, limit: int) -> tuple[list[dict], int]:
        """Normalised rows ``offset..offset+limit`` and the split's size."""
        total = len(self)
        end = min(offset + limit, total)
        return [_row(self.row(i), split, i) for i in range(min(offset, end), end)], total


def _as_dataset(d: Any) -> Dataset:
    if isinstance(d, Dataset):
        return d
    return Dataset.from_rows(d)


# ---- conversations ------------------------------------------------------------------------


def last_assistant(messages: Sequence[Mapping]) -> Mapping | None:
    """The last assistant message, if any."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return m
    return None


def completion_text(messages: Sequence[Mapping]) -> str:
    """The text of the last assistant message ('' if none)."""
    m = last_assistant(messages)
    return (m.get("content") or "") if m else ""


def count_tool_calls(messages: Sequence[Mapping]) -> int:
    """Tool calls made in a conversation."""
    return sum(len(m.get("tool_calls") or []) for m in messages)


# ---- rubrics ------------------------------------------------------------------------------



class Rubric:
    """Weighted reward functions. Each is called with the keyword arguments it names among
    ``prompt``, ``completion`` (the messages after the prompt), ``answer``, ``info``, ``state``,
    ``example``, ``messages`` (the whole conversation), ``task``, ``truncated`` and ``parser`` (the
    environment's, if it has one) (or all of them
    through ``**kwargs``) and returns a number; its metric is named after the function. The host
    computes the reward as the weighted sum, so a weight of 0 records a metric without training
    on it."""

    def __init__(self, funcs: Sequence[Callable] = (), weights: Sequence[float] | None = None, names: Sequence[str] | None = None):
        if weights is not None and len(weights) != len(funcs):
            raise ValueError(f"{len(funcs)} reward functions but {len(weights)} weights")
        self.funcs: list[tuple[str, Callable, float]] = []
        for i, f in enumerate(funcs):
            self.add_reward_func(f, 1.0 if weights is None else weights[i], None if names is None else names[i])

    def add_reward_func(self, func: Callable, weight: float = 1.0, name: str | None = None) -> "Rubric":
        """Adds a reward function (its metric is ``name`` or the function's name)."""
        name = name or getattr(func, "__name__", None)
        if not name or name == "<lambda>":
            raise ValueError("give a lambda reward function a name")
        if any(n == name for n, _, _ in self.funcs):
            raise ValueError(f"rubric metric {name!r} listed twice")
        weight = float(weight)
        if weight != weight or weight in (float("inf"), float("-inf")):
            raise ValueError(f"rubric weight of {name!r} is not finite")
        self.funcs.append((name, func, weight))
        return self

    def weights(self) -> list[tuple[str, float]]:
        """Metric names and weights, in order."""
        return [(n, w) for n, _, w in self.funcs]

    def score(self, **kwargs: Any) -> list[tuple[str, float]]:
        """Every metric of a finished rollout."""
        out = []
        for name, func, _ in self.funcs:
            value = func(**_accepted(func, kwargs))
            if isinstance(value, bool):
                value = 1.0 if value else 0.0
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise PluginError(f"reward function {name!r} returned {value!r}, not a number") from None
            out.append((name, value))
        return out


def _accepted(func: Callable, kwargs: Mapping[str, Any]) -> dict:
    params = inspect.signature(func).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


# ---- environments -------------------------------------------------------------------------


def _compact(state: Any) -> str:
    return json.dumps(state, separators=(",", ":"), ensure_ascii=False)


class Environment:
    """An environment: datasets by split, a system prompt, tools, a rubric, and the hooks the
    host calls. Subclass :class:`SingleTurnEnv`, :class:`MultiTurnEnv` or :class:`ToolEnv`.

    ``dataset`` is the ``train`` split and ``eval_dataset`` the ``test`` split (verifiers'
    names); ``datasets`` names splits freely. Each may be a :class:`Dataset` or a list of dicts.
    ``env_args`` declares the environment arguments users may pass (``--env-args`` JSON) with
    their defaults; anything else is refused. ``sampling_args`` recommends sampling defaults
    (``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``stop``). ``parser`` is handed to
    reward functions that ask for it; ``rewards`` names reward plugins the host loads and merges
    (``{"rlhost/math-verify": "^0.1"}``).
    """

    def __init__(
        self,
        *,
        name: str,
        version: str = "0.1.0",
        description: str = "",
        dataset: Any = None,
        eval_dataset: Any = None,
        datasets: Mapping[str, Any] | None = None,
        system_prompt: str | None = None,
        few_shot: Sequence[Mapping] | None = None,
        rubric: Rubric | None = None,
        parser: Any = None,
        tools: Sequence[Callable | Tool] = (),
        max_turns: int = 1,
        sampling_args: Mapping[str, Any] | None = None,
        env_args: Mapping[str, Any] | None = None,
        rewards: Mapping[str, str] | None = None,
    ):
        if not name.strip():
            raise ValueError("an environment needs a name")
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.name = name
        self.version = version
        self.description = description
        splits: dict[str, Dataset] = {}
        if dataset is not None:
            splits["train"] = _as_dataset(dataset)
        if eval_dataset is not None:
            splits["test"] = _as_dataset(eval_dataset)
        for split, d in (datasets or {}).items():
            splits[split] = _as_dataset(d)
        self.splits = splits
        self.system_prompt = system_prompt
        self.few_shot = list(few_shot or [])
        self.rubric = rubric or Rubric()
        self.parser = parser
        self.tools = [t if isinstance(t, Tool) else make_tool(t) for t in tools]
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique: {names}")
        self.max_turns = max_turns
        self.sampling_args = dict(sampling_args or {})
        unknown = set(self.sampling_args) - {"temperature", "top_p", "top_k", "max_tokens", "stop"}
        if unknown:
            raise ValueError(f"unknown sampling arguments: {sorted(unknown)}")
        self.env_args = dict(env_args or {})
        self.rewards = dict(rewards or {})

    # -- what the host asks -----------------------------------------------------------------

    def info(self) -> dict:
        """The environment's self-description (the WIT ``env-info``)."""
        s = self.sampling_args
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "system_prompt": self.system_prompt,
            "tools": [
                {"name": t.name, "description": t.description, "parameters": t.parameters}
                for t in self.tools
            ],
            "max_turns": self.max_turns,
            "sampling": {
                "temperature": s.get("temperature"),
                "top_p": s.get("top_p"),
                "top_k": s.get("top_k"),
                "max_tokens": s.get("max_tokens"),
                "stop": list(s.get("stop") or []),
            },
            "rubric": self.rubric.weights(),
            "rewards": list(self.rewards.items()),
            "splits": list(self.splits),
        }

    def dataset(self, split: str, offset: int, limit: int) -> tuple[list[dict], int]:
        """Rows ``offset..offset+limit`` of a split, and its size."""
        if split not in self.splits:
            raise UnknownSplit(split)
        return self.splits[split].page(split, offset, limit)

    def parse_env_args(self, env_args: str) -> dict:
        """The environment arguments of a rollout, checked against ``env_args``."""
        try:
            given = json.loads(env_args) if env_args.strip() else {}
        except json.JSONDecodeError as e:
            raise InvalidArgs(f"not JSON: {e}") from None
        if not isinstance(given, dict):
            raise InvalidArgs("must be a JSON object")
        unknown = sorted(set(given) - set(self.env_args))
        if unknown:
            known = ", ".join(sorted(self.env_args)) or "none"
            raise InvalidArgs(f"unknown argument(s) {', '.join(unknown)} (this environment takes: {known})")
        return {**self.env_args, **given}

    def initial_prompt(self, example: dict, env_args: dict) -> tuple[list[dict], dict]:
        """The prompt messages and the initial state of an episode. By default: the system
        prompt, the few-shot messages, then the example's ``prompt`` or its question."""
        messages: list[dict] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.extend(dict(m) for m in self.few_shot)
        if example["prompt"]:
            messages.extend(example["prompt"])
        else:
            messages.append({"role": "user", "content": example["question"]})
        return messages, self.setup_state({"turns": 0}, example, env_args)

    def setup_state(self, state: dict, example: dict, env_args: dict) -> dict:
        """Hook: add what the episode needs to its state."""
        return state

    def step(self, messages: list[dict], state: dict) -> tuple[list[dict], dict, bool]:
        """The environment's turn after an assistant message: messages to append, the new
        state, and whether the episode is over."""
        raise NotImplementedError

    def score_rollout(self, example: dict, messages: list[dict], state: dict, truncated: bool) -> list[tuple[str, float]]:
        """Every metric of a finished rollout (the rubric's functions)."""
        prompt_len = _prompt_length(messages)
        return self.rubric.score(
            prompt=messages[:prompt_len],
            completion=messages[prompt_len:],
            answer=example["answer"],
            info=example["info"],
            state=state,
            example=example,
            messages=messages,
            task=self.name,
            truncated=truncated,
            parser=self.parser,
        )


def _prompt_length(messages: Sequence[Mapping]) -> int:
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            return i
    return len(messages)


class SingleTurnEnv(Environment):
    """One prompt, one answer: the episode ends after the first assistant message."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_turns", 1)
        super().__init__(**kwargs)

    def step(self, messages, state):
        state = dict(state)
        state["turns"] = state.get("turns", 0) + 1
        return [], state, True


class MultiTurnEnv(Environment):
    """Several turns: after each assistant message the host asks :meth:`is_completed`, then
    :meth:`env_response` for the messages to append (feedback, the next user turn). The episode
    also ends at ``max_turns``."""

    def is_completed(self, messages: list[dict], state: dict) -> bool:
        """Hook: the episode is over (checked after every assistant message)."""
        return False

    def env_response(self, messages: list[dict], state: dict) -> tuple[list[dict], dict]:
        """Hook: the messages to append and the new state."""
        raise NotImplementedError(f"{type(self).__name__} must define env_response")

    def step(self, messages, state):
        state = dict(state)
        state["turns"] = state.get("turns", 0) + 1
        if self.is_completed(messages, state):
            return [], state, True
        new, state = self.env_response(messages, state)
        done = state["turns"] >= self.max_turns
        return list(new), state, done


class ToolEnv(MultiTurnEnv):
    """A tool-using environment: tool calls in the last assistant message are answered with the
    tools' results (one ``tool`` message each, in order); a reply without tool calls ends the
    episode. A tool's return value is sent as text (``str()``); an exception it raises becomes
    ``error: <message>``, so the model can recover."""

    def __init__(self, *, tools: Sequence[Callable | Tool], max_turns: int = 10, **kwargs: Any):
        super().__init__(tools=tools, max_turns=max_turns, **kwargs)

    def is_completed(self, messages, state):
        last = last_assistant(messages)
        return last is None or not last.get("tool_calls")

    def call_tool(self, name: str, arguments: str) -> str:
        """The reply to one tool call."""
        tool = next((t for t in self.tools if t.name == name), None)
        if tool is None:
            return f"error: unknown tool {json.dumps(name, ensure_ascii=False)}"
        try:
            args = _check_arguments(tool, arguments)
        except InvalidInput as e:
            return f"error: invalid input: {e.message}"
        try:
            return str(tool.function(**args))
        except PluginError as e:
            return f"error: {e.message}"
        except Exception as e:  # the tool failed on the model's input: the model sees why
            return f"error: {e}"

    def env_response(self, messages, state):
        last = last_assistant(messages) or {}
        replies = []
        for call in last.get("tool_calls") or []:
            fn = call.get("function", {})
            replies.append(
                {
                    "role": "tool",
                    "content": self.call_tool(fn.get("name", ""), fn.get("arguments", "")),
                    "tool_call_id": call.get("id", ""),
                }
            )
        return replies, state


_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def _check_arguments(tool: Tool, arguments: str) -> dict:
    prefix = f"invalid arguments for `{tool.name}`"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as e:
        raise InvalidInput(f"{prefix}: {e}") from None
    if not isinstance(args, dict):
        raise InvalidInput(f"{prefix}: expected an object")
    props = tool.parameters.get("properties", {})
    for name in tool.parameters.get("required", []):
        if name not in args:
            raise InvalidInput(f"{prefix}: missing field `{name}`")
    for name, value in args.items():
        if name not in props:
            raise InvalidInput(f"{prefix}: unknown field `{name}`")
        want = props[name].get("type")
        kinds = [want] if isinstance(want, str) else (want or [])
        if kinds:
            ok = any(
                isinstance(value, _JSON_TYPES[k]) and not (k in ("integer", "number") and isinstance(value, bool))
                for k in kinds
                if k in _JSON_TYPES
            )
            if not ok:
                raise InvalidInput(f"{prefix}: `{name}` must be {' or '.join(kinds)}")
    return args


# ---- reward plugins -----------------------------------------------------------------------


class RewardFunction:
    """A reusable reward plugin (the WIT ``reward`` world): ``score(completion, answer, info)``
    returns named metrics."""

    def __init__(self, *, name: str, version: str = "0.1.0", description: str = "", funcs: Sequence[Callable]):
        if not funcs:
            raise ValueError("a reward function needs at least one metric function")
        self.name = name
        self.version = version
        self.description = description
        self.funcs = list(funcs)

    def info(self) -> dict:
        """The WIT ``reward-info``."""
        return {
            "name": self.name,
            "version": self.version,
            "description": self.description,
            "metrics": [f.__name__ for f in self.funcs],
        }

    def score(self, completion: str, answer: str, info: dict) -> list[tuple[str, float]]:
        """Each metric function called with ``completion``, ``answer`` and ``info`` (those it names)."""
        out = []
        for f in self.funcs:
            v = f(**_accepted(f, {"completion": completion, "answer": answer, "info": info}))
            out.append((f.__name__, float(v)))
        return out
