//! `host bench generate`: rlhost's engine against Hugging Face transformers `generate` on the
//! same model folder, greedy, same prompts, same new-token count, same thread count, at several
//! batch sizes, interleaved (rlhost, transformers, rlhost, … per batch size) so both see the
//! same machine state. Reports generated tokens per second, best of the repeats, and the ratio.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use tch::Tensor;

use crate::engine::{Engine, EngineConfig, SamplingParams};

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct GenerateBenchOptions {
    /// The model folder (both sides load it).
    pub model: PathBuf,
    /// Batch sizes to measure.
    pub batch_sizes: Vec<usize>,
    /// Prompt length in tokens.
    pub prompt_len: usize,
    /// Tokens generated per sequence.
    pub new_tokens: usize,
    /// CPU threads of the peer (and the most the engine uses).
    pub threads: usize,
    /// The engine's threads: `None` lets it choose per step size (its default), and the
    /// benchmark then also measures it pinned to one thread, which the default must not lose to.
    pub engine_threads: Option<usize>,
    /// Timed runs per side and batch size (the best counts).
    pub repeats: usize,
    /// The peer's interpreter (transformers installed), or none to measure rlhost alone.
    pub python: Option<PathBuf>,
    /// `scripts/generate-peer.py`.
    pub peer_script: PathBuf,
    /// Weights and activations on both sides.
    pub precision: crate::device::Precision,
    /// Where both sides run.
    pub device: tch::Device,
}

/// One batch size's figures.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateRow {
    /// Sequences generated together.
    pub batch: usize,
    /// rlhost tokens per second (best run).
    pub rlhost_tokens_per_s: f64,
    /// transformers tokens per second (best run), when measured.
    pub transformers_tokens_per_s: Option<f64>,
    /// rlhost / transformers.
    pub ratio: Option<f64>,
    /// Why the peer has no figure at this batch size, when a run of it failed (rlhost's figures
    /// stand; the benchmark goes on).
    pub transformers_error: Option<String>,
    /// rlhost pinned to one thread (best run), when the engine chooses its threads.
    pub rlhost_one_thread_tokens_per_s: Option<f64>,
    /// The weights rlhost read per second, GB/s, counting one pass over them per step of
    /// `batch` tokens (prefill included in the time, so a lower bound of the decode's).
    pub rlhost_weights_gb_per_s: f64,
}

/// What `host bench generate` measured: the setting, then both sides' rates at each batch size.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateReport {
    /// The model folder.
    pub model: String,
    /// Prompt length.
    pub prompt_len: usize,
    /// New tokens per sequence.
    pub new_tokens: usize,
    /// Threads per side.
    pub threads: usize,
    /// `cpu` or `cuda:N`, both sides.
    pub device: String,
    /// `f32` or `bf16`, both sides.
    pub dtype: String,
    /// Bytes of the model's weights.
    pub weight_bytes: u64,
    /// The device's memory read bandwidth (on `threads` threads for the CPU), GB/s: the best of
    /// five sums over 1 GiB with libtorch, measured in the same run.
    pub read_gb_per_s: f64,
    /// Rows per batch size.
    pub rows: Vec<GenerateRow>,
}

/// Prompt of row `r` (shared with the peer script).
pub fn prompt(r: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((r * 131 + i * 17 + 3) % 500) as u32)
        .collect()
}

fn rlhost_run(
    engine: &Engine,
    rt: &tokio::runtime::Runtime,
    o: &GenerateBenchOptions,
    batch: usize,
) -> anyhow::Result<f64> {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(o.new_tokens),
        ignore_eos: true,
        ..Default::default()
    };
    let started = Instant::now();
    let produced = rt.block_on(async {
        let mut rxs = Vec::new();
        for r in 0..batch {
            rxs.push(engine.submit(prompt(r, o.prompt_len), params.clone(), 1)?);
        }
        let mut n = 0;
        for mut rx in rxs {
            n += crate::engine::collect(&mut rx, 1, o.prompt_len).await?[0]
                .token_ids
                .len();
        }
        Ok::<_, anyhow::Error>(n)
    })?;
    anyhow::ensure!(
        produced == batch * o.new_tokens,
        "rlhost generated {produced} tokens"
    );
    Ok(produced as f64 / started.elapsed().as_secs_f64())
}

