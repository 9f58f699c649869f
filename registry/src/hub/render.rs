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

impl Pages {
    /// Compiles the templates.
    pub fn new() -> Self {
        let mut env = Environment::new();
        for (name, source) in TEMPLATES {
            env.add_template(name, source)
                .unwrap_or_else(|e| panic!("template {name}: {e}"));
        }
        env.add_filter("fixed", fixed);
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
            html.contains("no package &lt;b&gt;x&lt;&#x2f;b&gt;")
                || html.contains("no package &lt;b&gt;x&lt;/b&gt;"),
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
    }
}
