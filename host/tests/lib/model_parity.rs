//! Qwen3 parity with Hugging Face `transformers` (`Qwen3ForCausalLM`, in `.venv-ref`), both
//! directions: models rlhost creates load in transformers, models transformers creates load in
//! rlhost, and both give the same logits on a padded batch (f32, within the rounding bound of two
//! evaluations that sum in different orders: `rlhost::testing::rounding`), the same greedy
//! continuation (32 tokens, rlhost with its KV cache; wherever the top two logits are further
//! apart than rounding could move them) and the same per-token log-probs; and so with LoRA
//! adapters in PEFT's format, written by either side and loaded by the other (`peft`'s
//! `PeftModel`), and merged into the base.

use std::path::{Path, PathBuf};
use std::process::Command;

use rlhost::model::{Qwen3, safetensors};
use rlhost::testing::rounding;
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
    // transformers and rlhost compute the same f32 arithmetic in other orders (their own
    // products, attention and norms): each within `logit_error` of the exact logits, the
    // chain bound over every sum along a logit's path (12 keys), so within twice that of each
    // other; log-probs likewise within twice `logprob_error` at temperature 0.7.
    let keys = ids[0].len();
    let logit_bound = 2.0 * rounding::logit_error(&model, keys);
    let valid = mask_t.to_kind(Kind::Bool).unsqueeze(-1);
    let diff = (&logits - &reference["logits"])
        .abs()
        .masked_fill(&valid.logical_not(), 0.0);
    let max = diff.max().double_value(&[]);
    assert!(
        max <= logit_bound,
        "{}: logits max |diff| {max} (bound {logit_bound:e})",
        dir.display()
    );
    let lp = Qwen3::token_logprobs(&logits, &tensor(&targets), 0.7);
    let lp_bound = 2.0 * rounding::logprob_error(&model, keys, 0.7);
    let lp_diff = (&lp - &reference["logprobs"])
        .abs()
        .masked_fill(&mask_t.to_kind(Kind::Bool).logical_not(), 0.0);
    let max = lp_diff.max().double_value(&[]);
    assert!(
        max <= lp_bound,
        "{}: log-prob max |diff| {max} (bound {lp_bound:e})",
        dir.display()
    );
    // The bounds are far below what a wrong sign, a missing scale or a dropped term would do
    // to logits of this size: the comparison can fail.
    let spread = logits.std(true).double_value(&[]);
    assert!(logit_bound < 0.01 * spread, "{logit_bound} vs {spread}");
    let greedy = model.greedy(&prompt, 32);
    let want: Vec<i64> = Vec::try_from(&reference["greedy"]).unwrap();
    assert_same_greedy(&model, &prompt, &greedy, &want, &dir.display().to_string());
}

