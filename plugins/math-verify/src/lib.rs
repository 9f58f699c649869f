//! `math-verify`: a reward plugin any environment can depend on. The answer is read from the
//! completion (by default the first `\boxed{…}`, as verifiers' `extract_boxed_answer`: the whole
//! text when there is none) and compared with the reference by [`rlhost_math_verify`]: exact
//! rationals, decimals rounded to 6 places, symbolic expressions, sets, tuples, intervals,
//! equations, matrices. Bounded in time: a pathological answer scores `correct = 0` with
//! `verify_timeout = 1`.
//!
//! `info` (JSON object, all optional): `"convention"`: `"math-rubric"` (default; gold first,
//! both wrapped in `\boxed{}`) or `"seed"` (verifiers' `math_python`: bare answers, prediction
//! first); `"extract"`: `"first-boxed"` (default) or `"none"` (the completion is the answer);
//! `"use_think"`: only what follows the last `</think>` counts.

use rlhost_math_env::answer_text;
use rlhost_math_verify::{Convention, check, first_boxed};
use rlhost_sdk::prelude::*;
use serde::Deserialize;

struct MathVerify;

#[derive(Deserialize, Default)]
#[serde(default)]
struct Options {
    convention: Option<String>,
    extract: Option<String>,
    use_think: bool,
}

impl RewardFunction for MathVerify {
    fn info() -> RewardInfo {
        RewardInfo {
            name: "math-verify".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "the answer is mathematically equal to the reference".into(),
            metrics: vec!["correct".into(), "verify_timeout".into()],
        }
    }

    fn score(completion: &str, answer: &str, info: &str) -> Result<Vec<Metric>, PluginError> {
        let text = if info.trim().is_empty() { "{}" } else { info };
        let o: Options = serde_json::from_str(text).map_err(|e| {
            PluginError::InvalidInput(format!("info is not a valid options object: {e}"))
        })?;
        let convention = match o.convention.as_deref() {
            None => Convention::MathRubric,
            Some(c) => c.parse().map_err(PluginError::InvalidInput)?,
        };
        let extract_boxed = match o.extract.as_deref() {
            None | Some("first-boxed") => true,
            Some("none") => false,
            Some(other) => {
                return Err(PluginError::InvalidInput(format!(
                    "extract: unknown value {other:?} (expected \"first-boxed\" or \"none\")"
                )));
            }
        };
        let verdict = match answer_text(completion, o.use_think) {
            Some(t) if !t.is_empty() => {
                let pred = if extract_boxed { first_boxed(t) } else { t };
                check(convention, pred, answer)
            }
            _ => rlhost_math_verify::Verdict {
                correct: false,
                timed_out: false,
            },
        };
        Ok(vec![
            flag("correct", verdict.correct),
            flag("verify_timeout", verdict.timed_out),
        ])
    }
}

rlhost_sdk::export_reward!(MathVerify);
