//! How far apart two floating-point computations of one quantity may be when they differ only in
//! rounding (another summation order, another kernel, another library): tolerances that follow
//! from the arithmetic — the sizes of the sums, the dtype, the magnitudes of the operands — for
//! the tests that compare such computations, never a constant that happened to pass on the
//! machine a test was written on. Nothing here may loosen a bound to make a test pass: a bound
//! that a dropped term, a wrong sign or a missing scale could hide under is as wrong as one that
//! rounding can break.
//!
//! Two bounds on the error of a computation that chains `n` roundings of unit roundoff `u` (a sum
//! of `n` terms, an inner product of length `n`, or a path through a network of such steps),
//! relative to the magnitudes of what it sums (`Σ|x_i|`, `|a|ᵀ|b|`), not to its result, which
//! cancellation can make small:
//!
//! - [`gamma`]: `γ_n = n·u / (1 − n·u)` (Higham, *Accuracy and Stability of Numerical
//!   Algorithms*, 2nd ed., §3.1 and Lemma 3.1), which holds for every order of the operations.
//!   For single reductions.
//! - [`gamma_likely`]: `γ̃_n(λ) = exp(λ·√n·u + n·u²/(1 − u)) − 1 ≈ λ·√n·u` (Higham and Mary, "A
//!   new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019,
//!   Theorem 2.4 and its inner products), which holds except with probability
//!   `n·2·exp(−λ²(1 − u)²/2)` when the roundings are independent and of mean zero, as
//!   round-to-nearest's are on operands like a model's. For chains through a whole model: their
//!   worst case (all `N` ≈ 7,000 roundings of a tiny Qwen3's logit in one direction) overstates
//!   the error by `√N` and would let a dropped term pass for rounding.
//!
//! A model's forward pass is bounded as a chain ([`forward_roundings`]): to first order the
//! relative errors of the steps along a logit's path add (Higham, Lemma 3.3, and §3.5 for
//! products of matrices: `γ_{Σn}` relative to the product of their magnitudes), and every
//! sublayer reads its input through an RMSNorm, which divides out the scale of the residual
//! stream, so the stream's relative error is the sum of its sublayers'. What this takes on
//! trust, not proves: that attention, SiLU and the norms pass a relative error of their input on
//! with a gain of about 1. The bounds leave room for that (measured against f64 with
//! transformers' Qwen3: one f32 forward of a tiny Qwen3 errs by 1/270 of [`logit_error`], one of
//! two layers with Qwen3-0.6B's widths by 1/620).

use tch::{Kind, Tensor};

use crate::model::{Qwen3, Qwen3Config};

/// The `λ` of [`gamma_likely`]: a bound over `N` roundings fails with probability at most
/// `N·2·e^(−λ²/2)` = `N·5e-18`; for the ~15,000 roundings of a gradient element and the ~10^6
/// quantities a test run bounds, below 1e-7.
pub const LAMBDA: f64 = 9.0;

/// The unit roundoff of `kind`: half the distance from 1 to the next number, the largest
/// relative error of one rounding to nearest (f32 `2⁻²⁴`, bf16 `2⁻⁸`, f16 `2⁻¹¹`, f64 `2⁻⁵³`).
pub fn unit_roundoff(kind: Kind) -> f64 {
    match kind {
        Kind::Float => f64::from(f32::EPSILON) / 2.0,
        Kind::BFloat16 => 2f64.powi(-8),
        Kind::Half => 2f64.powi(-11),
        Kind::Double => f64::EPSILON / 2.0,
        other => panic!("no unit roundoff for {other:?}"),
    }
}

/// `γ_n = n·u / (1 − n·u)`: the largest relative error of `n` roundings in `kind`, in any order
/// (a sum of `n + 1` terms relative to `Σ|x_i|`).
pub fn gamma(n: usize, kind: Kind) -> f64 {
    let nu = n as f64 * unit_roundoff(kind);
    assert!(nu < 0.5, "{n} roundings in {kind:?}: no bound (n·u = {nu})");
    nu / (1.0 - nu)
}

