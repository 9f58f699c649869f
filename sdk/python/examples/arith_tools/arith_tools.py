"""arith-tools in Python: multi-step arithmetic ("What is 482 * 317 - 95?") with a calculator tool.

The same environment as the Rust component in plugins/arith-tools and the AssemblyScript Extism
plugin in plugins/extism/arith-tools: the host's tests check that all three give identical
prompts, tool results and rewards.
"""

import rlhost_env as rl

MASK = (1 << 64) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1


def question(i: int) -> dict:
    """Row ``i``: the same 64-bit LCG as the Rust plugin."""
    x = i

    def nxt(m: int) -> int:
        nonlocal x
        x = (x * 6364136223846793005 + 1442695040888963407) & MASK
        return (x >> 33) % m

    x = (x * 6364136223846793005 + 1442695040888963407) & MASK
    a, b, c = 100 + nxt(900), 100 + nxt(900), nxt(1000)
    return {"question": f"What is {a} * {b} - {c}?", "answer": str(a * b - c)}


class CalcError(Exception):
    pass


def _checked(v: int, message: str = "overflow") -> int:
    if not I64_MIN <= v <= I64_MAX:
        raise CalcError(message)
    return v


def evaluate(expression: str) -> int:
    """+ - * / and parentheses over 64-bit integers, refusing overflow and division by zero
    (division truncates toward zero)."""
    t = bytes(b for b in expression.encode() if b not in b" \t\n\x0c\r")
    i = 0

    def peek():
        return t[i : i + 1]

    def sum_():
        nonlocal i
        v = product()
        while peek() in (b"+", b"-"):
            op = peek()
            i += 1
            r = product()
            v = _checked(v + r if op == b"+" else v - r)
        return v

    def product():
        nonlocal i
        v = atom()
        while peek() in (b"*", b"/"):
            op = peek()
            i += 1
            r = atom()
            if op == b"*":
                v = _checked(v * r, "overflow or division by zero")
            else:
                if r == 0:
                    raise CalcError("overflow or division by zero")
                q = abs(v) // abs(r)
                v = _checked(q if (v < 0) == (r < 0) else -q, "overflow or division by zero")
        return v

    def atom():
        nonlocal i
        if peek() == b"(":
            i += 1
            v = sum_()
            if peek() != b")":
                raise CalcError("missing )")
            i += 1
            return v
        if peek() == b"-":
            i += 1
            return _checked(-atom())
        start = i
        while peek().isdigit():
            i += 1
        digits = t[start:i]
        if not digits or int(digits) > I64_MAX:
            raise CalcError(f"expected a number at position {start}")
        return int(digits)

    v = sum_()
    if i != len(t):
        raise CalcError(f"unexpected input at position {i}")
    return v


@rl.tool(arguments_description="Arguments of the `calculator` tool.")
def calculator(expression: str) -> int:
    """Evaluate an integer expression.

    Args:
        expression: An integer expression with + - * / and parentheses, e.g. "(12 + 3) * 4".
    """
    return evaluate(expression)


def correct(completion, answer) -> bool:
    """The last reply's boxed answer is the reference."""
    boxed = rl.extract_boxed(rl.completion_text(completion))
    return boxed is not None and boxed.strip() == answer


def tool_calls(completion) -> int:
    """How many tool calls the model made (recorded, weight 0)."""
    return rl.count_tool_calls(completion)


def load_environment() -> rl.Environment:
    return rl.ToolEnv(
        name="arith-tools",
        version="0.1.0",
        description="Multi-step arithmetic with a calculator tool",
        system_prompt="Use the calculator tool when it helps. Give the final answer in \\boxed{}.",
        tools=[calculator],
        max_turns=4,
        dataset=rl.Dataset.generated(5000, question),
        eval_dataset=rl.Dataset.generated(200, lambda i: question((1 << 32) + i)),
        rubric=rl.Rubric([correct, tool_calls], weights=[1.0, 0.0]),
    )
