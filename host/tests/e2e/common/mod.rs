//! Helpers of the end-to-end tests: run the built `host` binary as a user would, in an isolated
//! `$RLHOST_HOME`, and talk to the servers it starts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde_json::{Value, json};

#[path = "../../lib/common/base.rs"]
mod base;
pub use base::*;

/// A `host` command with its own empty home folder and no registry override.
pub fn host(home: &Path) -> Command {
    let mut cmd = Command::new(host_bin());
    cmd.env("RLHOST_HOME", home)
        .env_remove("RLHOST_REGISTRY")
        .env_remove("RLHOST_LOG");
    cmd
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
) -> (u16, Arc<AtomicBool>) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(max_secs);
        while !flag.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
            let Ok((stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            stream.set_nonblocking(false).unwrap();
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
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
    registry_with_key(&home, &reg, &key, &["rlhost", "will"]);
    for name in dists {
        let src = dist(name);
        let pkg = root.join(format!("{name}.rlpkg"));
        ok(&["env", "pack", &s(&src), "-o", &s(&pkg)]);
        ok(&["env", "publish", &s(&pkg), "--key", &s(&key)]);
        ok(&["env", "install", name]);
    }
    home
}

/// A temporary folder holding a home with first-party plugins installed and a tiny model: where
/// most end-to-end tests start.
pub struct Workspace {
    /// The folder (removed on drop); `home` and `model` are inside it.
    pub tmp: tempfile::TempDir,
    /// The home folder ([`home_with_plugins`]).
    pub home: PathBuf,
    /// `tmp/tiny`, a tiny Qwen3 ([`tiny_model`]).
    pub model: PathBuf,
}

/// A [`Workspace`] with the built plugins `dists` installed and a tiny model made with `seed`.
pub fn workspace(dists: &[&str], seed: u64) -> Workspace {
    let tmp = tempfile::tempdir().unwrap();
    let home = home_with_plugins(tmp.path(), dists);
    let model = tmp.path().join("tiny");
    tiny_model(&model, seed);
    Workspace { tmp, home, model }
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
    /// Starts the server (one thread, auto tool choice, f32 unless `extra` names a `--dtype`:
    /// `auto` means bf16 on CPUs with bf16 matrix instructions, and most tests compare with f32
    /// references) with `extra` flags; waits until it listens. Its log goes to the test's stderr.
    pub fn start(model: &Path, extra: &[&str]) -> Self {
        Self::start_with_stderr(model, extra, std::process::Stdio::inherit())
    }

    /// [`InferenceServer::start`] with the server's log (`RLHOST_LOG=warn`, stderr) written to
    /// the file `log`.
    pub fn start_logging_to(model: &Path, extra: &[&str], log: &Path) -> Self {
        let file = std::fs::File::create(log).unwrap();
        Self::start_with_stderr(model, extra, file.into())
    }

    fn start_with_stderr(model: &Path, extra: &[&str], stderr: std::process::Stdio) -> Self {
        let dtype: &[&str] = if extra.iter().any(|a| a.starts_with("--dtype")) {
            &[]
        } else {
            &["--dtype", "f32"]
        };
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
            .args(dtype)
            .args(extra)
            .env("RLHOST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
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

/// The `HOST:PORT` of a server URL (`http://HOST:PORT`, a path after it ignored).
pub fn addr_of(url: &str) -> &str {
    let rest = url.trim_start_matches("http://");
    rest.split('/').next().unwrap_or(rest)
}

/// Sends `head` then `body` to the server at `url` (the body from another thread, write errors
/// ignored: the server may answer and close before it has read it all) and reads the answer up to
/// the length it announces or the end of the connection: status, content type, body.
pub fn raw_request(url: &str, head: &str, body: Vec<u8>) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr_of(url)).unwrap();
    // Long enough for a server working through a queue of stalled connections.
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut w = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let _ = w.write_all(&body);
    });
    let header = |head: &str, name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the body Content-Length announces is in (the connection may stay open).
    loop {
        let n = s.read(&mut buf).unwrap_or(0);
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = header(head, "content-length").and_then(|v| v.parse::<usize>().ok());
            if n == 0 || len.is_some_and(|len| body.len() >= len) {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                let ctype = header(head, "content-type").unwrap_or_default();
                return (status, ctype, body.to_string());
            }
        }
        assert!(n > 0, "the connection closed before an answer: {text:?}");
    }
}

/// `n` connections to the server at `url` that stall: the even ones after `partial_head` (a
/// request head without its blank line), the odd ones after `partial_body` (a complete head and
/// less body than it declares). Kept open until [`closed_by_server`].
pub fn stalled_connections(
    url: &str,
    n: usize,
    partial_head: &[u8],
    partial_body: &[u8],
) -> Vec<std::net::TcpStream> {
    use std::io::Write;
    (0..n)
        .map(|i| {
            let mut s = std::net::TcpStream::connect(addr_of(url)).unwrap();
            s.write_all(if i % 2 == 0 {
                partial_head
            } else {
                partial_body
            })
            .unwrap();
            s
        })
        .collect()
}

