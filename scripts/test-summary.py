#!/usr/bin/env python3
"""The last step of `make test`: one summary line from what the three test runs printed, and,
under CI (`CI=true`), the rule that nothing may skip or be ignored unless the allow-list says why.

    test-summary.py OUTPUT_LOG SKIP_LOG ALLOW_LIST

- OUTPUT_LOG: cargo's and unittest's output, concatenated (`test result:` lines, `test NAME ...
  ignored` lines, unittest's `Ran N tests` and `OK (skipped=K)` / `FAILED (...)`).
- SKIP_LOG: one `SKIPPED <test>: <reason>` line per skip a test recorded (`common::skip` in the
  host's tests, `rlhost::testing::skip` in its unit tests), written through `$RLHOST_SKIP_LOG`.
- ALLOW_LIST: a TOML file of `[[skip]]` and `[[ignored]]` entries, each with `test` (a substring of
  the test's name), `reason` (a substring of the skip's reason; not for `ignored`) and `why` (why
  CI cannot provide what the test needs, or where an ignored test runs instead).

A test that recorded a skip is counted as skipped, not passed (cargo counts it as passed). Prints
`tests: P passed, F failed, S skipped, I ignored`; exits 1 when a run failed, when no tests ran,
or, under CI, when a skip or an ignored test is not on the allow-list (each one is named)."""

import os
import re
import sys
import tomllib


def main() -> int:
    output_log, skip_log, allow_path = sys.argv[1:4]
    with open(output_log, encoding="utf-8", errors="replace") as f:
        output = f.read()
    with open(skip_log, encoding="utf-8", errors="replace") as f:
        skip_lines = [line.rstrip("\n") for line in f if line.startswith("SKIPPED ")]
    with open(allow_path, "rb") as f:
        allow = tomllib.load(f)

    passed = failed = ignored = 0
    python_skips = []  # unittest's own skips: never counted as passed
    for m in re.finditer(
        r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", output, re.M
    ):
        passed += int(m[1])
        failed += int(m[2])
        ignored += int(m[3])
    # unittest: "Ran N tests in Xs" then "OK", "OK (skipped=K)" or "FAILED (failures=A, errors=B)".
    for m in re.finditer(r"^Ran (\d+) tests? in [^\n]*\n\n(OK|FAILED)([^\n]*)", output, re.M):
        ran = int(m[1])
        counts = dict(
            (k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", m[3])
        )
        bad = counts.get("failures", 0) + counts.get("errors", 0)
        skipped_py = counts.get("skipped", 0)
        failed += bad
        passed += ran - bad - skipped_py
        for i in range(skipped_py):
            python_skips.append(f"python unittest #{len(python_skips) + 1}")
    ignored_names = re.findall(r"^test (.+?) \.\.\. ignored", output, re.M)

    # A test that skipped all or part of its work counts once, as skipped (cargo counted it as
    # passed).
    skipped_tests = {}
    for line in skip_lines:
        name, _, reason = line[len("SKIPPED ") :].partition(": ")
        skipped_tests.setdefault(name, reason)
    passed -= min(len(skipped_tests), passed)
    for name in python_skips:
        skipped_tests[name] = "skipped by unittest (its reason is in the output above)"

    for name, reason in skipped_tests.items():
        print(f"SKIPPED {name}: {reason}")
    for name in ignored_names:
        print(f"IGNORED {name}")
    print(
        f"tests: {passed} passed, {failed} failed, {len(skipped_tests)} skipped, "
        f"{ignored} ignored"
    )

    status = 0
    if failed:
        status = 1
    if passed + failed == 0:
        print("test-summary: no test results found in the output", file=sys.stderr)
        status = 1
    if os.environ.get("CI") == "true":
        def allowed(kind, name, reason=None):
            for entry in allow.get(kind, []):
                if entry["test"] in name and (reason is None or entry["reason"] in reason):
                    return True
            return False

        refused = [
            f"skipped: {name}: {reason}"
            for name, reason in skipped_tests.items()
            if not allowed("skip", name, reason)
        ]
        refused += [
            f"ignored: {name}" for name in ignored_names if not allowed("ignored", name)
        ]
        if refused:
            print(
                f"CI=true: {len(refused)} test(s) did not run and are not on the allow-list "
                f"({allow_path}); provide what they need in .ci/run, or add an entry saying why "
                "CI cannot:",
                file=sys.stderr,
            )
            for r in refused:
                print(f"  {r}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
