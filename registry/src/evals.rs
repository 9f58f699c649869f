//! Evaluations published to a registry: `host eval … --publish` uploads an environment's
//! `summary.json`, signed by the publisher's key over the environment's identity and the
//! summary's sha256 ([`crate::sign::eval_message`]). The registry checks the signature, that the
//! key is accepted for the publishing owner, that the environment version is published here and
//! that the run was not interrupted, then keeps the exact bytes, so anyone can verify them again.
//!
//! Stored as `evals/<owner>/<name>/<sha256>.json`, one [`StoredEval`] per file, written
//! atomically; the same bytes published twice are one evaluation.

use serde::{Deserialize, Serialize};

/// Largest summary accepted.
pub const MAX_EVAL_BYTES: usize = 256 << 10;
/// Evaluations one publisher may keep on one package.
pub const MAX_EVALS_PER_PUBLISHER: usize = 100;
/// Longest model name, split or metric name shown.
pub const MAX_NAME_CHARS: usize = 200;
/// Most metrics, and most Pass@k values, in a summary.
pub const MAX_FIGURES: usize = 64;

/// The sampling an evaluation ran with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalSampling {
    /// Sampling temperature (the server's default when absent).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus mass.
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Most new tokens per turn.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Seed of sampling and environments.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// What the registry reads of an evaluation summary (`host eval`'s `summary.json`; the rest of
/// the summary is kept, unread, in the stored bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalSummary {
    /// The environment, `owner/name`.
    pub plugin: String,
    /// Its version.
    pub plugin_version: semver::Version,
    /// The model (and endpoint) evaluated.
    pub model: String,
    /// The dataset split.
    pub split: String,
    /// Examples evaluated.
    pub examples: usize,
    /// Rollouts per example.
    pub rollouts_per_example: usize,
    /// Rollouts finished.
    pub rollouts: usize,
    /// Mean reward.
    pub reward: f64,
    /// Mean of each metric.
    pub metrics: Vec<(String, f64)>,
    /// Avg@k (k = rollouts per example).
    pub avg_at_k: f64,
    /// Pass@k by k.
    pub pass_at_k: Vec<(usize, f64)>,
    /// Sampling.
    #[serde(default)]
    pub sampling: EvalSampling,
    /// Environment arguments (a JSON object's text).
    #[serde(default)]
    pub env_args: String,
    /// When the evaluation finished (RFC 3339, UTC).
    pub date: String,
    /// The host version that ran it.
    pub host_version: String,
    /// The run was stopped before every planned rollout finished.
    #[serde(default)]
    pub interrupted: bool,
}

/// An evaluation as the registry keeps it: the exact summary bytes and who vouches for them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredEval {
    /// Hex sha256 of `summary` (its bytes): the evaluation's id.
    pub cksum: String,
    /// The owner who published it.
    pub publisher: String,
    /// The publisher's public key (hex).
    pub key: String,
    /// The signature over [`crate::sign::eval_message`] (hex).
    pub sig: String,
    /// The summary, exactly as signed.
    pub summary: String,
}

impl StoredEval {
    /// The summary's fields the registry shows (checked when it was published).
    pub fn parsed(&self) -> Result<EvalSummary, serde_json::Error> {
        serde_json::from_str(&self.summary)
    }
}

/// An evaluation to publish.
#[derive(Debug, Clone, Copy)]
pub struct EvalPublication<'a> {
    /// The summary's bytes, as written to `summary.json`.
    pub summary: &'a [u8],
    /// The signature (hex) over [`crate::sign::eval_message`].
    pub sig: &'a str,
    /// The publisher's public key (hex).
    pub public_key: &'a str,
    /// Authenticates the publisher to a server.
    pub token: Option<&'a str>,
}

/// Why an evaluation was refused before anything was stored.
pub(crate) fn check_summary(bytes: &[u8]) -> Result<EvalSummary, String> {
    if bytes.len() > MAX_EVAL_BYTES {
        return Err(format!(
            "the summary is {} bytes, over the {MAX_EVAL_BYTES}-byte limit",
            bytes.len()
        ));
    }
    let summary: EvalSummary = serde_json::from_slice(bytes)
        .map_err(|e| format!("not an evaluation summary of host eval: {e}"))?;
    if summary.interrupted {
        return Err(
            "the evaluation was interrupted: its figures cover the fastest rollouts only".into(),
        );
    }
    summary.check()?;
    Ok(summary)
}

