//! `exact-match`: the smallest reward plugin. The completion's last `\boxed{…}` (or, with
//! `{"fallback": "last-line"}` in `info`, its last non-empty line) must equal the reference
//! answer after light normalisation: surrounding whitespace and `$`, a trailing `.`, inner runs
//! of whitespace, and letter case are ignored. Symbolic equivalence is `math-verify`'s job.

use rlhost_sdk::prelude::*;

struct ExactMatch;

fn normalise(s: &str) -> String {
    let s = s.trim();
    let s = s.strip_suffix('.').unwrap_or(s).trim_matches('$').trim();
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

impl RewardFunction for ExactMatch {
    fn info() -> RewardInfo {
        RewardInfo {
            name: "exact-match".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "final boxed answer equals the reference".into(),
            metrics: vec!["exact_match".into(), "has_answer".into()],
        }
    }

    fn score(completion: &str, answer: &str, info: &str) -> Result<Vec<Metric>, PluginError> {
        let info: rlhost_sdk::serde_json::Value = rlhost_sdk::serde_json::from_str(info)
            .map_err(|e| PluginError::InvalidInput(format!("info is not JSON: {e}")))?;
        let last_line_fallback = match info.get("fallback").and_then(|v| v.as_str()) {
            None => false,
            Some("last-line") => true,
            Some(other) => {
                return Err(PluginError::InvalidInput(format!(
                    "unknown fallback {other:?} (expected \"last-line\")"
                )));
            }
        };
        let candidate = extract_boxed(completion).or_else(|| {
            last_line_fallback
                .then(|| completion.lines().rev().find(|l| !l.trim().is_empty()))
                .flatten()
        });
        let exact = candidate.is_some_and(|c| normalise(c) == normalise(answer));
        Ok(vec![
            flag("exact_match", exact),
            flag("has_answer", candidate.is_some()),
        ])
    }
}

rlhost_sdk::export_reward!(ExactMatch);
