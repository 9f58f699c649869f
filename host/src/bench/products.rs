//! `host bench products`: the matrix products of a decode step at a real model size, by each
//! kernel the engine can run them with ([`ProductKernel`]): libtorch's BLAS (MKL in its x86
//! build: what transformers runs), oneDNN on the weights in place, and the few-rows kernel. For
//! each row count, every layer's four products (q/k/v, output, gate/up, down) over random
//! weights of `--preset`'s shapes, streamed from memory as a decode step streams them, and the
//! output head; best of `--repeats`.

use std::time::Instant;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::model::kernels::{
    ProductKernel, bf16_dot, decode_attention, decode_attention_by_products, few_rows,
    onednn_product, product,
};
use crate::model::{Preset, Qwen3Config};

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct ProductsBenchOptions {
    /// Shapes of the weights.
    pub preset: Preset,
    /// Row counts (sequences in a decode step).
    pub rows: Vec<usize>,
    /// Timed sweeps per kernel and row count (the best counts).
    pub repeats: usize,
    /// The weights' and rows' dtype.
    pub dtype: crate::device::Precision,
    /// Keys each row's decode attention reads (its cached positions).
    pub keys: usize,
}

/// A decode step's attention at one row count: libtorch's batched products against the
/// decode attention kernel, every layer, on cache views of `keys` positions.
#[derive(Debug, Clone, Serialize)]
pub struct AttentionTimes {
    /// Rows (sequences) of the step.
    pub rows: usize,
    /// Keys each row reads.
    pub keys: usize,
    /// libtorch's two batched products and softmax, every layer, milliseconds.
    pub libtorch_ms: f64,
    /// [`decode_attention::attend`], every layer, milliseconds; `None` where it does not run
    /// (no AVX2 and FMA).
    pub kernel_ms: Option<f64>,
}

/// One kernel's times at one row count.
#[derive(Debug, Clone, Serialize)]
pub struct KernelTimes {
    /// `blas`, `onednn` or `few_rows`.
    pub kernel: String,
    /// Every layer's products, milliseconds.
    pub layers_ms: f64,
    /// The output head, milliseconds.
    pub head_ms: f64,
}

/// One row count's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ProductsRow {
    /// Rows of `x`.
    pub rows: usize,
    /// Each kernel that runs here.
    pub kernels: Vec<KernelTimes>,
}

/// What `host bench products` measured: times per row count and kernel, and kernels absent here.
#[derive(Debug, Clone, Serialize)]
pub struct ProductsReport {
    /// The weights' and rows' dtype.
    pub dtype: String,
    /// The CPU it ran on.
    pub cpu: String,
    /// Layers.
    pub layers: i64,
    /// Bytes of the layers' weights (f32).
    pub layer_bytes: u64,
    /// libtorch's threads.
    pub threads: i32,
    /// One per row count.
    pub rows: Vec<ProductsRow>,
    /// Kernels that do not run here and why (`onednn` where libtorch lacks it or it refused a
    /// product, `few_rows` without AVX2 and FMA): no column is measured for them.
    pub absent: Vec<AbsentKernel>,
    /// The decode step's attention per row count.
    pub attention: Vec<AttentionTimes>,
    /// How the `few_rows` column computes bf16 products on this CPU: `vdpbf16ps` (AVX-512
    /// BF16, [`bf16_dot`]) or `widened` (bf16 weights widened to f32 in AVX2 registers); `None`
    /// for f32, or where the kernel does not run.
    pub few_rows_bf16: Option<String>,
}

/// A kernel the benchmark could not measure here.
#[derive(Debug, Clone, Serialize)]
pub struct AbsentKernel {
    /// `onednn` or `few_rows`.
    pub kernel: String,
    /// Why it does not run.
    pub reason: String,
}

fn name(k: ProductKernel) -> &'static str {
    match k {
        ProductKernel::Blas => "blas",
        ProductKernel::OneDnn => "onednn",
        ProductKernel::FewRows => "few_rows",
        ProductKernel::Widened => "widened",
    }
}

