//! `plugin.toml`: what a plugin package says about itself.
//!
//! ```toml
//! [plugin]
//! owner = "will"
//! name = "math-python"
//! version = "0.1.0"
//! kind = "environment"          # or "reward"
//! abi = "rlhost:env@0.1.0"      # the WIT package the plugin was built against
//! runtime = "wasm"              # or "extism" (a core module speaking sdk/extism.md's JSON ABI),
//!                               # or "native" (a C-ABI shared library; never sandboxed)
//! description = "MATH problems with a Python tool"
//! license = "Apache-2.0"
//! tags = ["math", "tools"]
//! capabilities = ["sandbox.python"]
//! # artifact = "plugin.wasm"    # default: plugin.wasm (wasm) or plugin.so (native)
//! # data = "data"               # default: data (the plugin's read-only data folder)
//!
//! [dependencies]                # reward plugins it uses, with semver requirements
//! "will/math-verify" = "^0.1"
//! ```
//!
//! Parsing validates everything it can without the artifact: names, versions, ABI string,
//! capability names, and that paths stay inside the package.

use crate::name::is_slug;
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors reading or validating a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The manifest file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key, or a wrong type.
    #[error("invalid manifest {origin}: {message}")]
    Syntax {
        /// File path or other origin.
        origin: String,
        /// Parser message with line and column.
        message: String,
    },
    /// A field has an invalid value.
    #[error("invalid manifest {origin}: `{field}` {problem}")]
    Field {
        /// File path or other origin.
        origin: String,
        /// The field.
        field: String,
        /// What is wrong and what was expected.
        problem: String,
    },
}

/// The parsed `plugin.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The `[plugin]` table.
    pub plugin: PluginSection,
    /// Reward plugins used: `owner/name` → semver requirement.
    #[serde(default)]
    pub dependencies: BTreeMap<String, semver::VersionReq>,
    /// Dataset files shipped in the data folder, with their provenance.
    #[serde(default)]
    pub datasets: Vec<DatasetSource>,
    /// The environment arguments the plugin accepts (`-a '{"max_turns": 5}'`), documented for
    /// `host env info` and the registry's pages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<EnvArg>,
    /// Present when the plugin is written in Python: `host env build` makes the artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonSource>,
}

/// The `[python]` table: a plugin written in Python with the `rlhost_env` SDK, compiled into a
/// component (CPython for WASI and the plugin's modules, pre-imported) by `host env build`.
///
/// ```toml
/// [python]
/// module = "reverse_text"            # defines load_environment() (or load_reward())
/// dependencies = ["regex==2024.11.6"] # pure-Python wheels, snapshotted at build time
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonSource {
    /// The module (in the plugin folder) defining `load_environment()` or `load_reward()`;
    /// default: the plugin name with `-` written `_`.
    #[serde(default)]
    pub module: Option<String>,
    /// Pure-Python packages the plugin imports: pip requirement specifiers, or paths of wheels
    /// relative to the plugin folder.
    #[serde(default)]
    pub dependencies: Vec<String>,
}

/// One `[[datasets]]` entry: a data file of the package, where it came from, and where users
/// with the Hugging Face hub can get the original.
///
/// ```toml
/// [[datasets]]
/// split = "test"
/// file = "test.jsonl"                  # inside the data folder
/// source = "math500/test.jsonl"        # copied at pack time from the offline data folder
/// rows = 500
/// hf_dataset = "HuggingFaceH4/MATH-500"
/// hf_split = "test"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSource {
    /// The environment split this file serves.
    pub split: String,
    /// The file, relative to the data folder.
    pub file: PathBuf,
    /// Where `make plugins` copies it from, relative to the offline data folder.
    #[serde(default)]
    pub source: Option<String>,
    /// Rows the file must have.
    #[serde(default)]
    pub rows: Option<u64>,
    /// The upstream Hugging Face dataset id.
    #[serde(default)]
    pub hf_dataset: Option<String>,
    /// Its configuration (subset), if any.
    #[serde(default)]
    pub hf_config: Option<String>,
    /// Its split.
    #[serde(default)]
    pub hf_split: Option<String>,
    /// Its revision (commit), if pinned.
    #[serde(default)]
    pub hf_revision: Option<String>,
    /// Anything a user should know (partial copies, answer conventions).
    #[serde(default)]
    pub note: Option<String>,
}

