"""rlhost's Python sandbox guest.

Built into a WebAssembly component by componentize-py; everything imported at module level here is
in the component's pre-initialised snapshot, so a fresh instance starts with sympy loaded.
The host runs each call in a fresh instance (or keeps one per rollout for REPL mode), with
deadlines, a memory cap and no files, network or environment.
"""

import sys

import runner

# The standard library a math tool user reaches for, loaded at build time.
import bisect  # noqa: F401
import cmath  # noqa: F401
import collections  # noqa: F401
import copy  # noqa: F401
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import decimal  # noqa: F401
import fractions  # noqa: F401
import functools  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import json  # noqa: F401
import math  # noqa: F401
import numbers  # noqa: F401
import operator  # noqa: F401
import random  # noqa: F401
import re  # noqa: F401
import statistics  # noqa: F401
import string  # noqa: F401
import textwrap  # noqa: F401
import typing  # noqa: F401
import _ast_unparse  # noqa: F401 - ast.unparse imports it lazily (the math-python tool driver)
import array  # noqa: F401
import calendar  # noqa: F401
import enum  # noqa: F401
import hashlib  # noqa: F401
import io  # noqa: F401
import pprint  # noqa: F401
import queue  # noqa: F401 - not imported by anything else, so absent unless loaded here
import threading  # noqa: F401
import time  # noqa: F401
import unicodedata  # noqa: F401
import warnings  # noqa: F401

import importlib
import pkgutil
import types


def _ctypes_stub():
    """CPython for WASI has no `_ctypes`; sympy/external/gmpy.py only needs `sizeof(c_long)`
    (4 bytes on wasm32) to compute LONG_MAX. Installed as `ctypes` before sympy is imported."""
    module = types.ModuleType("ctypes", "rlhost stub: only c_long and sizeof (wasm32)")

    class c_long:  # noqa: N801 - mirrors the ctypes name
        pass

    def sizeof(obj):
        if obj is c_long or isinstance(obj, c_long):
            return 4
        raise TypeError("ctypes is not available in this sandbox")

    module.c_long = c_long
    module.sizeof = sizeof
    return module


try:
    import ctypes  # noqa: F401
except ImportError:
    sys.modules["ctypes"] = _ctypes_stub()


def _sleeping_locks():
    """Makes a wait on a lock last as a `time.sleep` does.

    CPython for WASI has no threads: its lock primitives are stubs that cannot block. A wait on a
    held lock with no timeout (a lock acquired twice, `threading.Event().wait()`,
    `Condition().wait()`, `queue.Queue().get()`, `Semaphore(0).acquire()`) traps in wasi-libc's
    `pthread_cond_wait` and crashes the interpreter, and one with a timeout fails at once instead
    of after the timeout (`Event().wait(0.2)` returned False at once). Nothing but this one thread
    could ever release such a lock, so waiting for it is only time passing: the lock installed
    here waits with `time.sleep`, which suspends the guest in a WASI poll that the host's deadline
    cancels. A wait without a timeout so ends at the deadline as a timed-out call, like a sleep
    past it; one with a timeout sleeps that long and fails, as CPython's does when no other thread
    releases the lock. Installed as `_thread.allocate_lock`/`LockType`/`lock`, `threading.Lock`
    (what Condition, Event, Semaphore, Barrier and queue.Queue build on) and threading's
    `_allocate_lock` (Condition's waiters). `queue.SimpleQueue` (C, waits in the same stub) becomes
    its pure Python twin, which waits on these locks. RLock stays CPython's own: with one thread
    it never waits. (The host turns a wait that still reaches the stub, on a lock made before
    this ran, into a timed-out call too.)
    """
    import _queue
    import _thread
    import operator

    sleep, monotonic = time.sleep, time.monotonic
    timeout_max = _thread.TIMEOUT_MAX
    longest_sleep = 3600.0  # one `time.sleep` at most; a longer wait sleeps again

    def wait_seconds(blocking, timeout):
        """`acquire`'s arguments as CPython checks them: seconds to wait, or None for ever."""
        if not isinstance(timeout, float):
            timeout = operator.index(timeout)
        if timeout != timeout:
            raise ValueError("Invalid value NaN (not a number)")
        if not blocking:
            if timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            return 0
        if timeout == -1:
            return None
        if timeout < 0:
            raise ValueError("timeout value must be a non-negative number")
        if timeout > timeout_max:
            raise OverflowError("timeout value is too large")
        return timeout

    class lock:  # noqa: N801 - stands in for _thread.lock, under its name
        """A lock for a single-threaded interpreter: waiting on it is sleeping."""

        __slots__ = ("_locked", "__weakref__")

        def __init__(self):
            self._locked = False

        def acquire(self, blocking=True, timeout=-1):
            wait = wait_seconds(blocking, timeout)
            if self._locked and wait != 0:
                end = None if wait is None else monotonic() + wait
                while self._locked:
                    left = longest_sleep if end is None else end - monotonic()
                    if left <= 0:
                        break
                    sleep(min(left, longest_sleep))
            if self._locked:
                return False
            self._locked = True
            return True

        def release(self):
            if not self._locked:
                raise RuntimeError("release unlocked lock")
            self._locked = False

        def locked(self):
            return self._locked

        def _at_fork_reinit(self):
            self._locked = False

        acquire_lock = acquire
        release_lock = release
        locked_lock = locked

        def __enter__(self):
            return self.acquire()

        def __exit__(self, *exc):
            self.release()

        def __repr__(self):
            state = "locked" if self._locked else "unlocked"
            return f"<{state} _thread.lock object at {id(self):#x}>"

        def __reduce__(self):
            raise TypeError("cannot pickle '_thread.lock' object")

    lock.__module__, lock.__qualname__ = "_thread", "lock"
    _thread.allocate_lock = _thread.allocate = lock
    _thread.LockType = _thread.lock = lock
    threading.Lock = threading._LockType = threading._allocate_lock = lock
    queue.SimpleQueue = _queue.SimpleQueue = queue._PySimpleQueue


_sleeping_locks()

import mpmath
import sympy

import wit_world
from wit_world import exports


def _import_everything(package):
    """Imports every non-test submodule: lazy imports would fail at run time (files on the
    build machine's path are not embedded, only what is imported during pre-initialisation)."""
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        name = info.name
        if ".tests" in name or ".test_" in name or name.endswith(".conftest"):
            continue
        try:
            importlib.import_module(name)
        except Exception:  # optional backends (matplotlib, numpy, …) are absent: skip
            pass


_import_everything(mpmath)
_import_everything(sympy)

# Warm up the common paths, then drop what the warm-up cached.
_x = sympy.Symbol("x")
sympy.integrate(sympy.sin(_x) ** 2, _x)
sympy.solve(_x**2 - 2, _x)
sympy.simplify(sympy.Rational(1, 3) + sympy.sqrt(8))
del _x
sympy.core.cache.clear_cache()

sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)

_namespace = runner.new_namespace()


class Python(exports.Python):
    def run(self, code: str) -> int:
        return runner.run_cell(code, _namespace)
