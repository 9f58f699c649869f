//! `will/math-python`: verifiers' `math_python` environment (Aug 2025), which prime-rl's
//! math-python example trains Qwen3-8B against. MATH train problems (the answer is the first
//! `\boxed{}` of the reference solution), the system prompt below, one `python` tool (fresh
//! interpreter per call, 10 s), at most 3 assistant turns, and the rubric `correct` (1) +
//! `num_turns` (0) + `num_tool_calls` (0) + `num_errors` (−0.1), with `correct` decided by
//! math-verify under the `seed` convention (verifiers' `math_python`: bare answers, prediction
//! first).
//!
//! Environment arguments select the later variants: `{"python_state": "persistent"}` (variables
//! live across calls in a rollout), `{"prompt": "libraries"}` (the later prompt naming the
//! available libraries), `{"answer_convention": "math-rubric"}`, `{"max_turns": N}`,
//! `{"use_think": true}`, `{"tools": "none"}`.

use rlhost_math_env::{Spec, math_environment};
use rlhost_math_verify::Convention;

/// verifiers' `math_python` system prompt.
pub const SYSTEM_PROMPT: &str = "Use python for all calculations (variables do not persist). Give your answer inside \\boxed{}.";

const SPEC: Spec = Spec {
    name: "math-python",
    description: "MATH problems solved with a Python tool (verifiers' math_python environment)",
    splits: &[("train", "train.jsonl")],
    system_prompt: SYSTEM_PROMPT,
    prompts: &[(
        "libraries",
        "Use python for all calculations. Variables persist between calls. The Python standard \
         library, sympy and mpmath are available. Give your answer inside \\boxed{}.",
    )],
    no_tools_prompt: None,
    tools: true,
    max_turns: 3,
    convention: Convention::Seed,
    error_weight: -0.1,
};

math_environment!(MathPython, SPEC);
