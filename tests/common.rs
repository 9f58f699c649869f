//! Helpers shared by the end-to-end tests: run the built `host` binary as a user would, in an
//! isolated `$RLHOST_HOME`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `host` binary cargo built for these tests.
pub fn host_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_host"))
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_owned()
}

/// A `host` command with its own empty home folder and no registry override.
pub fn host(home: &Path) -> Command {
    let mut cmd = Command::new(host_bin());
    cmd.env("RLHOST_HOME", home)
        .env_remove("RLHOST_REGISTRY")
        .env_remove("RLHOST_LOG");
    cmd
}

/// Runs a command and returns its output, printing both streams on failure to read.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// stdout and stderr as text.
pub fn texts(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The reference venv's Python, if `scripts/setup-py-reference.sh` has been run; otherwise prints
/// why the calling test skips its reference comparison.
pub fn reference_python(test: &str) -> Option<PathBuf> {
    let python = repo_root().join(".venv-ref/bin/python");
    if python.is_file() {
        Some(python)
    } else {
        skip(
            test,
            &format!(
                "{} is absent; run `make setup-py-reference`",
                python.display()
            ),
        );
        None
    }
}

/// Records that `test` skipped (part of) its work and why: printed, and appended to the file named
/// by `$RLHOST_SKIP_LOG` so `make test` can show it (cargo hides passing tests' output).
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}");
    println!("{line}");
    if let Some(path) = std::env::var_os("RLHOST_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// A request seen by [`serve_http`].
pub struct HttpRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path with the query.
    pub path: String,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// A reply from a [`serve_http`] handler: status, extra headers, body.
pub type HttpReply = (u16, Vec<(String, String)>, Vec<u8>);

/// A real HTTP/1.1 server on 127.0.0.1 (one request per connection) answering with `handler`,
/// until the returned flag is set or `max_secs` pass. Returns the port.
pub fn serve_http(
    max_secs: u64,
    handler: impl Fn(&HttpRequest) -> HttpReply + Send + 'static,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(max_secs);
        while !flag.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
            let Ok((stream, _)) = listener.accept() else {
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            };
            stream.set_nonblocking(false).unwrap();
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut words = line.split_whitespace();
            let method = words.next().unwrap_or("").to_string();
            let path = words.next().unwrap_or("").to_string();
            let mut headers = Vec::new();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                }
            }
            let len = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let (status, extra, reply) = handler(&HttpRequest {
                method,
                path,
                headers,
                body,
            });
            let mut head = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                reply.len()
            );
            for (k, v) in extra {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let mut stream = stream;
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&reply);
        }
    });
    (port, stop)
}

/// A home folder under `root` with the built first-party plugins `dists`
/// (`plugins/target/dist/NAME`) published to a file registry and installed from it.
pub fn home_with_plugins(root: &Path, dists: &[&str]) -> PathBuf {
    let home = root.join("home");
    let reg = root.join("registry");
    let key = root.join("publisher.key");
    let ok = |args: &[&str]| {
        let out = run(host(&home)
            .env("RLHOST_REGISTRY", format!("file://{}", reg.display()))
            .args(args));
        let (stdout, stderr) = texts(&out);
        assert!(out.status.success(), "host {args:?}:\n{stdout}{stderr}");
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();
    ok(&["registry", "init", "--root", &s(&reg)]);
    ok(&["registry", "keygen", "--out", &s(&key)]);
    for owner in ["rlhost", "will"] {
        ok(&[
            "registry",
            "add-key",
            "--root",
            &s(&reg),
            "--owner",
            owner,
            "--key-file",
            &s(&key),
        ]);
    }
    for dist in dists {
        let src = repo_root().join("plugins/target/dist").join(dist);
        assert!(
            src.join("plugin.toml").is_file(),
            "run `make plugins` first"
        );
        let pkg = root.join(format!("{dist}.rlpkg"));
        ok(&["env", "pack", &s(&src), "-o", &s(&pkg)]);
        ok(&["env", "publish", &s(&pkg), "--key", &s(&key)]);
        ok(&["env", "install", dist]);
    }
    home
}

/// The first line a child process prints on its (piped) stdout.
pub fn first_line(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout is piped"))
        .read_line(&mut line)
        .unwrap();
    line
}

/// `host inference` serving `model` on a free loopback port, killed on drop.
pub struct InferenceServer {
    /// The process.
    pub child: std::process::Child,
    /// `http://127.0.0.1:PORT/v1`.
    pub url: String,
}

impl InferenceServer {
    /// Starts the server (one thread, auto tool choice) with `extra` flags; waits until it
    /// listens.
    pub fn start(model: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(host_bin())
            .args([
                "inference",
                "--port",
                "0",
                "--threads",
                "1",
                "--enable-auto-tool-choice",
                "-m",
            ])
            .arg(model)
            .args(extra)
            .env("RLHOST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let line = first_line(&mut child);
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .trim_end_matches('/')
            .to_string();
        Self { child, url }
    }
}

impl Drop for InferenceServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tiny Qwen3 with rlhost's tokenizer, made by `host model init --seed SEED`.
pub fn tiny_model(dir: &Path, seed: u64) {
    let out = run(Command::new(host_bin())
        .args([
            "model",
            "init",
            "--preset",
            "tiny",
            "--seed",
            &seed.to_string(),
            "--out",
        ])
        .arg(dir));
    assert!(out.status.success(), "{}", texts(&out).1);
}
