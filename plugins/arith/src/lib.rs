//! `arith`: single-turn arithmetic questions ("What is 37 * 12?"), answered in `\boxed{}`.
//!
//! The smallest complete environment: a generated dataset (deterministic, no data files), a
//! validated environment argument, and a two-metric rubric. Tiny models can learn it, which makes
//! it the CPU demo's first task and the SDK's first example.

use rlhost_sdk::prelude::*;
use serde::Deserialize;

struct Arith;

/// Environment arguments (`-a '{"max_operand": 20}'`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Args {
    /// Largest operand in the questions asked (1..=999).
    max_operand: u64,
}

impl Default for Args {
    fn default() -> Self {
        Self { max_operand: 999 }
    }
}

const SPLITS: [(&str, u64, u64); 2] = [("train", 10_000, 1), ("test", 500, 2)];

/// Row `i` of a split: operands from a small integer hash, so every row is fixed forever.
fn row(split: &str, salt: u64, i: u64) -> Example {
    let h = |k: u64| {
        let mut x = (i << 8 | k) ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    let (a, b) = (h(1) % 1000, h(2) % 1000);
    let (op, value) = match h(3) % 3 {
        0 => ('+', a as i64 + b as i64),
        1 => ('-', a as i64 - b as i64),
        _ => ('*', (a * b) as i64),
    };
    Example {
        id: format!("{split}-{i}"),
        prompt: vec![],
        question: format!("What is {a} {op} {b}?"),
        answer: value.to_string(),
        info: format!(r#"{{"a":{a},"b":{b},"op":"{op}"}}"#),
    }
}

impl Environment for Arith {
    fn info() -> EnvInfo {
        EnvInfo {
            name: "arith".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Single-turn integer arithmetic, answer in \\boxed{}".into(),
            system_prompt: Some("Answer with the final result in \\boxed{}.".into()),
            tools: vec![],
            max_turns: 1,
            sampling: SamplingArgs {
                max_tokens: Some(64),
                ..Default::default()
            },
            rubric: Rubric::new()
                .metric("correct", 1.0)
                .metric("boxed", 0.0)
                .build(),
            rewards: vec![],
            splits: SPLITS.iter().map(|(s, ..)| s.to_string()).collect(),
        }
    }

    fn dataset(split: &str, offset: u64, limit: u32) -> Result<DatasetPage, PluginError> {
        let &(_, total, salt) = SPLITS
            .iter()
            .find(|(s, ..)| *s == split)
            .ok_or_else(|| PluginError::UnknownSplit(split.into()))?;
        let end = offset.saturating_add(limit as u64).min(total);
        Ok(DatasetPage {
            examples: (offset.min(end)..end)
                .map(|i| row(split, salt, i))
                .collect(),
            total,
        })
    }

    fn initial_prompt(example: Example, env_args: &str) -> Result<EpisodeStart, PluginError> {
        let args: Args =
            serde_json::from_str(env_args).map_err(|e| PluginError::InvalidArgs(e.to_string()))?;
        if !(1..=999).contains(&args.max_operand) {
            return Err(PluginError::InvalidArgs(format!(
                "max_operand must be in 1..=999, got {}",
                args.max_operand
            )));
        }
        let system = Self::info().system_prompt.unwrap_or_default();
        Ok(EpisodeStart {
            messages: vec![system_msg(system), user(example.question)],
            state: "{}".into(),
        })
    }

    fn score(rollout: Rollout) -> Result<Vec<Metric>, PluginError> {
        let reply = rlhost_sdk::messages::last_assistant(&rollout.messages)
            .map(|m| m.content.as_str())
            .unwrap_or("");
        let boxed = extract_boxed(reply);
        let correct = boxed.is_some_and(|b| b.trim() == rollout.example.answer);
        Ok(vec![
            flag("correct", correct),
            flag("boxed", boxed.is_some()),
        ])
    }
}

fn system_msg(text: String) -> Message {
    rlhost_sdk::messages::system(text)
}

rlhost_sdk::export_environment!(Arith);
