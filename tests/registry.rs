//! End-to-end: publishing to a registry and installing from it, as users do, with the failure
//! cases a registry must survive (tampering, missing or untrusted signatures, yanks, ABI
//! mismatches, concurrent installs, half-done installs).

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{host, repo_root, run, texts};

/// A scratch world: a registry, a publisher key, and a user home.
struct World {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl World {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        let w = Self { _tmp: tmp, root };
        w.ok(&["registry", "init", "--root", w.reg().to_str().unwrap()]);
        w.ok(&["registry", "keygen", "--out", w.key().to_str().unwrap()]);
        for owner in ["rlhost", "test"] {
            w.ok(&[
                "registry",
                "add-key",
                "--root",
                w.reg().to_str().unwrap(),
                "--owner",
                owner,
                "--key-file",
                w.key().to_str().unwrap(),
            ]);
        }
        w
    }
    fn reg(&self) -> PathBuf {
        self.root.join("registry")
    }
    fn key(&self) -> PathBuf {
        self.root.join("publisher.key")
    }
    fn home(&self) -> PathBuf {
        self.root.join("home")
    }
    fn url(&self) -> String {
        format!("file://{}", self.reg().display())
    }
    fn cmd(&self, args: &[&str]) -> Output {
        run(host(&self.home())
            .env("RLHOST_REGISTRY", self.url())
            .args(args))
    }
    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        let (stdout, stderr) = texts(&out);
        assert!(
            out.status.success(),
            "host {args:?} failed:\n{stdout}{stderr}"
        );
        stdout
    }
    fn fails(&self, args: &[&str]) -> String {
        let out = self.cmd(args);
        let (stdout, stderr) = texts(&out);
        assert_eq!(
            out.status.code(),
            Some(1),
            "host {args:?}:\n{stdout}{stderr}"
        );
        stderr
    }
    /// A copy of a built plugin folder with its version (and optionally ABI/owner) changed,
    /// packed into a .rlpkg.
    fn package(&self, dist: &str, version: &str, edit: &dyn Fn(String) -> String) -> PathBuf {
        let src = repo_root().join("plugins/target/dist").join(dist);
        assert!(
            src.join("plugin.toml").is_file(),
            "run `make plugins` first"
        );
        let dir = self.root.join(format!("src-{dist}-{version}"));
        copy_dir(&src, &dir);
        let manifest = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
        // The package's own version, whatever the built plugin says.
        let manifest: String = manifest
            .lines()
            .map(|l| match l.starts_with("version = ") {
                true => format!("version = \"{version}\"\n"),
                false => format!("{l}\n"),
            })
            .collect();
        std::fs::write(dir.join("plugin.toml"), edit(manifest)).unwrap();
        let out = self.root.join(format!("{dist}-{version}.rlpkg"));
        self.ok(&[
            "env",
            "pack",
            dir.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        out
    }
    fn publish(&self, pkg: &Path) {
        self.ok(&[
            "env",
            "publish",
            pkg.to_str().unwrap(),
            "--key",
            self.key().to_str().unwrap(),
        ]);
    }
}

fn copy_dir(src: &Path, dst: &Path) {
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

fn same(s: String) -> String {
    s
}

#[test]
fn publish_search_install_list_remove() {
    let w = World::new();
    let pkg = w.package("arith", "0.1.0", &same);
    w.publish(&pkg);
    // Publishing the same bytes again is harmless.
    w.publish(&pkg);
    w.publish(&w.package("exact-match", "0.1.0", &same));
    let found = w.ok(&["env", "search", "arith"]);
    assert!(found.contains("rlhost/arith@0.1.0"), "{found}");
    assert!(!found.contains("exact-match"), "{found}");

    let out = w.ok(&["env", "install", "arith"]);
    assert!(out.contains("installed rlhost/arith@0.1.0"), "{out}");
    let installed = w.home().join("plugins/rlhost/arith/0.1.0");
    assert!(installed.join("plugin.wasm").is_file());
    assert!(installed.join("plugin.toml").is_file());
    let again = w.ok(&["env", "install", "rlhost/arith@^0.1"]);
    assert!(again.contains("already installed"), "{again}");
    let lock = std::fs::read_to_string(w.home().join("plugins.lock")).unwrap();
    assert!(
        lock.contains("\"rlhost/arith\"") && lock.contains("\"cksum\""),
        "{lock}"
    );
    // Installing compiled and cached the component for the first run.
    assert!(
        w.home()
            .join("cache/components")
            .read_dir()
            .unwrap()
            .count()
            >= 1
    );

    let list = w.ok(&["env", "list"]);
    assert!(list.contains("rlhost/arith@0.1.0"), "{list}");
    w.ok(&["env", "remove", "rlhost/arith"]);
    assert!(!installed.exists());
    let list = w.ok(&["env", "list"]);
    assert!(list.contains("no plugins installed"), "{list}");
    let err = w.fails(&["env", "remove", "rlhost/arith"]);
    assert!(err.contains("not installed"), "{err}");
}

#[test]
fn versions_are_immutable_and_keys_are_checked_at_publish() {
    let w = World::new();
    w.publish(&w.package("arith", "0.1.0", &same));
    // Same version, different bytes.
    let changed = w.package("arith", "0.1.0", &|m| {
        m.replace("description = ", "description = \"changed\"\n# ")
    });
    let err = w.fails(&[
        "env",
        "publish",
        changed.to_str().unwrap(),
        "--key",
        w.key().to_str().unwrap(),
    ]);
    assert!(
        err.contains("already published with different bytes"),
        "{err}"
    );
    // A key the registry does not accept for the owner.
    let stranger = w.root.join("stranger.key");
    w.ok(&["registry", "keygen", "--out", stranger.to_str().unwrap()]);
    let pkg = w.package("arith", "0.2.0", &same);
    let err = w.fails(&[
        "env",
        "publish",
        pkg.to_str().unwrap(),
        "--key",
        stranger.to_str().unwrap(),
    ]);
    assert!(
        err.contains("is not accepted for owner \"rlhost\""),
        "{err}"
    );
}

#[test]
fn tampered_unsigned_and_untrusted_packages_are_refused() {
    let w = World::new();
    w.publish(&w.package("arith", "0.1.0", &same));
    // Flip one byte of the stored artifact.
    let artifacts: Vec<_> = std::fs::read_dir(w.reg().join("artifacts"))
        .unwrap()
        .flatten()
        .collect();
    let path = artifacts[0].path();
    let mut bytes = std::fs::read(&path).unwrap();
    let original = bytes.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let err = w.fails(&["env", "install", "rlhost/arith"]);
    assert!(
        err.contains("checksum mismatch for rlhost/arith@0.1.0"),
        "{err}"
    );
    assert!(
        !w.home().join("plugins/rlhost/arith").exists(),
        "nothing half-installed"
    );
    std::fs::write(&path, &original).unwrap();

    // Strip the signature from the index entry.
    let index = w.reg().join("index/rlhost/arith");
    let signed = std::fs::read_to_string(&index).unwrap();
    let mut entry: serde_json::Value = serde_json::from_str(signed.trim()).unwrap();
    entry["sig"] = serde_json::Value::Null;
    std::fs::write(&index, format!("{entry}\n")).unwrap();
    let err = w.fails(&["env", "install", "rlhost/arith"]);
    assert!(err.contains("is not signed"), "{err}");
    let out = w.ok(&["env", "install", "rlhost/arith", "--allow-unsigned"]);
    assert!(out.contains("installed rlhost/arith@0.1.0"), "{out}");
    std::fs::write(&index, signed).unwrap();

    // The owner's key was pinned on first use; a registry that swaps it is not believed.
    let mallory = w.root.join("mallory.key");
    w.ok(&["registry", "keygen", "--out", mallory.to_str().unwrap()]);
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(w.reg().join("config.json")).unwrap())
            .unwrap();
    config["keys"]["rlhost"] = serde_json::json!([]);
    std::fs::write(w.reg().join("config.json"), config.to_string()).unwrap();
    w.ok(&[
        "registry",
        "add-key",
        "--root",
        w.reg().to_str().unwrap(),
        "--owner",
        "rlhost",
        "--key-file",
        mallory.to_str().unwrap(),
    ]);
    let pkg = w.package("arith", "0.2.0", &same);
    w.ok(&[
        "env",
        "publish",
        pkg.to_str().unwrap(),
        "--key",
        mallory.to_str().unwrap(),
    ]);
    let err = w.fails(&["env", "install", "rlhost/arith@0.2"]);
    assert!(err.contains("not trusted for this owner"), "{err}");
    assert!(!w.home().join("plugins/rlhost/arith/0.2.0").exists());
}

#[test]
fn yanked_and_incompatible_versions_are_not_chosen() {
    let w = World::new();
    w.publish(&w.package("arith", "0.1.0", &same));
    w.publish(&w.package("arith", "0.2.0", &same));
    w.publish(&w.package("arith", "0.3.0", &|m| {
        m.replace("rlhost:env@0.1.0", "rlhost:env@0.2.0")
    }));
    w.ok(&["env", "yank", "rlhost/arith@0.2.0"]);
    let out = w.ok(&["env", "install", "rlhost/arith"]);
    assert!(out.contains("installed rlhost/arith@0.1.0"), "{out}");
    let out = w.cmd(&["env", "install", "rlhost/arith@=0.2.0"]);
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("installed rlhost/arith@0.2.0"), "{stdout}");
    assert!(
        stderr.contains("warning: rlhost/arith@0.2.0 is yanked"),
        "{stderr}"
    );
    let err = w.fails(&["env", "install", "rlhost/arith@>=0.3"]);
    assert!(
        err.contains("no version of rlhost/arith matches >=0.3"),
        "{err}"
    );
    assert!(
        err.contains("0.3.0 targets rlhost:env@0.2.0, this host supports rlhost:env@0.1.0..<0.2.0"),
        "{err}"
    );
    assert!(err.contains("0.2.0 does not match >=0.3"), "{err}");
    // The lock file pins what is installed.
    let err = w.fails(&["env", "install", "rlhost/arith@=0.1.0", "--locked"]);
    assert!(
        err.contains("--locked refuses to change plugins.lock"),
        "{err}"
    );
}

