//! `host bench sampler`: the sampler's cost at a real vocabulary against the decode step it
//! ends. A random-weights model of `--preset`'s shape gives the decode step at `--batch` rows;
//! the sampler then runs on logits of that size, peaked as a trained model's are (Gaussian
//! logits × 4: the top token holds about a third of the mass), once per sampling profile. For the
//! truncating profiles the partial selection is timed against sorting the whole vocabulary,
//! which the sampler did before.

use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::engine::sampling::{self, Rng, Row, SamplingParams};
use crate::model::SlotCache;
use crate::model::{Preset, Qwen3, Qwen3Config};

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct SamplerBenchOptions {
    /// Shape of the random-weights model timed for the decode step.
    pub preset: Preset,
    /// Rows sampled together.
    pub batch: usize,
    /// Timed repeats (the median counts).
    pub repeats: usize,
}

/// One sampling profile's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SamplerRow {
    /// The profile (`greedy`, `top_p=0.95`, …).
    pub profile: String,
    /// The whole sampling step, milliseconds (median).
    pub sample_ms: f64,
    /// Its share of decode step + sampling.
    pub share: f64,
    /// For truncating profiles: the truncation by partial selection, and by sorting the whole
    /// vocabulary (the previous way), milliseconds.
    pub truncate_ms: Option<(f64, f64)>,
}

/// What `host bench sampler` measured: the decode step and each profile's sampling cost.
#[derive(Debug, Clone, Serialize)]
pub struct SamplerReport {
    /// Vocabulary size.
    pub vocab: i64,
    /// Rows.
    pub batch: usize,
    /// The model forward of one decode step at `batch` rows, milliseconds (median).
    pub decode_ms: f64,
    /// One row per profile.
    pub rows: Vec<SamplerRow>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn time_ms(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..repeats.max(1))
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

/// The profiles measured: what RL and serving clients ask for.
fn profiles() -> Vec<(&'static str, SamplingParams)> {
    let p = |temperature, top_k, top_p, min_p| SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        ..SamplingParams::default()
    };
    vec![
        ("greedy", p(0.0, -1, 1.0, 0.0)),
        ("temperature=1 (RL)", p(1.0, -1, 1.0, 0.0)),
        ("top_k=20", p(0.7, 20, 1.0, 0.0)),
        ("top_p=0.95", p(1.0, -1, 0.95, 0.0)),
        ("top_k=20 top_p=0.8 (Qwen3)", p(0.7, 20, 0.8, 0.0)),
        ("min_p=0.05", p(1.0, -1, 1.0, 0.05)),
    ]
}

/// Runs the benchmark; `progress` hears what is being measured.
pub fn run(o: &SamplerBenchOptions, progress: &dyn Fn(&str)) -> anyhow::Result<SamplerReport> {
    let cfg = Qwen3Config::preset(o.preset);
    let vocab = cfg.vocab_size;
    let b = o.batch as i64;
    progress("building the random-weights model");
    let mut model = Qwen3::new(cfg, Device::Cpu, Kind::Float, 1)?;
    // As the engine runs it.
    model.prepare_for_inference();
    let decode_ms = tch::no_grad(|| {
        let mut cache = SlotCache::new(&model, b, 64);
        let prompt = 16i64;
        let ids = Tensor::arange(b * prompt, (Kind::Int64, Device::Cpu))
            .remainder(1000)
            .view([b, prompt]);
        let pos = Tensor::arange(prompt, (Kind::Int64, Device::Cpu))
            .unsqueeze(0)
            .expand([b, prompt], false);
        let _ = model.forward_slots(&ids, &pos, &mut cache, 0, prompt);
        progress("timing the decode step");
        let ids = Tensor::ones([b, 1], (Kind::Int64, Device::Cpu));
        let pos = Tensor::full([b, 1], prompt, (Kind::Int64, Device::Cpu));
        time_ms(o.repeats, || {
            let _ = model.forward_slots(&ids, &pos, &mut cache, 0, prompt + 1);
        })
    });
    tch::manual_seed(5);
    let logits = Tensor::randn([b, vocab], (Kind::Float, Device::Cpu)) * 4.0;
    let mut rows = Vec::new();
    for (name, params) in profiles() {
        progress(&format!("sampling: {name}"));
        let mut rngs: Vec<Rng> = (0..o.batch).map(|i| Rng::new(i as u64)).collect();
        let sample_ms = time_ms(o.repeats, || {
            let mut batch: Vec<Row<'_>> = rngs
                .iter_mut()
                .map(|rng| Row {
                    params: &params,
                    rng,
                    seen: &[],
                    prompt_len: 0,
                    allowed: None,
                })
                .collect();
            let _ = sampling::sample(&logits, &mut batch);
        });
        let truncates = (params.top_k > 0 && params.top_k < vocab) || params.top_p < 1.0;
        let truncate_ms = truncates.then(|| {
            let probs = (&logits / params.temperature).softmax(-1, Kind::Float);
            let k = if params.top_k > 0 {
                params.top_k
            } else {
                vocab
            };
            let ks = vec![k; o.batch];
            let ps = vec![params.top_p; o.batch];
            let partial = time_ms(o.repeats, || {
                let _ = tch::no_grad(|| sampling::truncate(&probs, &ks, &ps));
            });
            let sorted = time_ms(o.repeats, || {
                let _ = tch::no_grad(|| sampling::truncate_by_sort(&probs, &ks, &ps));
            });
            (partial, sorted)
        });
        rows.push(SamplerRow {
            profile: name.to_owned(),
            sample_ms,
            share: sample_ms / (decode_ms + sample_ms),
            truncate_ms,
        });
    }
    Ok(SamplerReport {
        vocab,
        batch: o.batch,
        decode_ms,
        rows,
    })
}

impl SamplerReport {
    /// The table `host bench sampler` prints without `--json`.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "sampler at vocabulary {}, batch {}: decode step (model forward) {:.1} ms\n\
             {:<28} {:>10} {:>8} {:>26}\n",
            self.vocab,
            self.batch,
            self.decode_ms,
            "profile",
            "sample ms",
            "share",
            "truncate: partial / sort ms"
        );
        for r in &self.rows {
            let t = r
                .truncate_ms
                .map(|(p, f)| format!("{p:.2} / {f:.2} ({:.1}x)", f / p))
                .unwrap_or_default();
            s.push_str(&format!(
                "{:<28} {:>10.2} {:>7.1}% {:>26}\n",
                r.profile,
                r.sample_ms,
                100.0 * r.share,
                t
            ));
        }
        s
    }
}
