//! End-to-end: files a request or a flag names are read bounded, and no failure under a request
//! answers with panic text or internals. On a real `host inference` over loopback, each route
//! family that reads files a client names (`POST /v1/load_lora_adapter`, `POST /update_weights`)
//! and the flags that name them at start (`--lora-modules`, `@ FILE`) are given what an attacker
//! would: a FIFO (a read that never returns), a link to `/dev/zero` (a read that never ends), a
//! 1.5 GiB sparse file with a garbage header, tensors whose shapes overflow or are negative
//! (libtorch panicked on them, and the panic's text reached the client). Each is a prompt 400
//! naming the file and what is wrong with it, in one line with no internals, and the server then
//! serves every dialect as before, with the same weights.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rlhost::model::Qwen3Config;
use serde_json::{Value, json};

use crate::common;

/// How long a refusal may take. A FIFO used to hold the request forever; a sparse file or
/// `/dev/zero` to read for seconds to minutes first.
const PROMPT: Duration = Duration::from_secs(15);

/// Text that must never reach a client: a panic's, libtorch's (its `TchError` debug form, C++
/// frames, source paths), a backtrace, a Rust source location.
const INTERNALS: [&str; 9] = [
    "panicked",
    "Torch(",
    "TchError",
    "backtrace",
    "Exception raised from",
    "aten/src",
    ".rs:",
    "/src/",
    "c10::",
];

/// POSTs `body` to `url` and returns the status and the body as text, failing the test when
/// no answer comes within [`PROMPT`] (a hang is the bug, not a slow test).
fn post(url: &str, body: &Value) -> (u16, String, Duration) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let (status, text) = rt.block_on(async {
        let client = reqwest::Client::builder().timeout(PROMPT).build().unwrap();
        let r = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("no answer from {url} within {PROMPT:?}: {e}"));
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    });
    (status, text, started.elapsed())
}

/// A refusal as a client must see it: a 400 in OpenAI's error shape naming `param`, one line
/// that says each of `says`, nothing of [`INTERNALS`], answered within [`PROMPT`].
fn assert_refused(what: &str, answer: (u16, String, Duration), param: &str, says: &[&str]) {
    let (status, text, took) = answer;
    assert_eq!(status, 400, "{what}: {text}");
    assert!(took < PROMPT, "{what}: took {took:?}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: {text}"));
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(v["error"]["param"], param, "{what}: {text}");
    assert!(
        !message.contains('\n'),
        "{what}: more than one line: {message}"
    );
    for bad in INTERNALS {
        assert!(
            !text.contains(bad),
            "{what}: the answer shows {bad:?}: {text}"
        );
    }
    for s in says {
        assert!(message.contains(s), "{what}: {s:?} missing from {message}");
    }
}

