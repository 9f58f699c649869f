//! End-to-end: publishing to a registry and installing from it, as users do, with the failure
//! cases a registry must survive (tampering, missing or untrusted signatures, yanks, ABI
//! mismatches, concurrent installs, half-done installs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{self, host, run, texts};

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
        common::registry_with_key(&w.home(), &w.reg(), &w.key(), &["rlhost", "test"]);
        w
    }
    /// A world whose registry has `rlhost/arith` 0.1.0.
    fn with_arith() -> Self {
        let w = Self::new();
        w.publish(&w.package("arith", "0.1.0", &same));
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
    /// `host ARGS` in the home, with this registry as the default one.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = host(&self.home());
        cmd.env("RLHOST_REGISTRY", self.url()).args(args);
        cmd
    }
    fn cmd(&self, args: &[&str]) -> Output {
        run(&mut self.command(args))
    }
    fn ok(&self, args: &[&str]) -> String {
        common::run_ok(&mut self.command(args))
    }
    fn fails(&self, args: &[&str]) -> String {
        common::run_err(&mut self.command(args))
    }
    /// A copy of a built plugin folder with its version (and optionally ABI/owner) changed,
    /// packed into a .rlpkg.
    fn package(&self, dist: &str, version: &str, edit: &dyn Fn(String) -> String) -> PathBuf {
        let src = common::dist(dist);
        let dir = self.root.join(format!("src-{dist}-{version}"));
        common::copy_dir(&src, &dir);
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
        self.publish_with(pkg, &self.key());
    }
    /// Publishes `pkg` signed with `key` (the index checks it against the owner's trusted keys).
    fn publish_with(&self, pkg: &Path, key: &Path) {
        self.ok(&[
            "env",
            "publish",
            pkg.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ]);
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
    let w = World::with_arith();
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
    let w = World::with_arith();
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
    w.publish_with(&pkg, &mallory);
    let err = w.fails(&["env", "install", "rlhost/arith@0.2"]);
    assert!(err.contains("not trusted for this owner"), "{err}");
    assert!(!w.home().join("plugins/rlhost/arith/0.2.0").exists());
}

#[test]
fn yanked_and_incompatible_versions_are_not_chosen() {
    let w = World::with_arith();
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
    let w = World::with_arith();
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
        self.command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}

impl World {
    fn serve(&self) -> common::RegistryServer {
        common::serve_registry(&self.home(), &self.reg(), &[])
    }

