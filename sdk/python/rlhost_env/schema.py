"""Tools as plain Python functions: the JSON Schema of a tool's arguments comes from the function's
type hints and its docstring, so what the model sees and what the function takes cannot drift.

The schema has the shape the Rust SDK derives from an argument struct (keys in the same order):
``{"type": "object", "properties": {...}, "required": [...], "description": ...}``.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Tool", "tool", "json_schema", "parse_docstring"]


@dataclass
class Tool:
    """A tool the environment offers the model: its name, description, the JSON Schema of its
    arguments, and the function that answers a call."""

    name: str
    description: str
    parameters: dict
    function: Callable[..., Any]

    def __call__(self, **kwargs: Any) -> Any:
        return self.function(**kwargs)


_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$"
)
_ARG_LINE = re.compile(r"^\s*\**(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Splits a Google-style docstring into its summary (the text before the first section) and
    the descriptions of its ``Args:`` entries (continuation lines joined with spaces)."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section = None
    current = None
    arg_indent = None
    for line in lines:
        m = _SECTION.match(line)
        if m:
            section = m.group(1).lower()
            current = None
            arg_indent = None
            continue
        if section is None:
            summary.append(line)
        elif section in ("args", "arguments", "parameters"):
            if not line.strip():
                current = None
                continue
            indent = len(line) - len(line.lstrip())
            m = _ARG_LINE.match(line)
            if m and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = m.group(1)
                args[current] = m.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + line.strip()).strip()
    text = "\n".join(summary).strip()
    # The summary is the first paragraph, joined into one line.
    first = text.split("\n\n")[0] if text else ""
    return " ".join(first.split()), args


def json_schema(annotation: Any) -> dict:
    """The JSON Schema of a Python type hint (str, int, float, bool, None, list[T], tuple,
    dict[str, T], Optional/Union, Literal, Any)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation is type(None) or annotation is None:
        return {"type": "null"}
    if annotation is str:
        return {"type": "string"}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    origin = typing.get_origin(annotation)
    targs = typing.get_args(annotation)
    if origin is typing.Literal:
        values = list(targs)
        kinds = {type(v) for v in values}
        schema: dict = {}
        if kinds == {str}:
            schema["type"] = "string"
        elif kinds <= {int}:
            schema["type"] = "integer"
        schema["enum"] = values
        return schema
    if origin in (typing.Union, types.UnionType):
        members = [a for a in targs if a is not type(None)]
        nullable = len(members) != len(targs)
        if len(members) == 1:
            inner = json_schema(members[0])
            if nullable and isinstance(inner.get("type"), str):
                inner = dict(inner)
                inner["type"] = [inner["type"], "null"]
            elif nullable:
                inner = {"anyOf": [inner, {"type": "null"}]}
            return inner
        return {"anyOf": [json_schema(a) for a in targs]}
    if annotation is list or origin is list or origin is typing.Sequence:
        schema = {"type": "array"}
        if targs:
            schema["items"] = json_schema(targs[0])
        return schema
    if annotation is tuple or origin is tuple:
        if targs and targs[-1] is not Ellipsis:
            return {
                "type": "array",
                "prefixItems": [json_schema(a) for a in targs],
                "minItems": len(targs),
                "maxItems": len(targs),
            }
        schema = {"type": "array"}
        if targs:
            schema["items"] = json_schema(targs[0])
        return schema
    if annotation is dict or origin is dict:
        schema = {"type": "object"}
        if len(targs) == 2:
            schema["additionalProperties"] = json_schema(targs[1])
        return schema
    raise TypeError(f"no JSON Schema for type hint {annotation!r}")


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    arguments_description: str | None = None,
):
    """Makes a :class:`Tool` of a function (usable as ``@tool`` or ``@tool(name=...)``).

    The name defaults to the function's, the description to its docstring's summary; each
    parameter's type hint gives its schema, the docstring's ``Args:`` entry its description, and
    parameters without a default are required. ``arguments_description`` describes the arguments
    object as a whole (what the Rust SDK takes from the argument struct's doc comment).
    """

    def make(fn: Callable[..., Any]) -> Tool:
        summary, arg_docs = parse_docstring(fn.__doc__)
        try:
            hints = typing.get_type_hints(fn)
        except Exception as e:  # unresolvable forward references
            raise TypeError(f"tool {fn.__name__}: cannot read its type hints: {e}") from e
        properties: dict = {}
        required: list[str] = []
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {fn.__name__}: *args/**kwargs cannot be described")
            if pname not in hints:
                raise TypeError(f"tool {fn.__name__}: parameter `{pname}` has no type hint")
            prop = json_schema(hints[pname])
            if pname in arg_docs and arg_docs[pname]:
                prop["description"] = arg_docs[pname]
            if param.default is inspect.Parameter.empty:
                required.append(pname)
            else:
                prop["default"] = param.default
            properties[pname] = prop
        schema: dict = {"type": "object", "properties": properties, "required": required}
        if arguments_description:
            schema["description"] = arguments_description
        return Tool(
            name=name or fn.__name__,
            description=description if description is not None else summary,
            parameters=schema,
            function=fn,
        )

    if function is not None:
        return make(function)
    return make
