"""Finding the final answer in a completion: ``\\boxed{…}`` (and ``\\fbox{…}``, ``\\boxed 5``) with
balanced braces, as math graders expect. The same rules as the Rust SDK's ``extract_boxed``."""

from __future__ import annotations

__all__ = ["extract_boxed"]

_MACROS = ("\\boxed", "\\fbox")


def _next_boxed(text: str, start: int) -> tuple[int, int] | None:
    search = start
    while True:
        hits = [(text.find(m, search), len(m)) for m in _MACROS]
        hits = [h for h in hits if h[0] >= 0]
        if not hits:
            return None
        pos, length = min(hits)
        after = pos + length
        if text.startswith("{", after):
            depth = 1
            for i in range(after + 1, len(text)):
                c = text[i]
                if c == "{":
                    depth += 1
                elif c == "}":
                    depth -= 1
                    if depth == 0:
                        return after + 1, i
            return None  # unbalanced: no answer
        if text.startswith(" ", after):
            begin = after + 1
            end = begin
            while end < len(text) and not text[end].isspace() and text[end] != "$":
                end += 1
            if end > begin:
                return begin, end
        search = after  # `\boxedx` or similar: not an answer, keep looking


def extract_boxed(text: str, last: bool = True) -> str | None:
    """The content of the last (or first) boxed answer in ``text``, or None."""
    found = None
    start = 0
    while (hit := _next_boxed(text, start)) is not None:
        found = text[hit[0] : hit[1]]
        if not last:
            return found
        start = hit[1]
    return found
