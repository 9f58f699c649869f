//! `host env init NAME`: a new environment plugin project from the SDK's template
//! (`sdk/template/`, embedded in the binary), ready for `cargo build --release`.

use std::path::{Path, PathBuf};

/// Where the new project gets `rlhost-sdk` from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SdkSource {
    /// A local checkout of the SDK (`sdk/` of the rlhost repository).
    Path(PathBuf),
    /// A registry version requirement (once the SDK is published).
    Version(String),
}

impl SdkSource {
    /// The SDK shipped with this host (`sdk/` of `$RLHOST_SOURCE` or of the install prefix's
    /// share folder), else the crates.io release matching this host.
    pub fn default_for_this_host() -> Self {
        match crate::home::shipped("sdk/Cargo.toml").and_then(|p| p.parent().map(Path::to_path_buf))
        {
            Some(dir) => Self::Path(dir.canonicalize().unwrap_or(dir)),
            None => Self::Version(rlhost_sdk::ABI_VERSION.to_owned()),
        }
    }

    fn dependency_line(&self) -> String {
        match self {
            Self::Path(p) => format!("rlhost-sdk = {{ path = {:?} }}", p.display().to_string()),
            Self::Version(v) => format!("rlhost-sdk = \"{v}\""),
        }
    }
}

/// Errors creating a project.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The name cannot be a plugin name.
    #[error("invalid plugin name {0:?}: use 1-64 of [a-z0-9-], starting with a letter")]
    BadName(String),
    /// The owner cannot be an owner name.
    #[error("invalid owner {0:?}: use 1-64 of [a-z0-9-], starting with a letter")]
    BadOwner(String),
    /// The target folder exists.
    #[error("{0} already exists: refusing to overwrite it")]
    Exists(PathBuf),
    /// Writing failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// What was being written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

const FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../sdk/template/Cargo.toml.tmpl"),
    ),
    (
        "plugin.toml",
        include_str!("../../../sdk/template/plugin.toml.tmpl"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../sdk/template/lib.rs.tmpl"),
    ),
    (
        ".cargo/config.toml",
        include_str!("../../../sdk/template/config.toml.tmpl"),
    ),
    (
        ".gitignore",
        include_str!("../../../sdk/template/gitignore.tmpl"),
    ),
    (
        "README.md",
        include_str!("../../../sdk/template/README.md.tmpl"),
    ),
    (
        "data/train.jsonl",
        include_str!("../../../sdk/template/data/train.jsonl"),
    ),
    (
        "data/test.jsonl",
        include_str!("../../../sdk/template/data/test.jsonl"),
    ),
];

/// The files of a Python plugin project (`host env init --python`); `{{module}}.py` is the module.
const PYTHON_FILES: &[(&str, &str)] = &[
    (
        "plugin.toml",
        include_str!("../../../sdk/python/template/plugin.toml.tmpl"),
    ),
    (
        "{{module}}.py",
        include_str!("../../../sdk/python/template/module.py.tmpl"),
    ),
    (
        ".gitignore",
        include_str!("../../../sdk/python/template/gitignore.tmpl"),
    ),
    (
        "README.md",
        include_str!("../../../sdk/python/template/README.md.tmpl"),
    ),
    (
        "data/train.jsonl",
        include_str!("../../../sdk/template/data/train.jsonl"),
    ),
    (
        "data/test.jsonl",
        include_str!("../../../sdk/template/data/test.jsonl"),
    ),
];

/// The language of a new plugin project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// A Rust crate against `rlhost-sdk`, built with cargo.
    Rust,
    /// A Python module against `rlhost_env`, built with `host env build`.
    Python,
}

