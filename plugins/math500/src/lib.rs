//! `math500`: MATH-500, the 500-problem test subset of MATH. Single-turn: the system prompt asks for step-by-step reasoning and the final
//! answer in `\boxed{}`, the user message is the problem, and `correct` is math-verify under
//! verifiers' `MathRubric` convention. `{"tools": "python"}` turns it into the tool-using
//! variant (the "w/ tool use" evals of prime-rl's math-python example: the python tool, 3
//! turns).

use rlhost_math_env::{BOXED_SYSTEM_PROMPT, Spec, math_environment};
use rlhost_math_verify::Convention;

const SPEC: Spec = Spec {
    name: "math500",
    description: "MATH-500, the 500-problem test subset of MATH",
    splits: &[("test", "test.jsonl")],
    system_prompt: BOXED_SYSTEM_PROMPT,
    prompts: &[],
    no_tools_prompt: None,
    tools: false,
    max_turns: 3,
    convention: Convention::MathRubric,
    error_weight: 0.0,
};

math_environment!(Env, SPEC);
