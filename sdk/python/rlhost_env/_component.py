"""The component glue: implements the WIT exports (``env`` or ``reward-fn``) on top of a plugin's
:class:`~rlhost_env.Environment` or :class:`~rlhost_env.RewardFunction`, converting between the
WIT records and the SDK's dicts. ``host env build`` generates the app module that uses it; plugin
authors never import it.
"""

from __future__ import annotations

import json

from componentize_py_types import Err  # type: ignore[import-not-found]
from wit_world.imports import types as T  # type: ignore[import-not-found]

from .env import Environment, PluginError, RewardFunction

_ROLES = {
    "system": T.Role.SYSTEM,
    "user": T.Role.USER,
    "assistant": T.Role.ASSISTANT,
    "tool": T.Role.TOOL,
}
_ROLE_NAMES = {v: k for k, v in _ROLES.items()}


def _json(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _error(e: PluginError):
    cls = {
        "invalid-args": T.PluginError_InvalidArgs,
        "invalid-input": T.PluginError_InvalidInput,
        "unknown-split": T.PluginError_UnknownSplit,
    }.get(e.kind, T.PluginError_Internal)
    return Err(cls(e.message))


def message_in(m) -> dict:
    """A WIT message as an OpenAI-style dict."""
    out = {"role": _ROLE_NAMES[m.role], "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning is not None:
        out["reasoning"] = m.reasoning
    return out


def message_out(d) -> "T.Message":
    """An OpenAI-style dict as a WIT message."""
    role = d.get("role")
    if role not in _ROLES:
        raise PluginError(f"message role must be one of {sorted(_ROLES)}, not {role!r}")
    calls = []
    for c in d.get("tool_calls") or []:
        fn = c.get("function", c)
        args = fn.get("arguments", "")
        calls.append(T.ToolCall(str(c.get("id", "")), str(fn.get("name", "")), args if isinstance(args, str) else _json(args)))
    content = d.get("content")
    return T.Message(
        _ROLES[role],
        "" if content is None else str(content),
        calls,
        d.get("tool_call_id"),
        d.get("reasoning"),
    )


def example_in(e) -> dict:
    info = json.loads(e.info) if e.info.strip() else {}
    return {
        "id": e.id,
        "prompt": [message_in(m) for m in e.prompt],
        "question": e.question,
        "answer": e.answer,
        "info": info,
    }


def example_out(d: dict) -> "T.Example":
    return T.Example(d["id"], [message_out(m) for m in d["prompt"]], d["question"], d["answer"], _json(d["info"]))


def _state_in(state: str) -> dict:
    try:
        value = json.loads(state) if state.strip() else {}
    except json.JSONDecodeError as e:
        raise PluginError(f"state is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise PluginError("state is not a JSON object")
    return value


def environment_export(load_environment):
    """The class implementing ``exports.Env`` for the environment ``load_environment()`` makes
    (called once, when the module is imported: at build time, into the component's snapshot)."""
    env = load_environment()
    if not isinstance(env, Environment):
        raise TypeError(f"load_environment() returned {type(env).__name__}, not an rlhost_env.Environment")

    class Env:
        def info(self):
            i = env.info()
            s = i["sampling"]
            return T.EnvInfo(
                i["name"],
                i["version"],
                i["description"],
                i["system_prompt"],
                [T.Tool(t["name"], t["description"], _json(t["parameters"])) for t in i["tools"]],
                i["max_turns"],
                T.SamplingArgs(s["temperature"], s["top_p"], s["top_k"], s["max_tokens"], s["stop"]),
                [T.MetricWeight(n, w) for n, w in i["rubric"]],
                [T.RewardDep(p, v) for p, v in i["rewards"]],
                i["splits"],
            )

        def dataset(self, split, offset, limit):
            try:
                rows, total = env.dataset(split, offset, limit)
                return T.DatasetPage([example_out(r) for r in rows], total)
            except PluginError as e:
                raise _error(e) from None

        def initial_prompt(self, example, env_args):
            try:
                args = env.parse_env_args(env_args)
                messages, state = env.initial_prompt(example_in(example), args)
                return T.EpisodeStart([message_out(m) for m in messages], _json(state))
            except PluginError as e:
                raise _error(e) from None

        def env_response(self, conversation, state):
            try:
                messages, new_state, done = env.step([message_in(m) for m in conversation], _state_in(state))
                return T.EnvStep([message_out(m) for m in messages], _json(new_state), bool(done))
            except PluginError as e:
                raise _error(e) from None

        def score(self, rollout):
            try:
                metrics = env.score_rollout(
                    example_in(rollout.example),
                    [message_in(m) for m in rollout.messages],
                    _state_in(rollout.state),
                    rollout.truncated,
                )
                return [T.Metric(n, v) for n, v in metrics]
            except PluginError as e:
                raise _error(e) from None

    return Env


def reward_export(load_reward):
    """The class implementing ``exports.RewardFn`` for the reward function ``load_reward()`` makes."""
    from wit_world.exports import reward_fn as R  # type: ignore[import-not-found]

    reward = load_reward()
    if not isinstance(reward, RewardFunction):
        raise TypeError(f"load_reward() returned {type(reward).__name__}, not an rlhost_env.RewardFunction")

    class RewardFn:
        def info(self):
            i = reward.info()
            return R.RewardInfo(i["name"], i["version"], i["description"], i["metrics"])

        def score(self, completion, answer, info):
            try:
                parsed = json.loads(info) if info.strip() else {}
                return [T.Metric(n, v) for n, v in reward.score(completion, answer, parsed)]
            except PluginError as e:
                raise _error(e) from None

    return RewardFn