fn peer_run(python: &Path, o: &GenerateBenchOptions, batch: usize) -> anyhow::Result<f64> {
    let out = std::process::Command::new(python)
        .arg(&o.peer_script)
        .arg("--model")
        .arg(&o.model)
        .args([
            "--batch",
            &batch.to_string(),
            "--prompt-len",
            &o.prompt_len.to_string(),
        ])
        .args([
            "--new-tokens",
            &o.new_tokens.to_string(),
            "--threads",
            &o.threads.to_string(),
        ])
        .args(["--repeats", "1"])
        .args([
            "--dtype",
            match o.precision {
                crate::device::Precision::F32 => "float32",
                crate::device::Precision::Bf16 => "bfloat16",
            },
        ])
        .args(["--device", &crate::device::name(o.device)])
        .env("OMP_WAIT_POLICY", "PASSIVE")
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the transformers peer failed ({}): {}",
        out.status,
        {
            let err = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = err.trim().lines().collect();
            lines[lines.len().saturating_sub(3)..].join(" | ")
        }
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let secs = v["seconds"][0]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("peer output {v}"))?;
    Ok(v["tokens"].as_f64().unwrap_or(0.0) / secs)
}

/// Runs the benchmark; `progress` hears what is being measured.
pub fn run(o: &GenerateBenchOptions, progress: &dyn Fn(&str)) -> anyhow::Result<GenerateReport> {
    let max_batch = o.batch_sizes.iter().copied().max().unwrap_or(1);
    let start = |threads: Option<usize>| {
        Engine::load(
            &o.model,
            "bench",
            o.device,
            o.precision.kind(),
            EngineConfig {
                max_batch_size: max_batch,
                max_model_len: o.prompt_len + o.new_tokens + 1,
                max_queue: max_batch,
                // Every run repeats the same prompts: the prefix cache would skip their
                // prefill from the second run on, and the peer has none.
                prefix_caching: false,
                threads,
                ..EngineConfig::default()
            },
        )
    };
    let engine = start(o.engine_threads)?;
    // On a GPU the CPU threads do not do the arithmetic: no one-thread run.
    let single = match o.engine_threads {
        None if o.threads > 1 && o.device == tch::Device::Cpu => Some(start(Some(1))?),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Warm-up: first calls allocate the cache and fault in libtorch kernels.
    for e in std::iter::once(&engine).chain(&single) {
        rlhost_run(
            e,
            &rt,
            &GenerateBenchOptions {
                new_tokens: 2,
                ..o.clone()
            },
            max_batch,
        )?;
    }
    let cfg = crate::model::Qwen3Config::load(&o.model)?;
    let weight_bytes: u64 = crate::model::checkpoint::parameter_shapes(&cfg)
        .iter()
        .map(|(_, s)| s.iter().product::<i64>() as u64)
        .sum::<u64>()
        * o.precision.kind().elt_size_in_bytes() as u64;
    progress("memory read bandwidth");
    let read_gb_per_s = read_bandwidth(o.threads, o.device);
    let mut rows = Vec::new();
    for &batch in &o.batch_sizes {
        let (mut ours, mut theirs, mut one) = (0f64, None::<f64>, None::<f64>);
        let mut peer_error = None::<String>;
        for rep in 0..o.repeats {
            progress(&format!(
                "batch {batch}: rlhost, run {}/{}",
                rep + 1,
                o.repeats
            ));
            ours = ours.max(rlhost_run(&engine, &rt, o, batch)?);
            if let Some(e) = &single {
                progress(&format!(
                    "batch {batch}: rlhost on one thread, run {}/{}",
                    rep + 1,
                    o.repeats
                ));
                let t = rlhost_run(e, &rt, o, batch)?;
                one = Some(one.map_or(t, |b| b.max(t)));
            }
            if let (Some(py), None) = (&o.python, &peer_error) {
                progress(&format!(
                    "batch {batch}: transformers, run {}/{}",
                    rep + 1,
                    o.repeats
                ));
                match peer_run(py, o, batch) {
                    Ok(t) => theirs = Some(theirs.map_or(t, |b| b.max(t))),
                    Err(e) => {
                        tracing::warn!("batch {batch}: the transformers peer failed: {e:#}");
                        peer_error = Some(format!("{e:#}"));
                        theirs = None;
                    }
                }
            }
        }
        rows.push(GenerateRow {
            batch,
            rlhost_tokens_per_s: ours,
            transformers_tokens_per_s: theirs,
            ratio: theirs.map(|t| ours / t),
            transformers_error: peer_error,
            rlhost_one_thread_tokens_per_s: one,
            rlhost_weights_gb_per_s: ours / batch as f64 * weight_bytes as f64 / 1e9,
        });
    }
    engine.shutdown();
    if let Some(e) = single {
        e.shutdown();
    }
    Ok(GenerateReport {
        model: o.model.display().to_string(),
        prompt_len: o.prompt_len,
        new_tokens: o.new_tokens,
        threads: o.threads,
        device: crate::device::name(o.device),
        dtype: o.precision.to_string(),
        weight_bytes,
        read_gb_per_s,
        rows,
    })
}

/// GB/s of a libtorch sum over 1 GiB of f32 on `device` (`threads` threads on the CPU), best of
/// five. Reading the sum back waits for the device.
fn read_bandwidth(threads: usize, device: tch::Device) -> f64 {
    let before = tch::get_num_threads();
    tch::set_num_threads(threads.max(1) as i32);
    let t = Tensor::ones([1 << 28], (tch::Kind::Float, device));
    let mut best = f64::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        let _ = t.sum(tch::Kind::Float).double_value(&[]);
        best = best.min(started.elapsed().as_secs_f64());
    }
    tch::set_num_threads(before);
    (1u64 << 30) as f64 / best / 1e9
}