fn best_ms(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..repeats.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::MAX, f64::min)
}

/// Runs the benchmark; `progress` hears what is being measured.
pub fn run(o: &ProductsBenchOptions, progress: &dyn Fn(&str)) -> anyhow::Result<ProductsReport> {
    let c = Qwen3Config::preset(o.preset);
    let (h, q, kv, i) = (
        c.hidden_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
        c.intermediate_size,
    );
    // (in, out) of each product of a layer, as the engine runs them (q/k/v and gate/up fused).
    let shapes = [(h, q + 2 * kv), (q, h), (h, 2 * i), (i, h)];
    progress("random weights");
    let kind = o.dtype.kind();
    let opts = (Kind::Float, Device::Cpu);
    let random = |shape: [i64; 2], scale: f64| (Tensor::randn(shape, opts) * scale).to_kind(kind);
    let layers: Vec<Vec<Tensor>> = (0..c.num_hidden_layers)
        .map(|_| {
            shapes
                .iter()
                .map(|&(n_in, n_out)| random([n_out, n_in], 0.02))
                .collect()
        })
        .collect();
    let head = random([c.vocab_size, h], 0.02);
    let mut kernels = vec![ProductKernel::Blas];
    if kind == Kind::BFloat16 {
        kernels.push(ProductKernel::Widened);
    }
    let mut absent = Vec::new();
    let mut missing = |k: ProductKernel, reason: String| {
        absent.push(AbsentKernel {
            kernel: name(k).into(),
            reason,
        })
    };
    // oneDNN is measured only where it really runs: [`product`] would fall back to the BLAS
    // silently, and the column would time the BLAS under oneDNN's name.
    if kind != Kind::Float {
        missing(
            ProductKernel::OneDnn,
            "the engine runs oneDNN on f32 products only".into(),
        );
    } else if !tch::utils::has_mkldnn() {
        missing(
            ProductKernel::OneDnn,
            "this libtorch was built without oneDNN".into(),
        );
    } else {
        match tch::no_grad(|| onednn_product(&Tensor::ones([1, h], opts), &layers[0][0])) {
            Ok(_) => kernels.push(ProductKernel::OneDnn),
            Err(e) => missing(
                ProductKernel::OneDnn,
                format!("oneDNN refused a product: {e}"),
            ),
        }
    }
    if few_rows::available() {
        kernels.push(ProductKernel::FewRows);
    } else {
        missing(
            ProductKernel::FewRows,
            "this CPU lacks AVX2 or FMA (or is not x86-64)".into(),
        );
    }
    let mut rows = Vec::new();
    tch::no_grad(|| {
        for &m in &o.rows {
            let xs: Vec<Tensor> = shapes
                .iter()
                .map(|&(n_in, _)| random([m as i64, n_in], 1.0))
                .collect();
            let mut times = Vec::new();
            for &k in &kernels {
                progress(&format!("{m} rows: {}", name(k)));
                let layers_ms = best_ms(o.repeats, || {
                    for layer in &layers {
                        for (x, w) in xs.iter().zip(layer) {
                            let _ = product(k, x, w);
                        }
                    }
                });
                let head_ms = best_ms(o.repeats, || {
                    let _ = product(k, &xs[0], &head);
                });
                times.push(KernelTimes {
                    kernel: name(k).into(),
                    layers_ms,
                    head_ms,
                });
            }
            rows.push(ProductsRow {
                rows: m,
                kernels: times,
            });
        }
    });
    // The attention of a decode step: one query per row and head over `keys` cached positions,
    // the keys and values narrowed out of a longer cache slab as the engine's slots hold them.
    let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let keys = o.keys as i64;
    let mut attention = Vec::new();
    tch::no_grad(|| {
        for &m in &o.rows {
            let b = m as i64;
            progress(&format!("{m} rows: decode attention over {keys} keys"));
            let slab = || random([b * nkv * (keys + 64), hd], 1.0).view([b, nkv, keys + 64, hd]);
            let (k, v) = (slab().narrow(2, 0, keys), slab().narrow(2, 0, keys));
            let q = random([b * nh, hd], 1.0).view([b, nh, 1, hd]);
            let scale = (hd as f64).powf(-0.5);
            let group = nh / nkv;
            let layers = c.num_hidden_layers;
            let libtorch_ms = best_ms(o.repeats, || {
                for _ in 0..layers {
                    let _ = decode_attention_by_products(&q, &k, &v, None, scale, group);
                }
            });
            let kernel_ms = decode_attention::available().then(|| {
                best_ms(o.repeats, || {
                    for _ in 0..layers {
                        let _ = decode_attention::attend(&q, &k, &v, None, scale, group)
                            .expect("the kernel takes the model's decode attention");
                    }
                })
            });
            attention.push(AttentionTimes {
                rows: m,
                keys: o.keys,
                libtorch_ms,
                kernel_ms,
            });
        }
    });
    let layer_bytes = shapes.iter().map(|&(a, b)| (a * b) as u64).sum::<u64>()
        * c.num_hidden_layers as u64
        * kind.elt_size_in_bytes() as u64;
    Ok(ProductsReport {
        dtype: match o.dtype {
            crate::device::Precision::F32 => "f32",
            crate::device::Precision::Bf16 => "bf16",
        }
        .into(),
        cpu: crate::device::cpu_summary(),
        layers: c.num_hidden_layers,
        layer_bytes,
        threads: tch::get_num_threads(),
        rows,
        absent,
        attention,
        few_rows_bf16: (kind == Kind::BFloat16 && few_rows::available()).then(|| {
            if bf16_dot::available() {
                "vdpbf16ps"
            } else {
                "widened"
            }
            .to_owned()
        }),
    })
}

