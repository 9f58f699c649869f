"""Runs a cell of model-written Python the way a notebook does; shared by the WebAssembly guest
(app.py) and the native fallback (../native/zygote.py) so both behave the same.

- Statements run in the given namespace; the value of a trailing expression is printed (repr).
- An uncaught exception prints a traceback of the user's code only (the cell's own line numbers
  and source lines, none of the sandbox's frames) and gives status 1.
- `sys.exit(n)` gives status n (a message argument is printed to stderr, status 1).
"""

import ast
import builtins
import linecache
import sys
import traceback

CELL = "<python>"
_QUOTE = 100  # characters of a syntax error's line quoted on each side of the error


def new_namespace():
    """A fresh `__main__`-like namespace."""
    return {"__name__": "__main__", "__builtins__": builtins}


def _compile(code):
    tree = ast.parse(code, CELL, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, CELL, "exec")
    tail = compile(last, CELL, "eval") if last is not None else None
    return body, tail


def _print_user_traceback(exc):
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


def run_cell(code, namespace):
    """Runs `code` in `namespace`; returns the exit status."""
    linecache.cache[CELL] = (len(code), None, code.splitlines(True), CELL)
    status = 0
    try:
        body, tail = _compile(code)
        exec(body, namespace)
        if tail is not None:
            value = eval(tail, namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as e:
        if e.code is None:
            status = 0
        elif isinstance(e.code, int):
            status = e.code
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except SyntaxError as e:
        # Quote at most a window of the offending line: a model's 200 000-character line
        # would otherwise flood the output and hide the error itself.
        if e.text and len(e.text) > 2 * _QUOTE:
            start = max(0, (e.offset or 1) - 1 - _QUOTE)
            e.text = e.text[start:start + 2 * _QUOTE] + "…"
            e.offset = (e.offset or 1) - start
            e.end_offset = None
        traceback.print_exception(type(e), e, None, file=sys.stderr)
        status = 1
    except BaseException as e:  # noqa: BLE001 - everything the code raises is its output
        _print_user_traceback(e)
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            pass
    return status
