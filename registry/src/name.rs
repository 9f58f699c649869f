//! Package names: `owner/name`, each part a slug of 1-64 characters of `[a-z0-9-]` that does not
//! start with `-`. This is the one check every name passes before it becomes a path under a
//! registry's root, a URL of a registry server or a folder of installed plugins: the manifest,
//! references typed by users, every server route and every client method use it, so a name like
//! `acme/../zeta/victim` or `..%2F..%2Fetc/passwd` never reaches the filesystem.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

/// Longest owner or name part.
pub const MAX_SLUG_LEN: usize = 64;

/// Whether `s` is a valid owner or name part: 1-64 of `[a-z0-9-]`, not starting with `-`.
pub fn is_slug(s: &str) -> bool {
    (1..=MAX_SLUG_LEN).contains(&s.len())
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A string that is not a package name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{given:?} is not a package name: expected owner/name, each 1-64 of [a-z0-9-] not starting with '-'"
)]
pub struct NameError {
    /// What was given (cut to 100 characters).
    pub given: String,
}

impl NameError {
    fn new(given: &str) -> Self {
        Self {
            given: given.chars().take(100).collect(),
        }
    }
}

/// A valid `owner/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PackageName {
    full: String,
    slash: usize,
}

impl PackageName {
    /// The name from its two parts.
    pub fn new(owner: &str, name: &str) -> Result<Self, NameError> {
        format!("{owner}/{name}").parse()
    }

    /// The owner part.
    pub fn owner(&self) -> &str {
        &self.full[..self.slash]
    }

    /// The name part.
    pub fn name(&self) -> &str {
        &self.full[self.slash + 1..]
    }

    /// `owner/name`.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// `base/owner/name`, checked to lie inside `base`: the parts are slugs, so the join has
    /// exactly two more plain components (no `..`, no root, no separator inside a part).
    pub fn path_under(&self, base: &Path) -> PathBuf {
        let path = base.join(self.owner()).join(self.name());
        let rel = path
            .strip_prefix(base)
            .expect("a path joined onto base starts with base");
        assert!(
            rel.components().count() == 2
                && rel.components().all(|c| matches!(c, Component::Normal(_))),
            "package name {} escaped {}",
            self.full,
            base.display()
        );
        path
    }
}

impl FromStr for PackageName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, NameError> {
        match s.split_once('/') {
            Some((owner, name)) if is_slug(owner) && is_slug(name) => Ok(Self {
                full: s.to_owned(),
                slash: owner.len(),
            }),
            _ => Err(NameError::new(s)),
        }
    }
}

impl fmt::Display for PackageName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl AsRef<str> for PackageName {
    fn as_ref(&self) -> &str {
        &self.full
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_owner_slash_name() {
        let n: PackageName = "acme/em-2".parse().unwrap();
        assert_eq!(
            (n.owner(), n.name(), n.as_str()),
            ("acme", "em-2", "acme/em-2")
        );
        assert_eq!(
            n.path_under(Path::new("/r/index")),
            PathBuf::from("/r/index/acme/em-2")
        );
        assert_eq!(PackageName::new("a", "b").unwrap().to_string(), "a/b");
    }

    #[test]
    fn refuses_every_shape_that_could_leave_a_folder() {
        let long = "a".repeat(65);
        let long_name = format!("acme/{long}");
        for bad in [
            "",
            "acme",
            "acme/",
            "/em",
            "acme/../zeta/victim",
            "acme/../../../../etc/index/acme/em",
            "../../etc/passwd",
            "acme/em/extra",
            "acme/..",
            "../em",
            "./em",
            "acme/.",
            "acme/em\0",
            "acme/em%2F..",
            "acme\\..\\em",
            "Acme/em",
            "acme/-em",
            "-acme/em",
            "acme/em.x",
            "acme/ em",
            "acme/é",
            long_name.as_str(),
        ] {
            assert!(bad.parse::<PackageName>().is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn errors_name_the_input_without_echoing_megabytes() {
        let huge = "x".repeat(10_000);
        let e = huge.parse::<PackageName>().unwrap_err().to_string();
        assert!(e.len() < 300, "{e}");
        assert!(e.contains("expected owner/name"));
    }
}
