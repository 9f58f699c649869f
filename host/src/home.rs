//! Where rlhost keeps its state on a machine: installed plugins, caches (compiled components,
//! downloads) and the user's settings file. One root folder, `$RLHOST_HOME` (default `~/.rlhost`):
//!
//! ```text
//! $RLHOST_HOME/
//!   config.toml     user settings (optional), e.g. [registry] default = "http://…"
//!   plugins/        installed plugins, one folder per owner/name/version
//!   cache/          derived data that can be deleted at any time
//!   registry/       the default local (directory) registry
//! ```
//!
//! Files that ship with rlhost rather than with a user come from three places, in this order,
//! and never from the folder the binary was compiled in:
//! - `$RLHOST_SOURCE`, an rlhost checkout (the repository's `.rlhost-env` sets it, so builds and
//!   tests in a checkout use its `sandbox/target/`, `sdk/`, `configs/`, `scripts/`, `.venv-ref`);
//! - the install prefix: `PREFIX/share/rlhost/` beside `PREFIX/bin/host`;
//! - assets embedded in the binary (the `host rl --plugin NAME` presets), written under
//!   `$RLHOST_HOME/cache/` when a command needs them as files.
//!
//! This module resolves and reads; it creates nothing on its own except the embedded presets'
//! copy in the cache (written atomically).

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Environment variable that moves rlhost's home folder.
pub const HOME_ENV: &str = "RLHOST_HOME";
/// Environment variable that overrides the configured registry URL.
pub const REGISTRY_ENV: &str = "RLHOST_REGISTRY";
/// Environment variable naming an rlhost source checkout whose assets a development build uses.
pub const SOURCE_ENV: &str = "RLHOST_SOURCE";

/// The rlhost checkout named by `$RLHOST_SOURCE`, when it is set to a folder.
pub fn source_tree() -> Option<PathBuf> {
    std::env::var_os(SOURCE_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
}

/// The install prefix's data folder, `PREFIX/share/rlhost` for a binary at `PREFIX/bin/host`,
/// when it exists.
pub fn share_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let share = exe.parent()?.parent()?.join("share").join("rlhost");
    share.is_dir().then_some(share)
}

/// A shipped file or folder at `rel` (a path inside an rlhost checkout, e.g.
/// `scripts/generate-peer.py`): in `$RLHOST_SOURCE`, else in the install prefix's share folder.
pub fn shipped(rel: &str) -> Option<PathBuf> {
    [source_tree(), share_dir()]
        .into_iter()
        .flatten()
        .map(|root| root.join(rel))
        .find(|p| p.exists())
}

/// The `host rl --plugin NAME` presets built into the binary: `NAME/rl/{train,orch,infer}.toml`
/// of the repository's `configs/`.
pub const RL_PRESETS: &[(&str, &str)] = &[
    (
        "math-python/rl/train.toml",
        include_str!("../../configs/math-python/rl/train.toml"),
    ),
    (
        "math-python/rl/orch.toml",
        include_str!("../../configs/math-python/rl/orch.toml"),
    ),
    (
        "math-python/rl/infer.toml",
        include_str!("../../configs/math-python/rl/infer.toml"),
    ),
    (
        "arith/rl/train.toml",
        include_str!("../../configs/arith/rl/train.toml"),
    ),
    (
        "arith/rl/orch.toml",
        include_str!("../../configs/arith/rl/orch.toml"),
    ),
    (
        "arith/rl/infer.toml",
        include_str!("../../configs/arith/rl/infer.toml"),
    ),
];

/// Errors while locating or reading rlhost's home folder.
#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    /// Neither `$RLHOST_HOME` nor `$HOME` is usable.
    #[error("cannot locate rlhost's home: set {HOME_ENV} (or HOME) to a folder path")]
    NoHome,
    /// `$RLHOST_HOME` is set but empty.
    #[error("{HOME_ENV} is set but empty: give it a folder path or unset it")]
    EmptyHome,
    /// The settings file exists but cannot be read.
    #[error("cannot read {path}")]
    ReadConfig {
        /// The settings file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The settings file is not valid (syntax, unknown key, wrong type).
    #[error("invalid settings in {path}: {message}")]
    InvalidConfig {
        /// The settings file.
        path: PathBuf,
        /// What the TOML parser said, with line and column.
        message: String,
    },
    /// A registry URL (from the settings file or the environment) has no supported scheme.
    #[error(
        "invalid registry URL {url:?} (from {origin}): expected file://PATH, http:// or https://"
    )]
    InvalidRegistryUrl {
        /// The URL as given.
        url: String,
        /// Where it came from.
        origin: String,
    },
}

/// rlhost's home folder and the paths inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlhostHome {
    root: PathBuf,
}

