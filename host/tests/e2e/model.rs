//! End-to-end: `host model init` / `host model info` as a user meets them — tiny models with the
//! tokenizer rlhost builds, refusals that name the problem, and model names given as Hugging Face
//! ids, served from a local HF cache or downloaded from a hub (a real HTTP server on loopback that
//! speaks the hub's `resolve` protocol).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::common::{self, host, run, run_err, texts};

fn init_tiny(home: &Path, out: &Path) {
    let stdout = common::run_ok(
        host(home)
            .args(["model", "init", "--preset", "tiny", "--seed", "3", "--out"])
            .arg(out),
    );
    assert!(stdout.contains("512-token byte-level BPE"), "{stdout}");
}

#[test]
fn tiny_models_come_with_a_tokenizer_and_chat_template() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("tiny");
    init_tiny(home.path(), &dir);
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let out = run(host(home.path())
        .args(["model", "info", "--check"])
        .arg(&dir));
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("tokenizer: 512 tokens (3 special), eos <|im_end|>, pad <|endoftext|>"),
        "{stdout}"
    );
    assert!(stdout.contains("every tensor present"), "{stdout}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config["eos_token_id"], 505,
        "<|im_end|> follows the learnt vocabulary"
    );

    // A second init into the same folder loses nothing.
    let before = std::fs::read(dir.join("model.safetensors")).unwrap();
    let stderr = run_err(
        host(home.path())
            .args(["model", "init", "--seed", "4", "--out"])
            .arg(&dir),
    );
    assert!(stderr.contains("already holds a model"));
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        before
    );
}

#[test]
fn real_sizes_need_a_real_tokenizer() {
    let home = tempfile::tempdir().unwrap();
    let out_dir = home.path().join("big");
    let stderr = run_err(
        host(home.path())
            .args(["model", "init", "--preset", "0.6b", "--out"])
            .arg(&out_dir),
    );
    assert!(
        stderr.contains("0.6b preset needs Qwen3's tokenizer: pass --tokenizer DIR"),
        "{stderr}"
    );
    assert!(!out_dir.exists(), "nothing written");

    // A tiny model with Qwen3's own tokenizer: the vocabulary grows to fit it.
    let qwen3 = common::repo_root().join("../shared/models/qwen3");
    let dir = home.path().join("tiny-qwen3-vocab");
    common::run_ok(
        host(home.path())
            .args(["model", "init", "--tokenizer"])
            .arg(&qwen3)
            .arg("--out")
            .arg(&dir),
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["vocab_size"], 151_669);
    assert_eq!(config["eos_token_id"], 151_645);
    assert_eq!(
        std::fs::read(dir.join("tokenizer.json")).unwrap(),
        std::fs::read(qwen3.join("tokenizer.json")).unwrap()
    );
}

/// Lays `files` out as the HF cache does: blobs, a snapshot of symlinks, `refs/main`.
fn cache_snapshot(hub: &Path, id: &str, commit: &str, from: &Path) -> PathBuf {
    let repo = hub.join(format!("models--{}", id.replace('/', "--")));
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let blob = repo
            .join("blobs")
            .join(entry.file_name().to_string_lossy().replace('.', "_"));
        std::fs::copy(entry.path(), &blob).unwrap();
        std::os::unix::fs::symlink(&blob, snap.join(entry.file_name())).unwrap();
    }
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    snap
}

#[test]
fn hub_ids_resolve_from_the_local_cache() {
    let home = tempfile::tempdir().unwrap();
    let model = home.path().join("m");
    init_tiny(home.path(), &model);
    let hf_home = home.path().join("hf");
    let snap = cache_snapshot(&hf_home.join("hub"), "acme/Tiny-1M", "c0ffee", &model);

    let out = run(host(home.path())
        .env("HF_HOME", &hf_home)
        .env("HF_HUB_OFFLINE", "1")
        .args(["model", "info", "acme/Tiny-1M", "--check"]));
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with(&snap.display().to_string()), "{stdout}");
    assert!(stdout.contains("every tensor present"), "{stdout}");

    // HF_HUB_CACHE wins over HF_HOME.
    common::run_ok(
        host(home.path())
            .env("HF_HOME", home.path().join("elsewhere"))
            .env("HF_HUB_CACHE", hf_home.join("hub"))
            .env("HF_HUB_OFFLINE", "1")
            .args(["model", "info", "acme/Tiny-1M"]),
    );

    // A snapshot without weights is not a model; offline, the error lists where it looked.
    std::fs::remove_file(snap.join("model.safetensors")).unwrap();
    let stderr = run_err(
        host(home.path())
            .env("HF_HOME", &hf_home)
            .env("HF_HUB_OFFLINE", "1")
            .args(["model", "info", "acme/Tiny-1M"]),
    );
    assert!(
        stderr.contains("cannot find model `acme/Tiny-1M`"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "no complete snapshot in the Hugging Face cache {}",
            hf_home.join("hub").display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("HF_HUB_OFFLINE is set"), "{stderr}");
    assert!(stderr.contains("pass a folder"), "{stderr}");
}

