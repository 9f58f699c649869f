//! Sampling: request parameters (OpenAI / vLLM semantics) and one batched sampling step over
//! the last position's logits of every running sequence.
//!
//! The whole batch is processed with a handful of tensor ops: `logit_bias`, then the repetition
//! penalty (over prompt and output) and the frequency and presence penalties (over the output,
//! OpenAI's definition: `logit -= frequency × count + presence × [count > 0]`), each only for the
//! rows that ask for it, then temperature, min-p, top-k and top-p (rows that ask for them; top-p on the top-k
//! renormalised distribution, as vLLM), then **inverse-CDF sampling**: one cumulative sum per
//! row and one uniform number per row, located with `searchsorted`. It is exact, costs O(vocab)
//! vectorised work instead of `multinomial`'s per-call overhead, and draws its uniform numbers
//! from each sequence's own generator, so a seeded request gets the same tokens whatever else
//! shares its batch.
//!
//! The log-probability reported for a token is the sampler's: `log_softmax(logits / T)` after
//! the bias and the penalties and before the top-k/top-p/min-p truncation — what the trainer
//! recomputes for the importance ratio (`Qwen3::token_logprobs` at the same temperature). Greedy
//! rows (temperature 0) report `log_softmax(logits)`. A grammar's token mask
//! ([`super::grammar`]) is truncation too: it restricts what is drawn (and the greedy argmax), not
//! the reported log-probability.

use std::sync::Arc;

use tch::{Kind, Tensor};

use super::grammar::Constraint;

/// Temperatures below this are greedy (as vLLM).
pub const GREEDY_BELOW: f64 = 1e-5;

/// The most alternatives listed with each sampled token's log-prob (OpenAI's and vLLM's
/// default limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// How one request samples and when it stops.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f64,
    /// Nucleus sampling mass in (0, 1]; 1 keeps everything.
    pub top_p: f64,
    /// Keep the `top_k` most likely tokens; 0 or -1 keeps everything.
    pub top_k: i64,
    /// Drop tokens less likely than `min_p` × the most likely one; 0 keeps everything.
    pub min_p: f64,
    /// Divide positive (multiply negative) logits of tokens already in the prompt or output.
    pub repetition_penalty: f64,
    /// Subtract this × the number of times a token occurs in the output so far (-2 to 2).
    pub frequency_penalty: f64,
    /// Subtract this from the logit of every token the output already has (-2 to 2).
    pub presence_penalty: f64,
    /// Added to the logits of these tokens before anything else (OpenAI's `logit_bias`; each
    /// bias in [-100, 100]).
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of this request's generator (with `n` > 1, sample `i` uses `seed + i`).
    pub seed: Option<u64>,
    /// Most tokens to generate (`None`: up to the context limit).
    pub max_tokens: Option<usize>,
    /// Strings that end the generation (not included in the text).
    pub stop: Vec<String>,
    /// Token ids that end the generation (in addition to end-of-sequence).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Alternatives to report per token with their log-probabilities.
    pub top_logprobs: usize,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// A grammar every sample must follow ([`super::grammar`]): only tokens it allows are
    /// drawn, and once it is complete only end-of-sequence.
    pub constraint: Option<Arc<Constraint>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            max_tokens: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            top_logprobs: 0,
            skip_special_tokens: true,
            constraint: None,
        }
    }
}