impl ProductsReport {
    /// A readable table: milliseconds, the weights' GB/s, and the speed-up over the BLAS.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "decode-step products, {} layers ({:.2} GB of {} weights) + output head, {} thread(s), best of runs\nCPU: {}\n\
             {:>5} {:>9} {:>11} {:>8} {:>8} {:>9} {:>8}\n",
            self.layers,
            self.layer_bytes as f64 / 1e9,
            self.dtype,
            self.threads,
            self.cpu,
            "rows",
            "kernel",
            "layers ms",
            "GB/s",
            "vs blas",
            "head ms",
            "vs blas"
        );
        for r in &self.rows {
            let blas = r.kernels.iter().find(|k| k.kernel == "blas");
            for k in &r.kernels {
                s.push_str(&format!(
                    "{:>5} {:>9} {:>11.1} {:>8.1} {:>7.2}x {:>9.1} {:>7.2}x\n",
                    r.rows,
                    k.kernel,
                    k.layers_ms,
                    self.layer_bytes as f64 / k.layers_ms / 1e6,
                    blas.map_or(f64::NAN, |b| b.layers_ms / k.layers_ms),
                    k.head_ms,
                    blas.map_or(f64::NAN, |b| b.head_ms / k.head_ms),
                ));
            }
        }
        for a in &self.absent {
            s.push_str(&format!("{}: not measured: {}\n", a.kernel, a.reason));
        }
        for a in &self.attention {
            s.push_str(&format!(
                "decode attention, {} rows over {} keys, {} layers: libtorch {:.1} ms, kernel {}\n",
                a.rows,
                a.keys,
                self.layers,
                a.libtorch_ms,
                a.kernel_ms
                    .map_or("not run here (no AVX2 and FMA)".to_owned(), |k| format!(
                        "{k:.1} ms ({:.2}x)",
                        a.libtorch_ms / k
                    )),
            ));
        }
        match self.few_rows_bf16.as_deref() {
            Some("vdpbf16ps") => s.push_str(
                "few_rows: bf16 pairs by vdpbf16ps (AVX-512 BF16), both operands in bf16\n",
            ),
            Some(_) => s.push_str(
                "few_rows: bf16 weights widened to f32 in AVX2 registers (no AVX-512 BF16 here)\n",
            ),
            None => {}
        }
        s
    }
}
