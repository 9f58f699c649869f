//! End-to-end: the registry as a hub people browse (`host registry serve`'s web pages) and
//! scripts read (their JSON twins), with every first-party plugin published as `make plugins`
//! publishes it: the pages agree with `host env search/info`, a hostile README renders inert,
//! evaluations published by `host eval --publish` show their summary's figures (unsigned,
//! tampered, interrupted and untrusted ones are refused), and a real headless Chromium walks the
//! pages as a person does (scripts/hub-browser.py), leaving screenshots in
//! `target/hub-screenshots/`.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::common::{self, host, run, texts};

/// What `scripts/publish-plugins.sh` publishes.
const FIRST_PARTY: &[&str] = &[
    "arith",
    "arith-tools",
    "exact-match",
    "math-verify",
    "math-python",
    "math500",
    "aime2024",
    "aime2025",
    "deepscaler",
    "arith-tools-extism",
    "exact-match-extism",
    "arith-tools-python",
    "exact-match-python",
    "reverse-text",
];

/// A README written to attack the page it is shown on.
const HOSTILE_README: &str = "# Hostile README\n\n\
<script>window.__pwned = 1; alert('script')</script>\n\n\
An image <img src=x onerror=\"window.__pwned = 2; alert('img')\"> and a \
<a href=\"javascript:alert('a')\" onclick=\"alert('click')\">link</a>.\n\n\
[markdown link](javascript:window.__pwned=3) [tabbed](java\tscript:alert(1)) \
[entity](jav&#x61;script:alert(1)) ![remote](https://evil.example/track.png)\n\n\
<iframe src=\"https://evil.example/\"></iframe><style>body{display:none}</style>\n\n\
<form action=\"https://evil.example/\"><input name=q></form>\n";

/// A registry with every first-party plugin (and a few more versions), its server, a token
/// and a key of the `rlhost` owner.
struct Hub {
    root: PathBuf,
    _server: common::RegistryServer,
    url: String,
    token: String,
    key: rlhost_registry::PublisherKey,
    // Last: the server stops (dropped above) before its folder goes.
    _tmp: tempfile::TempDir,
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

impl Hub {
    fn home(&self) -> PathBuf {
        self.root.join("home")
    }
    fn reg(&self) -> PathBuf {
        self.root.join("registry")
    }
    fn key_file(&self) -> PathBuf {
        self.root.join("publisher.key")
    }
    /// `host ARGS` against this registry's folder.
    fn local(&self, args: &[&str]) -> String {
        common::run_ok(
            host(&self.home())
                .env(
                    "RLHOST_REGISTRY",
                    format!("file://{}", self.reg().display()),
                )
                .args(args),
        )
    }
    /// `host ARGS --registry URL` against the server.
    fn remote(&self, args: &[&str]) -> Command {
        let mut cmd = host(&self.home());
        cmd.env_remove("RLHOST_REGISTRY_TOKEN")
            .args(args)
            .args(["--registry", &self.url]);
        cmd
    }

    /// A copy of the built plugin `dist` with `edit` applied to its manifest and `readme`
    /// (when given) as its README, packed and published.
    fn publish_variant(
        &self,
        dist: &str,
        tag: &str,
        edit: &dyn Fn(String) -> String,
        readme: Option<&str>,
    ) {
        let dir = self.root.join(format!("src-{tag}"));
        common::copy_dir(&common::dist(dist), &dir);
        let manifest = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
        std::fs::write(dir.join("plugin.toml"), edit(manifest)).unwrap();
        if let Some(r) = readme {
            std::fs::write(dir.join("README.md"), r).unwrap();
        }
        let pkg = self.root.join(format!("{tag}.rlpkg"));
        self.local(&["env", "pack", &s(&dir), "-o", &s(&pkg)]);
        self.local(&["env", "publish", &s(&pkg), "--key", &s(&self.key_file())]);
    }

