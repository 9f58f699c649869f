//! The plugin runtime against real plugins: first-party `arith` and deliberately bad fixtures,
//! all built from `plugins/` by `make plugins` (as WebAssembly components, and `arith` also as a
//! native library). Every test loads them through plugin folders, as the host does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rlhost::plugin::{
    Environment, LoadOptions, PluginError, PluginErrorKind, PluginLimits, PluginLoader,
};
use rlhost_sdk::messages::{assistant, user};
use rlhost_sdk::types::{Example, PluginError as GuestError, Rollout};

use crate::common::{self, dist, plugins_target, wasm};

/// A built native library (any host target folder), or a clear instruction.
fn native(crate_name: &str) -> PathBuf {
    let file = format!("lib{}.so", crate_name.replace('-', "_"));
    std::fs::read_dir(plugins_target())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("release").join(&file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} is missing: run `make plugins` first"))
}

/// Writes a plugin folder: `plugin.toml`, the artifact, optional data files.
struct Folder {
    kind: &'static str,
    runtime: &'static str,
    abi: &'static str,
    capabilities: &'static str,
    data: &'static [(&'static str, &'static str)],
}

const ENV_WASM: Folder = Folder {
    kind: "environment",
    runtime: "wasm",
    abi: "rlhost:env@0.1.0",
    capabilities: "[]",
    data: &[],
};

/// The same environment folder around a native library.
const ENV_NATIVE: Folder = Folder {
    runtime: "native",
    ..ENV_WASM
};

impl Folder {
    fn write(&self, root: &Path, name: &str, artifact: &Path) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let file = if self.runtime == "wasm" {
            "plugin.wasm"
        } else {
            "plugin.so"
        };
        std::fs::copy(artifact, dir.join(file)).unwrap();
        std::fs::write(
            dir.join("plugin.toml"),
            format!(
                "[plugin]\nowner = \"test\"\nname = \"{name}\"\nversion = \"0.1.0\"\n\
                 kind = \"{}\"\nabi = \"{}\"\nruntime = \"{}\"\ncapabilities = {}\n",
                self.kind, self.abi, self.runtime, self.capabilities
            ),
        )
        .unwrap();
        for (path, text) in self.data {
            std::fs::write(dir.join("data").join(path), text).unwrap();
        }
        dir
    }
}

fn loader(limits: PluginLimits, allow_native: bool) -> PluginLoader {
    PluginLoader::new(
        LoadOptions {
            limits,
            allow_native,
            ..Default::default()
        },
        None,
    )
    .expect("runtime starts")
}

fn quick_limits() -> PluginLimits {
    PluginLimits {
        call_timeout: Duration::from_millis(500),
        memory_bytes: 64 << 20,
        fuel: None,
        max_instances: 64,
    }
}

fn example(question: &str, answer: &str) -> Example {
    Example {
        id: "x".into(),
        prompt: vec![],
        question: question.into(),
        answer: answer.into(),
        info: "{}".into(),
    }
}

async fn load_env(
    loader: &PluginLoader,
    root: &Path,
    name: &str,
    folder: &Folder,
    artifact: &Path,
) -> Result<Arc<dyn Environment>, PluginError> {
    let dir = folder.write(root, name, artifact);
    loader.load_environment(&dir).await
}

/// `name`: a WebAssembly environment folder around the built `crate_name`, loaded.
async fn wasm_env(
    loader: &PluginLoader,
    root: &Path,
    name: &str,
    crate_name: &str,
) -> Arc<dyn Environment> {
    load_env(loader, root, name, &ENV_WASM, &wasm(crate_name))
        .await
        .unwrap()
}

/// Why the host refuses to load `name`.
async fn refusal(
    loader: &PluginLoader,
    root: &Path,
    name: &str,
    folder: &Folder,
    artifact: &Path,
) -> PluginError {
    match load_env(loader, root, name, folder, artifact).await {
        Ok(_) => panic!("{name} loaded; it should be refused"),
        Err(e) => e,
    }
}