/// `γ̃_n(λ)` at [`LAMBDA`]: the relative error of `n` roundings in `kind` that independent,
/// mean-zero rounding errors stay within (the module's second bound).
pub fn gamma_likely(n: usize, kind: Kind) -> f64 {
    let u = unit_roundoff(kind);
    let n = n as f64;
    (LAMBDA * n.sqrt() * u + n * u * u / (1.0 - u)).exp_m1()
}

/// Roundings along the path of one logit of a model shaped `cfg` whose queries attend to at most
/// `keys` keys, with LoRA adapters of rank `lora_rank` on every projection (0: none): per layer,
/// the input norm's mean of squares (`hidden` terms) and scaling, the query/key/value products
/// (`hidden`), the head norms (`head_dim`), the rotation, the scores (`head_dim`), the softmax
/// (`keys`), the weighted values (`keys`), the output product (`heads × head_dim`), the residual
/// sum, the post-attention norm (`hidden`), gate and up (`hidden`), SiLU and the gate product,
/// down (`intermediate`) and the residual sum; an adapter lengthens each of the four products
/// on the path by its `rank`-term sum, its scale and its sum into the product; then the final
/// norm (`hidden`) and the output product (`hidden`). Each elementwise step counts a few
/// roundings (3: libm-quality `exp`, `rsqrt` and SiLU err by about an ulp).
pub fn forward_roundings(cfg: &Qwen3Config, keys: usize, lora_rank: usize) -> usize {
    let d = cfg.hidden_size as usize;
    let hd = cfg.head_dim as usize;
    let heads = cfg.num_attention_heads as usize * hd;
    let inter = cfg.intermediate_size as usize;
    let norm = |n: usize| n + 3;
    let adapter = match lora_rank {
        0 => 0,
        r => 4 * (r + 2),
    };
    let attention = norm(d) + d + norm(hd) + 3 + (hd + 1) + (keys + 3) + keys + heads + 1;
    let mlp = norm(d) + d + 3 + inter + 1;
    cfg.num_hidden_layers as usize * (attention + mlp + adapter) + norm(d) + d
}

/// Roundings along the path of one gradient element of a model shaped `cfg` (attending to at
/// most `keys` keys, adapters of rank `lora_rank`) trained on `tokens` tokens in `micro_batches`
/// micro-batches: the forward path to the log-prob, the softmax over the vocabulary and its
/// derivative, the same path back (the transposed products sum as many terms), the sum over the
/// tokens into the weight's gradient and the sum over micro-batches.
pub fn gradient_roundings(
    cfg: &Qwen3Config,
    keys: usize,
    lora_rank: usize,
    tokens: usize,
    micro_batches: usize,
) -> usize {
    let vocab = cfg.vocab_size as usize;
    2 * forward_roundings(cfg, keys, lora_rank) + 2 * (vocab + 3) + tokens + micro_batches
}

/// The largest a logit's terms can weigh, `√hidden · max|g| · max_j ‖W_j‖₂` for the final norm's
/// gain `g` and the output weight's rows `W_j`: the normed hidden state `h` has `‖h‖₂ ≤ √hidden ·
/// max|g|` (unit RMS before the gain), so `Σ_k |W_jk h_k| ≤ ‖W_j‖₂ ‖h‖₂` (Cauchy–Schwarz), and a
/// relative error `ε` of `h` (normwise) moves logit `j` by at most `ε · ‖W_j‖₂ ‖h‖₂`.
pub fn logit_scale(model: &Qwen3) -> f64 {
    tch::no_grad(|| {
        let vars = model.vs.variables();
        let gain = vars
            .get("model.norm.weight")
            .expect("a Qwen3 has a final norm")
            .to_kind(Kind::Double)
            .abs()
            .max()
            .double_value(&[]);
        let rows = model
            .output_weight()
            .to_kind(Kind::Double)
            .norm_scalaropt_dim(2.0, [1], false)
            .max()
            .double_value(&[]);
        (model.cfg.hidden_size as f64).sqrt() * gain * rows
    })
}

