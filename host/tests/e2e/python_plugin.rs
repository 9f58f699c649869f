//! End-to-end: the Python SDK walkthrough of `sdk/python/README.md`, step by step as a new user
//! would take it: `host env init --python`, the ported module (taken from the README itself),
//! `host env pack` (which builds it with componentize-py), publishing to a folder registry,
//! `host env install`, and `host eval` against a scripted OpenAI-compatible server.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{self, host, repo_root};

/// The code block of `sdk/python/README.md` whose first line is `first_line`.
fn readme_block(first_line: &str) -> String {
    let readme = std::fs::read_to_string(repo_root().join("sdk/python/README.md")).unwrap();
    let mut blocks = readme.split("```python\n").skip(1);
    let block = blocks
        .find(|b| b.starts_with(first_line))
        .unwrap_or_else(|| panic!("sdk/python/README.md has no block starting {first_line:?}"));
    block.split("```").next().unwrap().to_owned()
}

/// The componentize-py `make plugins` installed (so the test does not download it again).
fn componentize_py() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache"));
    common::built(
        cache.join("rlhost/componentize-py-0.25.1/bin/componentize-py"),
        "plugins",
    )
}

/// `host` in `home`, building Python plugins with that componentize-py.
fn host_py(home: &Path) -> Command {
    let mut cmd = host(home);
    cmd.env("RLHOST_COMPONENTIZE_PY", componentize_py());
    cmd
}

/// `host ARGS` in `home`, which must succeed: its stdout.
fn ok(home: &Path, args: &[&str]) -> String {
    common::run_ok(host_py(home).args(args))
}

/// A path as a command-line argument.
fn arg(path: &Path) -> String {
    path.to_str().unwrap().to_owned()
}

#[test]
fn a_verifiers_module_becomes_an_installed_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let project = tmp.path().join("capitals");

    // 1. The project.
    let out = ok(
        &home,
        &[
            "env",
            "init",
            "capitals",
            "--python",
            "--owner",
            "alice",
            "--dir",
            &arg(&project),
        ],
    );
    assert!(out.contains("host env build"), "{out}");

    // 2. The ported module, exactly as the README gives it.
    let module = readme_block("# capitals.py");
    std::fs::write(project.join("capitals.py"), &module).unwrap();

    // 3. Build and pack; packing again is a cached build.
    let pkg = tmp.path().join("capitals.rlpkg");
    let out = ok(&home, &["env", "pack", &arg(&project), "-o", &arg(&pkg)]);
    assert!(out.contains("packed alice/capitals@0.1.0"), "{out}");
    let out = ok(&home, &["env", "pack", &arg(&project), "-o", &arg(&pkg)]);
    assert!(out.contains("(cached)"), "{out}");

    // A broken module fails the build with its traceback, and leaves the last good build.
    let built = std::fs::read(project.join("plugin.wasm")).unwrap();
    std::fs::write(
        project.join("capitals.py"),
        module.replace("name=\"capitals\",", "name=\"capitals\", colour=\"blue\","),
    )
    .unwrap();
    let stderr = common::run_err(host_py(&home).args(["env", "build", &arg(&project)]));
    assert!(
        stderr.contains("unexpected keyword argument 'colour'"),
        "{stderr}"
    );
    assert!(
        stderr.contains("capitals.py"),
        "the traceback names the file: {stderr}"
    );
    assert_eq!(std::fs::read(project.join("plugin.wasm")).unwrap(), built);
    std::fs::write(project.join("capitals.py"), &module).unwrap();

    // 4. Publish and install.
    let reg = tmp.path().join("registry");
    let key = tmp.path().join("alice.key");
    let url = format!("file://{}", reg.display());
    ok(&home, &["registry", "init", "--root", &arg(&reg)]);
    ok(&home, &["registry", "keygen", "--out", &arg(&key)]);
    ok(
        &home,
        &[
            "registry",
            "add-key",
            "--root",
            &arg(&reg),
            "--owner",
            "alice",
            "--key-file",
            &arg(&key),
        ],
    );
    ok(
        &home,
        &[
            "env",
            "publish",
            &arg(&pkg),
            "--key",
            &arg(&key),
            "--registry",
            &url,
        ],
    );
    let out = ok(
        &home,
        &["env", "install", "alice/capitals", "--registry", &url],
    );
    assert!(out.contains("alice/capitals"), "{out}");

    // 5. Evaluate: the scripted model answers the first test question right in the asked
    // format, the second wrong and without tags.
    let (url, stop) = common::scripted_openai(120, |body| {
        let msgs = body["messages"].as_array().unwrap();
        assert_eq!(
            msgs[0]["content"], "Think, then give the answer inside <answer> tags.",
            "the system prompt reaches the model"
        );
        let question = msgs[1]["content"].as_str().unwrap();
        let reply = if question.contains("7 times 8") {
            "<think>7*8</think>\n<answer>56</answer>"
        } else {
            "It is 100."
        };
        (200, common::chat_completion(Some(reply), vec![]))
    });
    let out = ok(
        &home,
        &[
            "eval", "capitals", "--split", "test", "-n", "-1", "-r", "2", "-b", &url,
        ],
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // exact_answer: 1, 0; format: 1, 0 → reward (1 + 0.2) / 2 = 0.6.
    assert!(
        out.contains("Reward: 0.600, exact_answer: 0.500, format_reward_func: 0.500"),
        "{out}"
    );
}