    fn start() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        let reg = root.join("registry");
        let key_file = root.join("publisher.key");
        let home = root.join("home");
        common::registry_with_key(&home, &reg, &key_file, &["rlhost", "will"]);
        let token = common::run_ok(host(&home).args([
            "registry",
            "token",
            "--root",
            &s(&reg),
            "--owner",
            "rlhost",
        ]))
        .trim()
        .to_owned();
        let server = common::serve_registry(&home, &reg, &[]);
        let key = rlhost_registry::PublisherKey::load(&key_file).unwrap();
        let hub = Self {
            root,
            url: server.url.clone(),
            _server: server,
            token,
            key,
            _tmp: tmp,
        };
        // Packed once for both tests of this file (packing validates each component: a minute
        // for the 14).
        for name in FIRST_PARTY {
            let pkg = common::packed(name);
            hub.local(&["env", "publish", &s(&pkg), "--key", &s(&hub.key_file())]);
        }
        // An older arith, yanked: the versions table shows both.
        let version = |v: &'static str| {
            move |m: String| -> String {
                m.lines()
                    .map(|l| match l.starts_with("version = ") {
                        true => format!("version = \"{v}\"\n"),
                        false => format!("{l}\n"),
                    })
                    .collect()
            }
        };
        hub.publish_variant("arith", "arith-0.0.9", &version("0.0.9"), None);
        hub.local(&["env", "yank", "rlhost/arith@0.0.9"]);
        hub.publish_variant(
            "arith",
            "hostile",
            &|m| {
                m.replace("name = \"arith\"", "name = \"hostile-readme\"")
                    .replace(
                        "description = \"",
                        "description = \"<b onmouseover=alert(1)>bold</b> \\\"quoted\\\" ",
                    )
            },
            Some(HOSTILE_README),
        );
        hub
    }
}

/// The version of the built plugin `dist`.
fn version_of(dist: &str) -> semver::Version {
    rlhost_registry::Manifest::load(&common::dist(dist).join("plugin.toml"))
        .unwrap()
        .plugin
        .version
}

