//! One environment in three flavours — `arith-tools` as a Rust component (`plugins/arith-tools`),
//! as a Python component built by `host env pack` from the Python SDK
//! (`sdk/python/examples/arith_tools`) and as an Extism plugin in AssemblyScript
//! (`plugins/extism/arith-tools`) — must be indistinguishable to the host: same info, dataset,
//! prompts, tool results, states and rewards on the same scripted conversation. And the hostile
//! plugin tests of the runtime (infinite loop, memory bomb, trap, wrong ABI) for the Python and
//! Extism flavours. All folders are built by `make plugins`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rlhost::plugin::{
    Environment, LoadOptions, PluginError, PluginErrorKind, PluginLimits, PluginLoader,
    SandboxOffer,
};
use rlhost::sandbox::Sandbox;
use rlhost_sdk::messages::{assistant, assistant_with_calls};
use rlhost_sdk::types::{Message, Metric, PluginError as GuestError, Rollout, ToolCall};

use crate::common::{self, dist};

/// The Python sandbox behind the `run-python` host function (`make sandbox`).
fn sandbox() -> Arc<dyn Sandbox> {
    common::python_sandbox().clone()
}

/// A loader whose compiled components are cached beside the built plugins (a Python
/// component takes seconds to compile; every test after the first loads it in milliseconds).
fn loader(limits: PluginLimits) -> PluginLoader {
    let cache = common::plugins_target().join("component-cache");
    PluginLoader::new(
        LoadOptions {
            limits,
            sandbox: SandboxOffer::Ready(sandbox()),
            ..Default::default()
        },
        Some(cache),
    )
    .expect("runtime starts")
}

fn quick_limits() -> PluginLimits {
    PluginLimits {
        call_timeout: Duration::from_millis(1500),
        memory_bytes: 64 << 20,
        fuel: None,
        max_instances: 16,
    }
}

/// Everything observable of one scripted rollout.
#[derive(Debug, PartialEq)]
struct Transcript {
    info: serde_json::Value,
    pages: Vec<serde_json::Value>,
    unknown_split: String,
    prompt: Vec<Message>,
    states: Vec<String>,
    tool_results: Vec<Vec<Message>>,
    done: Vec<bool>,
    metrics: Vec<Metric>,
}

fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.to_string(),
    }
}

