//! The first-party math environments and the math-verify reward plugin, loaded from the folders
//! `make plugins` assembles (datasets packed from the offline data folder), run through the real
//! runtime and, for the python tool, the real sandbox.

use std::path::PathBuf;
use std::sync::Arc;

use rlhost::plugin::{Environment, LoadOptions, PluginLoader, RewardFn, SandboxOffer};
use rlhost::sandbox::Sandbox;
use rlhost_sdk::messages::{assistant, assistant_with_calls, system, user};
use rlhost_sdk::types::{Example, Message, Metric, PluginError as GuestError, Rollout, ToolCall};

use crate::common::{self, dist};

/// The offline data folder the plugins were packed from.
fn data_dir() -> PathBuf {
    std::env::var_os("RLHOST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("../shared/data"))
}

fn first_row(file: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(data_dir().join(file)).unwrap();
    serde_json::from_str(text.lines().next().unwrap()).unwrap()
}

fn sandbox() -> Arc<dyn Sandbox> {
    common::python_sandbox().clone()
}

fn loader() -> PluginLoader {
    PluginLoader::new(
        LoadOptions {
            sandbox: SandboxOffer::Ready(sandbox()),
            ..Default::default()
        },
        None,
    )
    .unwrap()
}

async fn env(name: &str) -> Arc<dyn Environment> {
    loader().load_environment(&dist(name)).await.unwrap()
}

fn value(metrics: &[Metric], name: &str) -> f64 {
    metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no metric {name} in {metrics:?}"))
        .value
}

/// The reward the host computes: the rubric's weighted sum.
fn reward(env: &dyn Environment, metrics: &[Metric]) -> f64 {
    env.info()
        .rubric
        .iter()
        .map(|w| w.weight * value(metrics, &w.name))
        .sum()
}

async fn first_example(env: &dyn Environment, split: &str) -> Example {
    env.dataset(split, 0, 1).await.unwrap().examples.remove(0)
}

/// Plays `replies` as the assistant's turns, answering each with the environment, and scores.
async fn play(
    env: &dyn Environment,
    example: &Example,
    env_args: &str,
    replies: Vec<Message>,
) -> (Vec<Message>, Vec<Metric>) {
    let mut s = env.start(7).await.unwrap();
    let start = s.initial_prompt(example, env_args).await.unwrap();
    let mut conversation = start.messages;
    let mut state = start.state;
    for reply in replies {
        conversation.push(reply);
        let step = s.env_response(&conversation, &state).await.unwrap();
        conversation.extend(step.messages);
        state = step.state;
        if step.done {
            break;
        }
    }
    let rollout = Rollout {
        example: example.clone(),
        messages: conversation.clone(),
        state,
        truncated: false,
    };
    let metrics = s.score(&rollout).await.unwrap();
    (conversation, metrics)
}

const BOXED: &str = "Please reason step by step, and put your final answer within \\boxed{}.";

/// (plugin, split, data file, rows, the reference's system prompt)
const ENVS: &[(&str, &str, &str, u64, &str)] = &[
    (
        "math-python",
        "train",
        "math/train.jsonl",
        7500,
        "Use python for all calculations (variables do not persist). Give your answer inside \\boxed{}.",
    ),
    ("math500", "test", "math500/test.jsonl", 500, BOXED),
    ("aime2024", "test", "aime2024/test.jsonl", 30, BOXED),
    ("aime2025", "test", "aime2025/test.jsonl", 30, BOXED),
    (
        "deepscaler",
        "train",
        "deepscaler/train_partial.jsonl",
        10228,
        "You are a math assistant that can write python to solve math problems.",
    ),
    (
        "deepscaler",
        "test",
        "aime2024/test.jsonl",
        30,
        "You are a math assistant that can write python to solve math problems.",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datasets_have_the_expected_rows_and_first_prompts_render_as_the_references() {
    for (name, split, file, rows, prompt) in ENVS {
        let env = env(name).await;
        let page = env.dataset(split, 0, 2).await.unwrap();
        assert_eq!(page.total, *rows, "{name}/{split}");
        let last = env.dataset(split, rows - 1, 10).await.unwrap();
        assert_eq!(last.examples.len(), 1, "{name}/{split}: the last row pages");
        let reference = first_row(file);
        let example = &page.examples[0];
        assert_eq!(example.id, reference["id"].as_str().unwrap(), "{name}");
        assert_eq!(
            example.answer,
            reference["answer"].as_str().unwrap(),
            "{name}"
        );
        let mut s = env.start(1).await.unwrap();
        let start = s.initial_prompt(example, "{}").await.unwrap();
        // verifiers' format_prompt: the system prompt, then the problem as the user message.
        assert_eq!(
            start.messages,
            vec![
                system(*prompt),
                user(reference["problem"].as_str().unwrap())
            ],
            "{name}: first prompt"
        );
        let state: serde_json::Value = serde_json::from_str(&start.state).unwrap();
        let tool_env = matches!(*name, "math-python" | "deepscaler");
        assert_eq!(state["max_turns"], if tool_env { 3 } else { 1 }, "{name}");
        assert_eq!(
            state["tools"],
            serde_json::json!(if tool_env { vec!["python"] } else { vec![] }),
            "{name}: tools offered in this episode"
        );
        assert!(env.info().tools.iter().any(|t| t.name == "python"));
    }
    let err = env("math500")
        .await
        .dataset("train", 0, 1)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("train"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_completions_score_right_and_wrong() {
    for (name, split, ..) in ENVS {
        let env = env(name).await;
        // An integer answer, which the `seed` convention also extracts from bare text.
        let page = env.dataset(split, 0, 50).await.unwrap();
        let example = page
            .examples
            .iter()
            .find(|e| e.answer.parse::<i64>().is_ok())
            .expect("an integer answer in the first rows")
            .clone();
        let right = format!("So the answer is \\boxed{{{}}}.", example.answer);
        let (_, m) = play(env.as_ref(), &example, "{}", vec![assistant(right)]).await;
        assert_eq!(value(&m, "correct"), 1.0, "{name}: {m:?}");
        assert_eq!(value(&m, "num_turns"), 1.0);
        let n: i64 = example.answer.parse().unwrap();
        let wrong = format!("\\boxed{{{}}}", n + 1);
        let (_, m) = play(env.as_ref(), &example, "{}", vec![assistant(wrong)]).await;
        assert_eq!(value(&m, "correct"), 0.0, "{name}: {m:?}");
        let (_, m) = play(env.as_ref(), &example, "{}", vec![assistant("no idea")]).await;
        assert_eq!(value(&m, "correct"), 0.0, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_conventions_follow_the_seed_and_math_rubric() {
    // math500's first answer is bare LaTeX: the `seed` convention (verifiers' `math_python`: bare
    // answers) does not extract it at all, MathRubric's does, and accepts an equivalent rewrite.
    let env = env("math500").await;
    let example = first_example(env.as_ref(), "test").await;
    assert_eq!(example.answer, "\\left( 3, \\frac{\\pi}{2} \\right)");
    let rewrite = assistant("\\boxed{(3, \\dfrac{\\pi}{2})}");
    let (_, m) = play(env.as_ref(), &example, "{}", vec![rewrite.clone()]).await;
    assert_eq!(value(&m, "correct"), 1.0);
    // Under the `seed` convention bare LaTeX is extracted only where a number stands alone:
    // `\left( 3, … \right)` reads as 3 on both sides (so it matches), `\frac{\sqrt{3}}{2}`
    // reads as nothing (so even the exact answer scores 0), as Python math-verify does.
    let exact = assistant(format!("\\boxed{{{}}}", example.answer));
    let seed = r#"{"answer_convention": "seed"}"#;
    let (_, m) = play(env.as_ref(), &example, seed, vec![exact]).await;
    assert_eq!(value(&m, "correct"), 1.0);
    let surd = Example {
        answer: "\\frac{\\sqrt{3}}{2}".into(),
        ..example.clone()
    };
    let exact = assistant("\\boxed{\\frac{\\sqrt{3}}{2}}");
    let (_, m) = play(env.as_ref(), &surd, seed, vec![exact.clone()]).await;
    assert_eq!(
        value(&m, "correct"),
        0.0,
        "the `seed` convention misses bare LaTeX"
    );
    let (_, m) = play(env.as_ref(), &surd, "{}", vec![exact]).await;
    assert_eq!(value(&m, "correct"), 1.0);
    // use_think: only what follows </think> counts.
    let think = r#"{"use_think": true}"#;
    let hidden = assistant("<think>\\boxed{(3, \\frac{\\pi}{2})}</think> I am not sure.");
    let (_, m) = play(env.as_ref(), &example, think, vec![hidden]).await;
    assert_eq!(value(&m, "correct"), 0.0);
    let (_, m) = play(
        env.as_ref(),
        &example,
        think,
        vec![assistant("<think>hmm</think>\\boxed{(3,\\frac{\\pi}{2})}")],
    )
    .await;
    assert_eq!(value(&m, "correct"), 1.0);
    // Bad arguments are refused with the culprit named.
    let mut s = env.start(1).await.unwrap();
    let err = s
        .initial_prompt(&example, r#"{"tools": "bash"}"#)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("tools: unknown value \"bash\""),
        "{err}"
    );
    let _ = GuestError::InvalidArgs(String::new());
}

fn call(id: &str, code: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "python".into(),
        arguments: serde_json::json!({ "code": code }).to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn math_python_tool_follows_the_seeds_rules_through_the_real_sandbox() {
    let env = env("math-python").await;
    let example = Example {
        id: "t".into(),
        prompt: vec![],
        question: "What is 6 * 7?".into(),
        answer: "42".into(),
        info: "{}".into(),
    };
    let calls = vec![
        call("1", "print(6 * 7)"),
        call("2", "x = 6\nx * 7"),
        call("3", "'forty-two'"),
        call("4", "1 / 0"),
        call(
            "5",
            "import sys\nprint('out')\nprint('careful', file=sys.stderr)",
        ),
        call("6", "print('7' * 5000)"),
        call("7", "def broken(:"),
        call("8", "x"),
        call("9", "None"),
    ];
    let turns = vec![
        assistant_with_calls("Let me compute.", calls),
        assistant_with_calls("And a slow one.", vec![call("10", "while True:\n    pass")]),
        assistant("The answer is \\boxed{42}."),
    ];
    let args = r#"{"max_turns": 5}"#;
    let (conversation, m) = play(env.as_ref(), &example, args, turns).await;
    let tool = |id: &str| {
        conversation
            .iter()
            .find(|m| m.tool_call_id.as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no result for call {id}"))
            .content
            .clone()
    };
    assert_eq!(tool("1"), "42");
    assert_eq!(tool("2"), "42", "a trailing expression is printed");
    assert_eq!(tool("3"), "forty-two", "printed with print(), not repr()");
    let tb = tool("4");
    // Line 2: the cell became "\n_ = 1 / 0\nif _ is not None: print(_)", as verifiers' tool does.
    assert!(
        tb.starts_with(
            "Traceback (most recent call last):\n  File \"<string>\", line 2, in <module>\n"
        ),
        "{tb}"
    );
    assert!(tb.ends_with("ZeroDivisionError: division by zero"), "{tb}");
    assert_eq!(tool("5"), "careful", "stderr wins over stdout");
    assert_eq!(
        tool("6"),
        "7".repeat(1000),
        "output is cut at 1000 characters"
    );
    assert_eq!(tool("7"), "invalid syntax (<unknown>, line 1)");
    assert!(
        tool("8").ends_with("NameError: name 'x' is not defined"),
        "variables do not persist"
    );
    assert_eq!(tool("9"), "");
    assert_eq!(
        tool("10"),
        "Error: Code execution timed out after 10 seconds"
    );
    // correct 1, 3 turns, 10 tool messages, of which 3 contain "error" (ZeroDivisionError,
    // NameError, the timeout; the SyntaxError message says "invalid syntax").
    let errors = conversation
        .iter()
        .filter(|m| m.tool_call_id.is_some() && m.content.to_lowercase().contains("error"))
        .count() as f64;
    assert_eq!(errors, 3.0);
    assert_eq!(value(&m, "correct"), 1.0);
    assert_eq!(value(&m, "num_turns"), 3.0);
    assert_eq!(value(&m, "num_tool_calls"), 10.0);
    assert_eq!(value(&m, "num_errors"), errors);
    // The rubric's weighted sum in f64: a product and a sum per metric (γ over twice the
    // metrics, the weights' own roundings included), plus the hand value's two roundings,
    // relative to the terms' magnitudes.
    let r = reward(env.as_ref(), &m);
    let rubric = &env.info().rubric;
    let terms: f64 = rubric
        .iter()
        .map(|w| (w.weight * value(&m, &w.name)).abs())
        .sum();
    let bound =
        rlhost::testing::rounding::gamma(2 * rubric.len() + 2, tch::Kind::Double) * (terms + 1.0);
    assert!((r - (1.0 - 0.1 * errors)).abs() <= bound, "reward {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_are_capped_and_persistent_python_keeps_variables() {
    let env = env("math-python").await;
    let example = Example {
        id: "t".into(),
        prompt: vec![],
        question: "q".into(),
        answer: "42".into(),
        info: "{}".into(),
    };
    let keep = r#"{"python_state": "persistent", "max_turns": 4}"#;
    let turns = vec![
        assistant_with_calls("", vec![call("1", "y = 21\nprint('set')")]),
        assistant_with_calls("", vec![call("2", "y * 2")]),
        assistant("\\boxed{42}"),
    ];
    let (conversation, _) = play(env.as_ref(), &example, keep, turns).await;
    let results: Vec<&str> = conversation
        .iter()
        .filter(|m| m.tool_call_id.is_some())
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(results, vec!["set", "42"], "earlier cells replay silently");
    // The default: 3 turns; the third assistant message's calls are not run.
    let calls = |id: &str| assistant_with_calls("", vec![call(id, "1")]);
    let (conversation, m) = play(
        env.as_ref(),
        &example,
        "{}",
        vec![calls("a"), calls("b"), calls("c")],
    )
    .await;
    assert_eq!(value(&m, "num_turns"), 3.0);
    assert_eq!(value(&m, "num_tool_calls"), 2.0, "{conversation:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn math_verify_reward_plugin_scores_with_both_conventions() {
    let reward: Arc<dyn RewardFn> = loader().load_reward(&dist("math-verify")).await.unwrap();
    assert_eq!(reward.info().metrics, vec!["correct", "verify_timeout"]);
    let score = |c: &'static str, a: &'static str, i: &'static str| {
        let reward = reward.clone();
        async move { reward.score(c, a, i, 1).await }
    };
    let m = score("so \\boxed{\\frac{1}{2}} and \\boxed{7}", "0.5", "{}")
        .await
        .unwrap();
    assert_eq!(value(&m, "correct"), 1.0, "the first boxed answer counts");
    let m = score(
        "\\boxed{\\frac{\\sqrt{3}}{2}}",
        "\\frac{\\sqrt{3}}{2}",
        r#"{"convention":"seed"}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        value(&m, "correct"),
        0.0,
        "bare LaTeX is not extracted under the `seed` convention"
    );
    let m = score("x = 3", "3", r#"{"extract":"none"}"#).await.unwrap();
    assert_eq!(value(&m, "correct"), 1.0);
    let err = score("1", "1", r#"{"convention":"nope"}"#)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown answer convention \"nope\""),
        "{err}"
    );
    // A pathological answer gets a bounded verdict.
    let deep: &'static str = Box::leak(
        format!("\\boxed{{{}1{}}}", "(".repeat(20_000), ")".repeat(20_000)).into_boxed_str(),
    );
    let m = score(deep, "1", "{}").await.unwrap();
    assert_eq!(value(&m, "correct"), 0.0);
}

/// The `[[args]]` a math environment's manifest declares (what `host env info` and the
/// registry's page show) are the ones it accepts, and each declared default is what it does
/// when the argument is left out: the same prompt and the same episode state.
#[tokio::test]
async fn declared_arguments_are_accepted_and_their_defaults_are_true() {
    for name in [
        "math-python",
        "math500",
        "aime2024",
        "aime2025",
        "deepscaler",
        "arith",
    ] {
        let manifest = rlhost_registry::Manifest::load(&dist(name).join("plugin.toml")).unwrap();
        assert!(!manifest.args.is_empty(), "{name} declares no arguments");
        let env = env(name).await;
        let split = env.info().splits[0].clone();
        let example = first_example(env.as_ref(), &split).await;
        let mut s = env.start(1).await.unwrap();
        let plain = s.initial_prompt(&example, "{}").await.unwrap();
        for arg in &manifest.args {
            let (args, same) = match &arg.default {
                Some(d) => (format!("{{\"{}\": {d}}}", arg.name), true),
                None => {
                    let value = match arg.kind {
                        rlhost_registry::ArgType::String => "\"default\"",
                        rlhost_registry::ArgType::Integer => "2",
                        rlhost_registry::ArgType::Number => "0.5",
                        rlhost_registry::ArgType::Boolean => "true",
                    };
                    (format!("{{\"{}\": {value}}}", arg.name), false)
                }
            };
            let start = s
                .initial_prompt(&example, &args)
                .await
                .unwrap_or_else(|e| panic!("{name} refuses its declared {args}: {e:?}"));
            if same {
                assert_eq!(
                    start.messages, plain.messages,
                    "{name}: {args} is not the default"
                );
                assert_eq!(
                    start.state, plain.state,
                    "{name}: {args} is not the default"
                );
            }
        }
        let err = s
            .initial_prompt(&example, r#"{"not_an_argument": 1}"#)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not_an_argument"), "{name}: {err}");
    }
}