/// One `[[args]]` entry: an environment argument the plugin accepts.
///
/// ```toml
/// [[args]]
/// name = "max_turns"
/// type = "integer"          # string, integer, number or boolean
/// default = "3"             # JSON text, optional
/// description = "Maximum assistant turns"
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvArg {
    /// The key in the JSON object of environment arguments.
    pub name: String,
    /// Its JSON type.
    #[serde(rename = "type")]
    pub kind: ArgType,
    /// The value used when the argument is not given, as JSON text.
    #[serde(default)]
    pub default: Option<String>,
    /// What it does.
    #[serde(default)]
    pub description: String,
}

/// The JSON type of an environment argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArgType {
    /// A JSON string.
    String,
    /// A JSON integer.
    Integer,
    /// Any JSON number.
    Number,
    /// `true` or `false`.
    Boolean,
}

impl ArgType {
    /// Whether `value` has this type.
    pub fn admits(self, value: &serde_json::Value) -> bool {
        match self {
            Self::String => value.is_string(),
            Self::Integer => value.is_i64() || value.is_u64(),
            Self::Number => value.is_number(),
            Self::Boolean => value.is_boolean(),
        }
    }
}

/// What kind of plugin a package holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginKind {
    /// Exports the `environment` world.
    Environment,
    /// Exports the `reward` world.
    Reward,
}

/// How a plugin runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// A WebAssembly component, sandboxed.
    Wasm,
    /// An Extism plugin: a core WebAssembly module built with any Extism PDK, speaking the
    /// JSON ABI of `sdk/extism.md`; sandboxed like a component.
    Extism,
    /// A native shared library with the C ABI: trusted code, not sandboxed.
    Native,
}

/// The `[plugin]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    /// Publisher name (`[a-z0-9-]`, 1–64 chars).
    pub owner: String,
    /// Plugin name (`[a-z0-9-]`, 1–64 chars).
    pub name: String,
    /// Plugin version.
    pub version: semver::Version,
    /// Environment or reward function.
    pub kind: PluginKind,
    /// ABI targeted, e.g. `rlhost:env@0.1.0`.
    pub abi: String,
    /// Wasm or native.
    pub runtime: Runtime,
    /// One line for humans.
    #[serde(default)]
    pub description: String,
    /// SPDX license expression.
    #[serde(default)]
    pub license: Option<String>,
    /// Search tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Capabilities asked for, e.g. `sandbox.python`.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// The language the plugin is written in (`python`, `rust`, …), for people: the registry's
    /// pages label a `python` plugin so even once its `[python]` table is gone (prebuilt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The component or library, relative to the package root.
    #[serde(default)]
    pub artifact: Option<PathBuf>,
    /// The read-only data folder, relative to the package root.
    #[serde(default)]
    pub data: Option<PathBuf>,
}

/// The largest `plugin.toml` read: a manifest is a few KiB of TOML (its README and datasets
/// are files of their own), so 1 MiB leaves room for long argument lists and refuses a file
/// that is not a manifest before it fills memory.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// Capabilities a plugin may ask for.
pub const KNOWN_CAPABILITIES: &[&str] = &["sandbox.python"];