/// Asserts that two greedy continuations of `prompt`, `ours` by `model` and `theirs` by another
/// implementation of it, pick the same tokens wherever rounding cannot decide: each side's
/// logits are within `logit_error` of the exact ones, so where `model`'s two best logits at a
/// step (recomputed by a full forward pass, itself within `logit_error`) are more than four
/// times that apart, both sides take the exact argmax. From a step where they are closer (a
/// near tie, either token a correct answer) the continuations may part; the tokens before it
/// must agree, and so must all 32 where no step is that close.
fn assert_same_greedy(model: &Qwen3, prompt: &[i64], ours: &[i64], theirs: &[i64], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: greedy lengths");
    let all: Vec<i64> = prompt.iter().chain(ours).copied().collect();
    let n = all.len() as i64;
    let ids = Tensor::from_slice(&all).unsqueeze(0);
    let pos = Tensor::arange(n, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let logits = tch::no_grad(|| model.forward(&ids, &pos, None, None)).squeeze_dim(0);
    let margin = 4.0 * rounding::logit_error(model, all.len());
    let mut decided = 0;
    for (k, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let top = logits
            .get(prompt.len() as i64 - 1 + k as i64)
            .topk(2, -1, true, true)
            .0;
        let gap = top.double_value(&[0]) - top.double_value(&[1]);
        if gap <= margin {
            println!("{what}: step {k}'s best two logits are {gap:e} apart: a near tie");
            break;
        }
        assert_eq!(a, b, "{what}: greedy token {k} ({ours:?} vs {theirs:?})");
        decided += 1;
    }
    assert!(decided > 0, "{what}: the first greedy step is a near tie");
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
    // The cached steps attend to the same keys in smaller products: each evaluation within
    // `logit_error` (8 keys) of the exact logits.
    let bound = 2.0 * rounding::logit_error(&model, 8);
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
        assert!(max <= bound, "{max} (bound {bound:e})");
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
        // Both run the same layers on the same inputs (the same ops, so the same hidden
        // states); only the output product runs on fewer rows, which may change the BLAS's
        // order of its `hidden`-term sums: twice `γ_hidden` relative to the logits' terms,
        // at most `logit_scale`.
        let hidden = model.cfg.hidden_size as usize;
        let head_bound = 2.0 * rounding::gamma(hidden, Kind::Float) * rounding::logit_scale(&model);
        let d = max_diff(&full, &last);
        assert!(
            d <= head_bound,
            "{name}: last-position logits differ by {d} (bound {head_bound:e})"
        );
        // Another kernel for every product: each evaluation within `logit_error` of the exact
        // logits (keys up to the longest row and its decode step).
        let keys = *lens.iter().max().unwrap() as usize + 1;
        let bound = 2.0 * rounding::logit_error(&model, keys);
        model.use_small_product_kernels();
        let rows = lens.len() as i64 * lens.iter().max().unwrap();
        let (full_k, last_k, step_k) = slot_logits(&model, &lens);
        let spread = full.std(true).double_value(&[]);
        assert!(bound < 0.01 * spread, "{name}: {bound} vs {spread}");
        for (what, a, b) in [
            ("full prefill", &full, &full_k),
            ("last-position prefill", &last, &last_k),
            ("decode step", &step, &step_k),
        ] {
            let d = max_diff(a, b);
            assert!(
                d <= bound,
                "{name}, {what} ({:?} for the prefill's {rows} rows): differs from the BLAS by {d} \
                 (bound {bound:e})",
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
        // Each output an `n_in`-term sum in its own order: each side within `γ_{n_in}` of the
        // exact product, relative to its terms' magnitudes `|x|·|w|ᵀ`, element by element.
        let bound = rounding::product_error(&x, &w) * 2.0;
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
            let d = (&y - &reference).abs().to_kind(Kind::Double);
            let worst = (&d / &bound).max().double_value(&[]);
            assert!(
                worst <= 1.0,
                "{k:?} at {rows}x{n_in}x{n_out}: differs by up to {worst} of its bound (max {})",
                d.max().double_value(&[])
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
    // Merged weights `W + s·B·A` round a rank-term sum and two more operations per weight, no
    // more than the adapter's own path (`logit_error` counts it on every product): each side
    // within `logit_error` of the exact logits (12 keys).
    let bound = 2.0 * rounding::logit_error(&model, 12);
    let moved = (&with - &without).abs().max().double_value(&[]);
    assert!(
        moved > 100.0 * bound,
        "the adapter changes the logits beyond rounding: {moved} (bound {bound:e})"
    );
    model.merge_lora();
    assert!(model.lora().is_none());
    let merged = tch::no_grad(|| model.forward(&ids, &pos, None, None));
    let d = (&with - &merged).abs().max().double_value(&[]);
    assert!(
        d <= bound,
        "merged vs adapted logits: {d} (bound {bound:e})"
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

// ---- PEFT's settings (issue 60): each honoured or refused by name ----

/// The installed peft's `LoraConfig` has exactly the fields rlhost classifies
/// (`rlhost::model::peft::LORA_CONFIG`), in the version it names: a newer peft's setting fails
/// here until it is written down as honoured, a description, or refused.
#[test]
fn peft_lora_config_fields_are_each_classified() {
    let Some(python) = python() else { return };
    let out = common::run_ok(common::qwen3_reference(&python).arg("lora-fields"));
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(
        v["version"],
        rlhost::model::peft::PEFT_VERSION,
        "update LORA_CONFIG for this peft"
    );
    let theirs: std::collections::BTreeSet<&str> = v["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let ours: std::collections::BTreeSet<&str> = rlhost::model::peft::LORA_CONFIG
        .iter()
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(theirs, ours);
}

/// Adapters `peft` makes with `target_modules` as `"all-linear"`, as regular expressions and as
/// a list naming a module Qwen3 lacks beside ones it has load in rlhost on the projections peft
/// adapts, and compute as transformers + peft do (the folder keeps the form given: peft writes
/// `"all-linear"` out as the names it found, a folder from elsewhere may hold the string, which
/// peft resolves again on load).
#[test]
fn peft_target_module_forms_resolve_as_peft_resolves_them() {
    use rlhost::model::LoraTarget::{self, *};
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let cfg = rlhost::model::Qwen3Config::preset(rlhost::model::Preset::Tiny);
    common::seeded_model(cfg, 11).save(&base).unwrap();
    let cfg = rlhost::model::Qwen3Config::load(&base).unwrap();
    let forms: [(serde_json::Value, Vec<LoraTarget>); 4] = [
        (serde_json::json!("all-linear"), LoraTarget::ALL.to_vec()),
        (serde_json::json!(r".*\.(q|v)_proj"), vec![QProj, VProj]),
        (
            serde_json::json!(r"model\.layers\.\d+\.mlp\.(gate|down)_proj"),
            vec![GateProj, DownProj],
        ),
        (
            serde_json::json!(["q_proj", "qkv", "gate_proj"]),
            vec![QProj, GateProj],
        ),
    ];
    for (k, (form, adapted)) in forms.into_iter().enumerate() {
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
                &format!("{}", 20 + k),
                "--target-modules",
                &form.to_string(),
            ],
        );
        let path = adapter.join("adapter_config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config["target_modules"] = form.clone();
        std::fs::write(&path, config.to_string()).unwrap();
        let lora =
            rlhost::model::Lora::load_peft(&adapter, &cfg, Device::Cpu, Kind::Float).unwrap();
        assert_eq!(lora.config().target_modules, adapted, "{form}");
        compare_with(&python, &base, Some(&adapter));
    }
}

/// An aLoRA adapter `peft` makes (`alora_invocation_tokens`: tensors of plain LoRA's shapes,
/// computed by peft only from the invocation tokens on), a BD-LoRA one (`use_bdlora`) and one
/// with a setting this peft does not have are refused naming the setting, not computed as
/// plain LoRA nor refused with a shape error.
#[test]
fn peft_alora_bdlora_and_unknown_settings_are_refused_by_name() {
    let Some(python) = python() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().join("base");
    let cfg = rlhost::model::Qwen3Config::preset(rlhost::model::Preset::Tiny);
    common::seeded_model(cfg, 12).save(&base).unwrap();
    let cfg = rlhost::model::Qwen3Config::load(&base).unwrap();
    let make = |name: &str, targets: &str, extra: &str| {
        let dir = tmp.path().join(name);
        reference(
            &python,
            &[
                "create-lora",
                "--model",
                base.to_str().unwrap(),
                "--out",
                dir.to_str().unwrap(),
                "--targets",
                targets,
                "--extra",
                extra,
            ],
        );
        dir
    };
    let alora = make(
        "alora",
        "q_proj,k_proj,v_proj,o_proj",
        r#"{"alora_invocation_tokens": [5, 17]}"#,
    );
    let bdlora = make(
        "bdlora",
        "q_proj,o_proj",
        r#"{"use_bdlora": {"target_modules_bd_a": ["q_proj"], "target_modules_bd_b": ["o_proj"],
            "nblocks": 2}}"#,
    );
    let load = |dir: &Path| {
        rlhost::model::Lora::load_peft(dir, &cfg, Device::Cpu, Kind::Float)
            .err()
            .expect("refused")
            .to_string()
    };
    let err = load(&alora);
    assert!(
        err.contains("alora_invocation_tokens = [5,17]") && err.contains("invocation tokens"),
        "{err}"
    );
    let err = load(&bdlora);
    assert!(
        err.contains("use_bdlora = ") && err.contains("block-diagonal"),
        "{err}"
    );
    // With aLoRA off, the same folder is plain LoRA (peft writes every field, off); a key this
    // peft does not have is refused unless off.
    let path = alora.join("adapter_config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["alora_invocation_tokens"] = serde_json::Value::Null;
    std::fs::write(&path, config.to_string()).unwrap();
    rlhost::model::Lora::load_peft(&alora, &cfg, Device::Cpu, Kind::Float).unwrap();
    config["use_future_lora"] = serde_json::json!({"on": true});
    std::fs::write(&path, config.to_string()).unwrap();
    let err = load(&alora);
    assert!(err.contains("use_future_lora"), "{err}");
    config["use_future_lora"] = serde_json::Value::Null;
    std::fs::write(&path, config.to_string()).unwrap();
    rlhost::model::Lora::load_peft(&alora, &cfg, Device::Cpu, Kind::Float).unwrap();
}