impl RlhostHome {
    /// Resolves the home folder from the process environment (`$RLHOST_HOME`, else `~/.rlhost`).
    pub fn from_env() -> Result<Self, HomeError> {
        Self::resolve(std::env::var_os(HOME_ENV), std::env::var_os("HOME"))
    }

    /// Resolves the home folder from explicit values of `$RLHOST_HOME` and `$HOME`. A relative
    /// `$RLHOST_HOME` is taken relative to the current directory, so later `cd`s do not move it.
    pub fn resolve(
        rlhost_home: Option<std::ffi::OsString>,
        home: Option<std::ffi::OsString>,
    ) -> Result<Self, HomeError> {
        let root = match rlhost_home {
            Some(v) if v.is_empty() => return Err(HomeError::EmptyHome),
            Some(v) => PathBuf::from(v),
            None => match home {
                Some(h) if !h.is_empty() => PathBuf::from(h).join(".rlhost"),
                _ => return Err(HomeError::NoHome),
            },
        };
        let root = if root.is_relative() {
            std::env::current_dir()
                .map_err(|_| HomeError::NoHome)?
                .join(root)
        } else {
            root
        };
        Ok(Self { root })
    }

    /// A home at an explicit folder (tests, embedding).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The home folder: `$RLHOST_HOME`, else `~/.rlhost`, or the one given to [`at`](Self::at).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where installed plugins live.
    pub fn plugins_dir(&self) -> PathBuf {
        self.root.join("plugins")
    }

    /// Where derived, deletable data lives (compiled components, downloads).
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }

    /// The user settings file, `config.toml` in the home folder (a missing one means all defaults).
    pub fn config_path(&self) -> PathBuf {
        self.root.join("config.toml")
    }

    /// A folder holding the built-in `host rl` presets ([`RL_PRESETS`]) as files, written into
    /// the cache (per host version) the first time it is needed.
    pub fn rl_presets_dir(&self) -> std::io::Result<PathBuf> {
        let dir = self.cache_dir().join(format!("configs-{}", crate::VERSION));
        for (rel, text) in RL_PRESETS {
            let path = dir.join(rel);
            if std::fs::read_to_string(&path).ok().as_deref() != Some(*text) {
                rlhost_fs::write_atomically(&path, text.as_bytes())?;
            }
        }
        Ok(dir)
    }

    /// The default local registry (a directory registry inside the home folder).
    pub fn local_registry_dir(&self) -> PathBuf {
        self.root.join("registry")
    }

    /// Reads the settings file; a missing file means all defaults.
    pub fn load_settings(&self) -> Result<Settings, HomeError> {
        let path = self.config_path();
        // Bounded as every config file is ([`crate::config::CONFIG_FILE`]).
        let text = match crate::config::read_text(&path) {
            Ok(text) => text,
            Err(e) if e.is_not_found() => return Ok(Settings::default()),
            Err(e) => {
                return Err(HomeError::ReadConfig {
                    path,
                    source: e.into(),
                });
            }
        };
        toml::from_str(&text).map_err(|e| HomeError::InvalidConfig {
            path,
            message: e.to_string().trim_end().to_owned(),
        })
    }

    /// The registry in use: `$RLHOST_REGISTRY`, else `[registry] default` from the settings file,
    /// else the local directory registry in the home folder.
    pub fn registry(&self, env_override: Option<String>) -> Result<RegistrySource, HomeError> {
        if let Some(url) = env_override.filter(|u| !u.is_empty()) {
            return RegistrySource::new(url, RegistryOrigin::Environment);
        }
        if let Some(url) = self.load_settings()?.registry.default {
            return RegistrySource::new(url, RegistryOrigin::Settings(self.config_path()));
        }
        let url = format!("file://{}", self.local_registry_dir().display());
        RegistrySource::new(url, RegistryOrigin::Default)
    }
}

/// The user settings file, `$RLHOST_HOME/config.toml`. Unknown keys are errors, so a typo is
/// reported instead of silently ignored.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Registry settings.
    #[serde(default)]
    pub registry: RegistrySettings,
}

/// `[registry]` in the settings file.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    /// URL of the registry `host env install` uses: `file://PATH`, `http://…` or `https://…`.
    pub default: Option<String>,
}

/// Where the registry URL in use came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryOrigin {
    /// `$RLHOST_REGISTRY`.
    Environment,
    /// The settings file at this path.
    Settings(PathBuf),
    /// Nothing configured: the local registry in the home folder.
    Default,
}

impl std::fmt::Display for RegistryOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryOrigin::Environment => write!(f, "${REGISTRY_ENV}"),
            RegistryOrigin::Settings(path) => write!(f, "{}", path.display()),
            RegistryOrigin::Default => write!(f, "default"),
        }
    }
}

/// A registry URL with a supported scheme and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrySource {
    /// The URL.
    pub url: String,
    /// Where it was configured.
    pub origin: RegistryOrigin,
}