impl SamplingParams {
    /// Checks every value; the error names the parameter.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.top_k < -1 {
            return Err(format!(
                "top_k must be -1 (off), 0 (off) or positive, got {}",
                self.top_k
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(format!(
                "repetition_penalty must be > 0, got {}",
                self.repetition_penalty
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(v.is_finite() && (-2.0..=2.0).contains(&v)) {
                return Err(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        if let Some((t, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(b.is_finite() && (-100.0..=100.0).contains(b)))
        {
            return Err(format!(
                "logit_bias values must be in [-100, 100], got {b} for token {t}"
            ));
        }
        if self.max_tokens == Some(0) {
            return Err("max_tokens must be at least 1".into());
        }
        if self.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {}",
                self.top_logprobs
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err("stop strings must not be empty".into());
        }
        if self.ignore_eos && self.constraint.is_some() {
            return Err(
                "ignore_eos cannot be combined with a grammar constraint (a complete grammar allows only end-of-sequence)"
                    .into(),
            );
        }
        Ok(())
    }

    fn greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW
    }
}

/// A sequence's random generator (SplitMix64): cheap, seedable, independent per sequence.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator seeded from the clock and a process-wide counter.
    pub fn from_entropy() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self(t ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform number in (0, 1].
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// A uniform index in `0..n` (`n` ≥ 1): seeded shuffles and draws.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.uniform() * n as f64) as usize).min(n - 1)
    }
}

/// One row of a sampling step.
pub struct Row<'a> {
    /// The request's parameters.
    pub params: &'a SamplingParams,
    /// The sequence's generator.
    pub rng: &'a mut Rng,
    /// Prompt and output so far (for the penalties).
    pub seen: &'a [u32],
    /// How many of `seen` are the prompt (the frequency and presence penalties count the rest).
    pub prompt_len: usize,
    /// The tokens a grammar allows next, as bit words (bit `i % 32` of word `i / 32` is token
    /// `i`); `None` allows every token.
    pub allowed: Option<&'a [u32]>,
}

/// A sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// Its log-probability under the sampler (see the module docs).
    pub logprob: f32,
    /// The most likely alternatives, best first, when asked for.
    pub top: Vec<(u32, f32)>,
}

/// Samples one token per row of `logits` `[rows, vocab]`.
pub fn sample(logits: &Tensor, rows: &mut [Row<'_>]) -> Vec<Sampled> {
    tch::no_grad(|| sample_impl(logits, rows))
}

fn sample_impl(logits: &Tensor, rows: &mut [Row<'_>]) -> Vec<Sampled> {
    let (b, v) = logits.size2().expect("logits are [rows, vocab]");
    assert_eq!(b as usize, rows.len(), "one row per sequence");
    let device = logits.device();
    let logits = logits.to_kind(Kind::Float).copy();
    for (r, row) in rows.iter().enumerate() {
        adjust_row(&logits.get(r as i64), row, v, device);
    }
    let col = |f: &dyn Fn(&SamplingParams) -> f64| {
        let vals: Vec<f32> = rows.iter().map(|r| f(r.params) as f32).collect();
        Tensor::from_slice(&vals).to_device(device).unsqueeze(1)
    };
    let temps = col(&|p| if p.greedy() { 1.0 } else { p.temperature });
    let logp = (&logits / &temps).log_softmax(-1, Kind::Float);
    let drawn_from = apply_masks(&logp, rows);
    let drawn_from = drawn_from.as_ref().unwrap_or(&logp);
    let any_sampled = rows.iter().any(|r| !r.params.greedy());
    let mut chosen = drawn_from.argmax(-1, false);
    if any_sampled {
        let mut probs = drawn_from.exp();
        if rows.iter().any(|r| r.params.min_p > 0.0) {
            let floor = probs.amax(-1, true) * col(&|p| p.min_p);
            probs = probs.masked_fill(&probs.lt_tensor(&floor), 0.0);
        }
        let top_k = |p: &SamplingParams| p.top_k > 0 && p.top_k < v;
        if rows.iter().any(|r| top_k(r.params) || r.params.top_p < 1.0) {
            let ks: Vec<i64> = rows
                .iter()
                .map(|r| if top_k(r.params) { r.params.top_k } else { v })
                .collect();
            let ps: Vec<f64> = rows.iter().map(|r| r.params.top_p).collect();
            probs = truncate(&probs, &ks, &ps);
        }
        let cdf = probs.cumsum(-1, Kind::Float);
        let total = cdf.narrow(-1, v - 1, 1);
        let us: Vec<f32> = rows.iter_mut().map(|r| r.rng.uniform() as f32).collect();
        let target = Tensor::from_slice(&us).to_device(device).unsqueeze(1) * total;
        let drawn = target
            .searchsorted(&cdf, false, false, "left", None::<Tensor>)
            .clamp(0, v - 1)
            .squeeze_dim(1);
        let greedy: Vec<bool> = rows.iter().map(|r| r.params.greedy()).collect();
        let greedy = Tensor::from_slice(&greedy).to_device(device);
        chosen = chosen.where_self(&greedy, &drawn);
    }
    let chosen_lp = logp.gather(-1, &chosen.unsqueeze(1), false).squeeze_dim(1);
    // Ids and log-probs come back in one copy (one wait for a GPU): as f64, exact for both.
    let both: Vec<f64> = Vec::try_from(
        Tensor::cat(
            &[
                chosen.to_kind(Kind::Double),
                chosen_lp.to_kind(Kind::Double),
            ],
            0,
        )
        .to_device(tch::Device::Cpu),
    )
    .expect("ids and logprobs");
    let (tokens, lps) = both.split_at(b as usize);
    let tokens: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    let lps: Vec<f32> = lps.iter().map(|&l| l as f32).collect();
    let n_top = rows
        .iter()
        .map(|r| r.params.top_logprobs)
        .max()
        .unwrap_or(0);
    let (top_vals, top_ids): (Vec<f32>, Vec<i64>) = if n_top > 0 {
        let (vals, ids) = logp.topk(n_top as i64, -1, true, true);
        let both: Vec<f64> = Vec::try_from(
            Tensor::cat(
                &[
                    vals.to_kind(Kind::Double).reshape([-1]),
                    ids.to_kind(Kind::Double).reshape([-1]),
                ],
                0,
            )
            .to_device(tch::Device::Cpu),
        )
        .expect("top logprobs");
        let (vals, ids) = both.split_at(both.len() / 2);
        (
            vals.iter().map(|&x| x as f32).collect(),
            ids.iter().map(|&x| x as i64).collect(),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    rows.iter()
        .enumerate()
        .map(|(r, row)| Sampled {
            token: tokens[r] as u32,
            logprob: lps[r],
            top: (0..row.params.top_logprobs)
                .map(|j| (top_ids[r * n_top + j] as u32, top_vals[r * n_top + j]))
                .collect(),
        })
        .collect()
}

/// Candidates a top-p row without top-k considers before sorting its whole vocabulary: the
/// nucleus of a trained model's distribution is almost always far smaller.
const TOP_P_CANDIDATES: i64 = 1024;

/// Top-k and top-p truncation of `probs` `[rows, vocab]` (unnormalised), as vLLM: row `r` keeps
/// its `ks[r]` most likely tokens (`vocab`: all), renormalised, then the smallest prefix of them
/// whose mass reaches `ps[r]` (≥ 1: all). Rows asking for neither are left as they are.
///
/// Only the candidates a row can keep are selected (`topk`, a partial selection): its `k`, or
/// [`TOP_P_CANDIDATES`] for a top-p row without top-k. A batch where such a row's nucleus
/// reaches past its candidates falls back to sorting the vocabulary ([`truncate_by_sort`]).
pub fn truncate(probs: &Tensor, ks: &[i64], ps: &[f64]) -> Tensor {
    let (_, v) = probs.size2().expect("probs are [rows, vocab]");
    let device = probs.device();
    let only_p = |r: usize| ks[r] >= v && ps[r] < 1.0;
    let mut cand = ks.iter().copied().filter(|&k| k < v).max().unwrap_or(0);
    if (0..ks.len()).any(only_p) {
        cand = cand.max(TOP_P_CANDIDATES);
    }
    if cand >= v {
        return truncate_by_sort(probs, ks, ps);
    }
    let (vals, order) = probs.topk(cand, -1, true, true);
    let rank = Tensor::arange(cand, (Kind::Int64, device)).unsqueeze(0);
    let ks_col = Tensor::from_slice(ks).to_device(device).unsqueeze(1);
    let kept = &vals * rank.lt_tensor(&ks_col).to_kind(Kind::Float);
    // Top-k rows renormalise over their k; top-p-only rows over the whole vocabulary.
    let has_k: Vec<bool> = ks.iter().map(|&k| k < v).collect();
    let has_k = Tensor::from_slice(&has_k).to_device(device).unsqueeze(1);
    let mass = kept
        .sum_dim_intlist(-1, true, Kind::Float)
        .where_self(&has_k, &probs.sum_dim_intlist(-1, true, Kind::Float));
    let renorm = &kept / &mass;
    let p_of = |p: f64| if p < 1.0 { p as f32 } else { 2.0 };
    let p_col: Vec<f32> = ps.iter().map(|&p| p_of(p)).collect();
    let p_col = Tensor::from_slice(&p_col).to_device(device).unsqueeze(1);
    // A top-p-only row whose candidates hold less than its `p` needs tokens past them.
    let reached = renorm
        .sum_dim_intlist(-1, true, Kind::Float)
        .ge_tensor(&p_col);
    let only: Vec<bool> = (0..ks.len()).map(only_p).collect();
    let only = Tensor::from_slice(&only).to_device(device).unsqueeze(1);
    if only
        .logical_and(&reached.logical_not())
        .any()
        .int64_value(&[])
        != 0
    {
        return truncate_by_sort(probs, ks, ps);
    }
    // Keep the smallest prefix whose mass reaches top_p (the first token always).
    let before = renorm.cumsum(-1, Kind::Float) - &renorm;
    let keep = before.lt_tensor(&p_col).to_kind(Kind::Float);
    let truncated = probs.zeros_like().scatter(-1, &order, &(kept * keep));
    let asks: Vec<bool> = (0..ks.len()).map(|r| ks[r] < v || ps[r] < 1.0).collect();
    let asks = Tensor::from_slice(&asks).to_device(device).unsqueeze(1);
    truncated.where_self(&asks, probs)
}

/// [`truncate`] by sorting each row's whole vocabulary: the general case, and the reference
/// the partial selection is tested against.
pub fn truncate_by_sort(probs: &Tensor, ks: &[i64], ps: &[f64]) -> Tensor {
    let (_, v) = probs.size2().expect("probs are [rows, vocab]");
    let device = probs.device();
    let (sorted, order) = probs.sort(-1, true);
    let rank = Tensor::arange(v, (Kind::Int64, device)).unsqueeze(0);
    let keep_k = rank.lt_tensor(&Tensor::from_slice(ks).to_device(device).unsqueeze(1));
    let kept = &sorted * keep_k.to_kind(Kind::Float);
    let renorm = &kept / kept.sum_dim_intlist(-1, true, Kind::Float);
    // Keep the smallest prefix whose mass reaches top_p (the first token always).
    let before = renorm.cumsum(-1, Kind::Float) - &renorm;
    let p_col: Vec<f32> = ps
        .iter()
        .map(|&p| if p < 1.0 { p as f32 } else { 2.0 })
        .collect();
    let p_col = Tensor::from_slice(&p_col).to_device(device).unsqueeze(1);
    let keep = before.lt_tensor(&p_col).to_kind(Kind::Float);
    probs.zeros_like().scatter(-1, &order, &(kept * keep))
}

/// Applies `row`'s logit bias and penalties to its logits `line` `[vocab]` in place; rows that ask
/// for none cost nothing. Every step is a sparse update over the tokens concerned.
fn adjust_row(line: &Tensor, row: &Row<'_>, vocab: i64, device: tch::Device) {
    let p = row.params;
    let mut line = line.shallow_clone();
    let add = |line: &mut Tensor, pairs: Vec<(i64, f32)>| {
        let (idx, val): (Vec<i64>, Vec<f32>) = pairs
            .into_iter()
            .filter(|&(t, _)| (0..vocab).contains(&t))
            .unzip();
        if !idx.is_empty() {
            let idx = Tensor::from_slice(&idx).to_device(device);
            let val = Tensor::from_slice(&val).to_device(device);
            let _ = line.index_add_(0, &idx, &val);
        }
    };
    if !p.logit_bias.is_empty() {
        add(
            &mut line,
            p.logit_bias
                .iter()
                .map(|&(t, b)| (i64::from(t), b))
                .collect(),
        );
    }
    if p.repetition_penalty != 1.0 && !row.seen.is_empty() {
        let mut seen: Vec<i64> = row.seen.iter().map(|&t| i64::from(t)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.retain(|&t| t < vocab);
        let idx = Tensor::from_slice(&seen).to_device(device);
        let vals = line.index_select(0, &idx);
        let rp = p.repetition_penalty;
        let penalised = (&vals / rp).where_self(&vals.gt(0.0), &(&vals * rp));
        let _ = line.index_copy_(0, &idx, &penalised);
    }
    let output = &row.seen[row.prompt_len.min(row.seen.len())..];
    if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) && !output.is_empty() {
        let mut counts = std::collections::BTreeMap::<u32, u32>::new();
        for &t in output {
            *counts.entry(t).or_default() += 1;
        }
        add(
            &mut line,
            counts
                .into_iter()
                .map(|(t, c)| {
                    let d = p.frequency_penalty * f64::from(c) + p.presence_penalty;
                    (i64::from(t), -d as f32)
                })
                .collect(),
        );
    }
}

/// The log-probabilities to draw from when some rows carry a grammar mask: disallowed tokens at
/// -inf, and each masked row shifted so its best allowed token is at 0 (the allowed mass can be
/// too small for `exp` in f32; the draw only needs ratios). Unmasked rows are left exactly as
/// they are, so a seeded row draws the same tokens whatever shares its batch. `None` when no row
/// is masked (the common case costs nothing).
fn apply_masks(logp: &Tensor, rows: &[Row<'_>]) -> Option<Tensor> {
    if rows.iter().all(|r| r.allowed.is_none()) {
        return None;
    }
    let (b, v) = logp.size2().expect("[rows, vocab]");
    let device = logp.device();
    let words = (v as usize).div_ceil(32);
    let mut bits: Vec<i32> = vec![-1; b as usize * words];
    for (r, row) in rows.iter().enumerate() {
        if let Some(a) = row.allowed {
            let line = &mut bits[r * words..(r + 1) * words];
            line.fill(0);
            for (dst, &src) in line.iter_mut().zip(a) {
                *dst = src as i32;
            }
        }
    }
    // Unpack the bit words on the device: [b, words, 32] → [b, v].
    let shifts = Tensor::arange(32, (Kind::Int, device));
    let allowed = Tensor::from_slice(&bits)
        .to_device(device)
        .view([b, words as i64, 1])
        .bitwise_right_shift(&shifts)
        .bitwise_and(1)
        .view([b, words as i64 * 32])
        .narrow(1, 0, v)
        .to_kind(Kind::Bool);
    let masked = logp.masked_fill(&allowed.logical_not(), f64::NEG_INFINITY);
    let is_masked: Vec<bool> = rows.iter().map(|r| r.allowed.is_some()).collect();
    let is_masked = Tensor::from_slice(&is_masked)
        .to_device(device)
        .unsqueeze(1);
    let best = masked.amax(-1, true);
    let shift = best
        .zeros_like()
        .where_self(&is_masked.logical_not(), &best);
    Some(masked - shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::rounding::{log_softmax_error, unit_roundoff};

    fn run(logits: &[f32], params: &SamplingParams, seen: &[u32], rng: &mut Rng) -> Sampled {
        let t = Tensor::from_slice(logits).unsqueeze(0);
        let mut rows = [Row {
            params,
            rng,
            seen,
            prompt_len: 0,
            allowed: None,
        }];
        sample(&t, &mut rows).remove(0)
    }

    #[test]
    fn greedy_takes_the_argmax_with_its_log_softmax() {
        let p = SamplingParams {
            temperature: 0.0,
            top_logprobs: 2,
            ..Default::default()
        };
        let s = run(&[0.0, 3.0, 1.0, 2.0], &p, &[], &mut Rng::new(1));
        assert_eq!(s.token, 1);
        let z: f32 = [0.0f32, 3.0, 1.0, 2.0].iter().map(|x| x.exp()).sum();
        // Two f32 log-softmaxes of 4 logits up to 3 (the sampler's, and this one unshifted).
        let bound = 2.0 * log_softmax_error(4, 3.0);
        assert!(f64::from((s.logprob - (3.0 - z.ln())).abs()) <= bound);
        assert_eq!(s.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3]);
    }

    /// The empirical distribution matches softmax(logits / T) (chi-square-style bound), and
    /// the reported log-probs are exactly log_softmax(logits / T).
    #[test]
    fn sampling_follows_the_tempered_distribution() {
        let logits = [1.0f32, 2.0, 0.5, -1.0, 1.5];
        let t = 0.7;
        let p = SamplingParams {
            temperature: t,
            ..Default::default()
        };
        let z: f64 = logits.iter().map(|&x| (f64::from(x) / t).exp()).sum();
        let want: Vec<f64> = logits
            .iter()
            .map(|&x| (f64::from(x) / t).exp() / z)
            .collect();
        let mut counts = [0usize; 5];
        let mut rng = Rng::new(7);
        let n = 20_000;
        // The f32 log-softmax of 5 logits up to 2/0.7 against the f64 one.
        let bound = log_softmax_error(5, 2.0 / t);
        for _ in 0..n {
            let s = run(&logits, &p, &[], &mut rng);
            counts[s.token as usize] += 1;
            let lp = want[s.token as usize].ln();
            assert!((f64::from(s.logprob) - lp).abs() <= bound);
        }
        for (i, &c) in counts.iter().enumerate() {
            let freq = c as f64 / n as f64;
            let sd = (want[i] * (1.0 - want[i]) / n as f64).sqrt();
            assert!(
                (freq - want[i]).abs() < 5.0 * sd,
                "token {i}: {freq} vs {}",
                want[i]
            );
        }
    }

    #[test]
    fn truncation_keeps_only_allowed_tokens() {
        let logits = [3.0f32, 2.9, 2.8, 0.0, -5.0];
        let cases = [
            (
                SamplingParams {
                    top_k: 2,
                    ..Default::default()
                },
                vec![0, 1],
            ),
            (
                // Probabilities ≈ .34 .31 .28 .017 …: 0.6 needs the first two.
                SamplingParams {
                    top_p: 0.6,
                    ..Default::default()
                },
                vec![0, 1],
            ),
            (
                SamplingParams {
                    min_p: 0.5,
                    ..Default::default()
                },
                vec![0, 1, 2],
            ),
        ];
        for (p, allowed) in cases {
            let mut rng = Rng::new(3);
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..2000 {
                seen.insert(run(&logits, &p, &[], &mut rng).token);
            }
            assert_eq!(seen.into_iter().collect::<Vec<_>>(), allowed, "{p:?}");
        }
    }

    /// The partial selection keeps exactly what sorting the vocabulary keeps, for every mix of
    /// top-k, top-p, both and neither in one batch, at a real vocabulary size; a flat
    /// distribution whose nucleus passes the candidates takes the sorting path.
    #[test]
    fn partial_selection_truncates_as_the_full_sort() {
        let v = 151_936;
        tch::manual_seed(11);
        // Peaked rows (a trained model's) and one nearly flat row.
        let peaked =
            (Tensor::randn([5, v], (Kind::Float, tch::Device::Cpu)) * 4.0).softmax(-1, Kind::Float);
        let flat = (Tensor::randn([1, v], (Kind::Float, tch::Device::Cpu)) * 0.01)
            .softmax(-1, Kind::Float);
        let probs = Tensor::cat(&[&peaked, &flat], 0);
        let cases: [(&[i64], &[f64]); 4] = [
            (&[20, v, 50, v, 1, v], &[1.0, 0.9, 0.95, 1.0, 1.0, 1.0]),
            (&[v, v, v, v, v, v], &[0.5, 0.9, 0.99, 1.0, 0.7, 1.0]),
            (&[5, 40, v, v, 1000, 7], &[0.3, 1.0, 1.0, 1.0, 0.8, 0.5]),
            // The flat row's nucleus at 0.9 spans most of the vocabulary: full sort.
            (&[v, v, v, v, v, v], &[1.0, 1.0, 1.0, 1.0, 1.0, 0.9]),
        ];
        for (ks, ps) in cases {
            let fast = truncate(&probs, ks, ps);
            let reference = truncate_by_sort(&probs, ks, ps);
            let diff = (&fast - &reference).abs().max().double_value(&[]);
            assert!(diff == 0.0, "{ks:?} {ps:?}: differs by {diff}");
            // Rows asking for nothing are untouched.
            for r in 0..6 {
                if ks[r] >= v && ps[r] >= 1.0 {
                    assert!(fast.get(r as i64).equal(&probs.get(r as i64)));
                }
            }
        }
        // Each top-k row keeps exactly k tokens (no ties in random logits).
        let fast = truncate(&probs, &[20, v, 50, v, 1, v], &[1.0; 6]);
        let kept = fast.gt(0.0).sum_dim_intlist(-1, false, Kind::Int64);
        let kept: Vec<i64> = Vec::try_from(kept).unwrap();
        assert_eq!(kept, [20, v, 50, v, 1, v]);
    }

    /// A mask restricts what is drawn, greedy or sampled, even to tokens whose probability
    /// underflows; the reported log-prob stays the unmasked one.
    #[test]
    fn a_mask_restricts_the_draw_but_not_the_logprob() {
        let logits = [0.0f32, 200.0, 1.0, 2.0, -300.0];
        // Tokens 2 and 4 allowed (bits 2 and 4).
        let allowed = [0b10100u32];
        let z: f32 = logits.iter().map(|&x| (x - 200.0).exp()).sum::<f32>().ln() + 200.0;
        // Two f32 log-softmaxes of 5 logits up to 300 in magnitude.
        let bound = 2.0 * log_softmax_error(5, 300.0);
        for temperature in [0.0, 1.0] {
            let p = SamplingParams {
                temperature,
                top_k: 1,
                ..Default::default()
            };
            let mut rng = Rng::new(5);
            for _ in 0..50 {
                let t = Tensor::from_slice(&logits).unsqueeze(0);
                let mut rows = [Row {
                    params: &p,
                    rng: &mut rng,
                    seen: &[],
                    prompt_len: 0,
                    allowed: Some(&allowed),
                }];
                let s = sample(&t, &mut rows).remove(0);
                assert_eq!(s.token, 2, "T={temperature}");
                assert!(
                    f64::from((s.logprob - (1.0 - z)).abs()) <= bound,
                    "{}",
                    s.logprob
                );
            }
        }
        // Sampled without truncation: both allowed tokens appear, nothing else.
        let p = SamplingParams::default();
        let mut rng = Rng::new(9);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..400 {
            let t = Tensor::from_slice(&[0.0f32, 0.0, 0.0, 0.0, 0.5]).unsqueeze(0);
            let mut rows = [Row {
                params: &p,
                rng: &mut rng,
                seen: &[],
                prompt_len: 0,
                allowed: Some(&allowed),
            }];
            seen.insert(sample(&t, &mut rows)[0].token);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![2, 4]);
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let p = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..Default::default()
        };
        // 3.0 / 2 < 2.0: the seen best token loses to the unseen second.
        assert_eq!(run(&[3.0, 2.0, 0.0], &p, &[0], &mut Rng::new(0)).token, 1);
        assert_eq!(run(&[3.0, 2.0, 0.0], &p, &[2], &mut Rng::new(0)).token, 0);
    }

    /// OpenAI's definitions on output tokens only: `logit - frequency × count - presence`; the
    /// bias is added first and shows in the reported log-prob; the prompt is not counted.
    #[test]
    fn frequency_presence_and_bias_follow_openai() {
        let logits = [3.0f32, 2.5, 0.0, 1.0];
        let greedy = |p: SamplingParams, seen: &[u32], prompt_len: usize| {
            let t = Tensor::from_slice(&logits).unsqueeze(0);
            let mut rng = Rng::new(0);
            let mut rows = [Row {
                params: &p,
                rng: &mut rng,
                seen,
                prompt_len,
                allowed: None,
            }];
            sample(&t, &mut rows).remove(0)
        };
        let base = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        // Token 0 twice in the output: 3.0 - 0.3 × 2 = 2.4 < 2.5.
        let freq = SamplingParams {
            frequency_penalty: 0.3,
            ..base.clone()
        };
        assert_eq!(greedy(freq.clone(), &[0, 0], 0).token, 1);
        assert_eq!(greedy(freq.clone(), &[0], 0).token, 0);
        // The same tokens in the prompt are not counted.
        assert_eq!(greedy(freq, &[0, 0], 2).token, 0);
        // Presence is once per token, whatever the count.
        let pres = SamplingParams {
            presence_penalty: 0.6,
            ..base.clone()
        };
        assert_eq!(greedy(pres.clone(), &[0], 0).token, 1);
        // Both seen: each loses 0.6 once (2.4 > 1.9), and the log-prob is the shifted one's.
        let s = greedy(pres, &[0, 0, 0, 1], 0);
        assert_eq!(s.token, 0);
        let shifted = [2.4f32, 1.9, 0.0, 1.0];
        let z: f32 = shifted.iter().map(|x| x.exp()).sum();
        // Two f32 log-softmaxes of 4 logits up to 3, and the penalties' f32 subtractions
        // (`u` relative to at most 3, in the token's logit and the normaliser's largest).
        let u = unit_roundoff(Kind::Float);
        let bound = 2.0 * log_softmax_error(4, 3.0) + 2.0 * u * 3.0;
        assert!(
            f64::from((s.logprob - (2.4 - z.ln())).abs()) <= bound,
            "{}",
            s.logprob
        );
        // A negative penalty favours repeats.
        let neg = SamplingParams {
            frequency_penalty: -1.0,
            ..base.clone()
        };
        assert_eq!(greedy(neg, &[1], 0).token, 1);
        // Bias: -100 bans, +100 forces; the log-prob is the biased distribution's.
        let bias = SamplingParams {
            logit_bias: vec![(0, -100.0), (2, 1.0)],
            ..base.clone()
        };
        let s = greedy(bias, &[], 0);
        assert_eq!(s.token, 1);
        let biased = [-97.0f32, 2.5, 1.0, 1.0];
        let z: f32 = biased.iter().map(|x| x.exp()).sum();
        // As above, with logits up to 97 in magnitude.
        let bound = 2.0 * log_softmax_error(4, 97.0) + 2.0 * u * 97.0;
        assert!(f64::from((s.logprob - (2.5 - z.ln())).abs()) <= bound);
        let forced = SamplingParams {
            temperature: 1.0,
            logit_bias: vec![(2, 100.0)],
            ..Default::default()
        };
        let mut rng = Rng::new(5);
        for _ in 0..200 {
            assert_eq!(run(&logits, &forced, &[], &mut rng).token, 2);
        }
    }

    #[test]
    fn a_seeded_row_ignores_its_batch() {
        let p = SamplingParams::default();
        let other = SamplingParams {
            temperature: 0.3,
            top_k: 3,
            ..Default::default()
        };
        let logits = Tensor::from_slice(&[0.1f32, 0.2, 0.3, 0.4, 0.0, 0.5, 0.9, 0.1]).view([2, 4]);
        let alone = {
            let mut rng = Rng::new(42);
            let mut rows = [Row {
                params: &p,
                rng: &mut rng,
                seen: &[],
                prompt_len: 0,
                allowed: None,
            }];
            (0..50)
                .map(|_| sample(&logits.get(0).unsqueeze(0), &mut rows)[0].token)
                .collect::<Vec<_>>()
        };
        let batched = {
            let (mut a, mut b) = (Rng::new(42), Rng::new(9));
            (0..50)
                .map(|_| {
                    let mut rows = [
                        Row {
                            params: &p,
                            rng: &mut a,
                            seen: &[],
                            prompt_len: 0,
                            allowed: None,
                        },
                        Row {
                            params: &other,
                            rng: &mut b,
                            seen: &[],
                            prompt_len: 0,
                            allowed: None,
                        },
                    ];
                    sample(&logits, &mut rows)[0].token
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(alone, batched);
    }

    #[test]
    fn bad_parameters_are_named() {
        let bad = [
            (
                SamplingParams {
                    temperature: -1.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_k: -3,
                    ..Default::default()
                },
                "top_k",
            ),
            (
                SamplingParams {
                    max_tokens: Some(0),
                    ..Default::default()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    frequency_penalty: 2.5,
                    ..Default::default()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: f64::NAN,
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    logit_bias: vec![(1, 101.0)],
                    ..Default::default()
                },
                "logit_bias",
            ),
        ];
        for (p, name) in bad {
            assert!(p.validate().unwrap_err().contains(name), "{name}");
        }
    }
}
