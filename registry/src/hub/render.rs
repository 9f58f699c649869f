//! The hub's HTML: minijinja templates compiled into the binary, rendered with HTML
//! auto-escaping (every value from the registry is escaped; the README's HTML comes from
//! [`super::markdown::to_safe_html`], the one value marked safe), and the static files pages
//! use (stylesheet, copy-button script, icon), served by the binary itself.

use std::sync::OnceLock;

use minijinja::{Environment, context};
use sha2::Digest;

use super::{IndexPage, OwnerPage, PackagePage};

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("index.html", include_str!("templates/index.html")),
    ("owner.html", include_str!("templates/owner.html")),
    ("package.html", include_str!("templates/package.html")),
    ("error.html", include_str!("templates/error.html")),
    ("list.html", include_str!("templates/list.html")),
];

/// A static file of the pages.
pub struct Asset {
    /// Its MIME type.
    pub content_type: &'static str,
    /// Its bytes.
    pub bytes: &'static [u8],
}

const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/style.css"),
    ),
    (
        "copy.js",
        "text/javascript; charset=utf-8",
        include_bytes!("assets/copy.js"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("assets/favicon.svg"),
    ),
];

/// The static file `name` (`style.css`, `copy.js`, `favicon.svg`).
pub fn asset(name: &str) -> Option<Asset> {
    ASSETS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, content_type, bytes)| Asset {
            content_type,
            bytes,
        })
}

/// A short hash of every static file: pages link `?v=` it, so a new binary's files are fetched
/// even though browsers may keep the old ones for a long time.
pub fn asset_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        let mut h = sha2::Sha256::new();
        for (_, _, bytes) in ASSETS {
            h.update(bytes);
        }
        h.finalize()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    })
}

/// The page templates, ready to render.
pub struct Pages {
    env: Environment<'static>,
}

impl Default for Pages {
    fn default() -> Self {
        Self::new()
    }
}

/// `x` with `digits` decimals (`{{ reward|fixed(3) }}`).
fn fixed(x: f64, digits: Option<usize>) -> String {
    format!("{x:.*}", digits.unwrap_or(3))
}

/// `s` percent-encoded for a URL's query (`{{ v.version|urlencode }}`: `1.0.0+build` keeps its
/// `+`, which a query would read as a space).
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Pages {
    /// Compiles the templates.
    pub fn new() -> Self {
        let mut env = Environment::new();
        for (name, source) in TEMPLATES {
            env.add_template(name, source)
                .unwrap_or_else(|e| panic!("template {name}: {e}"));
        }
        env.add_filter("fixed", fixed);
        env.add_filter("urlencode", urlencode);
        env.add_global("asset_version", asset_version());
        env.add_global("registry_version", crate::VERSION);
        Self { env }
    }

    fn render(&self, name: &str, ctx: minijinja::Value) -> String {
        self.env
            .get_template(name)
            .and_then(|t| t.render(ctx))
            .unwrap_or_else(|e| panic!("rendering {name}: {e:#}"))
    }

    /// `/`.
    pub fn index(&self, page: &IndexPage) -> String {
        self.render("index.html", context! { page, query => page.query })
    }

    /// `/owner`.
    pub fn owner(&self, page: &OwnerPage) -> String {
        self.render("owner.html", context! { page })
    }

    /// `/owner/name`.
    pub fn package(&self, page: &PackagePage) -> String {
        let readme_html = page.readme.as_deref().map(super::markdown::to_safe_html);
        self.render(
            "package.html",
            context! {
                page,
                readme_html => readme_html.map(minijinja::Value::from_safe_string),
            },
        )
    }

    /// A page saying what was not found (or what failed).
    pub fn error(&self, status: u16, message: &str) -> String {
        self.render("error.html", context! { status, message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_renders_and_values_are_escaped() {
        let pages = Pages::new();
        let html = pages.error(404, "no package <b>x</b>");
        assert!(
            html.contains("no package &lt;b&gt;x&lt;&#x2f;b&gt;"),
            "{html}"
        );
        let html = pages.index(&IndexPage {
            query: "\"><script>alert(1)</script>".into(),
            environments: vec![],
            rewards: vec![],
        });
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(html.contains(asset_version()));
        assert!(asset("style.css").is_some() && asset("../x").is_none());
        assert_eq!(urlencode("0.3.0+build.1"), "0.3.0%2Bbuild.1");
        assert_eq!(urlencode("1.0.0-rc.1"), "1.0.0-rc.1");
    }

    #[test]
    fn a_full_package_page_renders_escaped() {
        use crate::hub::*;
        let v = semver::Version::parse("0.3.0+build.1").unwrap();
        let row = EvalRow {
            id: "ab".repeat(32),
            version: v.clone(),
            model: "<m>".into(),
            split: "test".into(),
            examples: 2,
            rollouts_per_example: 2,
            reward: 0.25,
            avg_at_k: 0.5,
            pass_at_k: vec![(1, 0.5), (2, 0.75)],
            metrics: vec![("correct".into(), 0.5)],
            sampling: crate::evals::EvalSampling {
                temperature: Some(1.0),
                ..Default::default()
            },
            env_args: "{\"x\": 1}".into(),
            date: "2026-11-28T12:00:00Z".into(),
            host_version: "0.1.0".into(),
            publisher: "will".into(),
            fingerprint: "aaaa bbbb cccc dddd".into(),
        };
        let page = PackagePage {
            name: "will/x".into(),
            owner: "will".into(),
            plugin: "x".into(),
            version: v.clone(),
            yanked: false,
            latest: Some(v.clone()),
            install: "host env install will/x@0.3.0+build.1".into(),
            kind: crate::PluginKind::Environment,
            runtime: "component".into(),
            abi: "rlhost:env@0.1.0".into(),
            min_host: None,
            description: "<script>".into(),
            license: Some("MIT".into()),
            tags: vec!["<t>".into()],
            versions: vec![VersionRow {
                version: v.clone(),
                yanked: false,
                abi: "rlhost:env@0.1.0".into(),
                min_host: None,
                sha256: "cd".repeat(32),
                signature: Signature {
                    state: SignatureState::Verified,
                    key: Some("ef".repeat(32)),
                    fingerprint: Some("aaaa bbbb cccc dddd".into()),
                    pinned: true,
                },
            }],
            capabilities: vec![CapabilityRow {
                name: "sandbox.python".into(),
                meaning: capability_meaning("sandbox.python").into(),
            }],
            datasets: vec![],
            args: vec![crate::EnvArg {
                name: "x".into(),
                kind: crate::ArgType::Integer,
                default: Some("1".into()),
                description: "<d>".into(),
            }],
            dependencies: vec![DependencyRow {
                name: "will/r".into(),
                req: "^0.1".into(),
            }],
            readme: Some("# Title\n\n<script>x</script>".into()),
            args_example: Some("host eval x -a '{\"x\":1}'".into()),
            leaderboard: leaderboard(std::slice::from_ref(&row)),
            evaluations_total: 1,
            evaluations: vec![row],
        };
        let html = Pages::new().package(&page);
        assert!(html.contains("?version=0.3.0%2Bbuild.1"), "{html}");
        assert!(!html.contains("<script>") && !html.contains("<m>") && !html.contains("<t>"));
        assert!(html.contains("data-pinned=\"true\""));
        assert!(html.contains("<h1>Title</h1>") && html.contains("&lt;script&gt;x"));
        assert!(html.contains("<td class=\"avg\">0.500</td>"));
    }
}