impl RegistrySource {
    fn new(url: String, origin: RegistryOrigin) -> Result<Self, HomeError> {
        let ok = url
            .strip_prefix("file://")
            .map(|p| p.starts_with('/'))
            .unwrap_or(false)
            || url.starts_with("http://")
            || url.starts_with("https://");
        if !ok {
            return Err(HomeError::InvalidRegistryUrl {
                url,
                origin: origin.to_string(),
            });
        }
        Ok(Self { url, origin })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home_with_settings(text: &str) -> (tempfile::TempDir, RlhostHome) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.toml"), text).unwrap();
        let home = RlhostHome::at(dir.path());
        (dir, home)
    }

    #[test]
    fn rlhost_home_wins_over_home() {
        let h = RlhostHome::resolve(Some("/srv/rl".into()), Some("/home/u".into())).unwrap();
        assert_eq!(h.root(), Path::new("/srv/rl"));
        assert_eq!(h.plugins_dir(), Path::new("/srv/rl/plugins"));
    }

    #[test]
    fn default_is_dot_rlhost_in_home() {
        let h = RlhostHome::resolve(None, Some("/home/u".into())).unwrap();
        assert_eq!(h.root(), Path::new("/home/u/.rlhost"));
    }

    #[test]
    fn relative_home_is_anchored_to_the_current_directory() {
        let h = RlhostHome::resolve(Some("rel/home".into()), None).unwrap();
        assert!(h.root().is_absolute());
        assert!(h.root().ends_with("rel/home"));
    }

    #[test]
    fn empty_or_missing_home_is_an_error() {
        assert!(matches!(
            RlhostHome::resolve(Some("".into()), Some("/h".into())),
            Err(HomeError::EmptyHome)
        ));
        assert!(matches!(
            RlhostHome::resolve(None, None),
            Err(HomeError::NoHome)
        ));
    }

    #[test]
    fn missing_settings_file_means_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let home = RlhostHome::at(dir.path());
        assert_eq!(home.load_settings().unwrap(), Settings::default());
        let reg = home.registry(None).unwrap();
        assert_eq!(reg.origin, RegistryOrigin::Default);
        assert_eq!(
            reg.url,
            format!("file://{}", dir.path().join("registry").display())
        );
    }

    #[test]
    fn registry_precedence_is_env_then_settings_then_default() {
        let (_d, home) = home_with_settings("[registry]\ndefault = \"http://127.0.0.1:7878\"\n");
        let from_settings = home.registry(None).unwrap();
        assert_eq!(from_settings.url, "http://127.0.0.1:7878");
        assert_eq!(
            from_settings.origin,
            RegistryOrigin::Settings(home.config_path())
        );
        let from_env = home.registry(Some("https://r.example".into())).unwrap();
        assert_eq!(from_env.url, "https://r.example");
        assert_eq!(from_env.origin, RegistryOrigin::Environment);
    }

    #[test]
    fn unknown_settings_key_names_the_file_and_the_key() {
        let (_d, home) = home_with_settings("[registry]\ndefualt = \"http://x\"\n");
        let err = home.load_settings().unwrap_err().to_string();
        assert!(err.contains("config.toml"), "{err}");
        assert!(err.contains("defualt"), "{err}");
    }

    #[test]
    fn the_rl_presets_are_written_once_and_match_the_repository() {
        let tmp = tempfile::tempdir().unwrap();
        let home = RlhostHome::at(tmp.path());
        let dir = home.rl_presets_dir().unwrap();
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        for (rel, text) in RL_PRESETS {
            assert_eq!(std::fs::read_to_string(dir.join(rel)).unwrap(), *text);
            assert_eq!(std::fs::read_to_string(repo.join(rel)).unwrap(), *text);
        }
        // Every preset folder of the repository is built in.
        for e in std::fs::read_dir(&repo).unwrap().flatten() {
            if e.path().join("rl").is_dir() {
                for f in ["train", "orch", "infer"] {
                    let rel = format!("{}/rl/{f}.toml", e.file_name().to_string_lossy());
                    assert!(
                        RL_PRESETS.iter().any(|(r, _)| *r == rel),
                        "{rel} is not built in"
                    );
                }
            }
        }
        assert_eq!(home.rl_presets_dir().unwrap(), dir);
    }

    #[test]
    fn registry_url_without_a_known_scheme_is_refused() {
        let (_d, home) = home_with_settings("[registry]\ndefault = \"ftp://x\"\n");
        let err = home.registry(None).unwrap_err().to_string();
        assert!(err.contains("ftp://x"), "{err}");
        assert!(home.registry(Some("relative/dir".into())).is_err());
        assert!(home.registry(Some("file://relative".into())).is_err());
    }
}