impl GenerateReport {
    /// The table `host bench generate` prints without `--json`.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "greedy generation, {} prompt + {} new tokens, {} thread(s), {} on {} (both sides), best of runs\n{}\n\
             weights {:.2} GB; memory read bandwidth {:.1} GB/s{}\n",
            self.prompt_len,
            self.new_tokens,
            self.threads,
            self.dtype,
            self.device,
            self.model,
            self.weight_bytes as f64 / 1e9,
            self.read_gb_per_s,
            if self.device == "cpu" {
                format!(" on {} thread(s)", self.threads)
            } else {
                format!(" ({})", self.device)
            }
        );
        s.push_str(&format!(
            "{:>6} {:>16} {:>22} {:>8} {:>22} {:>18}\n",
            "batch",
            "rlhost tok/s",
            "transformers tok/s",
            "ratio",
            "rlhost 1 thread tok/s",
            "rlhost weights GB/s"
        ));
        for r in &self.rows {
            s.push_str(&format!(
                "{:>6} {:>16.1} {:>22} {:>8} {:>22} {:>18.1}\n",
                r.batch,
                r.rlhost_tokens_per_s,
                r.transformers_tokens_per_s
                    .map_or("-".into(), |t| format!("{t:.1}")),
                r.ratio.map_or("-".into(), |x| format!("{x:.2}x")),
                r.rlhost_one_thread_tokens_per_s
                    .map_or("-".into(), |t| format!("{t:.1}")),
                r.rlhost_weights_gb_per_s
            ));
        }
        for r in &self.rows {
            if let Some(e) = &r.transformers_error {
                s.push_str(&format!("batch {}: {e}\n", r.batch));
            }
        }
        s
    }
}
