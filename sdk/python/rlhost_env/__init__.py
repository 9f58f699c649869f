"""rlhost_env: write rlhost environment and reward plugins in Python.

The concepts verifiers users know — an environment with datasets, a system prompt, tools as
plain Python functions, a rubric of weighted reward functions, single-turn, multi-turn and tool
flavours — built by ``host env build`` (or ``host env pack``) into a sandboxed WebAssembly
component with componentize-py, against the same WIT world as Rust plugins (``rlhost:env@0.1.0``).

A plugin module defines ``load_environment()`` (or ``load_reward()``)::

    import rlhost_env as rl

    def load_environment() -> rl.Environment:
        return rl.SingleTurnEnv(
            name="my-env",
            dataset=rl.Dataset.from_jsonl("train.jsonl"),
            system_prompt="Answer in \\\\boxed{}.",
            rubric=rl.Rubric([correct]),
        )
"""

from .answers import extract_boxed
from .env import (
    Dataset,
    Environment,
    InvalidArgs,
    InvalidInput,
    MultiTurnEnv,
    PluginError,
    RewardFunction,
    Rubric,
    SingleTurnEnv,
    ToolEnv,
    UnknownSplit,
    completion_text,
    count_tool_calls,
    last_assistant,
)
from .host import log, read_data, read_text, rollout_seed, run_python
from .parsers import XMLParser
from .schema import Tool, tool

__version__ = "0.1.0"
#: The plugin ABI (WIT package) this SDK builds against.
ABI_VERSION = "0.1.0"

__all__ = [
    "ABI_VERSION",
    "Dataset",
    "Environment",
    "InvalidArgs",
    "InvalidInput",
    "MultiTurnEnv",
    "PluginError",
    "RewardFunction",
    "Rubric",
    "SingleTurnEnv",
    "Tool",
    "ToolEnv",
    "UnknownSplit",
    "XMLParser",
    "completion_text",
    "count_tool_calls",
    "extract_boxed",
    "last_assistant",
    "log",
    "read_data",
    "read_text",
    "rollout_seed",
    "run_python",
    "tool",
]