/// How far one f32 evaluation of `model`'s logits (queries attending to at most `keys` keys) may
/// be from the exact ones: `γ̃_N · logit_scale`, `N` = [`forward_roundings`] (the module's chain
/// argument). Two evaluations that differ in rounding only are within twice this.
pub fn logit_error(model: &Qwen3, keys: usize) -> f64 {
    let kind = model.weight_kind();
    assert_eq!(kind, Kind::Float, "the chain bound is for f32 models");
    let rank = model.lora().map_or(0, |l| l.config().rank);
    gamma_likely(forward_roundings(&model.cfg, keys, rank), kind) * logit_scale(model)
}

/// bf16 roundings along the path of one logit of a model shaped `cfg` computing in bf16: the
/// weights each product reads (the embedding, query/key/value, output, gate/up, down and the
/// head: one rounding each) and every activation the layers store in bf16 (the input norm's
/// output, the projections', the head norms', the rotation's two, attention's, the output
/// product's, the residual sum, the post-attention norm's, gate/up's, SiLU's, the gate
/// product's, down's and the second residual sum: 14 a layer), then the final norm's output and
/// the logits. Products of bf16 operands accumulate in f32 on every CPU (widened to f32 or by
/// AVX-512 BF16's `vdpbf16ps`), whose error is 2¹⁶ times smaller and not counted.
pub fn bf16_roundings(cfg: &Qwen3Config) -> usize {
    cfg.num_hidden_layers as usize * (4 + 14) + 4
}

/// How far a logit of `model` computed in bf16 may be from the f32 one, under Higham and Mary's
/// model (independent, mean-zero roundings): each of the `N` [`bf16_roundings`] along its path
/// perturbs a tensor by at most `u = 2⁻⁸` relative, element by element; carried to the final
/// normed hidden state `h` with a gain of about 1 (the module's chain argument) and spread over
/// its `hidden` components as `h` is (the norms spread the stream's), the perturbations meet
/// a logit's weight row `W_j` as a sum of independent terms whose standard deviation is at most
/// `√N · u · ‖W_j‖₂ ‖h‖₂ / √hidden`, and which stays within `λ` of them:
/// `λ · √N · u · logit_scale / √hidden`. A model, not a proof (the spread is assumed); the f32
/// chain bound takes the worst direction instead, which f32 can afford and bf16 cannot (it
/// would exceed the logits themselves). Measured: the bf16 forward of a tiny Qwen3 (torch)
/// errs by 1/7 of it at the largest logit of 18,000.
pub fn bf16_logit_error(model: &Qwen3) -> f64 {
    let n = bf16_roundings(&model.cfg) as f64;
    let hidden = model.cfg.hidden_size as f64;
    LAMBDA * n.sqrt() * unit_roundoff(Kind::BFloat16) * logit_scale(model) / hidden.sqrt()
}

/// How far a log-prob of `model` at `temperature` computed in bf16 (its logits taken to f32 for
/// the log-softmax, as the trainer and the engine do) may be from the exact one: `2/T` times
/// [`bf16_logit_error`], plus the f32 log-softmax's rounding.
pub fn bf16_logprob_error(model: &Qwen3, temperature: f64) -> f64 {
    let vocab = model.cfg.vocab_size as usize;
    2.0 * bf16_logit_error(model) / temperature
        + log_softmax_error(vocab, logit_scale(model) / temperature)
}

/// How far the gradient of a step of a bf16 model shaped `cfg` in `micro_batches` micro-batches
/// may be from the f32 step's, normwise, relative to the scale of the terms it sums (the
/// gradient with every advantage positive): the `N` bf16 roundings are the forward pass's
/// ([`bf16_roundings`]) and, for each, the backward pass's of the gradient with respect to
/// that tensor and of the product carrying it on (three a forward rounding), and each
/// micro-batch's weight gradient's; each perturbs the gradient by at most `u = 2⁻⁸` of that
/// scale (gain about 1, the chain argument). Independent and of mean zero, their sum has a
/// root mean square norm of at most `√N · u`, and as each is itself the sum of at least
/// `hidden` independent elementwise roundings, its norm stays within `λ · u · √(N / hidden)` of
/// that (McDiarmid's inequality, each elementwise rounding moving it by at most `u /
/// √hidden`): `u · (√N + λ · √(N / hidden))`. A model, not a proof (the gains and the spread
/// over the elements are assumed); measured: a tiny Qwen3's bf16 step errs by 1/14 of it.
pub fn bf16_gradient_error(cfg: &Qwen3Config, micro_batches: usize) -> f64 {
    let n = (3 * bf16_roundings(cfg) + micro_batches) as f64;
    let hidden = cfg.hidden_size as f64;
    unit_roundoff(Kind::BFloat16) * (n.sqrt() + LAMBDA * (n / hidden).sqrt())
}