/// A safetensors file of one tensor `name` described by `shape` and `offsets` (JSON), followed
/// by `data` zero bytes: what a malicious folder holds.
fn raw_safetensors(path: &Path, name: &str, shape: &str, offsets: &str, data: usize) {
    let header =
        format!(r#"{{"{name}": {{"dtype": "F32", "shape": {shape}, "data_offsets": {offsets}}}}}"#);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data, 0);
    std::fs::write(path, bytes).unwrap();
}

fn mkfifo(path: &Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

fn link_to_dev_zero(path: &Path) {
    std::os::unix::fs::symlink("/dev/zero", path).unwrap();
}

/// `first` then `more`.
fn all<'a>(first: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
    first.iter().chain(more).copied().collect()
}

/// A 1.5 GiB sparse file whose first bytes say its header is 8 bytes of garbage.
fn sparse_giant(path: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(3 << 29).unwrap();
    f.write_at(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!", 0)
        .unwrap();
}

/// The traps one file of a folder can be: what it is, how it is made, and what its refusal must
/// say.
type Attack = (&'static str, fn(&Path), &'static [&'static str]);

const ATTACKS: [Attack; 3] = [
    ("a FIFO", mkfifo, &["FIFO", "not a regular file"]),
    (
        "a link to /dev/zero",
        link_to_dev_zero,
        &["character device"],
    ),
    (
        "a 1.5 GiB sparse file with a garbage header",
        sparse_giant,
        &["not a JSON object"],
    ),
];

/// A copy of the folder `good` as `dir`, with `file` replaced by `make`.
fn poisoned(good: &Path, dir: &Path, file: &str, make: impl FnOnce(&Path)) -> PathBuf {
    common::copy_dir(good, dir);
    let target = dir.join(file);
    std::fs::remove_file(&target).unwrap();
    make(&target);
    dir.to_owned()
}

/// A greedy completion on `model`: the text, to compare before and after the attacks.
fn complete(url: &str, model: &str) -> String {
    let (status, text, _) = post(
        &format!("{url}/completions"),
        &json!({"model": model, "prompt": "one two three", "max_tokens": 8, "temperature": 0,
                "ignore_eos": true}),
    );
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["choices"][0]["text"].as_str().unwrap().to_owned()
}

/// Every dialect still answers (chat, responses, messages, tokens in), so one bad file
/// poisoned no route.
fn every_dialect_serves(url: &str, root: &str) {
    let answers = [
        post(
            &format!("{url}/chat/completions"),
            &json!({"model": "tiny", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "one two"}]}),
        ),
        post(
            &format!("{url}/responses"),
            &json!({"model": "tiny", "input": "one two", "max_output_tokens": 4, "store": false}),
        ),
        post(
            &format!("{url}/messages"),
            &json!({"model": "tiny", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "one two"}]}),
        ),
        post(
            &format!("{root}/inference/v1/generate"),
            &json!({"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}}),
        ),
    ];
    for (status, text, _) in answers {
        assert_eq!(status, 200, "{text}");
    }
}

/// `POST /v1/load_lora_adapter` with an adapter folder whose `adapter_config.json` or
/// `adapter_model.safetensors` is a FIFO, a link to `/dev/zero` or a sparse giant, or whose
/// tensors have overflowing or negative shapes: each a prompt one-line 400 naming the file (the
/// FIFO used to hang the load forever, `/dev/zero` to grow the server until it was killed,
/// the shapes to answer `task N panicked ... Torch(...)`). The server then loads a good
/// adapter, serves it and every dialect, and its base model answers as before.
#[test]
fn adapter_folders_that_are_traps_are_refused_promptly_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    common::tiny_model(&model, 6);
    let cfg = Qwen3Config::load(&model).unwrap();
    let good = tmp.path().join("good");
    common::random_lora(&cfg, 8.0, 5)
        .save_peft(&good, "tiny", None)
        .unwrap();
    let server =
        common::InferenceServer::start(&model, &["--served-model-name", "tiny", "--enable-lora"]);
    let url = server.url.clone();
    let root = url.trim_end_matches("/v1").to_string();
    let before = complete(&url, "tiny");
    let load = |name: &str, dir: &Path| {
        post(
            &format!("{root}/v1/load_lora_adapter"),
            &json!({"lora_name": name, "lora_path": dir.display().to_string()}),
        )
    };
    let mut n = 0;
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        for (what, make, says) in ATTACKS {
            // The config is JSON: its garbage is refused by the JSON parser, by name.
            let says: &[&str] = if file == "adapter_config.json" && what.contains("sparse") {
                &["over the limit"]
            } else {
                says
            };
            n += 1;
            let dir = poisoned(&good, &tmp.path().join(format!("bad{n}")), file, make);
            assert_refused(
                &format!("{file} as {what}"),
                load(&format!("bad{n}"), &dir),
                "lora_path",
                &all(says, &[file]),
            );
        }
    }
    let tensor = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    for (what, shape, offsets, data, says) in [
        // 2^62 · 4 elements wrap to 0 in 64 bits: the old reader handed libtorch [2^62, 4].
        (
            "overflowing shape",
            "[4611686018427387904, 4]",
            "[0, 0]",
            0,
            "overflows 64 bits",
        ),
        // (-1)·(-4) = 4 elements, and 16 bytes are there: libtorch was handed [-1, -4].
        ("negative shape", "[-1, -4]", "[0, 16]", 16, "dimension -1"),
    ] {
        n += 1;
        let dir = poisoned(
            &good,
            &tmp.path().join(format!("bad{n}")),
            "adapter_model.safetensors",
            |p| raw_safetensors(p, tensor, shape, offsets, data),
        );
        assert_refused(
            what,
            load(&format!("bad{n}"), &dir),
            "lora_path",
            &[says, "q_proj.lora_A", "adapter_model.safetensors"],
        );
    }
    // None of them was loaded; a good adapter still is, and serves.
    let (status, text, _) = post(
        &format!("{url}/completions"),
        &json!({"model": "bad1",
        "prompt": "one", "max_tokens": 2}),
    );
    assert_eq!(status, 404, "{text}");
    let (status, text, _) = load("good", &good);
    assert_eq!(status, 200, "{text}");
    assert_ne!(complete(&url, "good"), before);
    assert_eq!(complete(&url, "tiny"), before, "the base model changed");
    every_dialect_serves(&url, &root);
}