/// A minimal hub on loopback: `GET /{owner}/{name}/resolve/main/{file}` with `Range`, answered
/// with the headers hub clients rely on (`ETag`, `X-Repo-Commit`, `Content-Range`); 404 for
/// files the folder lacks.
fn serve_hub(id: &'static str, dir: PathBuf, hits: Arc<AtomicUsize>) -> (u16, Arc<AtomicBool>) {
    common::serve_http(60, move |req| {
        hits.fetch_add(1, Ordering::Relaxed);
        let range_start: usize = req
            .headers
            .iter()
            .find(|(k, _)| k == "range")
            .and_then(|(_, v)| v.strip_prefix("bytes=")?.split('-').next()?.parse().ok())
            .unwrap_or(0);
        let prefix = format!("/{id}/resolve/main/");
        match req
            .path
            .strip_prefix(&prefix)
            .and_then(|f| std::fs::read(dir.join(f)).ok())
        {
            Some(bytes) => {
                let end = bytes.len().saturating_sub(1);
                let headers = vec![
                    (
                        "Content-Range".to_string(),
                        format!("bytes {range_start}-{end}/{}", bytes.len()),
                    ),
                    ("ETag".to_string(), format!("\"{:016x}\"", fnv(&bytes))),
                    (
                        "X-Repo-Commit".to_string(),
                        "5eed000000000000000000000000000000000000".to_string(),
                    ),
                ];
                (206, headers, bytes[range_start.min(bytes.len())..].to_vec())
            }
            None => (
                404,
                vec![("X-Error-Code".to_string(), "EntryNotFound".to_string())],
                b"Entry not found".to_vec(),
            ),
        }
    })
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn hub_ids_download_into_the_cache_then_work_offline() {
    let home = tempfile::tempdir().unwrap();
    let model = home.path().join("m");
    init_tiny(home.path(), &model);
    let hits = Arc::new(AtomicUsize::new(0));
    let (port, stop) = serve_hub("acme/Tiny-1M", model.clone(), hits.clone());
    let hf_home = home.path().join("hf");

    let out = run(host(home.path())
        .env("HF_HOME", &hf_home)
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{port}"))
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE")
        .args(["model", "info", "acme/Tiny-1M", "--check"]));
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("every tensor present"), "{stdout}");
    assert!(hits.load(Ordering::Relaxed) > 0);
    let snap = hf_home
        .join("hub/models--acme--Tiny-1M/snapshots/5eed000000000000000000000000000000000000");
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert_eq!(
            std::fs::read(snap.join(f)).unwrap(),
            std::fs::read(model.join(f)).unwrap(),
            "{f} downloaded intact"
        );
    }

    // The hub gone, the cache serves.
    stop.store(true, Ordering::Relaxed);
    common::run_ok(
        host(home.path())
            .env("HF_HOME", &hf_home)
            .env("HF_HUB_OFFLINE", "1")
            .args(["model", "info", "acme/Tiny-1M", "--check"]),
    );

    // A repository the hub does not have: the error says what failed, where.
    let (port, stop) = serve_hub("acme/Other", model.clone(), hits.clone());
    let stderr = run_err(
        host(home.path())
            .env("HF_HOME", &hf_home)
            .env("HF_ENDPOINT", format!("http://127.0.0.1:{port}"))
            .env_remove("HF_HUB_OFFLINE")
            .args(["model", "info", "acme/Missing"]),
    );
    stop.store(true, Ordering::Relaxed);
    assert!(
        stderr.contains(&format!(
            "downloading config.json from http://127.0.0.1:{port} failed"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("404"), "{stderr}");
}

/// `host model untie`: the copy has `lm_head.weight` (the embedding's values) and
/// `tie_word_embeddings: false`, the tokenizer files beside it, and the same logits as the
/// original; an existing `--out` is refused and left as it was.
#[test]
fn untie_copies_a_model_with_the_same_outputs() {
    use rlhost::model::Qwen3;
    use tch::{Device, Kind, Tensor};
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("tiny");
    init_tiny(home.path(), &dir);
    let out = home.path().join("tiny-untied");
    let stdout = common::run_ok(
        host(home.path())
            .args(["model", "untie"])
            .arg(&dir)
            .arg("--out")
            .arg(&out),
    );
    assert!(stdout.contains("lm_head.weight copied"), "{stdout}");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["tie_word_embeddings"], false);
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert_eq!(
            std::fs::read(dir.join(f)).unwrap(),
            std::fs::read(out.join(f)).unwrap(),
            "{f}"
        );
    }
    let tensors = rlhost::model::safetensors::read(&out.join("model.safetensors")).unwrap();
    assert!(tensors.iter().any(|(n, _)| n == "lm_head.weight"));
    let ids = Tensor::from_slice(&[5i64, 77, 300, 12, 9]).unsqueeze(0);
    let pos = Tensor::arange(5, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let logits = |d: &Path| {
        Qwen3::load(d, Device::Cpu, Kind::Float)
            .unwrap()
            .forward(&ids, &pos, None, None)
    };
    let diff = (logits(&dir) - logits(&out)).abs().max().double_value(&[]);
    // Exact: the same values in the same ops (an untied head is the embedding's copy).
    assert_eq!(diff, 0.0, "the same weights, the same logits");
    let before = std::fs::read(out.join("config.json")).unwrap();
    let err = run_err(
        host(home.path())
            .args(["model", "untie"])
            .arg(&dir)
            .arg("--out")
            .arg(&out),
    );
    assert!(err.contains("exists"), "{err}");
    assert_eq!(std::fs::read(out.join("config.json")).unwrap(), before);
}