    /// A command against `registry` with `token` in RLHOST_REGISTRY_TOKEN, in `home`.
    fn http(&self, home: &Path, registry: &str, token: Option<&str>, args: &[&str]) -> Command {
        let mut cmd = host(home);
        cmd.env_remove("RLHOST_REGISTRY_TOKEN");
        if let Some(t) = token {
            cmd.env("RLHOST_REGISTRY_TOKEN", t);
        }
        cmd.args(args).args(["--registry", registry]);
        cmd
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

    let stderr = common::run_err(&mut publish(None, &pkg));
    assert!(
        stderr.contains("401: a bearer token is required"),
        "{stderr}"
    );
    let stderr = common::run_err(&mut publish(Some("not-a-token"), &pkg));
    assert!(stderr.contains("401: unknown token"), "{stderr}");
    let stderr = common::run_err(&mut publish(Some(other.trim()), &pkg));
    assert!(
        stderr.contains("403: this token publishes for \"test\", not for \"rlhost\""),
        "{stderr}"
    );
    common::run_ok(&mut publish(Some(token.trim()), &pkg));
    let changed = w.package("arith", "0.1.0", &|m| {
        m.replace("description = ", "description = \"x\"\n# ")
    });
    let stderr = common::run_err(&mut publish(Some(token.trim()), &changed));
    assert!(stderr.contains("409"), "{stderr}");

    // A second machine (another home) installs over HTTP.
    let second = w.root.join("second-home");
    let stdout = common::run_ok(&mut w.http(&second, &server.url, None, &["env", "search"]));
    assert!(stdout.contains("rlhost/arith@0.1.0"), "{stdout}");
    common::run_ok(&mut w.http(
        &second,
        &server.url,
        None,
        &["env", "install", "rlhost/arith"],
    ));
    assert!(
        second
            .join("plugins/rlhost/arith/0.1.0/plugin.wasm")
            .is_file()
    );

    // Yanking needs the owner's token.
    let stderr = common::run_err(&mut w.http(
        &w.home(),
        &server.url,
        Some(other.trim()),
        &["env", "yank", "rlhost/arith@0.1.0"],
    ));
    assert!(stderr.contains("403"), "{stderr}");
    common::run_ok(&mut w.http(
        &w.home(),
        &server.url,
        Some(token.trim()),
        &["env", "yank", "rlhost/arith@0.1.0"],
    ));
    let third = w.root.join("third-home");
    let stderr = common::run_err(&mut w.http(
        &third,
        &server.url,
        None,
        &["env", "install", "rlhost/arith"],
    ));
    assert!(stderr.contains("0.1.0 is yanked"), "{stderr}");
}

#[test]
fn update_moves_to_the_newest_compatible_version() {
    let w = World::with_arith();
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
    let w = World::with_arith();
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
    w.publish_with(&pkg, &rotated);
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
    let w = World::with_arith();
    let url = {
        let server = w.serve();
        server.url.clone()
    }; // dropped: killed
    let stderr =
        common::run_err(&mut w.http(&w.home(), &url, None, &["env", "install", "rlhost/arith"]));
    assert!(stderr.contains(&url), "{stderr}");
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
    let w = World::with_arith();
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

// ---- Attacks (issue 18): names that try to leave the registry root, uploads that are read
// before their sender is known, connections that never finish, installs that half-succeed.

impl World {
    /// Accepts the world's publisher key for `owner` and issues a server token for it.
    fn owner_with_token(&self, owner: &str) -> String {
        let reg = self.reg();
        self.ok(&[
            "registry",
            "add-key",
            "--root",
            reg.to_str().unwrap(),
            "--owner",
            owner,
            "--key-file",
            self.key().to_str().unwrap(),
        ]);
        self.ok(&[
            "registry",
            "token",
            "--root",
            reg.to_str().unwrap(),
            "--owner",
            owner,
        ])
        .trim()
        .to_owned()
    }

    /// The `arith` plugin published as `owner/name@version`, with `extra` appended to its
    /// manifest.
    fn publish_as(&self, owner: &str, name: &str, version: &str, extra: &str) {
        let extra = extra.to_owned();
        let owner_line = format!("owner = \"{owner}\"");
        let name_line = format!("name = \"{name}\"");
        let pkg = self.package("arith", version, &move |m: String| {
            // Only the [plugin] table's owner and name ([[args]] tables have names too).
            let mut table = String::new();
            let mut m: String = m
                .lines()
                .map(|l| {
                    if l.starts_with('[') {
                        table = l.to_owned();
                    }
                    match l {
                        l if table == "[plugin]" && l.starts_with("owner = ") => {
                            format!("{owner_line}\n")
                        }
                        l if table == "[plugin]" && l.starts_with("name = ") => {
                            format!("{name_line}\n")
                        }
                        l => format!("{l}\n"),
                    }
                })
                .collect();
            m.push_str(&extra);
            m
        });
        let renamed = self.root.join(format!("{owner}-{name}-{version}.rlpkg"));
        std::fs::rename(&pkg, &renamed).unwrap();
        self.publish(&renamed);
    }
}

/// One raw HTTP/1.1 exchange (the path is sent exactly as given, like `curl --path-as-is`):
/// the status and the body.
fn raw_http(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let addr = common::addr_of(url);
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let (status, _, body) = common::raw_request(url, &head, body.to_vec());
    (status, body)
}

#[test]
fn yank_names_cannot_cross_owners_or_leave_the_root() {
    let w = World::new();
    let acme = w.owner_with_token("acme");
    w.owner_with_token("zeta");
    w.publish_as("zeta", "victim", "0.1.0", "");
    w.publish_as("acme", "em", "0.1.0", "");
    // A file outside the registry root that a traversal would rewrite.
    let elsewhere = w.root.join("elsewhere/index/acme");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::copy(w.reg().join("index/acme/em"), elsewhere.join("em")).unwrap();
    let outside_before = std::fs::read(elsewhere.join("em")).unwrap();
    let victim_before = std::fs::read(w.reg().join("index/zeta/victim")).unwrap();
    let server = w.serve();
    let auth = format!("Bearer {acme}");
    for name in [
        "acme/../zeta/victim",
        "acme/../../elsewhere/index/acme/em",
        "acme/../../../../../../../../../../tmp/x",
        "acme/./../zeta/victim",
        "acme/em/../../zeta/victim",
        "acme//zeta/victim",
        "acme/%2e%2e/zeta/victim",
        "acme\\..\\zeta\\victim",
        "/zeta/victim",
        "acme/ em",
        "ACME/em",
    ] {
        let body = serde_json::json!({"name": name, "version": "0.1.0", "yanked": true});
        let (status, text) = raw_http(
            &server.url,
            "POST",
            "/api/v1/yank",
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            body.to_string().as_bytes(),
        );
        assert_eq!(status, 400, "yank {name:?} -> {status} {text}");
        assert!(text.contains("is not a package name"), "{name:?}: {text}");
    }
    assert_eq!(
        std::fs::read(w.reg().join("index/zeta/victim")).unwrap(),
        victim_before
    );
    assert_eq!(std::fs::read(elsewhere.join("em")).unwrap(), outside_before);
    // The direct route to another owner's package is still refused, and the owner's own works.
    let (status, _) = raw_http(
        &server.url,
        "POST",
        "/api/v1/yank",
        &[("authorization", &auth)],
        br#"{"name":"zeta/victim","version":"0.1.0","yanked":true}"#,
    );
    assert_eq!(status, 403);
    let (status, text) = raw_http(
        &server.url,
        "POST",
        "/api/v1/yank",
        &[("authorization", &auth)],
        br#"{"name":"acme/em","version":"9.9.9","yanked":true}"#,
    );
    assert_eq!(status, 404, "{text}");
    let (status, text) = raw_http(
        &server.url,
        "POST",
        "/api/v1/yank",
        &[("authorization", &auth)],
        br#"{"name":"acme/em","version":"0.1.0","yanked":true}"#,
    );
    assert_eq!(status, 200, "{text}");
    // The client refuses such names before sending anything.
    let stderr = common::run_err(&mut w.http(
        &w.home(),
        &server.url,
        Some(&acme),
        &["env", "yank", "acme/../zeta/victim@0.1.0"],
    ));
    assert!(stderr.contains("is not a package name"), "{stderr}");
}

#[test]
fn index_reads_stay_inside_the_root_and_errors_name_no_server_path() {
    let w = World::with_arith();
    let server = w.serve();
    let root = w.reg().canonicalize().unwrap().display().to_string();
    let tmp = std::env::temp_dir().display().to_string();
    let paths = [
        "/index/..%2F..%2F..%2F..%2F..%2Fetc/passwd",
        "/index/..%2F..%2F..%2F..%2F..%2Fetc/does-not-exist-here",
        "/index/rlhost/..%2F..%2Fconfig.json",
        "/index/rlhost/..%2F..%2Ftokens.json",
        "/index/%2e%2e/%2e%2e",
        "/index/rlhost/%2e%2e",
        "/index/..%5C..%5Cetc/passwd",
        "/index/rlhost/arith%00",
        "/artifacts/..%2F..%2Fconfig.json",
        "/artifacts/..%2Ftokens.json.rlpkg",
    ];
    let mut answers = Vec::new();
    for path in paths {
        let (status, body) = raw_http(&server.url, "GET", path, &[], b"");
        assert!(
            status == 400 || status == 404,
            "GET {path} -> {status} {body}"
        );
        assert!(
            !body.contains(&root) && !body.contains(&tmp),
            "GET {path}: {body}"
        );
        assert!(
            !body.contains("root:"),
            "GET {path} read a system file: {body}"
        );
        answers.push((status, body));
    }
    // No existence oracle: a present and an absent file outside the root answer alike.
    assert_eq!(answers[0].0, answers[1].0);
    assert_eq!(
        answers[0].1.replace("passwd", "X"),
        answers[1].1.replace("does-not-exist-here", "X")
    );
    // The real routes still work.
    let (status, body) = raw_http(&server.url, "GET", "/index/rlhost/arith", &[], b"");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"rlhost/arith\""), "{body}");
    let (status, _) = raw_http(&server.url, "GET", "/index/rlhost/nothing", &[], b"");
    assert_eq!(status, 404);
    // A corrupt index answers 500 without the server's paths.
    std::fs::write(w.reg().join("index/rlhost/arith"), "{not json\n").unwrap();
    let (status, body) = raw_http(&server.url, "GET", "/index/rlhost/arith", &[], b"");
    assert_eq!(status, 500, "{body}");
    assert!(!body.contains(&root) && !body.contains(&tmp), "{body}");
}

