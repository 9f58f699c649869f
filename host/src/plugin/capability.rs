//! Capabilities: declared by the plugin (`capabilities` in `plugin.toml`), granted by the host
//! (the user's settings), and effective only when both agree. Plus the one file-system right a
//! plugin has: reading its own data folder, with no way out of it.

use std::path::{Component, Path, PathBuf};

/// Capability patterns the host grants: exact names (`sandbox.python`), a namespace wildcard
/// (`sandbox.*`) or everything (`*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    patterns: Vec<String>,
}

impl Default for Grants {
    /// The Python sandbox is itself isolated, so it is granted by default.
    fn default() -> Self {
        Self::new(["sandbox.*"])
    }
}

impl Grants {
    /// Grants from patterns.
    pub fn new<S: Into<String>>(patterns: impl IntoIterator<Item = S>) -> Self {
        Self {
            patterns: patterns.into_iter().map(Into::into).collect(),
        }
    }

    /// Grants nothing.
    pub fn none() -> Self {
        Self {
            patterns: Vec::new(),
        }
    }

    /// Whether `capability` is granted.
    pub fn allows(&self, capability: &str) -> bool {
        self.patterns.iter().any(|p| {
            p == "*"
                || p == capability
                || p.strip_suffix(".*").is_some_and(|ns| {
                    capability
                        .strip_prefix(ns)
                        .is_some_and(|rest| rest.starts_with('.') && rest.len() > 1)
                })
        })
    }

    /// The capabilities a plugin gets: what it declared and the host grants.
    pub fn effective(&self, declared: &[String]) -> Vec<String> {
        declared
            .iter()
            .filter(|c| self.allows(c))
            .cloned()
            .collect()
    }
}

impl std::fmt::Display for Grants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.patterns.is_empty() {
            true => f.write_str("none"),
            false => f.write_str(&self.patterns.join(", ")),
        }
    }
}

/// A capability a plugin declared that this host cannot give it now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Unavailable {
    /// The capability (`sandbox.python`).
    pub capability: String,
    /// Why: what was looked for, and where.
    pub reason: String,
    /// What makes it available.
    pub fix: String,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "it needs capability `{}`, which this host cannot grant: {}; to fix: {}",
            self.capability, self.reason, self.fix
        )
    }
}

/// A capability a loaded plugin had and lost while running (the sandbox's worker pool died):
/// rollouts from then on would be scored against failures, so the run must stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin {plugin} lost capability `{capability}` while running")]
pub struct CapabilityLost {
    /// The plugin, `owner/name vX.Y.Z`.
    pub plugin: String,
    /// The capability's name (`sandbox.python`).
    pub capability: String,
    /// What failed.
    #[source]
    pub source: crate::sandbox::SandboxError,
}

/// What a loaded plugin has of the capabilities it declared: the ones it runs without (only
/// when the user allowed that at load) and the first one lost while running.
#[derive(Debug, Default)]
pub struct CapabilityStatus {
    missing: Vec<Unavailable>,
    lost: std::sync::OnceLock<CapabilityLost>,
}

impl CapabilityStatus {
    /// A status for a plugin loaded without `missing`.
    pub fn new(missing: Vec<Unavailable>) -> Self {
        Self {
            missing,
            lost: Default::default(),
        }
    }

    /// The declared capabilities this plugin runs without.
    pub fn missing(&self) -> &[Unavailable] {
        &self.missing
    }

    /// The first capability lost while running, if any.
    pub fn lost(&self) -> Option<&CapabilityLost> {
        self.lost.get()
    }

    /// Records that a capability failed while running (the first loss is kept).
    pub(crate) fn lose(&self, lost: CapabilityLost) {
        let message = format!("{lost}: {}", lost.source);
        if self.lost.set(lost).is_ok() {
            tracing::error!("{message}");
        }
    }
}