/// A rollout of the example `q`/`a` with no messages and no state, for `score`.
fn bare_rollout() -> Rollout {
    Rollout {
        example: example("q", "a"),
        messages: vec![],
        state: String::new(),
        truncated: false,
    }
}

/// Runs one rollout of arith where the model answers at once (no tool call) and returns its
/// metrics.
async fn arith_rollout(env: &dyn Environment, reply: &str) -> Vec<(String, f64)> {
    let page = env.dataset("test", 3, 1).await.unwrap();
    let ex = page.examples[0].clone();
    let mut session = env.start(7).await.unwrap();
    let start = session.initial_prompt(&ex, "{}").await.unwrap();
    let mut messages = start.messages.clone();
    messages.push(assistant(reply.replace("ANSWER", &ex.answer)));
    let step = session.env_response(&messages, &start.state).await.unwrap();
    assert!(step.done, "an answer without tool calls ends the episode");
    let metrics = session
        .score(&Rollout {
            example: ex,
            messages,
            state: step.state,
            truncated: false,
        })
        .await
        .unwrap();
    metrics.into_iter().map(|m| (m.name, m.value)).collect()
}

fn metrics(correct: f64) -> Vec<(String, f64)> {
    [
        ("correct", correct),
        ("num_turns", 1.0),
        ("num_tool_calls", 0.0),
        ("num_errors", 0.0),
        ("verify_timeout", 0.0),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arith_component_runs_a_rollout() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(PluginLimits::default(), false);
    let env = wasm_env(&loader, tmp.path(), "arith", "arith").await;
    assert_eq!(env.id().to_string(), "test/arith v0.1.0");
    let info = env.info();
    assert_eq!(info.name, "arith");
    assert_eq!(&info.splits[..4], ["train", "test", "train-d1", "test-d1"]);
    assert_eq!(info.rubric[0].name, "correct");
    assert_eq!(info.tools[0].name, "python");

    let page = env.dataset("train", 9_998, 10).await.unwrap();
    assert_eq!(page.total, 10_000);
    assert_eq!(page.examples.len(), 2, "the last page is clamped");
    assert_eq!(page.examples[0].id, "train-9998");

    let right = arith_rollout(env.as_ref(), r"So it is \boxed{ANSWER}.").await;
    assert_eq!(right, metrics(1.0));
    let wrong = arith_rollout(env.as_ref(), r"\boxed{ANSWER1}").await;
    assert_eq!(wrong, metrics(0.0));
    // Without a box the whole message is the answer (verifiers' extract_boxed_answer).
    let unboxed = arith_rollout(env.as_ref(), "ANSWER").await;
    assert_eq!(unboxed, metrics(1.0));
    let prose = arith_rollout(env.as_ref(), "I do not know").await;
    assert_eq!(prose, metrics(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_errors_are_reported_and_leave_the_instance_usable() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(PluginLimits::default(), false);
    let env = wasm_env(&loader, tmp.path(), "arith", "arith").await;
    let err = env.dataset("validation", 0, 1).await.unwrap_err();
    assert!(
        matches!(
            &*err.kind,
            PluginErrorKind::Guest { call: "dataset", error: GuestError::UnknownSplit(s) } if s == "validation"
        ),
        "{err}"
    );
    let mut session = env.start(1).await.unwrap();
    let ex = example("What is 1 + 1?", "2");
    let err = session
        .initial_prompt(&ex, r#"{"max_turns": 0}"#)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin test/arith v0.1.0: `initial-prompt` failed: invalid environment arguments: \
         max_turns: 0 is not in 1..=100"
    );
    let err = session
        .initial_prompt(&ex, r#"{"max_turns": 5, "typo": 1}"#)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown field `typo`"), "{err}");
    // A plugin-reported error does not poison the instance.
    let ok = session.initial_prompt(&ex, "{}").await.unwrap();
    assert_eq!(ok.messages[1], user("What is 1 + 1?"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn component_and_native_builds_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(PluginLimits::default(), true);
    let component = wasm_env(&loader, tmp.path(), "arith", "arith").await;
    let native = load_env(
        &loader,
        tmp.path(),
        "arith-native",
        &ENV_NATIVE,
        &native("arith"),
    )
    .await
    .unwrap();
    assert_eq!(component.info(), native.info());
    for (split, offset) in [("train", 0), ("train", 4_321), ("test", 490)] {
        assert_eq!(
            component.dataset(split, offset, 16).await.unwrap(),
            native.dataset(split, offset, 16).await.unwrap()
        );
    }
    for reply in [r"\boxed{ANSWER}", r"\boxed{ANSWER5}", "no box"] {
        assert_eq!(
            arith_rollout(component.as_ref(), reply).await,
            arith_rollout(native.as_ref(), reply).await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_plugins_need_permission() {
    let tmp = tempfile::tempdir().unwrap();
    let err = refusal(
        &loader(PluginLimits::default(), false),
        tmp.path(),
        "arith",
        &ENV_NATIVE,
        &native("arith"),
    )
    .await;
    assert!(
        matches!(*err.kind, PluginErrorKind::NativeNotAllowed),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("plugin test/arith v0.1.0: is a native plugin")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_plugin_with_a_wrong_abi_is_refused_before_any_other_call() {
    // The fixture's entry point aborts the process if called: reaching the assertion proves the
    // host stopped at the version symbol.
    let tmp = tempfile::tempdir().unwrap();
    let err = refusal(
        &loader(PluginLimits::default(), true),
        tmp.path(),
        "bad-abi",
        &ENV_NATIVE,
        &native("fixture-native-bad-abi"),
    )
    .await;
    assert_eq!(
        err.to_string(),
        "plugin test/bad-abi v0.1.0: targets rlhost:env@9.0.0, this host supports \
         rlhost:env@0.1.0..<0.2.0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_times_out_while_other_rollouts_go_on() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(quick_limits(), false);
    let env = wasm_env(&loader, tmp.path(), "looper", "fixture-looper").await;
    let ex = example("q", "a");
    let rollout = Rollout {
        example: ex.clone(),
        messages: vec![user("q"), assistant("a")],
        state: "{}".into(),
        truncated: false,
    };

    let started = Instant::now();
    let looping = {
        let env = env.clone();
        let rollout = rollout.clone();
        tokio::spawn(async move {
            let mut s = env.start(1).await.unwrap();
            s.score(&rollout).await
        })
    };
    // While that guest spins, other rollouts of the same plugin complete promptly.
    let mut others = Vec::new();
    for seed in 0..8 {
        let mut s = env.start(100 + seed).await.unwrap();
        s.initial_prompt(&ex, "{}").await.unwrap();
        others.push(started.elapsed());
    }
    let err = looping.await.unwrap().unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(*err.kind, PluginErrorKind::Timeout { call: "score", .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "plugin test/looper v0.1.0: `score` timed out after 500ms"
    );
    assert!(waited >= Duration::from_millis(500), "{waited:?}");
    assert!(
        others.iter().all(|t| *t < Duration::from_millis(450)),
        "other rollouts were held up: {others:?}"
    );
    // The plugin still serves new rollouts.
    let mut s = env.start(2).await.unwrap();
    assert!(s.initial_prompt(&ex, "{}").await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuel_stops_an_infinite_loop_deterministically() {
    let tmp = tempfile::tempdir().unwrap();
    let limits = PluginLimits {
        fuel: Some(50_000_000),
        call_timeout: Duration::from_secs(30),
        ..quick_limits()
    };
    let loader = loader(limits, false);
    let env = wasm_env(&loader, tmp.path(), "looper", "fixture-looper").await;
    let mut s = env.start(1).await.unwrap();
    let err = s.score(&bare_rollout()).await.unwrap_err();
    assert!(
        matches!(
            *err.kind,
            PluginErrorKind::OutOfFuel {
                call: "score",
                fuel: 50_000_000
            }
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_is_stopped_at_the_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(quick_limits(), false);
    let env = wasm_env(&loader, tmp.path(), "bomb", "fixture-memory-bomb").await;
    let mut s = env.start(1).await.unwrap();
    let err = s
        .initial_prompt(&example("q", "a"), "{}")
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin test/bomb v0.1.0: `initial-prompt` ran out of memory (limit 64 MiB)"
    );
    // That session is done for; a new one is fresh.
    let again = s
        .initial_prompt(&example("q", "a"), "{}")
        .await
        .unwrap_err();
    assert!(matches!(*again.kind, PluginErrorKind::Poisoned), "{again}");
    let mut fresh = env.start(2).await.unwrap();
    let rollout = bare_rollout();
    assert_eq!(fresh.score(&rollout).await.unwrap()[0].value, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panicking_guest_names_the_plugin_and_the_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(quick_limits(), false);
    let env = wasm_env(&loader, tmp.path(), "panicker", "fixture-panicker").await;
    let mut s = env.start(1).await.unwrap();
    let start = s.initial_prompt(&example("q", "a"), "{}").await.unwrap();
    let err = s
        .env_response(&start.messages, &start.state)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("plugin test/panicker v0.1.0: `env-response` crashed:"),
        "{text}"
    );
    assert!(text.contains("fixture panic after 1 messages"), "{text}");
    let mut fresh = env.start(2).await.unwrap();
    assert!(fresh.initial_prompt(&example("q", "a"), "{}").await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_abi_is_refused_before_instantiation() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(PluginLimits::default(), false);
    // An honest manifest is refused before the artifact is even read, and a manifest that lies
    // is caught by the version inside the component.
    let honest = Folder {
        abi: "rlhost:env@0.2.0",
        ..ENV_WASM
    };
    for (name, folder) in [("future", &honest), ("liar", &ENV_WASM)] {
        let err = refusal(
            &loader,
            tmp.path(),
            name,
            folder,
            &wasm("fixture-future-abi"),
        )
        .await;
        assert_eq!(
            err.to_string(),
            format!(
                "plugin test/{name} v0.1.0: targets rlhost:env@0.2.0, this host supports \
                 rlhost:env@0.1.0..<0.2.0"
            )
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compatible_newer_patch_abi_is_accepted_and_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(PluginLimits::default(), false);
    let folder = Folder {
        abi: "rlhost:env@0.1.1",
        ..ENV_WASM
    };
    let env = load_env(
        &loader,
        tmp.path(),
        "compat",
        &folder,
        &wasm("fixture-compat-minor"),
    )
    .await
    .unwrap();
    assert_eq!(env.info().name, "compat-minor");
    let mut s = env.start(3).await.unwrap();
    let start = s
        .initial_prompt(&example("hello", "x"), "{}")
        .await
        .unwrap();
    assert_eq!(start.messages, vec![user("hello")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_artifacts_are_refused_with_the_file_named() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(PluginLimits::default(), false);
    let garbage = tmp.path().join("garbage.wasm");
    std::fs::write(&garbage, b"definitely not wasm").unwrap();
    let err = refusal(&loader, tmp.path(), "garbage", &ENV_WASM, &garbage).await;
    let text = err.to_string();
    assert!(text.starts_with("plugin test/garbage v0.1.0: "), "{text}");
    assert!(
        text.contains("plugin.wasm: not a valid WebAssembly binary"),
        "{text}"
    );

    // A reward manifest on an environment component.
    let as_reward = Folder {
        kind: "reward",
        ..ENV_WASM
    };
    let dir = as_reward.write(tmp.path(), "confused", &wasm("arith"));
    let err = loader.load_reward(&dir).await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "plugin test/confused v0.1.0: plugin.toml says a reward function but the component \
         exports an environment"
    );

    // A missing manifest names the folder.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let err = loader.load_environment(&empty).await.err().unwrap();
    assert!(err.to_string().contains("plugin.toml"), "{err}");
}

const PROBE_DATA: &[(&str, &str)] = &[(
    "train.jsonl",
    "{\"id\": \"p1\", \"problem\": \"2+2?\", \"answer\": 4, \"level\": 1}\n\
     {\"question\": \"3+3?\", \"answer\": \"6\"}\n",
)];

async fn probe_prompt(env: &dyn Environment, args: &str) -> String {
    let mut s = env.start(5).await.unwrap();
    let start = s.initial_prompt(&example("q", "a"), args).await.unwrap();
    start.messages[0].content.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_see_their_data_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("secret.txt"), "host secret").unwrap();
    let loader = loader(PluginLimits::default(), false);
    let folder = Folder {
        data: PROBE_DATA,
        ..ENV_WASM
    };
    let env = load_env(
        &loader,
        tmp.path(),
        "probe",
        &folder,
        &wasm("fixture-probe"),
    )
    .await
    .unwrap();

    let page = env.dataset("train", 0, 10).await.unwrap();
    assert_eq!(page.total, 2);
    assert_eq!(page.examples[0].id, "p1");
    assert_eq!(page.examples[0].answer, "4");
    assert_eq!(page.examples[0].info, r#"{"level":1}"#);
    let err = env.dataset("validation", 0, 10).await.unwrap_err();
    assert!(matches!(*err.kind, PluginErrorKind::Guest { .. }), "{err}");

    let read = probe_prompt(env.as_ref(), r#"{"read": "train.jsonl"}"#).await;
    assert!(read.starts_with("ok: {\"id\": \"p1\""), "{read}");
    for escape in ["../secret.txt", "../../secret.txt", "/etc/passwd"] {
        let text = probe_prompt(env.as_ref(), &format!(r#"{{"read": "{escape}"}}"#)).await;
        assert!(text.starts_with("err: "), "{escape}: {text}");
        assert!(!text.contains("host secret"), "{escape}: {text}");
    }
    // WASI: the data folder is mounted read-only at /data; nothing else exists.
    let via_fs = probe_prompt(env.as_ref(), r#"{"fs": "/data/train.jsonl"}"#).await;
    assert!(via_fs.starts_with("ok: {\"id\": \"p1\""), "{via_fs}");
    for path in ["/data/../secret.txt", "/etc/passwd", "secret.txt"] {
        let text = probe_prompt(env.as_ref(), &format!(r#"{{"fs": "{path}"}}"#)).await;
        assert!(text.starts_with("err: "), "{path}: {text}");
    }
    let home = probe_prompt(env.as_ref(), r#"{"env": "HOME"}"#).await;
    assert!(
        home.starts_with("err: "),
        "environment variables leak: {home}"
    );
    assert_eq!(
        probe_prompt(env.as_ref(), r#"{"clock": true}"#).await,
        "ok: 0",
        "clocks are frozen"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_and_randomness_are_per_rollout_and_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(PluginLimits::default(), false);
    let env = wasm_env(&loader, tmp.path(), "probe", "fixture-probe").await;
    let score = |seed: u64| {
        let env = env.clone();
        async move {
            let mut s = env.start(seed).await.unwrap();
            let rollout = bare_rollout();
            s.score(&rollout).await.unwrap()[0].value
        }
    };
    assert_eq!(score(12345).await, 12345.0);
    assert_eq!(score(0xABCD_0000_0042).await, 0x0000_0042 as f64);
    let random = |seed: u64| {
        let env = env.clone();
        async move {
            let mut s = env.start(seed).await.unwrap();
            s.initial_prompt(&example("q", "a"), r#"{"random": true}"#)
                .await
                .unwrap()
                .messages[0]
                .content
                .clone()
        }
    };
    assert_eq!(random(1).await, random(1).await);
    assert_ne!(random(1).await, random(2).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_needs_the_capability_and_a_sandbox() {
    let tmp = tempfile::tempdir().unwrap();
    let loader = loader(PluginLimits::default(), false);
    let python = |env: Arc<dyn Environment>| async move {
        let mut s = env.start(1).await.unwrap();
        let step = s.env_response(&[], "{}").await.unwrap();
        step.messages[0].content.clone()
    };
    let undeclared = wasm_env(&loader, tmp.path(), "probe", "fixture-probe").await;
    assert!(undeclared.capabilities().missing().is_empty());
    let text = python(undeclared).await;
    assert!(
        text.starts_with("err: capability `sandbox.python` is not granted"),
        "{text}"
    );
    // Declared, and this loader has no sandbox: refused at load, naming what and why.
    let declared = Folder {
        capabilities: "[\"sandbox.python\"]",
        ..ENV_WASM
    };
    let err = load_env(
        &loader,
        tmp.path(),
        "probe2",
        &declared,
        &wasm("fixture-probe"),
    )
    .await
    .map(|_| ())
    .unwrap_err();
    let PluginErrorKind::CapabilitiesUnavailable(missing) = &*err.kind else {
        panic!("{err}");
    };
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].capability, "sandbox.python");
    assert_eq!(
        missing[0].reason,
        "this host was set up without a Python sandbox"
    );
    assert!(
        err.to_string().starts_with(
            "plugin test/probe2 v0.1.0: cannot run on this host: it needs capability \
             `sandbox.python`, which this host cannot grant"
        ),
        "{err}"
    );
    // Told to run without it: it loads, says what it lacks, and its calls fail.
    let lenient = PluginLoader::new(
        LoadOptions {
            allow_missing_capabilities: true,
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let env = load_env(
        &lenient,
        tmp.path(),
        "probe3",
        &declared,
        &wasm("fixture-probe"),
    )
    .await
    .unwrap();
    let lacks: Vec<&str> = env
        .capabilities()
        .missing()
        .iter()
        .map(|m| m.capability.as_str())
        .collect();
    assert_eq!(lacks, ["sandbox.python"]);
    assert_eq!(
        python(env.clone()).await,
        "err: no Python sandbox: this host was set up without a Python sandbox"
    );
    // A call refused for a missing sandbox is not a sandbox that died.
    assert!(env.capabilities().lost().is_none());
    // Grants that leave the capability out refuse it the same way, naming the grants.
    let strict = PluginLoader::new(
        LoadOptions {
            grants: rlhost::plugin::Grants::none(),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let err = load_env(
        &strict,
        tmp.path(),
        "probe4",
        &declared,
        &wasm("fixture-probe"),
    )
    .await
    .map(|_| ())
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("this host's grants (none) leave it out"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_components_are_cached_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let loader = PluginLoader::new(LoadOptions::default(), Some(cache.clone())).unwrap();
    let dir = ENV_WASM.write(tmp.path(), "arith", &wasm("arith"));
    loader.load_environment(&dir).await.unwrap();
    let entries: Vec<_> = std::fs::read_dir(cache.join("components"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(entries[0].to_string_lossy().ends_with(".cwasm"));
    // A second load uses the entry; a corrupted entry is replaced, not fatal.
    loader.load_environment(&dir).await.unwrap();
    std::fs::write(&entries[0], b"corrupt").unwrap();
    let env = loader.load_environment(&dir).await.unwrap();
    assert_eq!(env.info().name, "arith");
    assert_ne!(std::fs::read(&entries[0]).unwrap(), b"corrupt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reward_plugin_as_component_and_native_agree() {
    let loader = loader(PluginLimits::default(), true);
    let component = loader.load_reward(&dist("exact-match")).await.unwrap();
    let native = loader
        .load_reward(&dist("exact-match-native"))
        .await
        .unwrap();
    assert_eq!(component.id().to_string(), "rlhost/exact-match v0.1.0");
    assert_eq!(component.info(), native.info());
    assert_eq!(component.info().metrics, vec!["exact_match", "has_answer"]);
    let cases = [
        (r"so \boxed{ 42 }.", "42", "{}", [1.0, 1.0]),
        (r"\boxed{\$Paris.}", "paris", "{}", [0.0, 1.0]),
        (r"\boxed{$Paris$.}", "paris", "{}", [1.0, 1.0]),
        ("The answer is\n\n  17  \n", "17", "{}", [0.0, 0.0]),
        (
            "The answer is\n17\n",
            "17",
            r#"{"fallback": "last-line"}"#,
            [1.0, 1.0],
        ),
        (r"\boxed{41}", "42", "{}", [0.0, 1.0]),
    ];
    for (completion, answer, info, expected) in cases {
        for reward in [&component, &native] {
            let metrics = reward.score(completion, answer, info, 0).await.unwrap();
            let values: Vec<f64> = metrics.iter().map(|m| m.value).collect();
            assert_eq!(values, expected, "{} on {completion:?}", reward.id());
        }
    }
    for reward in [&component, &native] {
        let err = reward
            .score("x", "y", r#"{"fallback": "first-line"}"#, 0)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "plugin rlhost/exact-match v0.1.0: `score` failed: invalid input: unknown \
             fallback \"first-line\" (expected \"last-line\")"
        );
    }
    // A reward folder is not an environment, whatever the caller hopes.
    let err = loader
        .load_environment(&dist("exact-match"))
        .await
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "plugin rlhost/exact-match v0.1.0: is a reward function, not an environment"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_datasets_page_through_one_instance() {
    let tmp = tempfile::tempdir().unwrap();
    let rows: String = (0..40_000)
        .map(|i| format!("{{\"id\": \"r{i}\", \"question\": \"q{i}\", \"answer\": \"{i}\"}}\n"))
        .collect();
    let dir = ENV_WASM.write(tmp.path(), "probe", &wasm("fixture-probe"));
    std::fs::write(dir.join("data/train.jsonl"), rows).unwrap();
    let env = loader(PluginLimits::default(), false)
        .load_environment(&dir)
        .await
        .unwrap();
    let mut seen = 0u64;
    while seen < 40_000 {
        let page = env.dataset("train", seen, 1_000).await.unwrap();
        assert_eq!(page.total, 40_000);
        assert_eq!(page.examples.len(), 1_000);
        assert_eq!(page.examples[0].id, format!("r{seen}"));
        assert_eq!(page.examples[999].answer, (seen + 999).to_string());
        seen += 1_000;
    }
    assert!(
        env.dataset("train", seen, 1_000)
            .await
            .unwrap()
            .examples
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_environment_answers_tool_calls_across_turns() {
    use rlhost_sdk::messages::assistant_with_calls;
    use rlhost_sdk::types::{Role, ToolCall};

    let env = loader(PluginLimits::default(), false)
        .load_environment(&dist("arith-tools"))
        .await
        .unwrap();
    let info = env.info();
    assert_eq!(info.tools[0].name, "calculator");
    let schema: serde_json::Value = serde_json::from_str(&info.tools[0].parameters).unwrap();
    assert_eq!(schema["properties"]["expression"]["type"], "string");

    let ex = env.dataset("test", 0, 1).await.unwrap().examples[0].clone();
    let expression = common::arith_expression(&ex.question);
    let mut s = env.start(9).await.unwrap();
    let start = s.initial_prompt(&ex, "{}").await.unwrap();
    let mut conv = start.messages.clone();
    let call = |id: &str, args: String| ToolCall {
        id: id.into(),
        name: "calculator".into(),
        arguments: args,
    };
    conv.push(assistant_with_calls(
        "",
        vec![
            call(
                "c1",
                serde_json::json!({ "expression": expression }).to_string(),
            ),
            call("c2", "{\"expr\": 1}".into()),
        ],
    ));
    let step = s.env_response(&conv, &start.state).await.unwrap();
    assert!(!step.done, "a turn with tool calls continues the episode");
    assert_eq!(step.messages.len(), 2);
    assert_eq!(step.messages[0].role, Role::Tool);
    assert_eq!(step.messages[0].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(step.messages[0].content, ex.answer);
    assert!(
        step.messages[1]
            .content
            .starts_with("error: invalid input: invalid arguments for `calculator`"),
        "{}",
        step.messages[1].content
    );
    conv.extend(step.messages);
    conv.push(assistant(format!("\\boxed{{{}}}", ex.answer)));
    let last = s.env_response(&conv, &step.state).await.unwrap();
    assert!(last.done, "a reply without tool calls ends the episode");
    let metrics = s
        .score(&Rollout {
            example: ex,
            messages: conv,
            state: last.state,
            truncated: false,
        })
        .await
        .unwrap();
    let values: Vec<(&str, f64)> = metrics.iter().map(|m| (m.name.as_str(), m.value)).collect();
    assert_eq!(values, vec![("correct", 1.0), ("tool_calls", 2.0)]);
}
