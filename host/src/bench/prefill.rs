//! `host bench prefill`: one prompt's prefill at a real vocabulary, the engine's way (the
//! output head on the last position only, [`Qwen3::forward_slots_last`]) against the way it
//! prefilled before (logits for every prompt position, `[prompt, vocab]`, then the last one
//! kept), on a random-weights model of `--preset`'s shape prepared as the engine prepares its
//! model. Reports each way's time and peak memory (the process's resident high-water mark,
//! reset between the two through `/proc/self/clear_refs`) and checks both give the same
//! next-token logits.

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use super::{Cost, measured};
use crate::model::SlotCache;
use crate::model::{Preset, Qwen3, Qwen3Config};

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct PrefillBenchOptions {
    /// Shape of the random-weights model.
    pub preset: Preset,
    /// Tokens in the prompt.
    pub prompt_len: usize,
}

/// What `host bench prefill` measured: each way's time and memory, and how far they differ.
#[derive(Debug, Clone, Serialize)]
pub struct PrefillReport {
    /// Vocabulary.
    pub vocab: i64,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// The engine's prefill: logits of the last position only.
    pub last_only: Cost,
    /// Logits of every position, then the last one (before).
    pub all_positions: Cost,
    /// Largest difference between the two ways' next-token logits.
    pub max_diff: f64,
}

/// Runs the benchmark; `progress` hears what is being measured.
pub fn run(o: &PrefillBenchOptions, progress: &dyn Fn(&str)) -> anyhow::Result<PrefillReport> {
    let cfg = Qwen3Config::preset(o.preset);
    let vocab = cfg.vocab_size;
    let n = o.prompt_len as i64;
    progress("building the random-weights model");
    let mut model = Qwen3::new(cfg, Device::Cpu, Kind::Float, 1)?;
    model.prepare_for_inference();
    let ids = (Tensor::arange(n, (Kind::Int64, Device::Cpu)) * 7 + 3)
        .remainder(vocab.min(150_000))
        .unsqueeze(0);
    let pos = Tensor::arange(n, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let last = Tensor::from_slice(&[n - 1]);
    tch::no_grad(|| {
        // The engine's cache exists before any prefill: sized here, outside the measurements.
        let mut cache = SlotCache::new(&model, 1, n);
        // One unmeasured pass of each way: first calls allocate libtorch's and oneDNN's state.
        let _ = model.forward_slots_last(&ids, &pos, &mut cache, 0, n, &last);
        let _ = model.forward_slots(&ids, &pos, &mut cache, 0, n);
        progress("last position only (the engine's prefill)");
        let (a, last_only) =
            measured(|| model.forward_slots_last(&ids, &pos, &mut cache, 0, n, &last))?;
        progress("every position (before)");
        let (b, all_positions) = measured(|| {
            model
                .forward_slots(&ids, &pos, &mut cache, 0, n)
                .select(1, -1)
        })?;
        Ok(PrefillReport {
            vocab,
            prompt_len: o.prompt_len,
            last_only,
            all_positions,
            max_diff: (a - b).abs().max().double_value(&[]),
        })
    })
}

impl PrefillReport {
    /// The text `host bench prefill` prints without `--json`.
    pub fn to_text(&self) -> String {
        format!(
            "prefill of a {}-token prompt, vocabulary {}\n\
             {:<34} {:>9} {:>10}\n\
             {:<34} {:>9.3} {:>10.1}\n\
             {:<34} {:>9.3} {:>10.1}\n\
             peak memory {:.1}x smaller, time {:.2}x; max difference of the next-token logits {:.1e}\n",
            self.prompt_len,
            self.vocab,
            "way",
            "seconds",
            "peak MiB",
            "last position only (engine)",
            self.last_only.seconds,
            self.last_only.peak_mib,
            "every position, keep last (before)",
            self.all_positions.seconds,
            self.all_positions.peak_mib,
            self.all_positions.peak_mib / self.last_only.peak_mib.max(1e-9),
            self.last_only.seconds / self.all_positions.seconds,
            self.max_diff
        )
    }
}