/// Writes a wheel (a zip with the module and its .dist-info) with Python's zipfile.
fn wheel(path: &Path, module: &str, source: &str) {
    let name = path.file_name().unwrap().to_str().unwrap();
    let mut parts = name.trim_end_matches(".whl").splitn(3, '-');
    let (dist, version) = (parts.next().unwrap(), parts.next().unwrap());
    let tag = parts.next().unwrap();
    let script = format!(
        r#"import sys, zipfile
info = "{dist}-{version}.dist-info"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("{module}.py", sys.argv[2])
    z.writestr(info + "/METADATA", "Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    z.writestr(info + "/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
    z.writestr(info + "/RECORD", "")
"#
    );
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    common::run_ok(
        Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(path)
            .arg(source),
    );
}

/// `[python] dependencies` are installed for the component's CPython and snapshotted in; a
/// package with native code is refused with a clear error.
#[test]
fn pure_python_dependencies_are_snapshotted_and_native_ones_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let project = tmp.path().join("greeter");
    ok(
        &home,
        &[
            "env",
            "init",
            "greeter",
            "--python",
            "--dir",
            &arg(&project),
        ],
    );
    wheel(
        &project.join("wheels/shout-1.0-py3-none-any.whl"),
        "shout",
        "def shout(s):\n    return s.upper() + '!'\n",
    );
    let manifest = std::fs::read_to_string(project.join("plugin.toml")).unwrap();
    let with_dep = manifest.replace(
        "# dependencies = [\"regex==2024.11.6\"]",
        "dependencies = [\"wheels/shout-1.0-py3-none-any.whl\"]",
    );
    assert_ne!(with_dep, manifest, "the template lists dependencies");
    std::fs::write(project.join("plugin.toml"), &with_dep).unwrap();
    let module = std::fs::read_to_string(project.join("greeter.py")).unwrap();
    std::fs::write(
        project.join("greeter.py"),
        module
            .replace(
                "import rlhost_env as rl",
                "import rlhost_env as rl\nfrom shout import shout",
            )
            .replace(
                "system_prompt=\"Put your final answer in \\\\boxed{}.\"",
                "system_prompt=shout(\"hello\")",
            ),
    )
    .unwrap();
    ok(&home, &["env", "build", &arg(&project)]);

    let rt = tokio::runtime::Runtime::new().unwrap();
    let info = rt.block_on(async {
        let loader = rlhost::plugin::PluginLoader::new(Default::default(), None).unwrap();
        let env = loader.load_environment(&project).await.unwrap();
        env.info().clone()
    });
    assert_eq!(info.system_prompt.as_deref(), Some("HELLO!"));

    // A wheel with native code for this machine's CPython cannot run in the sandbox.
    wheel(
        &project.join("wheels/fast-1.0-cp311-cp311-linux_x86_64.whl"),
        "fast",
        "",
    );
    std::fs::write(
        project.join("plugin.toml"),
        with_dep.replace(
            "\"wheels/shout-1.0-py3-none-any.whl\"",
            "\"wheels/shout-1.0-py3-none-any.whl\", \"wheels/fast-1.0-cp311-cp311-linux_x86_64.whl\"",
        ),
    )
    .unwrap();
    let stderr = common::run_err(host_py(&home).args(["env", "build", &arg(&project)]));
    assert!(stderr.contains("pure-Python wheels only"), "{stderr}");
    assert!(
        stderr.contains("fast-1.0-cp311"),
        "names the culprit: {stderr}"
    );
}
