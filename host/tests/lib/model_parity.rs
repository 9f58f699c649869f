//! Qwen3 parity with Hugging Face `transformers` (`Qwen3ForCausalLM`, in `.venv-ref`), both
//! directions: models rlhost creates load in transformers, models transformers creates load in
//! rlhost, and both give the same logits on a padded batch (f32, max |diff| ≤ 1e-4), the same
//! greedy continuation (32 tokens, rlhost with its KV cache) and the same per-token log-probs;
//! and so with LoRA adapters in PEFT's format, written by either side and loaded by the other
//! (`peft`'s `PeftModel`), and merged into the base.

use std::path::{Path, PathBuf};
use std::process::Command;

use rlhost::model::{Qwen3, safetensors};
use tch::{Device, Kind, Tensor};

use crate::common;

fn python() -> Option<PathBuf> {
    common::reference_python("model_parity")
}

fn reference(python: &Path, args: &[&str]) {
    common::run_ok(common::qwen3_reference(python).args(args));
}

const PAD: i64 = 0;

/// A batch of three rows: full, right-padded, left-padded (positions start after the pads).
type Rows = Vec<Vec<i64>>;

fn batch() -> (Rows, Rows, Rows) {
    let t = 12usize;
    let row = |seed: i64, n: usize| {
        (0..n as i64)
            .map(|i| (seed * 37 + i * 101) % 511 + 1)
            .collect::<Vec<_>>()
    };
    let mut ids = vec![];
    let mut mask = vec![];
    let mut pos = vec![];
    // Full.
    ids.push(row(1, t));
    mask.push(vec![1; t]);
    pos.push((0..t as i64).collect());
    // Right-padded to 7 tokens.
    let mut r = row(2, 7);
    r.resize(t, PAD);
    ids.push(r);
    mask.push((0..t).map(|i| i64::from(i < 7)).collect());
    pos.push((0..t as i64).map(|i| i.min(6)).collect());
    // Left-padded to 9 tokens.
    let mut r = vec![PAD; 3];
    r.extend(row(3, 9));
    ids.push(r);
    mask.push((0..t).map(|i| i64::from(i >= 3)).collect());
    pos.push((0..t as i64).map(|i| (i - 3).max(0)).collect());
    (ids, mask, pos)
}

fn tensor(rows: &[Vec<i64>]) -> Tensor {
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_slice(&flat).view([rows.len() as i64, rows[0].len() as i64])
}

/// Runs both implementations on the same inputs and compares.
fn compare(python: &Path, dir: &Path) {
    compare_with(python, dir, None);
}