/// The rounding error of one f32 log-softmax entry over `vocab` logits of magnitude at most
/// `max_abs` (after the temperature): the temperature's division and the shift by the maximum
/// (`u` each, relative to at most `2·max_abs`), `exp` (two ulps: 2u), the sum of `vocab` positive
/// terms (`γ_{vocab−1}` relative to the sum itself, with no cancellation), its logarithm (`u`
/// relative to at most `ln vocab`), and the final difference (`u` relative to at most
/// `2·max_abs + ln vocab`).
pub fn log_softmax_error(vocab: usize, max_abs: f64) -> f64 {
    let u = unit_roundoff(Kind::Float);
    let ln_v = (vocab as f64).ln();
    let shifted = 2.0 * max_abs;
    // The target's own shifted logit, then the exponentials' arguments and values, the sum.
    let sum = 2.0 * u * shifted + 2.0 * u + gamma(vocab.max(2) - 1, Kind::Float);
    u * shifted + sum + u * ln_v + u * (shifted + ln_v)
}

/// How far one f32 evaluation of a log-prob of `model` at `temperature` (queries attending to at
/// most `keys` keys) may be from the exact one: a log-prob `z_t/T − logsumexp(z/T)` moves by at
/// most `2/T` times the largest logit error ([`logit_error`]), plus the log-softmax's own
/// rounding ([`log_softmax_error`]; logits are at most [`logit_scale`]). Two evaluations that
/// differ in rounding only are within twice this.
pub fn logprob_error(model: &Qwen3, keys: usize, temperature: f64) -> f64 {
    let vocab = model.cfg.vocab_size as usize;
    2.0 * logit_error(model, keys) / temperature
        + log_softmax_error(vocab, logit_scale(model) / temperature)
}

/// Elementwise, how far one f32 evaluation of the product `x · wᵀ` (`x` `[rows, k]`, `w`
/// `[n, k]`) may be from the exact one, in any order of its sums: `γ_k · |x| · |w|ᵀ`.
pub fn product_error(x: &Tensor, w: &Tensor) -> Tensor {
    let k = *x.size().last().expect("a matrix") as usize;
    let magnitude = x
        .to_kind(Kind::Double)
        .abs()
        .matmul(&w.to_kind(Kind::Double).abs().tr());
    magnitude * gamma(k, Kind::Float)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants are the textbook ones, and the probabilistic bound grows as `√n`.
    #[test]
    fn bounds_are_the_textbook_ones() {
        assert_eq!(unit_roundoff(Kind::Float), 2f64.powi(-24));
        assert_eq!(unit_roundoff(Kind::BFloat16), 2f64.powi(-8));
        let u = 2f64.powi(-24);
        assert_eq!(gamma(512, Kind::Float), 512.0 * u / (1.0 - 512.0 * u));
        let (a, b) = (
            gamma_likely(100, Kind::Float),
            gamma_likely(400, Kind::Float),
        );
        assert_eq!(a, (LAMBDA * 10.0 * u + 100.0 * u * u / (1.0 - u)).exp_m1());
        // λ·√n·u to first order: four times the roundings, twice the bound.
        let first_order = LAMBDA * 20.0 * u;
        assert!((b / a - 2.0).abs() <= 2.0 * first_order, "{a} {b}");
        assert!((a - LAMBDA * 10.0 * u).abs() <= first_order * a);
        // The tiny preset's chain at 12 keys: 4 layers of 710 (attention) + 903 (MLP)
        // roundings, then the final norm (195) and the output product (192).
        let tiny = Qwen3Config::preset(crate::model::Preset::Tiny);
        assert_eq!(forward_roundings(&tiny, 12, 0), 4 * (710 + 903) + 195 + 192);
    }
}
