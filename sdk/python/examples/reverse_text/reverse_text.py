"""reverse-text, ported from verifiers' environments/reverse_text: reverse a text character by
character, answer inside <reversed_text> tags, rewarded by the longest-common-subsequence ratio
to the exact reversal (plus a weightless format metric).

The verifiers original maps `PrimeIntellect/Reverse-Text-RL` (Hugging Face) rows to
{"question": prompt, "answer": prompt[::-1]}. Without the hub, the packaged data are the
MATH-500 problem statements (`data/test.jsonl`, copied from the offline data folder when the
plugin is assembled); a user with the hub can point `source_field`/the data file at the original.
"""

from difflib import SequenceMatcher

import rlhost_env as rl

SYSTEM_PROMPT = "Reverse the text character-by-character. Put your answer in <reversed_text> tags."

parser = rl.XMLParser(["reversed_text"], answer_field="reversed_text")


def lcs_reward_func(completion, answer) -> float:
    """LCS ratio of the reversed prompt and the parsed completion."""
    response = parser.parse_answer(completion) or ""
    return SequenceMatcher(None, response, answer).ratio()


format_reward_func = parser.get_format_reward_func()


def to_row(row: dict) -> dict:
    text = row["problem"]
    return {"id": row["id"], "question": text, "answer": text[::-1]}


def load_environment() -> rl.Environment:
    return rl.SingleTurnEnv(
        name="reverse-text",
        version="0.1.0",
        description="Reverse a text; LCS similarity to the exact reversal (verifiers' reverse-text)",
        eval_dataset=rl.Dataset.from_jsonl("test.jsonl", transform=to_row),
        system_prompt=SYSTEM_PROMPT,
        parser=parser,
        rubric=rl.Rubric([lcs_reward_func, format_reward_func], weights=[1.0, 0.0]),
        sampling_args={"max_tokens": 1024},
    )
