//! The index: one file per package (`index/<owner>/<name>`), one JSON line per version, and the
//! registry's `config.json`. Resolution picks a version from it.

use std::collections::BTreeMap;

use semver::{Version, VersionReq};
use serde::{Deserialize, Serialize};

use crate::manifest::{PluginKind, Runtime};

/// One published version (one line of an index file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// `owner/name`.
    pub name: String,
    /// The version.
    pub vers: Version,
    /// Environment or reward function.
    pub kind: PluginKind,
    /// ABI targeted, e.g. `rlhost:env@0.1.0`.
    pub abi: String,
    /// Wasm or native.
    pub runtime: Runtime,
    /// Reward plugins it uses.
    #[serde(default)]
    pub deps: BTreeMap<String, VersionReq>,
    /// Hex sha256 of the `.rlpkg`.
    pub cksum: String,
    /// Hex ed25519 signature by the publisher (see [`crate::sign`]).
    #[serde(default)]
    pub sig: Option<String>,
    /// Hex public key that made `sig`.
    #[serde(default)]
    pub key: Option<String>,
    /// Withdrawn: not chosen by ranges, still installable exactly.
    #[serde(default)]
    pub yanked: bool,
    /// Oldest host version that can run it.
    #[serde(default)]
    pub min_host: Option<Version>,
    /// One line for humans.
    #[serde(default)]
    pub description: String,
    /// Capabilities it asks for.
    #[serde(default)]
    pub capabilities: Vec<String>,
}

/// `config.json` at the registry root.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryConfig {
    /// Artifact location, relative to the root or absolute, with `{cksum}` replaced.
    pub dl: String,
    /// Publisher keys accepted for each owner (hex ed25519 public keys).
    #[serde(default)]
    pub keys: BTreeMap<String, Vec<String>>,
}

impl RegistryConfig {
    /// The default layout: content-addressed artifacts under `artifacts/`.
    pub fn standard() -> Self {
        Self {
            dl: "artifacts/{cksum}.rlpkg".into(),
            keys: BTreeMap::new(),
        }
    }
}

/// Errors parsing a package reference or resolving it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The reference is not `owner/name[@req]` or `name[@req]`.
    #[error("invalid package reference {0:?}: expected owner/name[@version-requirement]")]
    BadReference(String),
    /// No such package.
    #[error("no package {0} in the registry")]
    NotFound(String),
    /// A bare name is published by several owners.
    #[error("{name} is published by several owners ({owners}): say which, e.g. {example}")]
    Ambiguous {
        /// The bare name.
        name: String,
        /// The owners.
        owners: String,
        /// An example reference.
        example: String,
    },
    /// The index of one package holds an entry that names another: a forged or corrupt index
    /// (a valid signature for `found` must not install it under `requested`).
    #[error(
        "the registry's index for {requested} holds an entry for {found:?}; refusing it (a forged or corrupt index)"
    )]
    MisnamedEntry {
        /// The package asked for (the index path).
        requested: String,
        /// The name in the entry.
        found: String,
    },
    /// No version fits; says why each was rejected.
    #[error("no version of {name} matches {req}:\n{reasons}")]
    NoMatch {
        /// The package.
        name: String,
        /// The requirement.
        req: String,
        /// One line per version.
        reasons: String,
    },
}

/// `owner/name[@req]` or `name[@req]` as typed by a user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRef {
    /// The owner, if given.
    pub owner: Option<String>,
    /// The name.
    pub name: String,
    /// The version requirement (`*` when not given).
    pub req: VersionReq,
    /// The requirement as typed, for messages.
    pub req_text: String,
}

impl std::str::FromStr for PackageRef {
    type Err = ResolveError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ResolveError::BadReference(s.to_owned());
        let (path, req_text) = match s.split_once('@') {
            Some((p, r)) => (p, r.trim().to_owned()),
            None => (s, "*".to_owned()),
        };
        let req = VersionReq::parse(&req_text).map_err(|_| bad())?;
        let slug = crate::name::is_slug;
        let (owner, name) = match path.split_once('/') {
            Some((o, n)) if slug(o) && slug(n) => (Some(o.to_owned()), n.to_owned()),
            None if slug(path) => (None, path.to_owned()),
            _ => return Err(bad()),
        };
        Ok(Self {
            owner,
            name,
            req,
            req_text,
        })
    }
}

/// Whether `req` pins one exact version (`=1.2.3`).
fn is_exact(req: &VersionReq) -> bool {
    req.comparators.len() == 1 && req.comparators[0].op == semver::Op::Exact
}

