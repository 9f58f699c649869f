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
pub const MAX_EVAL_BYTES: usize = 1 << 20;

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
    Ok(summary)
}
