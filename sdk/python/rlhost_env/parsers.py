"""Parsers: pulling structured fields out of completions, as verifiers' ``XMLParser`` does."""

from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence

__all__ = ["XMLParser"]


class XMLParser:
    """Reads ``<field>…</field>`` sections of assistant messages.

    ``fields`` are the tag names the format asks for, in order; ``answer_field`` is the one
    :meth:`parse_answer` returns.
    """

    def __init__(self, fields: Sequence[str], answer_field: str = "answer"):
        if not fields:
            raise ValueError("an XMLParser needs at least one field")
        self.fields = list(fields)
        self.answer_field = answer_field

    def parse(self, text: str) -> dict[str, str | None]:
        """Each field's last occurrence in ``text`` (stripped), or None. An unclosed last tag
        counts up to the end of the text."""
        out: dict[str, str | None] = {}
        for f in self.fields:
            closed = re.findall(rf"<{re.escape(f)}>(.*?)</{re.escape(f)}>", text, re.DOTALL)
            if closed:
                out[f] = closed[-1].strip()
                continue
            opened = re.search(rf"<{re.escape(f)}>(.*)$", text, re.DOTALL)
            out[f] = opened.group(1).strip() if opened else None
        return out

    def parse_answer(self, completion: str | Sequence[Mapping]) -> str | None:
        """The answer field of the last assistant message that has one (or of the text)."""
        if isinstance(completion, str):
            return self.parse(completion).get(self.answer_field)
        for m in reversed(completion):
            if m.get("role") == "assistant":
                value = self.parse(m.get("content") or "").get(self.answer_field)
                if value is not None:
                    return value
        return None

    def format_score(self, text: str) -> float:
        """The share of fields present as well-formed ``<f>…</f>`` sections."""
        present = sum(
            1 for f in self.fields if re.search(rf"<{re.escape(f)}>.*?</{re.escape(f)}>", text, re.DOTALL)
        )
        return present / len(self.fields)

    def get_format_reward_func(self) -> Callable[..., float]:
        """A reward function: the mean :meth:`format_score` over the assistant messages."""

        def format_reward_func(completion, **kwargs) -> float:
            texts = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
            if not texts:
                return 0.0
            return sum(self.format_score(t) for t in texts) / len(texts)

        return format_reward_func
