//! `arith-tools`: multi-step arithmetic ("What is 482 * 317 - 95?") with a `calculator` tool.
//! The SDK's tool-environment example: a tool schema from a Rust type, tool calls answered in
//! `env-response`, state carried between turns, and metrics about tool use.

use rlhost_sdk::prelude::*;
use rlhost_sdk::schema::{parse_args, tool};
use serde::{Deserialize, Serialize};

struct ArithTools;

/// Arguments of the `calculator` tool.
#[derive(Deserialize, rlhost_sdk::schemars::JsonSchema)]
#[schemars(crate = "rlhost_sdk::schemars")]
struct Calculator {
    /// An integer expression with + - * / and parentheses, e.g. "(12 + 3) * 4".
    expression: String,
}

#[derive(Serialize, Deserialize, Default)]
struct State {
    turns: u32,
}

const MAX_TURNS: u32 = 4;

fn question(i: u64) -> (String, i64) {
    let mut x = i
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 33) % m) as i64
    };
    let (a, b, c) = (100 + next(900), 100 + next(900), next(1000));
    (format!("What is {a} * {b} - {c}?"), a * b - c)
}

/// Evaluates `+ - * /` and parentheses over i64, refusing overflow and division by zero.
fn eval(expr: &str) -> Result<i64, String> {
    fn sum(t: &[u8], i: &mut usize) -> Result<i64, String> {
        let mut v = product(t, i)?;
        while let Some(&op @ (b'+' | b'-')) = t.get(*i) {
            *i += 1;
            let r = product(t, i)?;
            v = if op == b'+' {
                v.checked_add(r)
            } else {
                v.checked_sub(r)
            }
            .ok_or("overflow")?;
        }
        Ok(v)
    }
    fn product(t: &[u8], i: &mut usize) -> Result<i64, String> {
        let mut v = atom(t, i)?;
        while let Some(&op @ (b'*' | b'/')) = t.get(*i) {
            *i += 1;
            let r = atom(t, i)?;
            v = if op == b'*' {
                v.checked_mul(r)
            } else {
                v.checked_div(r)
            }
            .ok_or("overflow or division by zero")?;
        }
        Ok(v)
    }
    fn atom(t: &[u8], i: &mut usize) -> Result<i64, String> {
        match t.get(*i) {
            Some(b'(') => {
                *i += 1;
                let v = sum(t, i)?;
                (t.get(*i) == Some(&b')'))
                    .then_some(())
                    .ok_or("missing )")?;
                *i += 1;
                Ok(v)
            }
            Some(b'-') => {
                *i += 1;
                atom(t, i)?.checked_neg().ok_or_else(|| "overflow".into())
            }
            _ => {
                let start = *i;
                while t.get(*i).is_some_and(u8::is_ascii_digit) {
                    *i += 1;
                }
                let digits = std::str::from_utf8(&t[start..*i]).unwrap_or("");
                digits
                    .parse()
                    .map_err(|_| format!("expected a number at position {start}"))
            }
        }
    }
    let t: Vec<u8> = expr.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let mut i = 0;
    let v = sum(&t, &mut i)?;
    (i == t.len())
        .then_some(v)
        .ok_or_else(|| format!("unexpected input at position {i}"))
}

impl Environment for ArithTools {
    fn info() -> EnvInfo {
        EnvInfo {
            name: "arith-tools".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Multi-step arithmetic with a calculator tool".into(),
            system_prompt: Some(
                "Use the calculator tool when it helps. Give the final answer in \\boxed{}.".into(),
            ),
            tools: vec![tool::<Calculator>(
                "calculator",
                "Evaluate an integer expression.",
            )],
            max_turns: MAX_TURNS,
            sampling: SamplingArgs::default(),
            rubric: Rubric::new()
                .metric("correct", 1.0)
                .metric("tool_calls", 0.0)
                .build(),
            rewards: vec![],
            splits: vec!["train".into(), "test".into()],
        }
    }

    fn dataset(split: &str, offset: u64, limit: u32) -> Result<DatasetPage, PluginError> {
        let (base, total) = match split {
            "train" => (0, 5_000),
            "test" => (1 << 32, 200),
            _ => return Err(PluginError::UnknownSplit(split.into())),
        };
        let end = offset.saturating_add(limit.into()).min(total);
        let examples = (offset.min(end)..end)
            .map(|i| {
                let (q, a) = question(base + i);
                Example {
                    id: format!("{split}-{i}"),
                    prompt: vec![],
                    question: q,
                    answer: a.to_string(),
                    info: "{}".into(),
                }
            })
            .collect();
        Ok(DatasetPage { examples, total })
    }

    fn initial_prompt(example: Example, _: &str) -> Result<EpisodeStart, PluginError> {
        let prompt = Self::info().system_prompt.unwrap_or_default();
        let state = serde_json::to_string(&State::default()).expect("serialisable");
        Ok(EpisodeStart {
            messages: vec![system(prompt), user(example.question)],
            state,
        })
    }

    fn env_response(conversation: Vec<Message>, state: String) -> Result<EnvStep, PluginError> {
        let mut st: State = serde_json::from_str(&state)
            .map_err(|e| PluginError::InvalidInput(format!("state: {e}")))?;
        st.turns += 1;
        let last = rlhost_sdk::messages::last_assistant(&conversation)
            .ok_or_else(|| PluginError::InvalidInput("no assistant message".into()))?;
        let replies: Vec<Message> = last
            .tool_calls
            .iter()
            .map(|call| {
                let result = match call.name.as_str() {
                    "calculator" => parse_args::<Calculator>(&call.name, &call.arguments)
                        .map_err(|e| e.to_string())
                        .and_then(|a| eval(&a.expression))
                        .map_or_else(|e| format!("error: {e}"), |v| v.to_string()),
                    other => format!("error: unknown tool {other:?}"),
                };
                tool_result(call.id.clone(), result)
            })
            .collect();
        let done = replies.is_empty() || st.turns >= MAX_TURNS;
        let state = serde_json::to_string(&st).expect("serialisable");
        Ok(EnvStep {
            messages: replies,
            state,
            done,
        })
    }

    fn score(rollout: Rollout) -> Result<Vec<Metric>, PluginError> {
        let answer = rlhost_sdk::messages::last_assistant(&rollout.messages)
            .and_then(|m| extract_boxed(&m.content).map(str::trim));
        let calls = rlhost_sdk::messages::tool_calls(&rollout.messages);
        Ok(vec![
            flag("correct", answer == Some(rollout.example.answer.as_str())),
            metric("tool_calls", calls as f64),
        ])
    }
}

rlhost_sdk::export_environment!(ArithTools);

#[cfg(test)]
mod tests {
    use super::eval;

    #[test]
    fn calculator_evaluates_and_refuses_bad_input() {
        assert_eq!(eval("482 * 317 - 95"), Ok(152_699));
        assert_eq!(eval("(12 + 3) * -4 / 5"), Ok(-12));
        assert!(eval("1 / 0").is_err());
        assert!(eval("9223372036854775807 + 1").is_err());
        assert!(eval("2 +").is_err());
        assert!(eval("(1").is_err());
        assert!(eval("import os").is_err());
    }
}
