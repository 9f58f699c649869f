//! Policy-gradient losses and group advantages for GRPO-style training.
//!
//! Inputs are per-token tensors `[batch, seq]`: the current policy's log-probs of the sampled
//! tokens (with gradient, at the sampler's temperature), the sampler's log-probs (what the
//! engine reported), a loss mask (1 on generated tokens, 0 on prompt, tool and padding tokens),
//! and one advantage per sequence.
//!
//! Loss variants:
//! - [`LossKind::TruncatedIs`] (prime-rl's default since Sept 2025): token-level
//!   `-min(r, C) · A` with `r = exp(logp - logp_old)`; once `r` exceeds `C` the token's gradient
//!   is zero.
//! - [`LossKind::PpoClip`]: `-min(r · A, clip(r, 1 - ε_low, 1 + ε_high) · A)` (PPO; DAPO's
//!   clip-higher with `ε_high > ε_low`).
//!
//! Optionally a KL penalty to a reference policy with the k3 estimator
//! `exp(ref - logp) - (ref - logp) - 1`. Normalisation: per token (the sum over every
//! unmasked token of the batch divided by their count) or per sequence (each sequence's token
//! mean, then the mean over sequences). [`policy_loss`] normalises one tensor batch itself, one
//! row a sequence; [`weighted_policy_loss`] takes the normalisation as per-token weights, which
//! is what lets the trainer split a batch into micro-batches, and a merged multi-turn row into
//! one sequence per turn, without changing the objective.

use tch::{Kind, Tensor};

/// Which surrogate loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LossKind {
    /// `-min(r, clip_ratio) · A`.
    TruncatedIs,
    /// PPO's clipped surrogate with separate low/high epsilons.
    PpoClip,
}

/// How token losses are averaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormType {
    /// Over all unmasked tokens of the batch.
    Token,
    /// Over tokens within each sequence, then over sequences.
    Sequence,
}

/// Loss settings (the trainer config's `[loss]`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossConfig {
    /// The surrogate.
    #[serde(rename = "type")]
    pub kind: LossKind,
    /// Normalisation.
    pub norm_type: NormType,
    /// `C` of the truncated importance ratio.
    pub clip_ratio: f64,
    /// PPO's lower epsilon.
    pub eps_low: f64,
    /// PPO's upper epsilon (clip-higher when above `eps_low`).
    pub eps_high: f64,
    /// Weight of the KL penalty to the reference policy (0: none).
    pub kl_coef: f64,
}

impl Default for LossConfig {
    fn default() -> Self {
        Self {
            kind: LossKind::TruncatedIs,
            norm_type: NormType::Token,
            clip_ratio: 8.0,
            eps_low: 0.2,
            eps_high: 0.28,
            kl_coef: 0.0,
        }
    }
}

/// Statistics of one loss evaluation (over unmasked tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LossStats {
    /// Mean importance ratio.
    pub ratio_mean: f64,
    /// Largest importance ratio.
    pub ratio_max: f64,
    /// Share of tokens whose gradient the clipping removed.
    pub clipped_frac: f64,
    /// Mean k3 KL to the reference (0 without one).
    pub kl: f64,
}

/// The loss (a scalar with gradient) and its statistics, normalised as `cfg.norm_type` says
/// over this batch, each row one sequence.
pub fn policy_loss(
    cfg: &LossConfig,
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    ref_logprobs: Option<&Tensor>,
) -> (Tensor, LossStats) {
    let mask = mask.to_kind(Kind::Float);
    let weights = match cfg.norm_type {
        NormType::Token => &mask / mask.sum(Kind::Float).clamp_min(1.0),
        NormType::Sequence => {
            let rows = mask.size()[0].max(1) as f64;
            &mask / (mask.sum_dim_intlist(-1, true, Kind::Float).clamp_min(1.0) * rows)
        }
    };
    weighted_policy_loss(
        cfg,
        logprobs,
        old_logprobs,
        advantages,
        &mask,
        &weights,
        ref_logprobs,
    )
}