/// [`compare`] with a PEFT LoRA adapter on both sides (rlhost's reader, `peft`'s `PeftModel`).
fn compare_with(python: &Path, dir: &Path, adapter: Option<&Path>) {
    let (ids, mask, pos) = batch();
    let targets: Vec<Vec<i64>> = ids
        .iter()
        .map(|r| r.iter().map(|x| (x * 7 + 3) % 512).collect())
        .collect();
    let prompt: Vec<i64> = vec![5, 17, 300, 42, 9];
    let inputs = serde_json::json!({
        "input_ids": ids, "attention_mask": mask, "position_ids": pos,
        "targets": targets, "temperature": 0.7, "prompt": prompt, "new_tokens": 32,
    });
    let tmp = tempfile::tempdir().unwrap();
    let inp = tmp.path().join("inputs.json");
    std::fs::write(&inp, inputs.to_string()).unwrap();
    let out = tmp.path().join("reference.safetensors");
    let mut args = vec![
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--inputs",
        inp.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    if let Some(a) = adapter {
        args.extend(["--adapter", a.to_str().unwrap()]);
    }
    reference(python, &args);
    let reference: std::collections::HashMap<String, Tensor> =
        safetensors::read(&out).unwrap().into_iter().collect();

    let mut model = Qwen3::load(dir, Device::Cpu, Kind::Float).unwrap();
    if let Some(a) = adapter {
        let lora = rlhost::model::Lora::load_peft(a, &model.cfg, Device::Cpu, Kind::Float).unwrap();
        model.set_lora(Some(lora));
    }
    let (ids_t, mask_t, pos_t) = (tensor(&ids), tensor(&mask), tensor(&pos));
    let logits = tch::no_grad(|| model.forward(&ids_t, &pos_t, Some(&mask_t), None));
    let valid = mask_t.to_kind(Kind::Bool).unsqueeze(-1);
    let diff = (&logits - &reference["logits"])
        .abs()
        .masked_fill(&valid.logical_not(), 0.0);
    let max = diff.max().double_value(&[]);
    assert!(max <= 1e-4, "{}: logits max |diff| {max}", dir.display());
    let lp = Qwen3::token_logprobs(&logits, &tensor(&targets), 0.7);
    let lp_diff = (&lp - &reference["logprobs"])
        .abs()
        .masked_fill(&mask_t.to_kind(Kind::Bool).logical_not(), 0.0);
    let max = lp_diff.max().double_value(&[]);
    assert!(max <= 1e-4, "{}: log-prob max |diff| {max}", dir.display());
    let greedy = model.greedy(&prompt, 32);
    let want: Vec<i64> = Vec::try_from(&reference["greedy"]).unwrap();
    assert_eq!(greedy, want, "{}: greedy continuation", dir.display());
}

#[test]
fn rlhost_models_load_in_transformers_and_agree() {
    let Some(python) = python() else { return };
    for untied in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        let mut args = vec!["model", "init", "--preset", "tiny", "--seed", "7", "--out"];
        let d = dir.to_str().unwrap().to_string();
        args.push(&d);
        if untied {
            args.push("--untied");
        }
        common::run_ok(Command::new(common::host_bin()).args(&args));
        compare(&python, &dir);
    }
}

#[test]
fn transformers_models_load_in_rlhost_and_agree() {
    let Some(python) = python() else { return };
    for untied in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m");
        let mut args = vec!["create", "--seed", "11", "--out", dir.to_str().unwrap()];
        if untied {
            args.push("--untied");
        }
        reference(&python, &args);
        compare(&python, &dir);
    }
}

