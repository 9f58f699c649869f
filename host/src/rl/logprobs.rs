//! The trainer's log-probabilities at a real vocabulary: the output projection, log-softmax and
//! gather a chunk of positions at a time, forward and backward ([`ChunkedLogprobs`]), so a long
//! row never holds its `[positions, vocab]` logits. Trainer-side (the engine's sampler computes
//! log-probs of one position per row); it must give autograd's values and gradients exactly as
//! the unchunked computation would (tested below).

use tch::{Kind, Tensor};

/// Positions per chunk of the vocabulary projection: about 32 Mi logits (128 MB in f32) at once.
fn chunk_rows(w: &Tensor) -> i64 {
    let vocab = w.size()[0].max(1);
    ((32 << 20) / vocab).max(1)
}

/// Logits up to which [`ChunkedLogprobs::new`] runs plain autograd through them (64 Mi: three
/// f32 copies are under 1 GB): one projection fewer than the chunked passes, so short rows and
/// small vocabularies keep that speed; longer ones go a chunk at a time.
const DIRECT_LOGITS: i64 = 64 << 20;

/// What one pass over the chunks gives: log-probs, entropies, and (for the gradient) each
/// position's `(W[target] − E_p[W]) / T`.
struct ChunkPass {
    logprobs: Tensor,
    entropy: Tensor,
    /// Each position's log-normaliser `logsumexp(z)`.
    lse: Tensor,
    direction: Option<Tensor>,
}