/// The loss `Σ weights · token loss` (a scalar with gradient) and its statistics over the
/// tokens where `mask` is 1. The weights carry the normalisation (`cfg.norm_type` is not read):
/// weights summing over micro-batches to the batch's normalisation make the micro-batches'
/// losses sum to the batch's loss.
pub fn weighted_policy_loss(
    cfg: &LossConfig,
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    weights: &Tensor,
    ref_logprobs: Option<&Tensor>,
) -> (Tensor, LossStats) {
    let mask = mask.to_kind(Kind::Float);
    let adv = advantages.to_kind(Kind::Float).unsqueeze(-1);
    let ratio = (logprobs - old_logprobs).exp();
    let (per_token, clipped) = match cfg.kind {
        LossKind::TruncatedIs => {
            let clipped = ratio.gt(cfg.clip_ratio);
            (-(ratio.clamp_max(cfg.clip_ratio)) * &adv, clipped)
        }
        LossKind::PpoClip => {
            let unclipped = &ratio * &adv;
            let clipped_r = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * &adv;
            // The clipped branch is taken (no gradient) where it is the smaller.
            let clipped = clipped_r.lt_tensor(&unclipped);
            (-unclipped.minimum(&clipped_r), clipped)
        }
    };
    let mut kl_mean = 0.0;
    let per_token = match ref_logprobs {
        Some(r) if cfg.kl_coef != 0.0 => {
            let d = r - logprobs;
            let kl = d.exp() - &d - 1.0;
            kl_mean = masked_mean(&kl.detach(), &mask);
            per_token + kl * cfg.kl_coef
        }
        _ => per_token,
    };
    let loss = (&per_token * weights.to_kind(Kind::Float)).sum(Kind::Float);
    let ratio_d = ratio.detach();
    let stats = LossStats {
        ratio_mean: masked_mean(&ratio_d, &mask),
        ratio_max: (&ratio_d * &mask).max().double_value(&[]),
        clipped_frac: masked_mean(&clipped.to_kind(Kind::Float), &mask),
        kl: kl_mean,
    };
    (loss, stats)
}

fn masked_mean(x: &Tensor, mask: &Tensor) -> f64 {
    let n = mask.sum(Kind::Float).double_value(&[]);
    if n == 0.0 {
        return 0.0;
    }
    (x * mask).sum(Kind::Float).double_value(&[]) / n
}

/// How group advantages are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdvantageKind {
    /// Dr. GRPO: `r - mean(r)` (no std normalisation).
    Drgrpo,
    /// GRPO: `(r - mean(r)) / (std(r) + 1e-6)`.
    Grpo,
    /// RLOO: `r_i - mean of the others`.
    Rloo,
}