/// One HTTP exchange on loopback (`Connection: close`): status, headers (lower-case names),
/// body.
fn http(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<(String, String)>, String) {
    let mut stream = std::net::TcpStream::connect(common::addr_of(url)).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
        common::addr_of(url),
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn get_json(url: &str, path: &str) -> Value {
    let (status, _, body) = http(url, "GET", path, &[], b"");
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

fn get_html(url: &str, path: &str) -> String {
    let (status, headers, body) = http(url, "GET", path, &[("Accept", "text/html")], b"");
    assert_eq!(status, 200, "GET {path}: {body}");
    assert_eq!(
        header(&headers, "content-type"),
        Some("text/html; charset=utf-8")
    );
    unescape(&body)
}

/// HTML text with the entities minijinja's escaping writes turned back into characters.
fn unescape(html: &str) -> String {
    html.replace("&#x2f;", "/")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Every version line `host env info` prints (before what it says about an installed copy).
fn info_lines(text: &str) -> BTreeSet<String> {
    text.lines()
        .take_while(|l| !l.starts_with("installed:"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_hub_agrees_with_the_cli_and_renders_hostile_readmes_inert() {
    let hub = Hub::start();
    let url = &hub.url;

    // `host env search` and the index's JSON list the same packages, versions, descriptions.
    let searched: BTreeSet<String> = common::run_ok(&mut hub.remote(&["env", "search"]))
        .lines()
        .map(str::to_owned)
        .collect();
    let index = get_json(url, "/api/v1/hub");
    let listed: BTreeSet<String> = ["environments", "rewards"]
        .iter()
        .flat_map(|k| index[k].as_array().unwrap().clone())
        .map(|p| {
            format!(
                "{}@{}  {}  ({})",
                p["name"].as_str().unwrap(),
                p["version"].as_str().unwrap(),
                p["description"].as_str().unwrap(),
                p["abi"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(listed, searched);
    assert_eq!(listed.len(), FIRST_PARTY.len() + 1, "{listed:#?}");
    let rewards: Vec<&str> = index["rewards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(rewards.contains(&"rlhost/math-verify"), "{rewards:?}");
    // Each flavour is labelled as it was written (a prebuilt Python plugin by its `language`).
    let runtime = |name: &str| {
        ["environments", "rewards"]
            .iter()
            .flat_map(|k| index[k].as_array().unwrap().clone())
            .find(|p| p["name"] == name)
            .unwrap()["runtime"]
            .clone()
    };
    assert_eq!(runtime("rlhost/arith-tools"), "component");
    assert_eq!(runtime("rlhost/arith-tools-extism"), "extism");
    assert_eq!(runtime("rlhost/arith-tools-python"), "python");
    assert_eq!(runtime("rlhost/exact-match-python"), "python");
    // The HTML index lists them too, and `Accept: application/json` on `/` is the same JSON.
    let html = get_html(url, "/");
    for p in index["environments"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        assert!(
            html.contains(&format!("data-package=\"{name}\"")),
            "{name} not on /"
        );
    }
    let (_, _, body) = http(url, "GET", "/", &[("Accept", "application/json")], b"");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), index);
    // A search the CLI and the page answer alike.
    let cli: BTreeSet<String> = common::run_ok(&mut hub.remote(&["env", "search", "aime"]))
        .lines()
        .map(|l| l.split('@').next().unwrap().to_owned())
        .collect();
    let page = get_json(url, "/api/v1/hub?q=aime");
    let web: BTreeSet<String> = page["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(web, cli);
    assert!(
        web.contains("rlhost/aime2024") && web.contains("rlhost/aime2025"),
        "{web:?}"
    );

    // Every first-party package: `host env info` and the page's JSON agree on every version;
    // the JSON carries the packed README and the manifest's data and arguments; the HTML
    // shows the install command, the checksums and a verified signature.
    let public = hub.key.public_hex();
    let mut names = BTreeSet::new();
    for dist in FIRST_PARTY {
        let manifest =
            rlhost_registry::Manifest::load(&common::dist(dist).join("plugin.toml")).unwrap();
        names.insert(manifest.full_name());
    }
    for name in &names {
        let info = info_lines(&common::run_ok(&mut hub.remote(&["env", "info", name])));
        let page = get_json(url, &format!("/api/v1/packages/{name}"));
        let from_page: BTreeSet<String> = page["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let state = v["signature"]["state"].as_str().unwrap();
                format!(
                    "{name}@{}  {}  {}  {}{}",
                    v["version"].as_str().unwrap(),
                    v["abi"].as_str().unwrap(),
                    v["sha256"].as_str().unwrap(),
                    if state == "verified" { "signed" } else { state },
                    if v["yanked"].as_bool().unwrap() {
                        "  (yanked)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        assert_eq!(from_page, info, "{name}");
        for v in page["versions"].as_array().unwrap() {
            assert_eq!(v["signature"]["state"], "verified", "{name}");
            assert_eq!(v["signature"]["pinned"], true, "{name}");
            assert_eq!(v["signature"]["key"], public.as_str());
        }
        let version = page["version"].as_str().unwrap();
        let install = format!("host env install {name}@{version}");
        assert_eq!(page["install"], install.as_str());
        let html = get_html(url, &format!("/{name}"));
        assert!(html.contains(&install), "{name}: no install command");
        assert!(html.contains("Signature verifies"), "{name}");
        assert!(
            html.contains(&rlhost_registry::sign::fingerprint(&public)),
            "{name}"
        );
        for v in page["versions"].as_array().unwrap() {
            assert!(html.contains(v["sha256"].as_str().unwrap()), "{name}");
        }
        let readme = page["readme"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no README"));
        assert!(
            readme.lines().count() > 10,
            "{name}: a README worth reading"
        );
        let first_heading = readme
            .lines()
            .find(|l| l.starts_with("# "))
            .unwrap()
            .trim_start_matches("# ");
        assert!(html.contains(first_heading), "{name}: README not rendered");
    }
    // The manifest's data and arguments, as `host env info` reads them from an installed copy.
    let page = get_json(url, "/api/v1/packages/will/math-python");
    let manifest =
        rlhost_registry::Manifest::load(&common::dist("math-python").join("plugin.toml")).unwrap();
    assert_eq!(
        page["datasets"],
        serde_json::to_value(&manifest.datasets).unwrap()
    );
    assert_eq!(page["args"], serde_json::to_value(&manifest.args).unwrap());
    assert!(!manifest.args.is_empty());
    assert_eq!(page["datasets"][0]["rows"], 7500);
    assert_eq!(page["capabilities"][0]["name"], "sandbox.python");
    common::run_ok(&mut hub.remote(&[
        "env",
        "install",
        "will/math-python",
        "--allow-missing-capabilities",
    ]));
    let info = common::run_ok(&mut hub.remote(&["env", "info", "will/math-python"]));
    for arg in &manifest.args {
        assert!(info.contains(&format!("  arg {} (", arg.name)), "{info}");
    }
    assert!(
        info.contains("split train: data/train.jsonl, 7500 rows"),
        "{info}"
    );
    // A yanked older version: listed, flagged, installable only exactly.
    let arith = get_json(url, "/api/v1/packages/rlhost/arith?version=0.0.9");
    assert_eq!(arith["install"], "host env install rlhost/arith@=0.0.9");
    assert_eq!(arith["yanked"], true);
    assert_eq!(arith["latest"], version_of("arith").to_string().as_str());

    // The owner's page: its key and its packages.
    let owner = get_json(url, "/api/v1/owners/will");
    assert_eq!(owner["keys"][0]["key"], public.as_str());
    assert_eq!(owner["packages"][0]["name"], "will/math-python");
    assert!(get_html(url, "/will").contains("will/math-python"));

    // The hostile README: shown as text, nothing from it runs or loads.
    let html = get_html(url, "/rlhost/hostile-readme");
    let raw = http(url, "GET", "/rlhost/hostile-readme", &[], b"").2;
    let start = raw.find("<section id=\"readme\"").unwrap();
    let readme = &raw[start..start + raw[start..].find("</section>").unwrap()];
    for tag in readme
        .split('<')
        .skip(1)
        .map(|t| &t[..t.find('>').unwrap_or(t.len())])
    {
        let lower = tag.to_lowercase();
        let name = lower
            .trim_start_matches('/')
            .split([' ', '/'])
            .next()
            .unwrap()
            .to_owned();
        assert!(
            ![
                "script", "img", "iframe", "style", "form", "input", "object", "embed"
            ]
            .contains(&name.as_str()),
            "<{tag}> in the README"
        );
        assert!(!lower.contains(" on"), "a handler in <{tag}>");
        assert!(!lower.contains("javascript:"), "<{tag}>");
    }
    assert!(
        html.contains("<script>window.__pwned = 1;"),
        "the script is shown as text"
    );
    assert!(
        !raw.contains("<b onmouseover"),
        "the description is escaped"
    );
    // Headers: a strict CSP, no sniffing, revalidation with an ETag.
    let (status, headers, _) = http(url, "GET", "/will/math-python", &[], b"");
    assert_eq!(status, 200);
    let csp = header(&headers, "content-security-policy").unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert_eq!(header(&headers, "x-content-type-options"), Some("nosniff"));
    assert_eq!(header(&headers, "cache-control"), Some("no-cache"));
    let etag = header(&headers, "etag").unwrap().to_owned();
    let (status, _, body) = http(
        url,
        "GET",
        "/will/math-python",
        &[("If-None-Match", &etag)],
        b"",
    );
    assert_eq!((status, body.as_str()), (304, ""));
    // Every resource a page uses is the binary's own, and versioned ones are immutable.
    let page_html = http(url, "GET", "/", &[], b"").2;
    for link in page_html
        .split(['"', '\''])
        .filter(|p| p.starts_with("/static/"))
    {
        let (status, headers, _) = http(url, "GET", link, &[], b"");
        assert_eq!(status, 200, "{link}");
        assert!(
            header(&headers, "cache-control")
                .unwrap()
                .contains("immutable"),
            "{link}"
        );
    }
    assert!(
        !page_html.contains("http://") && !page_html.contains("https://"),
        "an external resource"
    );
    let weak = format!("W/{etag}");
    let (status, _, _) = http(
        url,
        "GET",
        "/will/math-python",
        &[("If-None-Match", &weak)],
        b"",
    );
    assert_eq!(status, 304);
    // Bad input: the page's error (HTML, same headers) or JSON for the twins, never a bare 400.
    let (status, headers, body) = http(url, "GET", "/will/math-python?version=garbage", &[], b"");
    assert_eq!(status, 400);
    assert!(
        header(&headers, "content-type")
            .unwrap()
            .starts_with("text/html")
    );
    assert!(
        header(&headers, "content-security-policy")
            .unwrap()
            .contains("default-src 'none'")
    );
    assert!(
        unescape(&body).contains("?version= must be a semver version"),
        "{body}"
    );
    for path in [
        "/api/v1/packages/will/Evil",
        "/api/v1/owners/Bad",
        "/api/v1/packages/will/math-python?version=x",
    ] {
        let (status, headers, body) = http(url, "GET", path, &[], b"");
        assert!(status == 400 || status == 404, "{path}: {status}");
        assert_eq!(
            header(&headers, "content-type"),
            Some("application/json"),
            "{path}"
        );
        assert!(body.contains("\"error\""), "{path}: {body}");
        assert_eq!(
            header(&headers, "x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
    }
    // `Accept` by quality: a browser's header is HTML, q=0 is a refusal.
    for (accept, json) in [
        ("text/html,*/*;q=0.8", false),
        ("application/json;q=0", false),
        ("text/html;q=0.1, application/json", true),
    ] {
        let (_, headers, _) = http(url, "GET", "/will/math-python", &[("Accept", accept)], b"");
        let kind = header(&headers, "content-type").unwrap();
        assert_eq!(kind == "application/json", json, "{accept}: {kind}");
    }
    // A README over the limit is refused when packed.
    let big = hub.root.join("src-big");
    common::copy_dir(&common::dist("arith"), &big);
    std::fs::write(big.join("README.md"), "x".repeat((1 << 20) + 1)).unwrap();
    let err = common::run_err(host(&hub.home()).args([
        "env",
        "pack",
        &s(&big),
        "-o",
        &s(&hub.root.join("big.rlpkg")),
    ]));
    assert!(
        err.contains("a README may be at most 1048576 bytes"),
        "{err}"
    );

    // Not found: a page for people, JSON for scripts.
    let (status, headers, body) = http(url, "GET", "/will/nothing", &[], b"");
    assert_eq!(status, 404);
    assert!(
        header(&headers, "content-type")
            .unwrap()
            .starts_with("text/html")
    );
    assert!(
        unescape(&body).contains("no package will/nothing"),
        "{body}"
    );
    let (status, _, body) = http(url, "GET", "/api/v1/packages/will/nothing", &[], b"");
    assert_eq!(status, 404);
    assert!(body.contains("\"error\""), "{body}");

    // An owner named like a route of the pages cannot publish: its pages would be hidden.
    let dir = hub.root.join("src-static");
    common::copy_dir(&common::dist("arith"), &dir);
    let manifest = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    std::fs::write(
        dir.join("plugin.toml"),
        manifest.replacen("owner = \"rlhost\"", "owner = \"static\"", 1),
    )
    .unwrap();
    let pkg = hub.root.join("static.rlpkg");
    hub.local(&["env", "pack", &s(&dir), "-o", &s(&pkg)]);
    let err = common::run_err(
        host(&hub.home())
            .env("RLHOST_REGISTRY", format!("file://{}", hub.reg().display()))
            .args(["env", "publish", &s(&pkg), "--key", &s(&hub.key_file())]),
    );
    assert!(err.contains("\"static\" is reserved"), "{err}");

    browser(&hub, &public);
}

/// The same pages in a real headless Chromium (skipped when none is installed).
fn browser(hub: &Hub, public: &str) {
    let test = "hub::the_hub_agrees_with_the_cli_and_renders_hostile_readmes_inert (browser)";
    let found = ["chromium-headless-shell", "chromium"].iter().any(|b| {
        Command::new("sh")
            .args(["-c", &format!("command -v {b}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !found {
        common::skip(
            test,
            "no Chromium (scripts/setup.sh installs chromium-headless-shell where apt is available)",
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let shots = root.join("target/hub-screenshots");
    let out = run(Command::new("python3")
        .arg(root.join("scripts/hub-browser.py"))
        .args(["--url", &hub.url, "--out", &s(&shots), "--search", "math"])
        .args([
            "--open",
            "will/math-python",
            "--hostile",
            "rlhost/hostile-readme",
        ]));
    let (stdout, stderr) = texts(&out);
    assert!(out.status.success(), "hub-browser.py failed:\n{stderr}");
    let r: Value = serde_json::from_str(&stdout).unwrap();
    std::fs::write(shots.join("report.json"), &stdout).unwrap();
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_owned())
            .collect()
    };
    // The index lists every package; the search typed into the box finds the math ones.
    let all = names(&r["index"]["packages"]);
    assert!(
        all.contains(&"will/math-python".to_owned())
            && all.contains(&"rlhost/math-verify".to_owned()),
        "{all:?}"
    );
    assert_eq!(r["search"]["url"], "/?q=math");
    assert_eq!(r["search"]["query"], "math");
    let found = names(&r["search"]["packages"]);
    let expected: Vec<String> = {
        let j = get_json(&hub.url, "/api/v1/hub?q=math");
        ["environments", "rewards"]
            .iter()
            .flat_map(|k| j[k].as_array().unwrap().clone())
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(found, expected);
    assert!(
        found.len() < all.len(),
        "the search narrowed nothing: {found:?}"
    );
    // The package page, reached by a click.
    let p = &r["package"];
    assert_eq!(p["url"], "/will/math-python");
    let install = format!(
        "host env install will/math-python@{}",
        version_of("math-python")
    );
    assert_eq!(p["install"], install.as_str());
    assert_eq!(p["signature"]["state"], "verified");
    assert_eq!(p["signature"]["pinned"], true);
    assert_eq!(
        p["fingerprint"],
        rlhost_registry::sign::fingerprint(public).as_str()
    );
    let json = get_json(&hub.url, "/api/v1/packages/will/math-python");
    assert_eq!(p["sha256"], json["versions"][0]["sha256"]);
    assert_eq!(
        p["versions"][0]["version"],
        version_of("math-python").to_string().as_str()
    );
    assert!(!p["readme_headings"].as_array().unwrap().is_empty(), "{p}");
    assert_eq!(p["datasets"][0]["rows"], "7500");
    assert_eq!(p["datasets"][0]["upstream"], "chiayewken/competition_math");
    assert!(names(&p["args"]).contains(&"max_turns".to_owned()));
    assert_eq!(names(&p["capabilities"]), vec!["sandbox.python".to_owned()]);
    assert!(
        p["stylesheets_loaded"].as_u64().unwrap() >= 1,
        "the stylesheet did not load"
    );
    // The Copy button selects the command (and copies it where the clipboard allows).
    assert_eq!(p["copy_button_visible"], true);
    assert_eq!(r["copy"]["selection"], install.as_str());
    assert!(r["copy"]["state"].is_string(), "{}", r["copy"]);
    // Without JavaScript: no dead button; one click selects the whole command.
    assert_eq!(r["no_js"]["copy_button_visible"], false);
    assert_eq!(r["no_js"]["install_user_select"], "all");
    // The hostile README: inert.
    let h = &r["hostile"];
    assert_eq!(h["scripts_in_readme"], 0, "{h}");
    assert_eq!(h["handlers"], serde_json::json!([]), "{h}");
    assert_eq!(h["javascript_links"], serde_json::json!([]), "{h}");
    assert_eq!(h["embedded"], 0, "{h}");
    assert_eq!(h["pwned"], false, "{h}");
    assert_eq!(h["shown_as_text"], true, "{h}");
    assert_eq!(r["dialogs"], serde_json::json!([]), "a dialog fired: {r}");
    for shot in names(&r["screenshots"]) {
        let bytes = std::fs::read(shots.join(&shot)).unwrap();
        assert!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
            "{shot}"
        );
    }
}

/// `host eval --publish` runs, signs and uploads a summary whose figures the environment's page
/// shows. Everything the upload needs that is known before the run is checked before it (each
/// refusal exits 1 naming the culprit, with no rollout run: no `-s` folder, nothing on the
/// page): the token of an HTTP registry, `--token-var` with a folder registry (which takes
/// none), a model name over the registry's 200 characters, a key the registry accepts for no
/// owner, an environment version the registry does not have, an evaluation of no example.
#[test]
fn evaluations_published_by_host_eval_show_their_figures() {
    let hub = Hub::start();
    let url = &hub.url;
    let model = hub.root.join("tiny");
    common::tiny_model(&model, 3);
    common::run_ok(&mut hub.remote(&["env", "install", "rlhost/arith"]));
    let save = hub.root.join("eval");
    let publish_eval = |model: &Path, n: &str, key: &Path, registry: &str| {
        let mut cmd = host(&hub.home());
        cmd.env_remove("RLHOST_REGISTRY_TOKEN").args([
            "eval",
            "arith",
            "-m",
            &s(model),
            "--dtype",
            "f32",
            "-n",
            n,
            "-r",
            "2",
            "--max-tokens",
            "8",
            "--temperature",
            "1.0",
            "--seed",
            "7",
            "-s",
            &s(&save),
            "--publish",
            "--key",
            &s(key),
            "--registry",
            registry,
        ]);
        cmd
    };
    let mut eval = publish_eval(&model, "4", &hub.key_file(), url);
    // Publishing flags without --publish are refused, not ignored.
    let err = common::run_err(&mut hub.remote(&["eval", "arith", "-m", &s(&model)]));
    assert!(
        err.contains("--registry names where --publish uploads"),
        "{err}"
    );
    for flag in [["--token-var", "T"], ["--key", "k"]] {
        let out = run(host(&hub.home())
            .args(["eval", "arith", "-m", &s(&model)])
            .args(flag));
        let (_, err) = texts(&out);
        assert_eq!(out.status.code(), Some(2), "{flag:?}: {err}");
        assert!(err.contains("--publish"), "{flag:?}: {err}");
    }
    // Refused before any rollout, each naming what is wrong.
    let refused = |cmd: &mut Command, wanted: &[&str]| {
        let err = common::run_err(cmd);
        for w in wanted {
            assert!(err.contains(w), "{w:?} not in: {err}");
        }
        assert!(!save.exists(), "rollouts ran before: {err}");
    };
    // An HTTP registry takes evaluations with a token only.
    refused(&mut eval, &["RLHOST_REGISTRY_TOKEN", "is not set", url]);
    refused(
        publish_eval(&model, "4", &hub.key_file(), url)
            .env("MY_TOKEN", " ")
            .args(["--token-var", "MY_TOKEN"]),
        &["$MY_TOKEN is not set", "--token-var"],
    );
    let token = |mut cmd: Command| -> Command {
        cmd.env("RLHOST_REGISTRY_TOKEN", &hub.token);
        cmd
    };
    // The summary's model (the folder's path and the engine) over the registry's limit.
    let long = hub.root.join("m".repeat(200));
    std::os::unix::fs::symlink(&model, &long).unwrap();
    refused(
        &mut token(publish_eval(&long, "4", &hub.key_file(), url)),
        &["model must be 1-200", "characters", "-m/-b"],
    );
    // A key the registry accepts for no owner.
    let stranger = hub.root.join("stranger.key");
    common::run_ok(host(&hub.home()).args(["registry", "keygen", "--out", &s(&stranger)]));
    refused(
        &mut token(publish_eval(&model, "4", &stranger, url)),
        &["--key", "for no owner"],
    );
    // An evaluation of nothing.
    refused(
        &mut token(publish_eval(&model, "0", &hub.key_file(), url)),
        &["no example", "-n"],
    );
    // A folder registry: it takes no token, and has no arith of the version installed.
    let empty = hub.root.join("empty-registry");
    let empty_key = hub.root.join("empty.key");
    common::registry_with_key(&hub.home(), &empty, &empty_key, &["rlhost"]);
    let folder = format!("file://{}", empty.display());
    refused(
        publish_eval(&model, "4", &empty_key, &folder).args(["--token-var", "T"]),
        &["--token-var T", "takes no token"],
    );
    refused(
        &mut publish_eval(&model, "4", &empty_key, &folder),
        &["has no rlhost/arith@", &version_of("arith").to_string()],
    );
    assert_eq!(
        get_json(url, "/api/v1/packages/rlhost/arith")["evaluations"],
        serde_json::json!([]),
        "nothing was published"
    );
    let out = run(eval.env("RLHOST_REGISTRY_TOKEN", &hub.token));
    let (_, stderr) = texts(&out);
    assert!(out.status.success(), "{stderr}");
    let arith = version_of("arith");
    assert!(
        stderr.contains(&format!("published the evaluation of rlhost/arith@{arith}")),
        "{stderr}"
    );
    let bytes = std::fs::read(save.join("arith/summary.json")).unwrap();
    let summary: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(summary["plugin"], "rlhost/arith");
    assert_eq!(summary["sampling"]["temperature"], 1.0);
    assert_eq!(summary["sampling"]["seed"], 7);
    assert_eq!(summary["host_version"], rlhost::VERSION);

    // The page's figures are the summary's.
    let page = get_json(url, "/api/v1/packages/rlhost/arith");
    let evals = page["evaluations"].as_array().unwrap();
    assert_eq!(evals.len(), 1);
    let e = &evals[0];
    for k in [
        "model",
        "split",
        "examples",
        "rollouts_per_example",
        "reward",
        "avg_at_k",
        "pass_at_k",
        "metrics",
        "date",
        "sampling",
    ] {
        assert_eq!(e[k], summary[k], "{k}");
    }
    assert_eq!(e["publisher"], "rlhost");
    let id = e["id"].as_str().unwrap();
    assert_eq!(id, rlhost_registry::package::checksum(&bytes));
    let html = get_html(url, "/rlhost/arith");
    let reward = format!("{:.3}", summary["reward"].as_f64().unwrap());
    let row_start = html
        .find(&format!("data-eval=\"{id}\""))
        .expect("the evaluation's row");
    let row = &html[row_start..row_start + html[row_start..].find("</tr>").unwrap()];
    assert!(
        row.contains(&format!("<td class=\"reward\">{reward}</td>")),
        "{row}"
    );
    assert!(row.contains(summary["model"].as_str().unwrap()), "{row}");
    for m in summary["metrics"].as_array().unwrap() {
        let shown = format!("{} {:.3}", m[0].as_str().unwrap(), m[1].as_f64().unwrap());
        assert!(row.contains(&shown), "{shown} not in {row}");
    }
    assert_eq!(page["leaderboard"][0]["id"], id);
    assert_eq!(page["leaderboard"][0]["avg_at_k"], summary["avg_at_k"]);
    assert!(
        get_json(url, "/api/v1/hub")["environments"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "rlhost/arith" && p["evaluations"] == 1)
    );
    // The full summary: the exact bytes, with a signature anyone can check.
    let (status, headers, body) = http(
        url,
        "GET",
        &format!("/rlhost/arith/evals/{id}.json"),
        &[],
        b"",
    );
    assert_eq!(status, 200);
    assert_eq!(body.as_bytes(), bytes.as_slice());
    assert_eq!(header(&headers, "x-content-type-options"), Some("nosniff"));
    assert!(header(&headers, "content-security-policy").is_some());
    rlhost_registry::sign::verify_eval(
        header(&headers, "x-rlhost-key").unwrap(),
        header(&headers, "x-rlhost-signature").unwrap(),
        "rlhost/arith",
        &arith,
        id,
    )
    .unwrap();

    // Refusals: each leaves the page as it was.
    let put = |body: &[u8], sig: Option<&str>, key: &str, token: Option<&str>| {
        let path = match sig {
            Some(sig) => format!("/api/v1/evals?sig={sig}&key={key}"),
            None => format!("/api/v1/evals?key={key}"),
        };
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("Authorization", a));
        }
        let (status, _, body) = http(url, "PUT", &path, &headers, body);
        (status, body)
    };
    let public = hub.key.public_hex();
    let sign = |bytes: &[u8], version: &str| {
        hub.key.sign_eval(
            "rlhost/arith",
            &semver::Version::parse(version).unwrap(),
            &rlhost_registry::package::checksum(bytes),
        )
    };
    let token = Some(hub.token.as_str());
    let (status, body) = put(&bytes, None, &public, token);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("must be signed"), "{body}");
    // Tampered: signed, then a figure changed.
    let mut forged = summary.clone();
    forged["avg_at_k"] = serde_json::json!(0.99);
    let forged = serde_json::to_vec_pretty(&forged).unwrap();
    let (status, body) = put(
        &forged,
        Some(&sign(&bytes, &arith.to_string())),
        &public,
        token,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("does not verify"), "{body}");
    // Signed by a key the registry does not accept for the token's owner.
    let stranger = rlhost_registry::PublisherKey::generate().unwrap();
    let sig = stranger.sign_eval(
        "rlhost/arith",
        &arith,
        &rlhost_registry::package::checksum(&forged),
    );
    let (status, body) = put(&forged, Some(&sig), &stranger.public_hex(), token);
    assert_eq!(status, 403, "{body}");
    // Interrupted runs and unpublished versions.
    let mut cut = summary.clone();
    cut["interrupted"] = serde_json::json!(true);
    let cut = serde_json::to_vec_pretty(&cut).unwrap();
    let (status, body) = put(&cut, Some(&sign(&cut, &arith.to_string())), &public, token);
    assert_eq!(
        (status, body.contains("interrupted")),
        (400, true),
        "{body}"
    );
    let mut other = summary.clone();
    other["plugin_version"] = serde_json::json!("9.9.9");
    let other = serde_json::to_vec_pretty(&other).unwrap();
    let (status, body) = put(&other, Some(&sign(&other, "9.9.9")), &public, token);
    assert_eq!(status, 404, "{body}");
    let (status, _) = put(
        &bytes,
        Some(&sign(&bytes, &arith.to_string())),
        &public,
        Some("not-a-token"),
    );
    assert_eq!(status, 401);
    // The same bytes again: one evaluation.
    let (status, _) = put(
        &bytes,
        Some(&sign(&bytes, &arith.to_string())),
        &public,
        token,
    );
    assert_eq!(status, 200);
    let page = get_json(url, "/api/v1/packages/rlhost/arith");
    assert_eq!(page["evaluations"].as_array().unwrap().len(), 1);
}