/// Reads each of [`stalled_connections`] to its end, which the server must reach by closing it
/// within `wait` (a stalled head may be reset; a stalled body must be answered and closed
/// cleanly); returns what the server answered the stalled bodies (the odd connections).
pub fn stalled_bodies_answered(stalled: Vec<std::net::TcpStream>, wait: Duration) -> Vec<String> {
    use std::io::Read;
    let closed: Vec<String> = stalled
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            s.set_read_timeout(Some(wait)).unwrap();
            let mut rest = Vec::new();
            let result = s.read_to_end(&mut rest);
            // A stalled head carries no answer: the server closing it by a reset closes it too.
            let reset =
                matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset);
            if let Err(e) = result
                .as_ref()
                .map(|_| ())
                .or_else(|e| if i % 2 == 0 && reset { Ok(()) } else { Err(e) })
            {
                panic!(
                    "stalled connection {i} (a stalled {}) did not end cleanly: {e}; read {:?}",
                    if i % 2 == 0 { "head" } else { "body" },
                    String::from_utf8_lossy(&rest)
                );
            }
            String::from_utf8_lossy(&rest).into_owned()
        })
        .collect();
    closed.into_iter().skip(1).step_by(2).collect()
}

/// A non-streamed chat completion of the scripted model: `content` and `tool_calls` (OpenAI
/// tool-call objects); the finish reason follows from them.
pub fn chat_completion(content: Option<&str>, tool_calls: Vec<Value>) -> Value {
    let finish = if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    json!({
        "id": "chatcmpl-scripted", "object": "chat.completion", "created": 0, "model": "scripted",
        "choices": [{"index": 0, "finish_reason": finish,
                     "message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    })
}

/// A scripted OpenAI-compatible server (see [`serve_http`]): `GET …/models` lists the one model
/// `scripted`; any other request is a chat completion request whose JSON body `reply` answers
/// with a status and a JSON body. Returns the base URL (`http://127.0.0.1:PORT/v1`) and the stop
/// flag.
pub fn scripted_openai(
    max_secs: u64,
    reply: impl Fn(&Value) -> (u16, Value) + Send + 'static,
) -> (String, Arc<AtomicBool>) {
    let (port, stop) = serve_http(max_secs, move |req| {
        if req.path.ends_with("/models") {
            let models = json!({"object": "list", "data": [{"id": "scripted"}]});
            return (200, vec![], models.to_string().into_bytes());
        }
        let body: Value = serde_json::from_slice(&req.body).unwrap();
        let (status, answer) = reply(&body);
        (status, vec![], answer.to_string().into_bytes())
    });
    (format!("http://127.0.0.1:{port}/v1"), stop)
}

/// A folder of this test process's own, for what its tests share (made on the first call):
/// `$CARGO_TARGET_TMPDIR/e2e-<pid>`. Those of processes that are gone are removed then.
pub fn process_scratch() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(root).unwrap();
        for e in std::fs::read_dir(root).unwrap().flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("e2e-")) else {
                continue;
            };
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let dir = root.join(format!("e2e-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

/// A folder of [`process_scratch`] holding what `make` wrote into it, made once per `key` in
/// this process: later callers of the same key get the same folder, and concurrent ones wait for
/// the first. For the deterministic, slow things several tests start from (a taught model, a
/// packed plugin).
pub fn made_once(key: &str, make: impl FnOnce(&Path)) -> PathBuf {
    type Made = Arc<std::sync::OnceLock<PathBuf>>;
    static MADE: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, Made>>> =
        std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let entry = MADE
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(key.to_owned())
        .or_default()
        .clone();
    entry
        .get_or_init(|| {
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dir = process_scratch().join(format!("made-{n}"));
            std::fs::create_dir_all(&dir).unwrap();
            make(&dir);
            dir
        })
        .clone()
}

/// `host env pack` of the built plugin `dist` (under plugins/target/dist), packed once per
/// process ([`made_once`]): the package file.
pub fn packed(dist_name: &str) -> PathBuf {
    let dir = made_once(&format!("packed {dist_name}"), |d| {
        let pkg = d.join("plugin.rlpkg");
        run_ok(host(&d.join("home")).args([
            "env",
            "pack",
            dist(dist_name).to_str().unwrap(),
            "-o",
            pkg.to_str().unwrap(),
        ]));
    });
    dir.join("plugin.rlpkg")
}

/// A copy of the folder `src` (files and subfolders) at `dst`.
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        let to = dst.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

/// A directory registry at `reg` and a publisher key at `key` that it accepts for `owners`,
/// made with `host registry init/keygen/add-key` in `home`.
pub fn registry_with_key(home: &Path, reg: &Path, key: &Path, owners: &[&str]) {
    let ok = |args: &[&str]| run_ok(host(home).args(args));
    let s = |p: &Path| p.to_str().unwrap().to_string();
    ok(&["registry", "init", "--root", &s(reg)]);
    ok(&["registry", "keygen", "--out", &s(key)]);
    for owner in owners {
        ok(&[
            "registry",
            "add-key",
            "--root",
            &s(reg),
            "--owner",
            owner,
            "--key-file",
            &s(key),
        ]);
    }
}

/// `host registry serve` on a free loopback port, killed when dropped.
pub struct RegistryServer {
    /// The server process.
    pub child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serves the registry at `reg` (from `home`), with `extra` flags (limits).
pub fn serve_registry(home: &Path, reg: &Path, extra: &[&str]) -> RegistryServer {
    let mut child = host(home)
        .args(["registry", "serve", "--root"])
        .arg(reg)
        .args(["--addr", "127.0.0.1:0"])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let line = first_line(&mut child);
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    RegistryServer { child, url }
}