/// Picks the highest version of `entries` matching `req` that is not yanked (unless pinned
/// exactly), whose ABI `abi_ok` accepts and whose `min_host` is at most `host`. Otherwise lists
/// every version with the reason it was rejected.
pub fn resolve<'a>(
    name: &str,
    entries: &'a [IndexEntry],
    req: &VersionReq,
    req_text: &str,
    abi_ok: &dyn Fn(&str) -> Result<(), String>,
    host: &Version,
) -> Result<&'a IndexEntry, ResolveError> {
    if let Some(e) = entries.iter().find(|e| e.name != name) {
        return Err(ResolveError::MisnamedEntry {
            requested: name.to_owned(),
            found: e.name.clone(),
        });
    }
    let mut sorted: Vec<&IndexEntry> = entries.iter().collect();
    sorted.sort_by(|a, b| b.vers.cmp(&a.vers));
    let mut reasons = Vec::new();
    for e in sorted {
        let why = if !req.matches(&e.vers) {
            Some(format!("does not match {req_text}"))
        } else if e.yanked && !is_exact(req) {
            Some("is yanked (install it with @=VERSION to use it anyway)".to_owned())
        } else if let Err(abi) = abi_ok(&e.abi) {
            Some(abi)
        } else {
            e.min_host
                .as_ref()
                .filter(|m| *m > host)
                .map(|min| format!("needs host {min} or newer (this is {host})"))
        };
        match why {
            None => return Ok(e),
            Some(why) => reasons.push(format!("  {} {why}", e.vers)),
        }
    }
    if reasons.is_empty() {
        return Err(ResolveError::NotFound(name.to_owned()));
    }
    Err(ResolveError::NoMatch {
        name: name.to_owned(),
        req: req_text.to_owned(),
        reasons: reasons.join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(v: &str, abi: &str, yanked: bool) -> IndexEntry {
        IndexEntry {
            name: "will/demo".into(),
            vers: Version::parse(v).unwrap(),
            kind: PluginKind::Environment,
            abi: abi.into(),
            runtime: Runtime::Wasm,
            deps: BTreeMap::new(),
            cksum: "00".into(),
            sig: None,
            key: None,
            yanked,
            min_host: None,
            description: String::new(),
            capabilities: vec![],
        }
    }

    fn abi_ok(abi: &str) -> Result<(), String> {
        match abi {
            "rlhost:env@0.1.0" => Ok(()),
            other => Err(format!(
                "targets {other}, this host supports rlhost:env@0.1.0..<0.2.0"
            )),
        }
    }

    #[test]
    fn parses_references() {
        let r: PackageRef = "will/math-python@^0.2".parse().unwrap();
        assert_eq!(r.owner.as_deref(), Some("will"));
        assert_eq!(r.name, "math-python");
        assert!(r.req.matches(&Version::new(0, 2, 5)));
        let r: PackageRef = "arith".parse().unwrap();
        assert_eq!((r.owner, r.req_text.as_str()), (None, "*"));
        for bad in ["Will/x", "a/b/c", "x@not-a-version", "", "/x"] {
            assert!(bad.parse::<PackageRef>().is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_an_index_whose_entry_names_another_package() {
        // A valid line signed for zeta/renamed, stored at index/acme/ev-renamed.
        let mut forged = entry("0.1.0", "rlhost:env@0.1.0", false);
        forged.name = "zeta/renamed".into();
        let entries = vec![entry("0.0.9", "rlhost:env@0.1.0", false), forged];
        let err = resolve(
            "will/demo",
            &entries,
            &VersionReq::STAR,
            "*",
            &abi_ok,
            &Version::new(0, 1, 0),
        )
        .unwrap_err();
        assert_eq!(
            err,
            ResolveError::MisnamedEntry {
                requested: "will/demo".into(),
                found: "zeta/renamed".into()
            }
        );
    }

    #[test]
    fn picks_the_highest_usable_version_and_explains_refusals() {
        let host = Version::new(0, 1, 0);
        let entries = vec![
            entry("0.1.0", "rlhost:env@0.1.0", false),
            entry("0.2.0", "rlhost:env@0.1.0", true),
            entry("0.3.0", "rlhost:env@0.2.0", false),
        ];
        let any = VersionReq::STAR;
        let got = resolve("will/demo", &entries, &any, "*", &abi_ok, &host).unwrap();
        assert_eq!(got.vers, Version::new(0, 1, 0));
        let exact = VersionReq::parse("=0.2.0").unwrap();
        let got = resolve("will/demo", &entries, &exact, "=0.2.0", &abi_ok, &host).unwrap();
        assert_eq!(
            got.vers,
            Version::new(0, 2, 0),
            "an exact pin installs a yanked version"
        );
        let req = VersionReq::parse(">=0.2").unwrap();
        let err = resolve("will/demo", &entries, &req, ">=0.2", &abi_ok, &host)
            .unwrap_err()
            .to_string();
        assert!(err.contains("0.3.0 targets rlhost:env@0.2.0"), "{err}");
        assert!(err.contains("0.2.0 is yanked"), "{err}");
        assert!(err.contains("0.1.0 does not match >=0.2"), "{err}");
        let mut newer = entry("0.1.1", "rlhost:env@0.1.0", false);
        newer.min_host = Some(Version::new(9, 0, 0));
        let entries = vec![newer];
        let err = resolve("will/demo", &entries, &any, "*", &abi_ok, &host)
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs host 9.0.0"), "{err}");
    }
}