impl Manifest {
    /// Reads (a regular file of at most [`MAX_MANIFEST_BYTES`]) and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ManifestError> {
        let limit = rlhost_fs::FileLimit::new("plugin manifest", MAX_MANIFEST_BYTES);
        let text = rlhost_fs::read_to_string(path, limit).map_err(|e| ManifestError::Read {
            path: path.to_owned(),
            source: e.into(),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates manifest text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ManifestError> {
        let m: Manifest = toml::from_str(text).map_err(|e| ManifestError::Syntax {
            origin: origin.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        m.validate(origin)?;
        Ok(m)
    }

    fn validate(&self, origin: &str) -> Result<(), ManifestError> {
        let bad = |field: &str, problem: String| ManifestError::Field {
            origin: origin.to_owned(),
            field: field.to_owned(),
            problem,
        };
        let p = &self.plugin;
        for (field, value) in [("plugin.owner", &p.owner), ("plugin.name", &p.name)] {
            if !is_slug(value) {
                return Err(bad(
                    field,
                    format!("is {value:?}: expected 1-64 of [a-z0-9-], not starting with '-'"),
                ));
            }
        }
        parse_abi(&p.abi).map_err(|problem| bad("plugin.abi", problem))?;
        self.check_shown_text(origin)?;
        for cap in &p.capabilities {
            if !KNOWN_CAPABILITIES.contains(&cap.as_str()) {
                return Err(bad(
                    "plugin.capabilities",
                    format!("has unknown capability {cap:?} (known: {KNOWN_CAPABILITIES:?})"),
                ));
            }
        }
        for (field, path) in [("plugin.artifact", &p.artifact), ("plugin.data", &p.data)] {
            if let Some(path) = path
                && !is_inside(path)
            {
                return Err(bad(
                    field,
                    format!(
                        "{} leaves the package: use a relative path without `..`",
                        path.display()
                    ),
                ));
            }
        }
        for d in &self.datasets {
            if !is_inside(&d.file) {
                return Err(bad(
                    "datasets.file",
                    format!(
                        "{} leaves the data folder: use a relative path without `..`",
                        d.file.display()
                    ),
                ));
            }
            if d.source
                .as_deref()
                .is_some_and(|s| !is_inside(Path::new(s)))
            {
                return Err(bad(
                    "datasets.source",
                    format!("{:?} must be a relative path without `..`", d.source),
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for arg in &self.args {
            if !is_identifier(&arg.name) || arg.name.len() > 64 {
                return Err(bad(
                    "args.name",
                    format!(
                        "is {:?}: expected an identifier (letters, digits, `_`; at most 64)",
                        arg.name
                    ),
                ));
            }
            if !seen.insert(arg.name.as_str()) {
                return Err(bad(
                    "args.name",
                    format!("{:?} is declared twice", arg.name),
                ));
            }
            if let Some(default) = &arg.default {
                let ok = serde_json::from_str::<serde_json::Value>(default)
                    .is_ok_and(|v| arg.kind.admits(&v));
                if !ok {
                    return Err(bad(
                        "args.default",
                        format!(
                            "of {:?} is {default:?}: expected JSON text of a {}",
                            arg.name,
                            serde_json::to_string(&arg.kind).expect("serialisable")
                        ),
                    ));
                }
            }
        }
        if let Some(lang) = &p.language
            && (!is_slug(lang) || lang.len() > 32)
        {
            return Err(bad(
                "plugin.language",
                format!("is {lang:?}: expected a lower-case name such as \"python\""),
            ));
        }
        if let Some(py) = &self.python {
            if p.language.as_deref().is_some_and(|l| l != "python") {
                return Err(bad(
                    "plugin.language",
                    "must be \"python\" (or absent) for a plugin with a [python] table".into(),
                ));
            }
            if p.runtime != Runtime::Wasm {
                return Err(bad(
                    "plugin.runtime",
                    "must be \"wasm\" for a Python plugin (it is built into a component)".into(),
                ));
            }
            if let Some(module) = &py.module
                && !module.split('.').all(is_identifier)
            {
                return Err(bad(
                    "python.module",
                    format!("is {module:?}: expected a Python module name such as \"my_env\""),
                ));
            }
            if let Some(dep) = py
                .dependencies
                .iter()
                .find(|d| d.trim().is_empty() || d.trim_start().starts_with('-'))
            {
                return Err(bad(
                    "python.dependencies",
                    format!("has {dep:?}: expected a requirement such as \"regex==2024.11.6\""),
                ));
            }
        }
        for dep in self.dependencies.keys() {
            let ok = dep
                .split_once('/')
                .is_some_and(|(o, n)| is_slug(o) && is_slug(n));
            if !ok {
                return Err(bad(
                    "dependencies",
                    format!("has key {dep:?}: expected \"owner/name\""),
                ));
            }
        }
        Ok(())
    }

    /// Text the hub and `host env info` show, checked for what would hide or reorder it (see
    /// [`crate::name::check_name_text`]): names, tags, licenses and dataset ids as names; the
    /// description, notes and argument descriptions as prose (line breaks allowed).
    fn check_shown_text(&self, origin: &str) -> Result<(), ManifestError> {
        use crate::name::{check_name_text, check_prose_text};
        let p = &self.plugin;
        let bad = |e: crate::name::TextError| ManifestError::Field {
            origin: origin.to_owned(),
            field: e.field,
            problem: e.problem,
        };
        check_prose_text("plugin.description", &p.description).map_err(bad)?;
        if let Some(license) = &p.license {
            check_name_text("plugin.license", license).map_err(bad)?;
        }
        for tag in &p.tags {
            check_name_text("plugin.tags", tag).map_err(bad)?;
        }
        for d in &self.datasets {
            check_name_text("datasets.split", &d.split).map_err(bad)?;
            check_name_text("datasets.file", &d.file.to_string_lossy()).map_err(bad)?;
            let ids = [
                ("datasets.source", &d.source),
                ("datasets.hf_dataset", &d.hf_dataset),
                ("datasets.hf_config", &d.hf_config),
                ("datasets.hf_split", &d.hf_split),
                ("datasets.hf_revision", &d.hf_revision),
            ];
            for (field, value) in ids {
                if let Some(value) = value {
                    check_name_text(field, value).map_err(bad)?;
                }
            }
            if let Some(note) = &d.note {
                check_prose_text("datasets.note", note).map_err(bad)?;
            }
        }
        for arg in &self.args {
            if let Some(default) = &arg.default {
                check_prose_text("args.default", default).map_err(bad)?;
            }
            check_prose_text("args.description", &arg.description).map_err(bad)?;
        }
        if let Some(py) = &self.python {
            for dep in &py.dependencies {
                check_name_text("python.dependencies", dep).map_err(bad)?;
            }
        }
        Ok(())
    }

    /// `owner/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.plugin.owner, self.plugin.name)
    }

    /// `owner/name` as a checked name (both parts were validated when the manifest was parsed).
    pub fn package_name(&self) -> crate::PackageName {
        crate::PackageName::new(&self.plugin.owner, &self.plugin.name)
            .expect("a parsed manifest has slug owner and name")
    }

    /// The ABI version targeted (validated at parse time).
    pub fn abi_version(&self) -> semver::Version {
        parse_abi(&self.plugin.abi).expect("validated when parsed")
    }

    /// The artifact's path relative to the package root.
    pub fn artifact(&self) -> PathBuf {
        self.plugin
            .artifact
            .clone()
            .unwrap_or_else(|| match self.plugin.runtime {
                Runtime::Wasm | Runtime::Extism => PathBuf::from("plugin.wasm"),
                Runtime::Native => PathBuf::from("plugin.so"),
            })
    }

    /// The Python module a Python plugin's entry point lives in.
    pub fn python_module(&self) -> Option<String> {
        self.python.as_ref().map(|py| {
            py.module
                .clone()
                .unwrap_or_else(|| self.plugin.name.replace('-', "_"))
        })
    }

    /// The data folder's path relative to the package root.
    pub fn data_dir(&self) -> PathBuf {
        self.plugin
            .data
            .clone()
            .unwrap_or_else(|| PathBuf::from("data"))
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// `rlhost:env@0.1.0` → `0.1.0`.
pub fn parse_abi(abi: &str) -> Result<semver::Version, String> {
    let version = abi
        .strip_prefix("rlhost:env@")
        .ok_or_else(|| format!("is {abi:?}: expected \"rlhost:env@X.Y.Z\""))?;
    semver::Version::parse(version).map_err(|e| format!("is {abi:?}: bad version: {e}"))
}

fn is_inside(path: &Path) -> bool {
    path.components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && path.components().next().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[plugin]
owner = "will"
name = "math-python"
version = "0.1.0"
kind = "environment"
abi = "rlhost:env@0.1.0"
runtime = "wasm"
capabilities = ["sandbox.python"]

[dependencies]
"will/math-verify" = "^0.1"
"#;

    #[test]
    fn parses_a_full_manifest() {
        let m = Manifest::parse(GOOD, "plugin.toml").unwrap();
        assert_eq!(m.full_name(), "will/math-python");
        assert_eq!(m.abi_version(), semver::Version::new(0, 1, 0));
        assert_eq!(m.artifact(), PathBuf::from("plugin.wasm"));
        assert_eq!(m.data_dir(), PathBuf::from("data"));
        assert!(m.dependencies["will/math-verify"].matches(&semver::Version::new(0, 1, 5)));
    }

    fn err_of(replace: (&str, &str)) -> String {
        let text = GOOD.replace(replace.0, replace.1);
        Manifest::parse(&text, "x/plugin.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn every_bad_field_is_named() {
        let e = err_of(("name = \"math-python\"", "name = \"Math Python\""));
        assert!(
            e.contains("plugin.name") && e.contains("x/plugin.toml"),
            "{e}"
        );
        let e = err_of(("rlhost:env@0.1.0", "rlhost:env@one"));
        assert!(e.contains("plugin.abi"), "{e}");
        let e = err_of(("\"sandbox.python\"", "\"network\""));
        assert!(e.contains("unknown capability \"network\""), "{e}");
        let e = err_of((
            "runtime = \"wasm\"",
            "runtime = \"wasm\"\nartifact = \"../evil.so\"",
        ));
        assert!(
            e.contains("plugin.artifact") && e.contains("leaves the package"),
            "{e}"
        );
        let e = err_of(("version = \"0.1.0\"", "version = \"1\""));
        assert!(e.contains("version"), "{e}");
        let e = err_of(("\"will/math-verify\"", "\"math-verify\""));
        assert!(e.contains("owner/name"), "{e}");
        let e = err_of((
            "kind = \"environment\"",
            "kind = \"environment\"\nkinds = 1",
        ));
        assert!(e.contains("unknown field `kinds`"), "{e}");
    }

    #[test]
    fn environment_arguments_are_checked() {
        let with = |args: &str| Manifest::parse(&format!("{GOOD}\n{args}"), "p.toml");
        let m = with(
            "[[args]]\nname = \"max_turns\"\ntype = \"integer\"\ndefault = \"3\"\ndescription = \"turns\"",
        )
        .unwrap();
        assert_eq!(m.args[0].kind, ArgType::Integer);
        let e = with("[[args]]\nname = \"tools\"\ntype = \"string\"\ndefault = \"python\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("args.default") && e.contains("\"tools\""), "{e}");
        let e = with(
            "[[args]]\nname = \"x\"\ntype = \"integer\"\n[[args]]\nname = \"x\"\ntype = \"string\"",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("declared twice"), "{e}");
        let e = with("[[args]]\nname = \"x\"\ntype = \"list\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant `list`"), "{e}");
        let e = with("[[args]]\nname = \"x'$(id)\"\ntype = \"string\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected an identifier"), "{e}");
    }

    /// A description or tag with a bidi override was accepted and shown on the hub reordered.
    #[test]
    fn shown_text_refuses_hidden_and_reordering_characters() {
        let data = "[[datasets]]\nsplit = \"test\"\nfile = \"test.jsonl\"\n";
        let in_plugin =
            |line: &str| GOOD.replacen("capabilities =", &format!("{line}\ncapabilities ="), 1);
        let in_data =
            |text: &str| GOOD.replacen("[dependencies]", &format!("{text}\n[dependencies]"), 1);
        for (field, text) in [
            (
                "plugin.description",
                in_plugin("description = \"safe \u{202E}exe.txt\""),
            ),
            (
                "plugin.tags",
                in_plugin("tags = [\"math\", \"ma\u{200B}th\"]"),
            ),
            ("plugin.license", in_plugin("license = \"MIT\u{2066}\"")),
            (
                "datasets.split",
                in_data(&data.replace("\"test\"\nfile", "\"te\u{200E}st\"\nfile")),
            ),
            (
                "datasets.note",
                in_data(&format!("{data}note = \"a\u{202D}b\"")),
            ),
            (
                "datasets.hf_dataset",
                in_data(&format!("{data}hf_dataset = \"org/\u{00AD}set\"")),
            ),
        ] {
            let e = Manifest::parse(&text, "x/plugin.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("`{field}` has")) && e.contains("x/plugin.toml"),
                "{field}: {e}"
            );
        }
        Manifest::parse(&in_data(data), "p.toml").unwrap();
        let args = "[[args]]\nname = \"x\"\ntype = \"string\"\ndescription = \"a \u{2067}b\"";
        let e = Manifest::parse(&format!("{GOOD}\n{args}"), "p.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`args.description` has") && e.contains("U+2067"),
            "{e}"
        );
        // Prose keeps its line breaks.
        let ok = GOOD.replacen(
            "capabilities =",
            "description = \"\"\"two\nlines\"\"\"\ncapabilities =",
            1,
        );
        Manifest::parse(&ok, "p.toml").unwrap();
    }

    #[test]
    fn absolute_data_path_is_refused() {
        let e = err_of(("runtime = \"wasm\"", "runtime = \"wasm\"\ndata = \"/etc\""));
        assert!(e.contains("plugin.data"), "{e}");
        let e = err_of((
            "runtime = \"wasm\"",
            "runtime = \"wasm\"\nlanguage = \"Py thon\"",
        ));
        assert!(e.contains("plugin.language"), "{e}");
    }
}

#[cfg(test)]
mod reading {
    use super::*;

    /// A `plugin.toml` or a key file that is a device (here a link to /dev/zero, which would
    /// read forever) or a folder is refused at once, by name, before anything is read.
    #[test]
    fn manifests_and_keys_that_are_not_regular_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let zero = dir.path().join("plugin.toml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = Manifest::load(&zero).unwrap_err().to_string();
        assert!(err.contains("plugin.toml"), "{err}");
        let key = dir.path().join("publisher.key");
        std::os::unix::fs::symlink("/dev/zero", &key).unwrap();
        let err = crate::sign::PublisherKey::load(&key)
            .err()
            .expect("a device is no key file")
            .to_string();
        assert!(
            err.contains("publisher.key") && err.contains("not a regular file"),
            "{err}"
        );
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).unwrap();
        assert!(Manifest::load(&folder).is_err());
    }
}