/// `POST /update_weights` with a folder whose `model.safetensors` is a FIFO, a link to
/// `/dev/zero` or a sparse giant, whose tensors have overflowing or negative shapes, or whose
/// shard index names a file outside the folder: each a prompt one-line 400, and the weights
/// served are unchanged (the same greedy answer, the same policy version).
#[test]
fn weight_folders_that_are_traps_are_refused_and_the_weights_stay() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    common::tiny_model(&model, 6);
    let server = common::InferenceServer::start(&model, &["--served-model-name", "tiny"]);
    let url = server.url.clone();
    let root = url.trim_end_matches("/v1").to_string();
    let before = complete(&url, "tiny");
    let update = |dir: &Path| {
        post(
            &format!("{root}/update_weights"),
            &json!({"model_path": dir.display().to_string()}),
        )
    };
    let mut n = 0;
    for (what, make, says) in ATTACKS {
        n += 1;
        let dir = poisoned(
            &model,
            &tmp.path().join(format!("bad{n}")),
            "model.safetensors",
            make,
        );
        assert_refused(
            what,
            update(&dir),
            "model_path",
            &all(says, &["model.safetensors"]),
        );
    }
    for (what, shape, offsets, data, says) in [
        (
            "overflowing shape",
            "[4294967296, 4294967296, 4]",
            "[0, 0]",
            0,
            "overflows 64 bits",
        ),
        ("negative shape", "[-2, -2]", "[0, 16]", 16, "dimension -2"),
    ] {
        n += 1;
        let dir = poisoned(
            &model,
            &tmp.path().join(format!("bad{n}")),
            "model.safetensors",
            |p| raw_safetensors(p, "model.norm.weight", shape, offsets, data),
        );
        assert_refused(
            what,
            update(&dir),
            "model_path",
            &[says, "model.norm.weight"],
        );
    }
    // A shard index that points outside the folder (here at /dev/zero) is refused by name.
    n += 1;
    let dir = tmp.path().join(format!("bad{n}"));
    common::copy_dir(&model, &dir);
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        json!({"weight_map": {"model.norm.weight": "/dev/zero"}}).to_string(),
    )
    .unwrap();
    assert_refused(
        "a shard outside the folder",
        update(&dir),
        "model_path",
        &["a shard must be a file name"],
    );
    assert_eq!(complete(&url, "tiny"), before, "the weights changed");
    // The same folder, unharmed, is taken: the route works.
    let (status, text, _) = update(&model);
    assert_eq!(status, 200, "{text}");
    assert_eq!(complete(&url, "tiny"), before);
    every_dialect_serves(&url, &root);
}

/// The flags that name files at start: `--lora-modules NAME=DIR` whose adapter weights are a
/// FIFO, and `@ FILE` naming a FIFO, end `host inference` at once with an error naming the file
/// (both used to wait forever for a writer); a link to `/dev/zero` likewise; a model whose
/// tensor has a negative shape is an error naming it, not a libtorch panic.
#[test]
fn flags_naming_traps_fail_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    common::tiny_model(&model, 6);
    let cfg = Qwen3Config::load(&model).unwrap();
    let good = tmp.path().join("good");
    common::random_lora(&cfg, 8.0, 5)
        .save_peft(&good, "tiny", None)
        .unwrap();
    let fifo_adapter = poisoned(
        &good,
        &tmp.path().join("fifo"),
        "adapter_model.safetensors",
        mkfifo,
    );
    let zero_adapter = poisoned(
        &good,
        &tmp.path().join("zero"),
        "adapter_config.json",
        link_to_dev_zero,
    );
    let fifo_toml = tmp.path().join("serve.toml");
    mkfifo(&fifo_toml);
    // A model whose weights libtorch would be handed with a negative shape (it panicked, and
    // the server died with exit 101 and the panic's text).
    let negative = poisoned(
        &model,
        &tmp.path().join("negative"),
        "model.safetensors",
        |p| raw_safetensors(p, "model.norm.weight", "[-2, -2]", "[0, 16]", 16),
    );
    // Exit 1 for an error; 2 for a command line that cannot be read (`@ FILE` is part of it).
    let cases: [(Vec<String>, i32, &[&str]); 4] = [
        (
            vec![
                "--enable-lora".into(),
                "--lora-modules".into(),
                format!("a={}", fifo_adapter.display()),
            ],
            1,
            &["FIFO", "adapter_model.safetensors"],
        ),
        (
            vec![
                "--enable-lora".into(),
                "--lora-modules".into(),
                format!("a={}", zero_adapter.display()),
            ],
            1,
            &["character device", "adapter_config.json"],
        ),
        (
            vec!["@".into(), fifo_toml.display().to_string()],
            2,
            &["FIFO", "serve.toml"],
        ),
        (
            vec!["--model.name".into(), negative.display().to_string()],
            1,
            &["dimension -2", "model.norm.weight"],
        ),
    ];
    for (mut args, code, says) in cases {
        if !args.iter().any(|a| a == "--model.name") {
            args.extend(["--model.name".into(), model.display().to_string()]);
        }
        let started = Instant::now();
        let log = tmp.path().join("stderr.txt");
        let mut child = Command::new(common::host_bin())
            .args(["inference", "--port", "0", "--dtype", "f32"])
            .args(&args)
            .env("RLHOST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // A child that outlives the deadline is killed, so a hang fails instead of waiting.
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > PROMPT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{args:?}: still running after {PROMPT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let took = started.elapsed();
        let err = std::fs::read_to_string(&log).unwrap();
        assert!(took < PROMPT, "{args:?}: took {took:?}: {err}");
        assert_eq!(status.code(), Some(code), "{args:?}: {err}");
        for s in says {
            assert!(err.contains(s), "{args:?}: {s:?} missing from {err}");
        }
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