fn is_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Creates the project `name` in the new folder `dir`; returns the files written. The folder
/// appears complete or not at all (written beside it, then renamed).
pub fn init(
    dir: &Path,
    name: &str,
    owner: &str,
    sdk: &SdkSource,
    language: Language,
) -> Result<Vec<PathBuf>, TemplateError> {
    if !is_name(name) {
        return Err(TemplateError::BadName(name.to_owned()));
    }
    if !is_name(owner) {
        return Err(TemplateError::BadOwner(owner.to_owned()));
    }
    if dir.exists() {
        return Err(TemplateError::Exists(dir.to_owned()));
    }
    let file_name = dir
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| name.to_owned());
    let tmp = dir.with_file_name(format!(".{file_name}.tmp.{}", std::process::id()));
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| TemplateError::Io { path, source }
    };
    let substitutions = [
        ("{{name}}", name.to_owned()),
        ("{{crate_name}}", name.replace('-', "_")),
        ("{{module}}", name.replace('-', "_")),
        ("{{owner}}", owner.to_owned()),
        ("{{abi}}", rlhost_sdk::ABI_VERSION.to_owned()),
        ("{{sdk_dependency}}", sdk.dependency_line()),
    ];
    let result = (|| {
        let mut written = Vec::new();
        let files = match language {
            Language::Rust => FILES,
            Language::Python => PYTHON_FILES,
        };
        for (rel, text) in files {
            let mut rel = rel.to_string();
            for (key, value) in &substitutions {
                rel = rel.replace(key, value);
            }
            let path = tmp.join(&rel);
            std::fs::create_dir_all(path.parent().expect("files are inside the folder"))
                .map_err(io(&path))?;
            let mut text = text.to_string();
            for (key, value) in &substitutions {
                text = text.replace(key, value);
            }
            std::fs::write(&path, text).map_err(io(&path))?;
            written.push(dir.join(&rel));
        }
        std::fs::rename(&tmp, dir).map_err(io(dir))?;
        Ok(written)
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_complete_project_with_substitutions() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("my-env");
        let files = init(
            &dir,
            "my-env",
            "me",
            &SdkSource::Version("0.1.0".into()),
            Language::Rust,
        )
        .unwrap();
        assert_eq!(files.len(), FILES.len());
        let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("name = \"my_env\""), "{cargo}");
        assert!(cargo.contains("rlhost-sdk = \"0.1.0\""), "{cargo}");
        let manifest =
            rlhost_registry::Manifest::load(&dir.join("plugin.toml")).expect("valid manifest");
        assert_eq!(manifest.full_name(), "me/my-env");
        assert_eq!(
            manifest.plugin.abi,
            format!("rlhost:env@{}", rlhost_sdk::ABI_VERSION)
        );
        for (_, text) in FILES {
            assert!(!text.is_empty());
        }
        let all: String = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect();
        assert!(!all.contains("{{"), "unsubstituted placeholder left");
    }

    #[test]
    fn writes_a_python_project() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("my-env");
        let sdk = SdkSource::Version("0.1.0".into());
        let files = init(&dir, "my-env", "me", &sdk, Language::Python).unwrap();
        assert!(files.contains(&dir.join("my_env.py")), "{files:?}");
        let manifest =
            rlhost_registry::Manifest::load(&dir.join("plugin.toml")).expect("valid manifest");
        assert_eq!(manifest.python_module().as_deref(), Some("my_env"));
        let module = std::fs::read_to_string(dir.join("my_env.py")).unwrap();
        assert!(module.contains("name=\"my-env\""), "{module}");
        assert!(!module.contains("{{"), "unsubstituted placeholder left");
    }

    #[test]
    fn refuses_bad_names_and_existing_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let sdk = SdkSource::Version("0.1.0".into());
        assert!(matches!(
            init(&tmp.path().join("x"), "My Env", "me", &sdk, Language::Rust),
            Err(TemplateError::BadName(_))
        ));
        assert!(matches!(
            init(&tmp.path().join("x"), "ok", "-me", &sdk, Language::Python),
            Err(TemplateError::BadOwner(_))
        ));
        std::fs::write(tmp.path().join("taken"), "keep me").unwrap();
        assert!(matches!(
            init(
                &tmp.path().join("taken"),
                "taken",
                "me",
                &sdk,
                Language::Python
            ),
            Err(TemplateError::Exists(_))
        ));
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("taken")).unwrap(),
            "keep me"
        );
    }
}