#[test]
fn uploads_are_refused_from_their_headers_before_the_body_is_read() {
    let w = World::new();
    let acme = w.owner_with_token("acme");
    let server = w.serve();
    let addr = common::addr_of(&server.url);
    // The headers announce 200 MB that never come: the answer must not wait for them.
    let ask = |auth: Option<&str>, length: u64| {
        let auth = auth
            .map(|t| format!("authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "PUT /api/v1/publish?sig=00&key=00 HTTP/1.1\r\nhost: {addr}\r\n{auth}content-length: {length}\r\n\r\n"
        );
        common::raw_request(&server.url, &head, vec![])
    };
    let t = std::time::Instant::now();
    for _ in 0..8 {
        let (status, _, body) = ask(None, 255 << 20);
        assert_eq!(status, 401, "{body}");
        let (status, _, body) = ask(Some("not-a-token"), 255 << 20);
        assert_eq!(status, 401, "{body}");
    }
    // An authenticated upload over the limit is refused from its length alone.
    let (status, _, body) = ask(Some(&acme), 300 << 20);
    assert_eq!(status, 413, "{body}");
    // A yank too: the token is checked before its body is read.
    let (status, _, body) = common::raw_request(
        &server.url,
        &format!("POST /api/v1/yank HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 1500000\r\n\r\n"),
        vec![],
    );
    assert_eq!(status, 401, "{body}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(8),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn the_registry_server_closes_stalled_connections_and_keeps_serving() {
    let w = World::new();
    let acme = w.owner_with_token("acme");
    let server = common::serve_registry(
        &w.home(),
        &w.reg(),
        &[
            "--header-timeout",
            "1",
            "--body-timeout",
            "1",
            "--max-connections",
            "16",
        ],
    );
    // 16 partial headers and 16 partial bodies (authenticated uploads with a well-formed
    // signature and key, so only their bodies are left to read): twice the connection cap.
    let (sig, key) = ("0".repeat(128), format!("01{}", "0".repeat(62)));
    let upload = format!(
        "PUT /api/v1/publish?sig={sig}&key={key} HTTP/1.1\r\nhost: x\r\n\
         authorization: Bearer {acme}\r\ncontent-length: 5000\r\n\r\n(zstd"
    );
    let stalled = common::stalled_connections(
        &server.url,
        32,
        b"GET /config.json HTTP/1.1\r\nhost: x\r\n",
        upload.as_bytes(),
    );
    // A normal request gets through once the stalled ones time out.
    let t = std::time::Instant::now();
    let (status, body) = raw_http(&server.url, "GET", "/config.json", &[], b"");
    assert_eq!(status, 200, "{body}");
    let took = t.elapsed();
    assert!(took < std::time::Duration::from_secs(8), "{took:?}");
    // Every stalled connection was closed by the server; a stalled upload was told why.
    for answer in common::stalled_bodies_answered(stalled, std::time::Duration::from_secs(10)) {
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("--body-timeout"), "{answer}");
    }
}

#[test]
fn an_install_whose_dependency_fails_changes_nothing() {
    let w = World::new();
    w.owner_with_token("acme");
    // A dependency that does not exist.
    w.publish_as(
        "acme",
        "ev-dep",
        "0.1.0",
        "\n[dependencies]\n\"acme/does-not-exist\" = \"^1\"\n",
    );
    // A dependency that exists but is refused (its artifact is tampered with).
    w.publish_as("acme", "bad-dep", "1.0.0", "");
    w.publish_as(
        "acme",
        "ev-refused",
        "0.1.0",
        "\n[dependencies]\n\"acme/bad-dep\" = \"^1\"\n",
    );
    let index = std::fs::read_to_string(w.reg().join("index/acme/bad-dep")).unwrap();
    let cksum = index
        .split("\"cksum\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_owned();
    let artifact = w.reg().join(format!("artifacts/{cksum}.rlpkg"));
    let mut bytes = std::fs::read(&artifact).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&artifact, bytes).unwrap();
    // Something installed before must survive, and the lock and trust files stay as they were.
    w.publish(&w.package("arith", "0.1.0", &same));
    w.ok(&["env", "install", "rlhost/arith"]);
    let lock = std::fs::read(w.home().join("plugins.lock")).unwrap();
    let trust = std::fs::read(w.home().join("trust.json")).unwrap();

    let err = w.fails(&["env", "install", "acme/ev-dep"]);
    assert!(err.contains("acme/does-not-exist"), "{err}");
    let err = w.fails(&["env", "install", "acme/ev-refused"]);
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(!w.home().join("plugins/acme").exists());
    assert_eq!(std::fs::read(w.home().join("plugins.lock")).unwrap(), lock);
    assert_eq!(std::fs::read(w.home().join("trust.json")).unwrap(), trust);
    let leftovers: Vec<_> = std::fs::read_dir(w.home().join("plugins"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".staging-") || n.starts_with(".trash-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(w.ok(&["env", "list"]).contains("rlhost/arith@0.1.0"));

    // With the dependency healthy, the pair installs together.
    w.publish_as("acme", "good-dep", "1.0.0", "");
    w.publish_as(
        "acme",
        "ev-ok",
        "0.1.0",
        "\n[dependencies]\n\"acme/good-dep\" = \"^1\"\n",
    );
    let out = w.ok(&["env", "install", "acme/ev-ok"]);
    assert!(
        out.contains("acme/ev-ok@0.1.0") && out.contains("acme/good-dep@1.0.0"),
        "{out}"
    );
    let lock = std::fs::read_to_string(w.home().join("plugins.lock")).unwrap();
    assert!(
        lock.contains("acme/ev-ok") && lock.contains("acme/good-dep"),
        "{lock}"
    );
}

#[test]
fn an_index_entry_naming_another_package_is_refused() {
    let w = World::new();
    w.owner_with_token("acme");
    w.owner_with_token("zeta");
    w.publish_as("zeta", "renamed", "0.1.0", "");
    // A valid, zeta-signed line, stored under acme's name.
    std::fs::create_dir_all(w.reg().join("index/acme")).unwrap();
    std::fs::copy(
        w.reg().join("index/zeta/renamed"),
        w.reg().join("index/acme/ev-renamed"),
    )
    .unwrap();
    let err = w.fails(&["env", "install", "acme/ev-renamed"]);
    assert!(
        err.contains("index for acme/ev-renamed holds an entry for \"zeta/renamed\""),
        "{err}"
    );
    assert!(!w.home().join("plugins/zeta").exists());
    assert!(!w.home().join("plugins/acme").exists());
    // Over HTTP too.
    let server = w.serve();
    let stderr = common::run_err(&mut w.http(
        &w.home(),
        &server.url,
        None,
        &["env", "install", "acme/ev-renamed"],
    ));
    assert!(
        stderr.contains("holds an entry for \"zeta/renamed\""),
        "{stderr}"
    );
}

#[test]
fn index_dependencies_must_match_the_signed_manifest() {
    let w = World::new();
    w.owner_with_token("acme");
    w.publish_as("acme", "dep", "1.0.0", "");
    w.publish_as(
        "acme",
        "top",
        "0.1.0",
        "\n[dependencies]\n\"acme/dep\" = \"^1\"\n",
    );
    w.publish_as("acme", "leaf", "0.1.0", "");
    let index = w.reg().join("index/acme/top");
    let line = std::fs::read_to_string(&index).unwrap();
    assert!(line.contains(r#""deps":{"acme/dep":"^1"}"#), "{line}");
    // The index drops a dependency the package needs, or adds one it never asked for.
    std::fs::write(
        &index,
        line.replace(r#""deps":{"acme/dep":"^1"}"#, r#""deps":{}"#),
    )
    .unwrap();
    let err = w.fails(&["env", "install", "acme/top"]);
    assert!(
        err.contains("signed manifest says \"acme/dep\" ^1"),
        "{err}"
    );
    let leaf = w.reg().join("index/acme/leaf");
    let line = std::fs::read_to_string(&leaf).unwrap();
    std::fs::write(
        &leaf,
        line.replace(r#""deps":{}"#, r#""deps":{"acme/dep":"^1"}"#),
    )
    .unwrap();
    let err = w.fails(&["env", "install", "acme/leaf"]);
    assert!(err.contains("signed manifest says none"), "{err}");
    assert!(!w.home().join("plugins/acme").exists());
}