/// Why a data file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataAccessError {
    /// The plugin has no data folder.
    #[error("this plugin has no data folder")]
    NoDataDir,
    /// The path is absolute, has `..`, or is empty.
    #[error("data path {0:?} must be relative, without `..`")]
    BadPath(String),
    /// The path resolves (through a symlink) outside the data folder.
    #[error("data path {0:?} leaves the plugin's data folder")]
    Escapes(String),
    /// The file does not exist or cannot be read.
    #[error("cannot read data file {path:?}: {message}")]
    Io {
        /// The requested path.
        path: String,
        /// The I/O error.
        message: String,
    },
}

/// A plugin's read-only data folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// The folder at `root` (canonicalised, so later checks compare real paths).
    pub fn new(root: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: root.canonicalize()?,
        })
    }

    /// The folder's real path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The real path of `relative`, refusing anything that would leave the folder, including
    /// through symlinks.
    pub fn resolve(&self, relative: &str) -> Result<PathBuf, DataAccessError> {
        let rel = Path::new(relative);
        let plain = !relative.is_empty()
            && rel
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !plain {
            return Err(DataAccessError::BadPath(relative.to_owned()));
        }
        let real = self
            .root
            .join(rel)
            .canonicalize()
            .map_err(|e| DataAccessError::Io {
                path: relative.to_owned(),
                message: e.to_string(),
            })?;
        if !real.starts_with(&self.root) {
            return Err(DataAccessError::Escapes(relative.to_owned()));
        }
        Ok(real)
    }

    /// Reads a file, at most `max_bytes` long.
    pub fn read(&self, relative: &str, max_bytes: u64) -> Result<Vec<u8>, DataAccessError> {
        let path = self.resolve(relative)?;
        // Bounded: a package may carry a FIFO or a device node in its data folder, and the
        // plugin names the file. The message names it as the plugin did, not by host path.
        rlhost_fs::read(&path, rlhost_fs::FileLimit::new("data file", max_bytes)).map_err(|e| {
            DataAccessError::Io {
                path: relative.to_owned(),
                message: e.reason(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_wildcard_and_all_grants() {
        let g = Grants::new(["sandbox.python"]);
        assert!(g.allows("sandbox.python"));
        assert!(!g.allows("sandbox.node"));
        let g = Grants::new(["sandbox.*"]);
        assert!(g.allows("sandbox.python"));
        assert!(
            !g.allows("sandbox"),
            "a namespace wildcard needs a name after the dot"
        );
        assert!(!g.allows("sandboxes.python"));
        assert!(!g.allows("network.http"));
        assert!(Grants::new(["*"]).allows("network.http"));
        assert!(!Grants::none().allows("sandbox.python"));
        assert_eq!(
            Grants::default().effective(&["sandbox.python".into(), "network.http".into()]),
            vec!["sandbox.python".to_string()]
        );
    }

    #[test]
    fn reads_inside_and_refuses_escapes() {
        let outer = tempfile::tempdir().unwrap();
        let data = outer.path().join("data");
        std::fs::create_dir_all(data.join("sub")).unwrap();
        std::fs::write(data.join("sub/rows.jsonl"), b"{}").unwrap();
        std::fs::write(outer.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(outer.path().join("secret"), data.join("link")).unwrap();
        std::os::unix::fs::symlink(outer.path(), data.join("up")).unwrap();
        let dir = DataDir::new(&data).unwrap();

        assert_eq!(dir.read("sub/rows.jsonl", 100).unwrap(), b"{}");
        assert_eq!(dir.read("./sub/rows.jsonl", 100).unwrap(), b"{}");
        for bad in ["../secret", "/etc/passwd", "", "sub/../../secret"] {
            assert_eq!(
                dir.read(bad, 100),
                Err(DataAccessError::BadPath(bad.into())),
                "{bad}"
            );
        }
        assert_eq!(
            dir.read("link", 100),
            Err(DataAccessError::Escapes("link".into()))
        );
        assert_eq!(
            dir.read("up/secret", 100),
            Err(DataAccessError::Escapes("up/secret".into()))
        );
        assert!(matches!(
            dir.read("missing", 100),
            Err(DataAccessError::Io { .. })
        ));
        assert!(matches!(
            dir.read("sub/rows.jsonl", 1),
            Err(DataAccessError::Io { .. })
        ));
    }
}