#[test]
fn concurrent_installs_and_failed_validation_leave_a_consistent_home() {
    let w = World::new();
    w.publish(&w.package("arith", "0.1.0", &same));
    let a = w.cmd_spawn(&["env", "install", "rlhost/arith"]);
    let b = w.cmd_spawn(&["env", "install", "rlhost/arith"]);
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(
        a.status.success() && b.status.success(),
        "{:?} {:?}",
        texts(&a),
        texts(&b)
    );
    let outs = format!("{}{}", texts(&a).0, texts(&b).0);
    assert_eq!(outs.matches("already installed").count(), 1, "{outs}");
    // A broken component is refused at install, and the installed version stays usable.
    w.package("arith", "0.1.1", &same);
    let bad = w.root.join("src-arith-0.1.1/plugin.wasm");
    std::fs::write(&bad, b"\0asm\x0d\0\x01\0garbage").unwrap();
    let broken_pkg = w.root.join("broken.rlpkg");
    w.ok(&[
        "env",
        "pack",
        w.root.join("src-arith-0.1.1").to_str().unwrap(),
        "-o",
        broken_pkg.to_str().unwrap(),
    ]);
    w.publish(&broken_pkg);
    let err = w.fails(&["env", "install", "rlhost/arith@=0.1.1"]);
    assert!(err.contains("rlhost/arith@0.1.1"), "{err}");
    assert!(!w.home().join("plugins/rlhost/arith/0.1.1").exists());
    let leftovers: Vec<_> = std::fs::read_dir(w.home().join("plugins"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".staging"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "staging folders left behind: {leftovers:?}"
    );
    assert!(
        w.home()
            .join("plugins/rlhost/arith/0.1.0/plugin.wasm")
            .is_file()
    );
}

impl World {
    fn cmd_spawn(&self, args: &[&str]) -> std::process::Child {
        host(&self.home())
            .env("RLHOST_REGISTRY", self.url())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// `host registry serve` on a free loopback port, killed when dropped.
struct Server {
    child: std::process::Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl World {
    fn serve(&self) -> Server {
        let mut child = host(&self.home())
            .args([
                "registry",
                "serve",
                "--root",
                self.reg().to_str().unwrap(),
                "--addr",
                "127.0.0.1:0",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let line = common::first_line(&mut child);
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Server { child, url }
    }

    /// A command against `registry` with `token` in RLHOST_REGISTRY_TOKEN, in `home`.
    fn http(&self, home: &Path, registry: &str, token: Option<&str>, args: &[&str]) -> Output {
        let mut cmd = host(home);
        cmd.env_remove("RLHOST_REGISTRY_TOKEN");
        if let Some(t) = token {
            cmd.env("RLHOST_REGISTRY_TOKEN", t);
        }
        run(cmd.args(args).args(["--registry", registry]))
    }
}

#[test]
fn http_registry_publish_and_install_end_to_end() {
    let w = World::new();
    let reg = w.reg();
    let token = w.ok(&[
        "registry",
        "token",
        "--root",
        reg.to_str().unwrap(),
        "--owner",
        "rlhost",
    ]);
    let other = w.ok(&[
        "registry",
        "token",
        "--root",
        reg.to_str().unwrap(),
        "--owner",
        "test",
    ]);
    let tokens = std::fs::read_to_string(reg.join("tokens.json")).unwrap();
    assert!(!tokens.contains(token.trim()), "tokens are stored hashed");
    let server = w.serve();
    let pkg = w.package("arith", "0.1.0", &same);
    let key = w.key();
    let publish = |tok: Option<&str>, pkg: &Path| {
        w.http(
            &w.home(),
            &server.url,
            tok,
            &[
                "env",
                "publish",
                pkg.to_str().unwrap(),
                "--key",
                key.to_str().unwrap(),
            ],
        )
    };

    let out = publish(None, &pkg);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        texts(&out).1.contains("401: a bearer token is required"),
        "{}",
        texts(&out).1
    );
    let out = publish(Some("not-a-token"), &pkg);
    assert!(
        texts(&out).1.contains("401: unknown token"),
        "{}",
        texts(&out).1
    );
    let out = publish(Some(other.trim()), &pkg);
    assert!(
        texts(&out)
            .1
            .contains("403: this token publishes for \"test\", not for \"rlhost\""),
        "{}",
        texts(&out).1
    );
    let out = publish(Some(token.trim()), &pkg);
    assert!(out.status.success(), "{}", texts(&out).1);
    let changed = w.package("arith", "0.1.0", &|m| {
        m.replace("description = ", "description = \"x\"\n# ")
    });
    let out = publish(Some(token.trim()), &changed);
    assert!(texts(&out).1.contains("409"), "{}", texts(&out).1);

    // A second machine (another home) installs over HTTP.
    let second = w.root.join("second-home");
    let out = w.http(&second, &server.url, None, &["env", "search"]);
    assert!(
        texts(&out).0.contains("rlhost/arith@0.1.0"),
        "{:?}",
        texts(&out)
    );
    let out = w.http(
        &second,
        &server.url,
        None,
        &["env", "install", "rlhost/arith"],
    );
    assert!(out.status.success(), "{}", texts(&out).1);
    assert!(
        second
            .join("plugins/rlhost/arith/0.1.0/plugin.wasm")
            .is_file()
    );

    // Yanking needs the owner's token.
    let out = w.http(
        &w.home(),
        &server.url,
        Some(other.trim()),
        &["env", "yank", "rlhost/arith@0.1.0"],
    );
    assert!(texts(&out).1.contains("403"), "{}", texts(&out).1);
    let out = w.http(
        &w.home(),
        &server.url,
        Some(token.trim()),
        &["env", "yank", "rlhost/arith@0.1.0"],
    );
    assert!(out.status.success(), "{}", texts(&out).1);
    let third = w.root.join("third-home");
    let out = w.http(
        &third,
        &server.url,
        None,
        &["env", "install", "rlhost/arith"],
    );
    assert!(
        texts(&out).1.contains("0.1.0 is yanked"),
        "{}",
        texts(&out).1
    );
}

#[test]
fn update_moves_to_the_newest_compatible_version() {
    let w = World::new();
    w.publish(&w.package("arith", "0.1.0", &same));
    w.ok(&["env", "install", "rlhost/arith"]);
    w.publish(&w.package("arith", "0.1.5", &same));
    w.publish(&w.package("arith", "0.2.0", &same));
    let out = w.ok(&["env", "update"]);
    assert!(
        out.contains("updated rlhost/arith from 0.1.0 to 0.1.5"),
        "{out}"
    );
    let out = w.ok(&["env", "update", "rlhost/arith"]);
    assert!(out.contains("rlhost/arith is up to date (0.1.5)"), "{out}");
    let lock = std::fs::read_to_string(w.home().join("plugins.lock")).unwrap();
    assert!(lock.contains("\"0.1.5\""), "{lock}");
}

#[test]
fn a_changed_key_is_accepted_only_after_an_explicit_trust() {
    let w = World::new();
    w.publish(&w.package("arith", "0.1.0", &same));
    w.ok(&["env", "install", "rlhost/arith"]);
    let rotated = w.root.join("rotated.key");
    let public = w.ok(&["registry", "keygen", "--out", rotated.to_str().unwrap()]);
    w.ok(&[
        "registry",
        "add-key",
        "--root",
        w.reg().to_str().unwrap(),
        "--owner",
        "rlhost",
        "--key",
        public.trim(),
    ]);
    let pkg = w.package("arith", "0.1.1", &same);
    w.ok(&[
        "env",
        "publish",
        pkg.to_str().unwrap(),
        "--key",
        rotated.to_str().unwrap(),
    ]);
    let err = w.fails(&["env", "install", "rlhost/arith@=0.1.1"]);
    assert!(err.contains("not trusted for this owner"), "{err}");
    let err = w.fails(&["registry", "trust", "--owner", "rlhost", "--key", "xyz"]);
    assert!(err.contains("invalid public key"), "{err}");
    w.ok(&[
        "registry",
        "trust",
        "--owner",
        "rlhost",
        "--key",
        public.trim(),
    ]);
    let listed = w.ok(&["registry", "trust"]);
    assert!(listed.contains(public.trim()), "{listed}");
    let out = w.ok(&["env", "install", "rlhost/arith@=0.1.1"]);
    assert!(out.contains("installed rlhost/arith@0.1.1"), "{out}");
}

#[test]
fn a_dead_server_installs_nothing() {
    let w = World::new();
    w.publish(&w.package("arith", "0.1.0", &same));
    let url = {
        let server = w.serve();
        server.url.clone()
    }; // dropped: killed
    let out = w.http(&w.home(), &url, None, &["env", "install", "rlhost/arith"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(texts(&out).1.contains(&url), "{}", texts(&out).1);
    let plugins = w.home().join("plugins");
    let left: Vec<_> = std::fs::read_dir(&plugins)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name())
                .filter(|n| n != ".install.lock")
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn an_install_killed_by_a_full_disk_leaves_nothing_half_done() {
    // RLIMIT_FSIZE makes the first large write fail as a full disk would (the kernel stops the
    // process with SIGXFSZ mid-install).
    if std::process::Command::new("prlimit")
        .arg("--version")
        .output()
        .is_err()
    {
        common::skip(
            "an_install_killed_by_a_full_disk_leaves_nothing_half_done",
            "no prlimit",
        );
        return;
    }
    let w = World::new();
    w.publish(&w.package("arith", "0.1.0", &same));
    let out = run(std::process::Command::new("prlimit")
        .arg("--fsize=20000")
        .arg(common::host_bin())
        .args(["env", "install", "rlhost/arith"])
        .env("RLHOST_HOME", w.home())
        .env("RLHOST_REGISTRY", w.url()));
    assert!(
        !out.status.success(),
        "the install should have died: {:?}",
        texts(&out)
    );
    assert!(
        !w.home().join("plugins/rlhost/arith/0.1.0").exists(),
        "half-installed"
    );
    // The next install, with room, completes and clears what the killed one left behind;
    // `find_installed` (what eval and rl use) sees it.
    w.ok(&["env", "install", "rlhost/arith"]);
    let leftovers: Vec<_> = std::fs::read_dir(w.home().join("plugins"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".staging"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let home = rlhost::home::RlhostHome::at(w.home());
    let dir = rlhost::plugin::install::find_installed(&home, "arith").unwrap();
    assert!(
        dir.ends_with("plugins/rlhost/arith/0.1.0"),
        "{}",
        dir.display()
    );
    assert_eq!(
        rlhost::plugin::install::find_installed(&home, "rlhost/arith").unwrap(),
        dir
    );
    assert!(rlhost::plugin::install::find_installed(&home, "nope").is_err());
}