/// Advantages of one group's rewards.
pub fn advantages(kind: AdvantageKind, rewards: &[f64]) -> Vec<f64> {
    let n = rewards.len();
    if n == 0 {
        return Vec::new();
    }
    let mean = rewards.iter().sum::<f64>() / n as f64;
    match kind {
        AdvantageKind::Drgrpo => rewards.iter().map(|r| r - mean).collect(),
        AdvantageKind::Grpo => {
            let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
            rewards.iter().map(|r| (r - mean) / (std + 1e-6)).collect()
        }
        AdvantageKind::Rloo => {
            if n == 1 {
                return vec![0.0];
            }
            let total: f64 = rewards.iter().sum();
            rewards
                .iter()
                .map(|r| r - (total - r) / (n - 1) as f64)
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rows: &[&[f32]]) -> Tensor {
        let cols = rows[0].len() as i64;
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_slice(&flat).view([rows.len() as i64, cols])
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }

    #[test]
    fn group_advantages() {
        let r = [1.0, 0.0, 0.0, 1.0];
        assert_eq!(
            advantages(AdvantageKind::Drgrpo, &r),
            vec![0.5, -0.5, -0.5, 0.5]
        );
        // std = 0.5
        let g = advantages(AdvantageKind::Grpo, &r);
        close(g[0], 0.5 / (0.5 + 1e-6));
        // RLOO: 1 - (1/3), 0 - (2/3)
        let l = advantages(AdvantageKind::Rloo, &r);
        close(l[0], 1.0 - 1.0 / 3.0);
        close(l[1], -2.0 / 3.0);
        // A solved-by-all group has no signal.
        assert!(
            advantages(AdvantageKind::Drgrpo, &[1.0; 4])
                .iter()
                .all(|&a| a == 0.0)
        );
        assert_eq!(advantages(AdvantageKind::Rloo, &[0.3]), vec![0.0]);
    }

    /// Truncated IS: ratios e^0 = 1 and e^3 ≈ 20 (> C = 8); masked tokens do not count.
    #[test]
    fn truncated_ratio_loss_values_gradients_and_masking() {
        let old = t(&[&[0.0, 0.0, 0.0], &[0.0, 0.0, 0.0]]);
        let cur = t(&[&[0.0, 3.0, 0.0], &[0.5, 0.0, 9.0]]).set_requires_grad(true);
        let mask = t(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 0.0]]);
        let adv = Tensor::from_slice(&[2.0f32, -1.0]);
        let cfg = LossConfig::default();
        let (loss, stats) = policy_loss(&cfg, &cur, &old, &adv, &mask, None);
        // Tokens: -(1·2), -(8·2), -(e^0.5·-1), -(1·-1) over 4 tokens.
        let want = (-2.0 - 16.0 + 0.5f64.exp() + 1.0) / 4.0;
        close(loss.double_value(&[]), want);
        close(stats.clipped_frac, 0.25);
        close(stats.ratio_max, 3.0f64.exp());
        loss.backward();
        let g = cur.grad();
        // d/dlogp of -r·A/4 = -r·A/4 where unclipped; 0 where clipped or masked.
        close(g.double_value(&[0, 0]), -0.5);
        close(g.double_value(&[0, 1]), 0.0);
        close(g.double_value(&[0, 2]), 0.0);
        close(g.double_value(&[1, 0]), 0.5f64.exp() / 4.0);
        close(g.double_value(&[1, 2]), 0.0);
    }

    /// PPO clip both sides: A > 0 clips above 1 + ε_high, A < 0 clips below 1 - ε_low.
    #[test]
    fn ppo_clip_both_sides() {
        let cfg = LossConfig {
            kind: LossKind::PpoClip,
            ..Default::default()
        };
        let l = |r: f64, a: f32| {
            let cur = Tensor::from_slice(&[r.ln() as f32])
                .view([1, 1])
                .set_requires_grad(true);
            let old = Tensor::zeros([1, 1], (Kind::Float, tch::Device::Cpu));
            let mask = Tensor::ones([1, 1], (Kind::Float, tch::Device::Cpu));
            let (loss, stats) =
                policy_loss(&cfg, &cur, &old, &Tensor::from_slice(&[a]), &mask, None);
            loss.backward();
            (
                loss.double_value(&[]),
                cur.grad().double_value(&[0, 0]),
                stats.clipped_frac,
            )
        };
        // r = 1.5, A = 1: clipped at 1.28, no gradient.
        let (v, g, c) = l(1.5, 1.0);
        close(v, -1.28);
        close(g, 0.0);
        close(c, 1.0);
        // r = 0.5, A = 1: below the band, unclipped (min picks r·A): gradient -r·A.
        let (v, g, _) = l(0.5, 1.0);
        close(v, -0.5);
        close(g, -0.5);
        // r = 0.5, A = -1: clipped at 0.8: loss 0.8, no gradient.
        let (v, g, c) = l(0.5, -1.0);
        close(v, 0.8);
        close(g, 0.0);
        close(c, 1.0);
        // r = 1.5, A = -1: unclipped: loss 1.5, gradient -r·A = 1.5.
        let (v, g, _) = l(1.5, -1.0);
        close(v, 1.5);
        close(g, 1.5);
    }

    /// Token vs sequence normalisation differ when sequences have different lengths.
    #[test]
    fn token_and_sequence_normalisation() {
        let zeros = t(&[&[0.0, 0.0, 0.0], &[0.0, 0.0, 0.0]]);
        let mask = t(&[&[1.0, 1.0, 1.0], &[1.0, 0.0, 0.0]]);
        let adv = Tensor::from_slice(&[1.0f32, -3.0]);
        let mut cfg = LossConfig::default();
        // Ratios are 1: token losses -1, -1, -1 and 3.
        let (loss, _) = policy_loss(&cfg, &zeros, &zeros, &adv, &mask, None);
        close(loss.double_value(&[]), 0.0 / 4.0);
        cfg.norm_type = NormType::Sequence;
        let (loss, _) = policy_loss(&cfg, &zeros, &zeros, &adv, &mask, None);
        close(loss.double_value(&[]), (-1.0 + 3.0) / 2.0);
    }

    #[test]
    fn k3_kl_penalty() {
        let cur = t(&[&[0.0, -1.0]]);
        let reference = t(&[&[0.0, 0.0]]);
        let mask = t(&[&[1.0, 1.0]]);
        let cfg = LossConfig {
            kl_coef: 0.5,
            ..Default::default()
        };
        let (loss, stats) = policy_loss(
            &cfg,
            &cur,
            &cur,
            &Tensor::from_slice(&[0.0f32]),
            &mask,
            Some(&reference),
        );
        // k3 at d = ref - logp = 1: e - 1 - 1; at d = 0: 0.
        let kl = (1f64.exp() - 2.0) / 2.0;
        close(stats.kl, kl);
        close(loss.double_value(&[]), 0.5 * kl);
    }
}