#[test]
fn broken_checkpoints_are_refused_with_the_culprit_named() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = rlhost::model::Qwen3Config::preset(rlhost::model::Preset::Tiny);
    let model = common::seeded_model(cfg, 1);
    let dir = tmp.path().join("m");
    model.save(&dir).unwrap();
    // A tensor with the wrong shape.
    let mut weights = safetensors::read(&dir.join("model.safetensors")).unwrap();
    let i = weights
        .iter()
        .position(|(n, _)| n == "model.layers.1.mlp.up_proj.weight")
        .unwrap();
    weights[i].1 = Tensor::zeros([10, 192], (Kind::Float, Device::Cpu));
    safetensors::write(&dir.join("model.safetensors"), &weights, None).unwrap();
    let err = Qwen3::load(&dir, Device::Cpu, Kind::Float)
        .err()
        .unwrap()
        .to_string();
    assert_eq!(
        err,
        "tensor `model.layers.1.mlp.up_proj.weight` has shape [10, 192] in the checkpoint, the config needs [512, 192]"
    );
    // A missing tensor.
    drop(weights.remove(i));
    safetensors::write(&dir.join("model.safetensors"), &weights, None).unwrap();
    let err = Qwen3::load(&dir, Device::Cpu, Kind::Float)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("no tensor `model.layers.1.mlp.up_proj.weight`"),
        "{err}"
    );
    // A truncated file.
    model.save(&dir).unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let err = Qwen3::load(&dir, Device::Cpu, Kind::Float)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn cached_decoding_equals_full_forward() {
    let cfg = rlhost::model::Qwen3Config::preset(rlhost::model::Preset::Tiny);
    let model = common::seeded_model(cfg, 3);
    let ids = Tensor::from_slice(&[4i64, 8, 15, 16, 23, 42, 7, 99]).unsqueeze(0);
    let pos = Tensor::arange(8, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    tch::no_grad(|| {
        let full = model.forward(&ids, &pos, None, None);
        let mut cache = rlhost::model::KvCache::new(4);
        let a = model.forward(
            &ids.narrow(1, 0, 5),
            &pos.narrow(1, 0, 5),
            None,
            Some(&mut cache),
        );
        let b = model.forward(
            &ids.narrow(1, 5, 3),
            &pos.narrow(1, 5, 3),
            None,
            Some(&mut cache),
        );
        let stepwise = Tensor::cat(&[a, b], 1);
        let max = (full - stepwise).abs().max().double_value(&[]);
        assert!(max < 1e-5, "{max}");
        assert_eq!(cache.len(), 8);
    });
}

/// Logits of a padded slot-cache prefill and of the decode step after it, from `model`: the
/// full `[rows, seq, vocab]` selection at each row's last real position, the same positions
/// through [`Qwen3::forward_slots_last`] (the engine's prefill), and one decode step.
fn slot_logits(model: &Qwen3, lens: &[i64]) -> (Tensor, Tensor, Tensor) {
    use rlhost::model::SlotCache;
    let t = *lens.iter().max().unwrap();
    let rows = lens.len() as i64;
    let ids: Vec<i64> = (0..rows * t).map(|i| (i * 53 + 7) % 500 + 1).collect();
    let ids = Tensor::from_slice(&ids).view([rows, t]);
    // Padded positions continue past a row's end (the engine's layout): never attended to by
    // the row's real queries, overwritten by its next token.
    let pos = Tensor::arange(t, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .expand([rows, t], true);
    let last = Tensor::from_slice(&lens.iter().map(|l| l - 1).collect::<Vec<_>>());
    tch::no_grad(|| {
        let mut cache = SlotCache::new(model, rows, 16);
        let full = model.forward_slots(&ids, &pos, &mut cache, 0, t);
        let selected = full
            .gather(
                1,
                &last.view([-1, 1, 1]).expand([-1, 1, full.size()[2]], false),
                false,
            )
            .squeeze_dim(1);
        let mut cache = SlotCache::new(model, rows, 16);
        let only_last = model.forward_slots_last(&ids, &pos, &mut cache, 0, t, &last);
        let next = only_last.argmax(-1, false).unsqueeze(1);
        let step_pos = (&last + 1).unsqueeze(1);
        let step = model
            .forward_slots(&next, &step_pos, &mut cache, 0, t + 1)
            .select(1, 0);
        (selected, only_last, step)
    })
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// The engine's prefill computes the output head at each row's last position only; its logits
/// equal the full-logit selection. With the small-product kernels (what the engine turns on
/// for f32 on the CPU) prefill and decode logits equal the BLAS's, on the tiny shape and on one
/// with Qwen3-0.6B's layer widths (1,024 / 3,072, 16 query and 8 key-value heads of 128), for
/// prefills whose layers take the small-product kernel (≤ 128 rows) and the BLAS; each kernel's
/// products (few-rows and oneDNN, whichever this machine picks) equal the BLAS's.
#[test]
fn last_position_logits_and_small_product_kernels_equal_the_full_blas_forward() {
    use rlhost::model::{Preset, ProductKernel, Qwen3Config};
    let tiny = Qwen3Config::preset(Preset::Tiny);
    let mut wide = tiny.clone();
    (wide.hidden_size, wide.intermediate_size) = (1024, 3072);
    (
        wide.num_attention_heads,
        wide.num_key_value_heads,
        wide.head_dim,
    ) = (16, 8, 128);
    wide.num_hidden_layers = 2;
    for (name, cfg, lens) in [
        ("tiny", tiny.clone(), vec![9i64, 5, 7]),
        ("tiny, 100-row prefill", tiny.clone(), vec![50, 50]),
        ("0.6B widths", wide.clone(), vec![12, 3]),
        ("0.6B widths, 150-row prefill", wide, vec![50, 41, 50]),
    ] {
        let mut model = common::seeded_model(cfg, 11);
        let (full, last, step) = slot_logits(&model, &lens);
        let d = max_diff(&full, &last);
        assert!(d <= 1e-5, "{name}: last-position logits differ by {d}");
        model.use_small_product_kernels();
        let rows = lens.len() as i64 * lens.iter().max().unwrap();
        let (full_k, last_k, step_k) = slot_logits(&model, &lens);
        let scale = full.abs().max().double_value(&[]);
        for (what, a, b) in [
            ("full prefill", &full, &full_k),
            ("last-position prefill", &last, &last_k),
            ("decode step", &step, &step_k),
        ] {
            let d = max_diff(a, b);
            assert!(
                d <= 1e-5 * scale.max(1.0),
                "{name}, {what} ({:?} for the prefill's {rows} rows): differs from the BLAS by {d} \
                 (logits up to {scale})",
                model.product_kernel(Kind::Float, rows)
            );
        }
    }
    // Each kernel against the BLAS directly, at the 0.6B shapes' widths and rows of a decode.
    tch::manual_seed(4);
    for (rows, n_in, n_out) in [(1i64, 1024i64, 4096i64), (8, 3072, 1024), (100, 1024, 6144)] {
        let x = Tensor::randn([rows, n_in], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([n_out, n_in], (Kind::Float, Device::Cpu)) * 0.05;
        let reference = rlhost::model::kernels::product(ProductKernel::Blas, &x, &w);
        let scale = reference.abs().max().double_value(&[]);
        // Each kernel's own result, never the BLAS it would fall back to: oneDNN must run where
        // libtorch has it, the few-rows kernel where the CPU has AVX2 and FMA.
        let mut results = Vec::new();
        if tch::utils::has_mkldnn() {
            let y = rlhost::model::kernels::onednn_product(&x, &w)
                .unwrap_or_else(|e| panic!("libtorch has oneDNN, yet it refused a product: {e}"));
            results.push((ProductKernel::OneDnn, y));
        } else {
            common::skip(
                "model_parity oneDNN product",
                "this libtorch was built without oneDNN",
            );
        }
        if rlhost::model::kernels::few_rows::available() {
            let y = rlhost::model::kernels::product(ProductKernel::FewRows, &x, &w);
            results.push((ProductKernel::FewRows, y));
        } else {
            common::skip(
                "model_parity few-rows product",
                "this CPU lacks AVX2 or FMA: the few-rows kernel does not run here",
            );
        }
        for (k, y) in results {
            let d = max_diff(&y, &reference);
            assert!(
                d <= 1e-5 * scale,
                "{k:?} at {rows}x{n_in}x{n_out}: {d} (scale {scale})"
            );
        }
    }
    // Which kernel each size takes on this machine (x86-64 with AVX2: CI's and ours).
    let mut model = common::seeded_model(Qwen3Config::preset(Preset::Tiny), 1);
    assert_eq!(
        model.product_kernel(Kind::Float, 8),
        ProductKernel::Blas,
        "a trained model's"
    );
    model.use_small_product_kernels();
    let small = if rlhost::model::kernels::few_rows::available() {
        ProductKernel::FewRows
    } else {
        ProductKernel::OneDnn
    };
    for rows in [1, 8, 64, 128] {
        assert_eq!(
            model.product_kernel(Kind::Float, rows),
            small,
            "{rows} rows"
        );
    }
    assert_eq!(model.product_kernel(Kind::Float, 129), ProductKernel::Blas);
    // bf16 products of few rows take the few-rows kernel too (on bf16 weights); larger ones
    // are widened to f32 where the CPU has no bf16 matrix instructions (libtorch emulates bf16
    // there), else libtorch's bf16 BLAS.
    assert_eq!(
        model.product_kernel(Kind::BFloat16, 8),
        if rlhost::model::kernels::few_rows::available() {
            ProductKernel::FewRows
        } else if rlhost::model::kernels::cpu_has_bf16_matrix() {
            ProductKernel::Blas
        } else {
            ProductKernel::Widened
        }
    );
    assert_eq!(
        model.product_kernel(Kind::BFloat16, 129),
        if rlhost::model::kernels::cpu_has_bf16_matrix() {
            ProductKernel::Blas
        } else {
            ProductKernel::Widened
        }
    );
    // Products autograd records keep the BLAS: gradients reach every weight.
    let ids = Tensor::from_slice(&[1i64, 2, 3]).unsqueeze(0);
    let pos = Tensor::arange(3, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    model
        .forward(&ids, &pos, None, None)
        .sum(Kind::Float)
        .backward();
    for (name, v) in model.vs.variables() {
        let g = v.grad();
        assert!(
            g.defined() && g.abs().sum(Kind::Float).double_value(&[]) > 0.0,
            "{name} got no gradient through the small-product kernels"
        );
    }
}

// ---- LoRA adapters (PEFT's format, peft as the reference) ----

/// A base model and a random adapter on all seven projections, B not zero.
fn adapted_model(dir: &Path) -> rlhost::model::Lora {
    let cfg = rlhost::model::Qwen3Config::preset(rlhost::model::Preset::Tiny);
    common::seeded_model(cfg.clone(), 7).save(dir).unwrap();
    common::random_lora(&cfg, 8.0, 9)
}

/// A PEFT folder rlhost writes, loaded by `peft` onto the transformers model, gives rlhost's
/// logits, log-probs and greedy continuation; and merged into the base (`merge_lora`), the
/// model computes the same, saved as a plain folder that transformers loads alike.
#[test]
fn rlhost_adapters_load_in_peft_and_agree_and_merge() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let lora = adapted_model(&base);
    let adapter = tmp.path().join("adapter");
    lora.save_peft(&adapter, base.to_str().unwrap(), None)
        .unwrap();
    compare_with(&python, &base, Some(&adapter));
    // Merged: the same logits as base + adapter, and a plain folder transformers agrees with.
    let (ids, _, pos) = batch();
    let (ids, pos) = (tensor(&ids), tensor(&pos));
    let mut model = Qwen3::load(&base, Device::Cpu, Kind::Float).unwrap();
    let without = tch::no_grad(|| model.forward(&ids, &pos, None, None));
    model.set_lora(Some(
        rlhost::model::Lora::load_peft(&adapter, &model.cfg, Device::Cpu, Kind::Float).unwrap(),
    ));
    let with = tch::no_grad(|| model.forward(&ids, &pos, None, None));
    let moved = (&with - &without).abs().max().double_value(&[]);
    assert!(moved > 1e-2, "the adapter changes the logits: {moved}");
    model.merge_lora();
    assert!(model.lora().is_none());
    let merged = tch::no_grad(|| model.forward(&ids, &pos, None, None));
    let d = (&with - &merged).abs().max().double_value(&[]);
    // f32 rounding of the merged weights, relative to the logits' size (1.27e-5 on logits up
    // to ~10 on a Zen 3 EPYC, where MKL sums in another order than on Intel).
    let scale = with.abs().max().double_value(&[]).max(1.0);
    assert!(
        d <= 1e-5 * scale,
        "merged vs adapted logits: {d} (logits up to {scale})"
    );
    let out = tmp.path().join("merged");
    model.save(&out).unwrap();
    compare_with(&python, &out, None);
}

/// An adapter `peft` writes (random A and B, B not zero: not a fresh one), loaded by rlhost,
/// gives transformers + peft's logits, log-probs and greedy continuation.
#[test]
fn peft_adapters_load_in_rlhost_and_agree() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let cfg = rlhost::model::Qwen3Config::preset(rlhost::model::Preset::Tiny);
    common::seeded_model(cfg, 8).save(&base).unwrap();
    for (k, targets) in [
        "q_proj,k_proj,v_proj,o_proj",
        "q_proj,v_proj,gate_proj,up_proj,down_proj",
    ]
    .into_iter()
    .enumerate()
    {
        let adapter = tmp.path().join(format!("adapter-{k}"));
        reference(
            &python,
            &[
                "create-lora",
                "--model",
                base.to_str().unwrap(),
                "--out",
                adapter.to_str().unwrap(),
                "--seed",
                &format!("{}", 3 + k),
                "--targets",
                targets,
            ],
        );
        // Not a fresh adapter: every B has values (else the parity would hold for any A).
        let cfg = rlhost::model::Qwen3Config::load(&base).unwrap();
        let lora =
            rlhost::model::Lora::load_peft(&adapter, &cfg, Device::Cpu, Kind::Float).unwrap();
        for (name, t) in lora.tensors() {
            assert!(t.abs().max().double_value(&[]) > 0.0, "{name} is zero");
        }
        compare_with(&python, &base, Some(&adapter));
    }
}