impl EvalSummary {
    /// The figures hold together: names of sane length, finite values, rates in [0, 1],
    /// `rollouts = examples × rollouts_per_example`, Pass@k for k in 1..=rollouts per example,
    /// an RFC 3339 UTC date. A summary that fails this was not written by `host eval`.
    pub fn check(&self) -> Result<(), String> {
        let name_ok = |what: &str, s: &str| {
            if s.is_empty() || s.chars().count() > MAX_NAME_CHARS || s.chars().any(char::is_control)
            {
                Err(format!(
                    "{what} must be 1-{MAX_NAME_CHARS} printable characters"
                ))
            } else {
                Ok(())
            }
        };
        name_ok("model", &self.model)?;
        name_ok("split", &self.split)?;
        if self.metrics.len() > MAX_FIGURES || self.pass_at_k.len() > MAX_FIGURES {
            return Err(format!("at most {MAX_FIGURES} metrics and Pass@k values"));
        }
        for (name, value) in &self.metrics {
            name_ok("a metric name", name)?;
            if !value.is_finite() {
                return Err(format!("metric {name} is not finite"));
            }
        }
        if !self.reward.is_finite() {
            return Err("reward is not finite".into());
        }
        let rate = |what: &str, x: f64| match (0.0..=1.0).contains(&x) {
            true => Ok(()),
            false => Err(format!("{what} is {x}, not a rate in [0, 1]")),
        };
        rate("avg_at_k", self.avg_at_k)?;
        if self.examples == 0 || self.rollouts_per_example == 0 {
            return Err("an evaluation of no example or no rollout".into());
        }
        if self.examples.checked_mul(self.rollouts_per_example) != Some(self.rollouts) {
            return Err(format!(
                "rollouts is {}, not examples × rollouts_per_example = {} × {}",
                self.rollouts, self.examples, self.rollouts_per_example
            ));
        }
        for &(k, p) in &self.pass_at_k {
            if k == 0 || k > self.rollouts_per_example {
                return Err(format!(
                    "pass@{k} with {} rollouts per example",
                    self.rollouts_per_example
                ));
            }
            rate(&format!("pass@{k}"), p)?;
        }
        if self.env_args.len() > 4096 {
            return Err("env_args is over 4096 bytes".into());
        }
        if !is_rfc3339_utc(&self.date) {
            return Err(format!(
                "date {:?} is not RFC 3339 UTC (YYYY-MM-DDTHH:MM:SSZ)",
                self.date
            ));
        }
        Ok(())
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` with a plausible month, day, hour, minute and second.
fn is_rfc3339_utc(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        b.get(r.clone())?
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| s[r].parse().ok())?
    };
    b.len() == 20
        && (b[4], b[7], b[10], b[13], b[16], b[19]) == (b'-', b'-', b'T', b':', b':', b'Z')
        && digits(0..4).is_some()
        && digits(5..7).is_some_and(|m| (1..=12).contains(&m))
        && digits(8..10).is_some_and(|d| (1..=31).contains(&d))
        && digits(11..13).is_some_and(|h| h < 24)
        && digits(14..16).is_some_and(|m| m < 60)
        && digits(17..19).is_some_and(|s| s < 61)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> serde_json::Value {
        serde_json::json!({
            "plugin": "rlhost/arith", "plugin_version": "0.1.0", "model": "tiny", "split": "test",
            "examples": 2, "rollouts_per_example": 2, "rollouts": 4, "reward": 0.5,
            "metrics": [["correct", 0.5]], "avg_at_k": 0.5, "pass_at_k": [[1, 0.5], [2, 0.75]],
            "date": "2026-11-28T12:00:00Z", "host_version": "0.1.0"
        })
    }

    #[test]
    fn summaries_must_hold_together() {
        let check = |v: &serde_json::Value| check_summary(v.to_string().as_bytes());
        check(&good()).unwrap();
        let bad = |path: &str, value: serde_json::Value, why: &str| {
            let mut v = good();
            v[path] = value;
            let err = check(&v).unwrap_err();
            assert!(err.contains(why), "{path}: {err}");
        };
        bad("avg_at_k", serde_json::json!(1e308), "not a rate");
        bad("pass_at_k", serde_json::json!([[3, 0.5]]), "pass@3 with 2");
        bad("pass_at_k", serde_json::json!([[1, 5.0]]), "not a rate");
        bad("rollouts", serde_json::json!(0), "rollouts is 0");
        bad("examples", serde_json::json!(0), "no example");
        bad("date", serde_json::json!("9999-99-99"), "RFC 3339");
        bad("model", serde_json::json!("z".repeat(201)), "model must be");
        bad("model", serde_json::json!(""), "model must be");
        bad("interrupted", serde_json::json!(true), "interrupted");
        bad("metrics", serde_json::json!([["x\ny", 0.5]]), "metric name");
        let huge = serde_json::json!("x".repeat(MAX_EVAL_BYTES));
        bad("env_args", huge, "over the");
    }
}