/// `host model merge-lora`: a PEFT adapter (all seven projections, B not zero) folded into its
/// base gives a plain folder (tokenizer copied, no adapter files) whose logits are base +
/// adapter's; an adapter of another shape, or an existing `--out`, is refused by name and
/// nothing is written.
#[test]
fn merge_lora_writes_a_plain_model_with_the_adapters_outputs() {
    use rlhost::model::{Lora, LoraConfig, Qwen3, Qwen3Config};
    use tch::{Device, Kind, Tensor};
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("tiny");
    init_tiny(home.path(), &dir);
    let cfg = Qwen3Config::load(&dir).unwrap();
    let lora = common::random_lora(&cfg, 32.0, 2);
    let adapter = home.path().join("adapter");
    lora.save_peft(&adapter, dir.to_str().unwrap(), None)
        .unwrap();
    let out = home.path().join("merged");
    let merge = |adapter: &Path, out: &Path| {
        let mut cmd = host(home.path());
        cmd.args(["model", "merge-lora", "--base"])
            .arg(&dir)
            .arg("--adapter")
            .arg(adapter)
            .arg("--out")
            .arg(out);
        cmd
    };
    let stdout = common::run_ok(&mut merge(&adapter, &out));
    assert!(stdout.contains("rank 4"), "{stdout}");
    assert!(out.join("tokenizer.json").is_file());
    assert!(!out.join("adapter_config.json").exists());
    let ids = Tensor::from_slice(&[5i64, 77, 300, 12, 9]).unsqueeze(0);
    let pos = Tensor::arange(5, (Kind::Int64, Device::Cpu)).unsqueeze(0);
    let mut adapted = Qwen3::load(&dir, Device::Cpu, Kind::Float).unwrap();
    let base_logits = tch::no_grad(|| adapted.forward(&ids, &pos, None, None));
    adapted.set_lora(Some(lora));
    let want = tch::no_grad(|| adapted.forward(&ids, &pos, None, None));
    let merged = Qwen3::load(&out, Device::Cpu, Kind::Float).unwrap();
    let got = tch::no_grad(|| merged.forward(&ids, &pos, None, None));
    // Merged weights round a rank-term sum and two more operations per weight, no more than
    // the adapter's own path that `logit_error` counts: each side within it of the exact
    // logits (5 keys).
    let bound = 2.0 * rlhost::testing::rounding::logit_error(&adapted, 5);
    let d = (&want - &got).abs().max().double_value(&[]);
    assert!(
        d <= bound,
        "merged vs base + adapter: {d} (bound {bound:e})"
    );
    assert!(
        (&want - &base_logits).abs().max().double_value(&[]) > 100.0 * bound,
        "the adapter matters far beyond rounding"
    );
    // Refusals: an existing --out, an adapter for another shape.
    let err = run_err(&mut merge(&adapter, &out));
    assert!(err.contains("exists"), "{err}");
    let other = home.path().join("other-adapter");
    let mut wide = cfg.clone();
    wide.hidden_size *= 2;
    Lora::new(&wide, LoraConfig::default(), Device::Cpu, Kind::Float, 1)
        .unwrap()
        .save_peft(&other, "wide", None)
        .unwrap();
    let err = run_err(&mut merge(&other, &home.path().join("never")));
    assert!(err.contains("--adapter") && err.contains("lora_A"), "{err}");
    assert!(!home.path().join("never").exists());
    // An adapter whose change would overflow (factors of 1e30, finite each: the merge once
    // wrote a model of NaNs and exited 0) is refused by name, and nothing is written.
    let huge = common::random_lora(&cfg, 32.0, 3);
    tch::no_grad(|| {
        for t in huge.tensors().values() {
            let _ = t.shallow_clone().fill_(1e30);
        }
    });
    let huge_dir = home.path().join("huge-adapter");
    huge.save_peft(&huge_dir, dir.to_str().unwrap(), None)
        .unwrap();
    let err = run_err(&mut merge(&huge_dir, &home.path().join("never")));
    assert!(
        err.contains("--adapter") && err.contains("refused") && err.contains("beyond"),
        "{err}"
    );
    assert!(!home.path().join("never").exists());
}
