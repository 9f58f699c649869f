//! End-to-end: a plugin author's first steps. `host env init` makes a project; plain
//! `cargo build --release` turns it into a component; the host loads it and runs a rollout.

use std::process::Command;

use rlhost::plugin::{LoadOptions, PluginLoader};
use rlhost_sdk::messages::assistant;
use rlhost_sdk::types::Rollout;

use crate::common::{host, repo_root, run, run_err, texts};

#[test]
fn init_build_load_and_score_a_new_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("capitals");
    let out = run(host(tmp.path())
        .args(["env", "init", "capitals", "--owner", "alice", "--dir"])
        .arg(&project));
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("created"), "{stdout}");

    // A second init into the same folder refuses and keeps what is there.
    let stderr = run_err(
        host(tmp.path())
            .args(["env", "init", "capitals", "--dir"])
            .arg(&project),
    );
    assert!(stderr.contains("already exists"), "{stderr}");

    // Build exactly as the README says, sharing the plugins' target folder to reuse the SDK's
    // compiled dependencies.
    let target = repo_root().join("plugins/target");
    let build = run(Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet"])
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target));
    assert!(
        build.status.success(),
        "cargo build failed:\n{}",
        texts(&build).1
    );
    let wasm = target.join("wasm32-wasip2/release/capitals.wasm");
    assert!(wasm.is_file(), "{} missing", wasm.display());

    // A plugin folder: plugin.toml + plugin.wasm + data/.
    let folder = tmp.path().join("installed/capitals");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::copy(project.join("plugin.toml"), folder.join("plugin.toml")).unwrap();
    std::fs::copy(&wasm, folder.join("plugin.wasm")).unwrap();
    std::fs::create_dir(folder.join("data")).unwrap();
    for split in ["train.jsonl", "test.jsonl"] {
        std::fs::copy(
            project.join("data").join(split),
            folder.join("data").join(split),
        )
        .unwrap();
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let loader = PluginLoader::new(LoadOptions::default(), None).unwrap();
        let env = loader.load_environment(&folder).await.unwrap();
        assert_eq!(env.id().to_string(), "alice/capitals v0.1.0");
        let page = env.dataset("train", 0, 10).await.unwrap();
        assert_eq!(page.total, 3);
        let ex = page.examples[0].clone();
        assert_eq!(ex.answer, "Paris");
        let mut session = env.start(1).await.unwrap();
        let start = session.initial_prompt(&ex, "{}").await.unwrap();
        assert_eq!(start.messages.len(), 2);
        for (reply, expected) in [(r"It is \boxed{Paris}.", 1.0), (r"\boxed{Lyon}", 0.0)] {
            let mut messages = start.messages.clone();
            messages.push(assistant(reply));
            let metrics = session
                .score(&Rollout {
                    example: ex.clone(),
                    messages,
                    state: start.state.clone(),
                    truncated: false,
                })
                .await
                .unwrap();
            assert_eq!(metrics[0].name, "correct");
            assert_eq!(metrics[0].value, expected, "{reply}");
        }
    });
}