/// Drives `env` through the same conversation: two tool turns (a correct expression, overflow,
/// division by zero, bad syntax, an unknown tool, unicode), then a boxed answer.
async fn transcript(env: &dyn Environment) -> Transcript {
    let info = serde_json::to_value(env.info()).unwrap();
    let mut pages = Vec::new();
    for (split, offset, limit) in [("train", 0, 3), ("test", 198, 5), ("test", 500, 2)] {
        let page = env.dataset(split, offset, limit).await.unwrap();
        pages.push(serde_json::to_value(page).unwrap());
    }
    let unknown_split = env.dataset("dev", 0, 1).await.unwrap_err().to_string();
    let ex = env.dataset("test", 7, 1).await.unwrap().examples.remove(0);
    let expression = common::arith_expression(&ex.question);

    let mut session = env.start(11).await.unwrap();
    let start = session.initial_prompt(&ex, "{}").await.unwrap();
    let mut conv = start.messages.clone();
    let mut state = start.state.clone();
    let (mut states, mut tool_results, mut done) = (vec![state.clone()], vec![], vec![]);
    let turns = [
        vec![
            call(
                "c1",
                "calculator",
                serde_json::json!({ "expression": expression }),
            ),
            call(
                "c2",
                "calculator",
                serde_json::json!({ "expression": "9223372036854775807 + 1" }),
            ),
            call(
                "c3",
                "calculator",
                serde_json::json!({ "expression": "(7 - 7) / 0" }),
            ),
        ],
        vec![
            call(
                "c4",
                "calculator",
                serde_json::json!({ "expression": "2 * (3 + 4" }),
            ),
            call(
                "c5",
                "calculator",
                serde_json::json!({ "expression": "12 ÷ 4" }),
            ),
            call(
                "c6",
                "calculator",
                serde_json::json!({ "expression": "-(-3) * -9 / 2 + 1x" }),
            ),
            call("c7", "search", serde_json::json!({ "query": "primes" })),
            call(
                "c8",
                "calculator",
                serde_json::json!({ "expression": " -2 * -(3 - 10) / 4 " }),
            ),
        ],
    ];
    for calls in turns {
        conv.push(assistant_with_calls("let me compute", calls));
        let step = session.env_response(&conv, &state).await.unwrap();
        state = step.state.clone();
        states.push(state.clone());
        done.push(step.done);
        tool_results.push(step.messages.clone());
        conv.extend(step.messages);
    }
    conv.push(assistant(format!(
        "The result is \\boxed{{{}}}, I think.",
        ex.answer
    )));
    let last = session.env_response(&conv, &state).await.unwrap();
    done.push(last.done);
    states.push(last.state.clone());
    let metrics = session
        .score(&Rollout {
            example: ex.clone(),
            messages: conv.clone(),
            state: last.state,
            truncated: false,
        })
        .await
        .unwrap();
    Transcript {
        info,
        pages,
        unknown_split,
        prompt: start.messages,
        states,
        tool_results,
        done,
        metrics,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_environment_in_rust_python_and_extism_behaves_identically() {
    let loader = loader(PluginLimits::default());
    let rust = loader.load_environment(&dist("arith-tools")).await.unwrap();
    let reference = transcript(rust.as_ref()).await;
    // The reference itself is what the scripted conversation means.
    let results: Vec<&str> = reference.tool_results[0]
        .iter()
        .chain(&reference.tool_results[1])
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results[1], "error: overflow");
    assert_eq!(results[2], "error: overflow or division by zero");
    assert_eq!(results[3], "error: missing )");
    assert_eq!(results[4], "error: unexpected input at position 2");
    assert_eq!(results[5], "error: unexpected input at position 12");
    assert_eq!(results[6], "error: unknown tool \"search\"");
    assert_eq!(results[7], "-3");
    assert_eq!(reference.done, vec![false, false, true]);
    let metrics: Vec<(&str, f64)> = reference
        .metrics
        .iter()
        .map(|m| (m.name.as_str(), m.value))
        .collect();
    assert_eq!(metrics, vec![("correct", 1.0), ("tool_calls", 8.0)]);

    for flavour in ["arith-tools-extism", "arith-tools-python"] {
        let env = loader.load_environment(&dist(flavour)).await.unwrap();
        let got = transcript(env.as_ref()).await;
        assert_eq!(got.info, reference.info, "{flavour}: info");
        assert_eq!(got.pages, reference.pages, "{flavour}: dataset pages");
        assert_eq!(
            got.unknown_split.replace(flavour, "arith-tools"),
            reference.unknown_split,
            "{flavour}: unknown split"
        );
        assert_eq!(got.prompt, reference.prompt, "{flavour}: prompt");
        assert_eq!(
            got.tool_results, reference.tool_results,
            "{flavour}: tool results"
        );
        assert_eq!(got.states, reference.states, "{flavour}: states");
        assert_eq!(got.done, reference.done, "{flavour}: done");
        assert_eq!(got.metrics, reference.metrics, "{flavour}: rewards");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reward_function_in_rust_python_and_extism_scores_identically() {
    let loader = loader(PluginLimits::default());
    let cases = [
        (r"so \boxed{ 42 }.", "42", "{}"),
        (r"\boxed{$\frac{1}{2}$.}", r"\frac{1}{2}", "{}"),
        (
            "The answer is\n  Paris  of   France.  \n\n",
            "paris OF france",
            r#"{"fallback":"last-line"}"#,
        ),
        ("no box here", "7", "{}"),
        (r"\boxed{6} then \boxed{7}", "6", "{}"),
        (r"\boxed 12$", "12", "{}"),
    ];
    let rust = loader.load_reward(&dist("exact-match")).await.unwrap();
    let mut reference = Vec::new();
    for (completion, answer, info) in cases {
        reference.push(rust.score(completion, answer, info, 3).await.unwrap());
    }
    let flat: Vec<f64> = reference.iter().flatten().map(|m| m.value).collect();
    assert_eq!(
        flat,
        vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    );
    let bad = rust
        .score("x", "y", r#"{"fallback":"first-line"}"#, 3)
        .await
        .unwrap_err();
    for flavour in ["exact-match-python", "exact-match-extism"] {
        let reward = loader.load_reward(&dist(flavour)).await.unwrap();
        assert_eq!(reward.info(), rust.info(), "{flavour}: info");
        for ((completion, answer, info), want) in cases.iter().zip(&reference) {
            let got = reward.score(completion, answer, info, 3).await.unwrap();
            assert_eq!(&got, want, "{flavour}: {completion:?} vs {answer:?}");
        }
        let e = reward
            .score("x", "y", r#"{"fallback":"first-line"}"#, 3)
            .await
            .unwrap_err();
        assert_eq!(
            e.kind.to_string(),
            bad.kind.to_string(),
            "{flavour}: the same error"
        );
    }
}

fn kind(e: &PluginError) -> &PluginErrorKind {
    &e.kind
}

/// The hostile tests, against one flavour's fixture: `dataset(split)` misbehaves by split.
async fn hostile(env: Arc<dyn Environment>, flavour: &str) {
    let t = Instant::now();
    let e = env.dataset("loop", 0, 1).await.unwrap_err();
    assert!(
        matches!(
            kind(&e),
            PluginErrorKind::Timeout {
                call: "dataset",
                ..
            }
        ),
        "{flavour}: {e}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "{flavour}: a loop is stopped at the deadline ({:?})",
        t.elapsed()
    );
    // The plugin is still usable: the broken instance was replaced.
    env.dataset("ok", 0, 1).await.unwrap();

    let e = env.dataset("bomb", 0, 1).await.unwrap_err();
    assert!(
        matches!(kind(&e), PluginErrorKind::OutOfMemory { limit_mib: 64, .. }),
        "{flavour}: {e}"
    );
    env.dataset("ok", 0, 1).await.unwrap();

    let e = env.dataset("trap", 0, 1).await.unwrap_err();
    assert!(
        matches!(
            kind(&e),
            PluginErrorKind::Crash {
                call: "dataset",
                ..
            }
        ),
        "{flavour}: {e}"
    );
    assert!(e.to_string().contains(flavour), "names the plugin: {e}");
    env.dataset("ok", 0, 1).await.unwrap();

    let e = env.dataset("nope", 0, 1).await.unwrap_err();
    assert!(
        matches!(
            kind(&e),
            PluginErrorKind::Guest {
                error: GuestError::UnknownSplit(s),
                ..
            } if s == "nope"
        ),
        "{flavour}: {e}"
    );

    // The host API: data files, the Python sandbox (whose time does not count against the
    // call's deadline), errors passed back.
    let page = env.dataset("data", 0, 1).await.unwrap();
    assert_eq!(
        page.examples[0].question, "hello from the data folder\n",
        "{flavour}"
    );
    let e = env.dataset("missing", 0, 1).await.unwrap_err();
    assert!(
        matches!(kind(&e), PluginErrorKind::Guest { error: GuestError::Internal(m), .. }
            if m.contains("nope.txt")),
        "{flavour}: {e}"
    );
    let page = env.dataset("python", 0, 1).await.unwrap();
    assert_eq!(page.examples[0].question, "42\n", "{flavour}");

    // Rollouts are isolated and seeded: the seed reaches the plugin through the host API.
    let ex = rlhost_sdk::types::Example {
        id: "x".into(),
        prompt: vec![],
        question: "q".into(),
        answer: "a".into(),
        info: "{}".into(),
    };
    let mut s = env.start(424242).await.unwrap();
    let start = s.initial_prompt(&ex, "{}").await.unwrap();
    assert_eq!(start.messages[0].content, "seed 424242", "{flavour}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_extism_plugins_are_contained() {
    let loader = loader(quick_limits());
    let env = loader
        .load_environment(&dist("fixture-extism-hostile"))
        .await
        .unwrap();
    hostile(env, "fixtures/extism-hostile").await;
    let e = env_abort(&loader).await;
    assert!(e.contains("deliberate assertion failure"), "{e}");

    future_abi_is_refused(&loader, "fixture-extism-future-abi").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_python_plugins_are_contained() {
    let loader = loader(quick_limits());
    let env = loader
        .load_environment(&dist("fixture-python-hostile"))
        .await
        .unwrap();
    hostile(env.clone(), "fixtures/python-hostile").await;
    // A Python exception that is not a plugin error crashes the call, and the host shows the
    // traceback.
    let e = env.dataset("trap", 0, 1).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("deliberate crash in a Python plugin"),
        "{e}"
    );

    future_abi_is_refused(&loader, "fixture-python-future-abi").await;
}

/// Loading the fixture `name`, built for ABI 9.0, is refused as an ABI mismatch.
async fn future_abi_is_refused(loader: &PluginLoader, name: &str) {
    let e = loader
        .load_environment(&dist(name))
        .await
        .err()
        .expect("a future ABI is refused");
    assert!(
        matches!(kind(&e), PluginErrorKind::AbiMismatch { found, .. } if found.major == 9),
        "{e}"
    );
}

/// An AssemblyScript `assert` becomes an Extism error, reported as the plugin's own failure.
async fn env_abort(loader: &PluginLoader) -> String {
    let env = loader
        .load_environment(&dist("fixture-extism-hostile"))
        .await
        .unwrap();
    let e = env.dataset("abort", 0, 1).await.unwrap_err();
    assert!(
        matches!(
            kind(&e),
            PluginErrorKind::Guest {
                error: GuestError::Internal(_),
                ..
            } | PluginErrorKind::Crash { .. }
        ),
        "{e}"
    );
    e.to_string()
}