/// One pass over `h` `[n, hidden]` in chunks of `chunk` positions, in f32, without a graph.
fn chunk_pass(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    temperature: f64,
    chunk: i64,
    with_direction: bool,
) -> ChunkPass {
    let n = h.size()[0];
    let w32 = w.detach().to_kind(Kind::Float);
    let (mut lps, mut ents, mut lses, mut dirs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut start = 0;
    while start < n {
        let len = chunk.min(n - start);
        let hc = h.detach().narrow(0, start, len).to_kind(Kind::Float);
        let tc = targets.narrow(0, start, len);
        let z = hc.matmul(&w32.tr()) / temperature;
        let lse = z.logsumexp([-1], true);
        let logp = z.gather(-1, &tc.unsqueeze(-1), false) - &lse;
        let p = (&z - &lse).exp();
        // −Σ p log p = lse − Σ p z.
        let ent = lse.squeeze_dim(-1) - (&p * &z).sum_dim_intlist(-1, false, Kind::Float);
        if with_direction {
            dirs.push((w32.index_select(0, &tc) - p.matmul(&w32)) / temperature);
        }
        lps.push(logp.squeeze_dim(-1));
        ents.push(ent);
        lses.push(lse.squeeze_dim(-1));
        start += len;
    }
    let cat = |v: &[Tensor]| match v.is_empty() {
        true => Tensor::zeros([0], (Kind::Float, h.device())),
        false => Tensor::cat(v, 0),
    };
    ChunkPass {
        logprobs: cat(&lps),
        entropy: cat(&ents),
        lse: cat(&lses),
        direction: with_direction.then(|| match dirs.is_empty() {
            true => Tensor::zeros([0, h.size()[1]], (Kind::Float, h.device())),
            false => Tensor::cat(&dirs, 0),
        }),
    }
}

/// Log-probabilities of `targets` under `softmax(h Wᵀ / T)` for a long sequence without ever
/// holding its `[positions, vocab]` logits: the projection, log-softmax and gather run a chunk
/// of positions at a time, forward and backward.
///
/// `logprobs` is differentiable: its gradient reaches `h` (and so every weight before it) through
/// a linearisation, `h · d` with `d = (W[target] − E_p[W]) / T` computed in the forward chunks,
/// which is exactly `∂ log p / ∂ h`. The output weight's gradient, `Σ g (onehot − p)ᵀ h / T`,
/// needs the loss's gradient `g` of each log-prob, so after `loss.backward()` the caller calls
/// [`ChunkedLogprobs::backward_output_weight`], which recomputes the chunks' probabilities and
/// adds it to `W`'s gradient. Cost: one more projection of every position than plain autograd;
/// peak memory: one chunk's logits instead of three copies of all of them.
pub struct ChunkedLogprobs {
    /// `[n]` log-probabilities, with a graph to `h`.
    pub logprobs: Tensor,
    /// `[n]` entropies of each position's distribution (no graph).
    pub entropy: Tensor,
    /// What the output weight's gradient needs after `backward` (chunked runs only).
    pending: Option<OutputGrad>,
}

/// A chunked run's inputs to the output weight's gradient.
struct OutputGrad {
    /// Holds the log-probs' values; its gradient after `backward` is the loss's `g`.
    leaf: Tensor,
    lse: Tensor,
    h: Tensor,
    w: Tensor,
    targets: Tensor,
    temperature: f64,
    chunk: i64,
}

impl ChunkedLogprobs {
    /// Log-probs of `targets` `[n]` for hidden states `h` `[n, hidden]` and output weight `w`
    /// `[vocab, hidden]` at `temperature`: through the whole logits when they are small
    /// ([`DIRECT_LOGITS`]), a chunk of positions at a time otherwise.
    pub fn new(h: &Tensor, w: &Tensor, targets: &Tensor, temperature: f64) -> Self {
        if h.size()[0] * w.size()[0] > DIRECT_LOGITS {
            return Self::with_chunk(h, w, targets, temperature, chunk_rows(w));
        }
        let z = h.matmul(&w.tr()).to_kind(Kind::Float) / temperature;
        let log_dist = z.log_softmax(-1, Kind::Float);
        let logprobs = log_dist
            .gather(-1, &targets.unsqueeze(-1), false)
            .squeeze_dim(-1);
        let entropy =
            tch::no_grad(|| -(log_dist.exp() * &log_dist).sum_dim_intlist(-1, false, Kind::Float));
        // The output weight's gradient comes from autograd itself.
        Self {
            logprobs,
            entropy,
            pending: None,
        }
    }

    /// As [`ChunkedLogprobs::new`], `chunk` positions at a time.
    pub fn with_chunk(
        h: &Tensor,
        w: &Tensor,
        targets: &Tensor,
        temperature: f64,
        chunk: i64,
    ) -> Self {
        let pass = tch::no_grad(|| chunk_pass(h, w, targets, temperature, chunk.max(1), true));
        let direction = pass.direction.expect("asked for");
        let leaf = pass.logprobs.detach().set_requires_grad(true);
        let h32 = h.to_kind(Kind::Float);
        let linear = (&h32 * &direction).sum_dim_intlist(-1, false, Kind::Float);
        let logprobs = &leaf + (&linear - linear.detach());
        // `+ w·0` puts the output weight in the graph once, so a gradient exists to add to.
        let logprobs = match w.grad().defined() {
            true => logprobs,
            false => logprobs + w.sum(Kind::Float) * 0.0,
        };
        Self {
            logprobs,
            entropy: pass.entropy,
            pending: Some(OutputGrad {
                leaf,
                lse: pass.lse,
                h: h.detach(),
                w: w.shallow_clone(),
                targets: targets.shallow_clone(),
                temperature,
                chunk: chunk.max(1),
            }),
        }
    }

    /// Adds the output weight's gradient, once `backward` ran through `logprobs` (nothing to
    /// add when the logits went through autograd whole).
    pub fn backward_output_weight(&self) {
        let Some(o) = &self.pending else {
            return;
        };
        let g = o.leaf.grad();
        // Nothing to do without a gradient, or for a frozen output weight (LoRA).
        if !g.defined() || !o.w.requires_grad() {
            return;
        }
        tch::no_grad(|| {
            let w32 = o.w.detach().to_kind(Kind::Float);
            let n = o.h.size()[0];
            let mut wg = o.w.grad();
            // Accumulated in place when the gradient is f32; through one f32 sum otherwise.
            let mut grad = match wg.kind() {
                Kind::Float => None,
                _ => Some(w32.zeros_like()),
            };
            let mut start = 0;
            while start < n {
                let len = o.chunk.min(n - start);
                let hc = o.h.narrow(0, start, len).to_kind(Kind::Float);
                let tc = o.targets.narrow(0, start, len);
                let gc = g.narrow(0, start, len).unsqueeze(-1) / o.temperature;
                let lse = o.lse.narrow(0, start, len).unsqueeze(-1);
                // p from the forward's normaliser, then g (onehot − p) / T in place.
                let mut coef = hc.matmul(&w32.tr());
                let _ = coef.g_div_scalar_(o.temperature);
                let _ = coef.g_sub_(&lse);
                let _ = coef.exp_();
                let _ = coef.g_mul_(&gc);
                let _ = coef.neg_();
                let _ = coef.scatter_add_(-1, &tc.unsqueeze(-1), &gc);
                match grad.as_mut() {
                    None => {
                        let _ = wg.addmm_(&coef.tr(), &hc);
                    }
                    Some(acc) => {
                        let _ = acc.addmm_(&coef.tr(), &hc);
                    }
                }
                start += len;
            }
            if let Some(acc) = grad {
                let _ = wg.f_add_(&acc.to_kind(wg.kind())).expect("same shape");
            }
        });
    }
}

/// Log-probabilities of `targets` under `softmax(h Wᵀ / temperature)` and each position's
/// entropy, without a graph: [`ChunkedLogprobs::new`]'s values (for the reference model).
pub fn chunked_logprobs_no_grad(
    h: &Tensor,
    w: &Tensor,
    targets: &Tensor,
    temperature: f64,
) -> (Tensor, Tensor) {
    tch::no_grad(|| {
        let parts = chunk_pass(h, w, targets, temperature, chunk_rows(w), false);
        (parts.logprobs, parts.entropy)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::rounding::{gamma, log_softmax_error, unit_roundoff};
    use tch::Device;

    /// Elementwise bounds on the distance of two f32 computations of the log-probs, entropies
    /// and gradients of `softmax(h Wᵀ / T)` that differ in the order of their sums (chunks of
    /// rows or one product; log-softmax or log-sum-exp; autograd or the linearisation), from
    /// the operands: each side's logits within `γ_hidden · |h|·|W|ᵀ / T` of the exact ones
    /// (`δz`), each probability within `ε_p = 2δz + log_softmax_error + 2u` relative;
    /// - a log-prob `z_t − lse` moves by `2δz` and rounds by `log_softmax_error`;
    /// - an entropy moves by `Σ_j p_j |log p_j + H| · δz` (its gradient is `−p_j (log p_j + H)`)
    ///   and rounds by the log-softmax's error plus a `vocab`-term sum of terms up to `p·|z|`;
    /// - `∂/∂h = coef · (W_t − Σ_j p_j W_j) / T` errs by `ε_p + γ_vocab + 2u` relative to
    ///   `|coef| · (|W_t| + Σ_j p_j |W_j|) / T`;
    /// - `∂/∂W_j = Σ_i coef_i (onehot − p)_ij h_i / T`, an `n`-term sum, by `γ_n + ε_p + 2u`
    ///   relative to `Σ_i |coef_i| (onehot + p)_ij |h_i| / T`;
    ///
    /// and each bound doubled, as both sides err.
    struct ChunkBounds {
        logprobs: Tensor,
        entropy: Tensor,
        grad_h: Tensor,
        grad_w: Tensor,
    }

    impl ChunkBounds {
        fn new(h: &Tensor, w: &Tensor, targets: &Tensor, coef: &Tensor, t: f64) -> Self {
            let (h, w, coef) = (
                h.to_kind(Kind::Double),
                w.to_kind(Kind::Double),
                coef.to_kind(Kind::Double),
            );
            let (n, d) = h.size2().unwrap();
            let v = w.size()[0];
            let u = unit_roundoff(Kind::Float);
            let z = h.matmul(&w.tr()) / t;
            let zmax = z.abs().max().double_value(&[]);
            let dz = (h.abs().matmul(&w.abs().tr()) / t * gamma(d as usize, Kind::Float))
                .amax([-1], false);
            let lsm = log_softmax_error(v as usize, zmax);
            let logp = z.log_softmax(-1, Kind::Double);
            let p = logp.exp();
            let ent = -(&p * &logp).sum_dim_intlist(-1, false, Kind::Double);
            let logprobs = (&dz * 2.0 + lsm) * 2.0;
            let sensitivity =
                (&p * (&logp + ent.unsqueeze(-1)).abs()).sum_dim_intlist(-1, false, Kind::Double);
            let own = (&ent + zmax) * (gamma(v as usize, Kind::Float) + lsm + 2.0 * u) + lsm;
            let entropy = (&sensitivity * &dz + own) * 2.0;
            let eps_p = &dz * 2.0 + lsm + 2.0 * u;
            let onehot = Tensor::zeros([n, v], (Kind::Double, Device::Cpu)).scatter_value(
                -1,
                &targets.unsqueeze(-1),
                1.0,
            );
            let weight = (&onehot + &p).matmul(&w.abs()) * coef.abs().unsqueeze(-1) / t;
            let grad_h =
                weight * (&eps_p + gamma(v as usize, Kind::Float) + 2.0 * u).unsqueeze(-1) * 2.0;
            let scaled = (&onehot + &p)
                * (coef.abs() * (&eps_p + gamma(n as usize, Kind::Float) + 2.0 * u)).unsqueeze(-1);
            let grad_w = scaled.tr().matmul(&h.abs()) / t * 2.0;
            Self {
                logprobs,
                entropy,
                grad_h,
                grad_w,
            }
        }
    }

    /// Values, entropies and gradients (to the hidden states and to the output weight) of the
    /// chunked path equal plain autograd through `[positions, vocab]` logits, for chunk sizes
    /// that split the positions evenly, unevenly, and not at all.
    #[test]
    fn chunked_log_softmax_equals_the_unchunked_one() {
        tch::manual_seed(3);
        let (n, d, v, t) = (37, 16, 301, 0.7);
        let opts = (Kind::Float, Device::Cpu);
        let h0 = Tensor::randn([n, d], opts);
        let w0 = Tensor::randn([v, d], opts) * 0.5;
        let targets = Tensor::randint(v, [n], (Kind::Int64, Device::Cpu));
        let coef = Tensor::randn([n], opts);
        // Reference: autograd through the full logits.
        let h = h0.copy().set_requires_grad(true);
        let w = w0.copy().set_requires_grad(true);
        let logp_full = (h.matmul(&w.tr()) / t)
            .log_softmax(-1, Kind::Float)
            .gather(-1, &targets.unsqueeze(-1), false)
            .squeeze_dim(-1);
        let probs = (h.matmul(&w.tr()) / t).softmax(-1, Kind::Float);
        let ent_full = -(&probs * probs.log()).sum_dim_intlist(-1, false, Kind::Float);
        (&logp_full * &coef).sum(Kind::Float).backward();
        let (gh, gw) = (h.grad(), w.grad());
        let bounds = ChunkBounds::new(&h0, &w0, &targets, &coef, t);
        let close = |a: &Tensor, b: &Tensor, bound: &Tensor, what: &str| {
            let diff = (a - b).abs().to_kind(Kind::Double);
            let worst = (&diff / bound).max().double_value(&[]);
            assert!(
                worst <= 1.0,
                "{what}: differs by up to {worst} of its bound (max {})",
                diff.max().double_value(&[])
            );
        };
        // `None`: `new`, which takes these small logits whole through autograd.
        for chunk in [Some(1), Some(5), Some(10), Some(37), Some(1000), None] {
            let h = h0.copy().set_requires_grad(true);
            let w = w0.copy().set_requires_grad(true);
            let c = match chunk {
                Some(chunk) => ChunkedLogprobs::with_chunk(&h, &w, &targets, t, chunk),
                None => ChunkedLogprobs::new(&h, &w, &targets, t),
            };
            close(&c.logprobs, &logp_full, &bounds.logprobs, "log-probs");
            close(&c.entropy, &ent_full, &bounds.entropy, "entropy");
            (&c.logprobs * &coef).sum(Kind::Float).backward();
            c.backward_output_weight();
            close(&h.grad(), &gh, &bounds.grad_h, "gradient to h");
            close(&w.grad(), &gw, &bounds.grad_w, "gradient to W");
        }
        let (lp, ent) = chunked_logprobs_no_grad(&h0, &w0, &targets, t);
        close(&lp, &logp_full, &bounds.logprobs, "no-grad log-probs");
        close(&ent, &ent_full, &bounds.entropy, "no-grad entropy");
        // A frozen output weight (LoRA): the hidden states get the same gradient, the weight
        // none.
        for chunk in [5, 1000] {
            let h = h0.copy().set_requires_grad(true);
            let c = ChunkedLogprobs::with_chunk(&h, &w0, &targets, t, chunk);
            (&c.logprobs * &coef).sum(Kind::Float).backward();
            c.backward_output_weight();
            close(&h.grad(), &gh, &bounds.grad_h, "gradient to h, frozen W");
            assert!(!w0.grad().defined());
        }
    }
}
