"""exact-match in Python: a reward plugin (the WIT `reward` world). The completion's last
\\boxed{…} (or, with {"fallback": "last-line"} in info, its last non-empty line) must equal the
reference answer after light normalisation. The same reward as the Rust plugin
plugins/exact-match and the Extism one in plugins/extism/exact-match."""

import rlhost_env as rl


def normalise(s: str) -> str:
    s = s.strip()
    s = s[:-1] if s.endswith(".") else s
    s = s.strip("$").strip()
    return " ".join(s.split()).lower()


def _candidate(completion: str, info: dict):
    fallback = info.get("fallback")
    if fallback not in (None, "last-line"):
        raise rl.InvalidInput(f'unknown fallback "{fallback}" (expected "last-line")')
    boxed = rl.extract_boxed(completion)
    if boxed is None and fallback == "last-line":
        lines = [line for line in completion.splitlines() if line.strip()]
        boxed = lines[-1] if lines else None
    return boxed


def exact_match(completion, answer, info) -> float:
    c = _candidate(completion, info)
    return 1.0 if c is not None and normalise(c) == normalise(answer) else 0.0


def has_answer(completion, info) -> float:
    return 1.0 if _candidate(completion, info) is not None else 0.0


def load_reward() -> rl.RewardFunction:
    return rl.RewardFunction(
        name="exact-match",
        version="0.1.0",
        description="final boxed answer equals the reference",
        funcs=[exact_match, has_answer],
    )
