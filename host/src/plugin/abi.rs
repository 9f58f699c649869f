//! Plugin ABI versions: which ones this host loads ([`AbiVersion`], the one dispatch point from a
//! version to its adapter), and reading the one a component targets **before** compiling it, so
//! an incompatible plugin is refused with a clear message instead of a link error.
//!
//! The version travels inside the component itself: the exported interface names carry it
//! (`rlhost:env/env@0.1.0`), so it cannot disagree with what the code was built against.

use semver::Version;

use super::PluginErrorKind;

/// An ABI version this host has an adapter for: **the** place where a version a plugin reports
/// maps to the code that speaks it. Components dispatch on it to the module of that version
/// (`component::v0_1_0`: its bindings, host imports and conversions); Extism and native plugins
/// speak its JSON form. A new ABI is a new variant and a new module beside the old ones, which
/// are never edited to fit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbiVersion {
    /// `rlhost:env@0.1.x` (`sdk/wit/v0.1.0`).
    V0_1_0,
    /// Test builds only: `rlhost:env@0.2.0-fixture`, a fake next minor version with an adapter
    /// of its own (`component::v0_2_0_fixture`), so that a test proves components of two
    /// versions load through this dispatch (`plugins/fixtures/next-abi`).
    #[cfg(test)]
    V0_2_0Fixture,
}

impl AbiVersion {
    /// Every version this host loads, oldest first.
    pub const ALL: &'static [AbiVersion] = &[
        AbiVersion::V0_1_0,
        #[cfg(test)]
        AbiVersion::V0_2_0Fixture,
    ];

    /// The WIT package version the adapter was written for.
    pub fn version(self) -> Version {
        match self {
            AbiVersion::V0_1_0 => Version::new(0, 1, 0),
            #[cfg(test)]
            AbiVersion::V0_2_0Fixture => Version::parse("0.2.0-fixture").expect("a semver version"),
        }
    }

    /// Whether this adapter speaks `found`: its semver-compatible range (for 0.x, the same
    /// minor), or, for a pre-release, exactly that version (a pre-release promises no
    /// compatibility, and wasmtime links pre-release interface names only by their exact name).
    pub fn speaks(self, found: &Version) -> bool {
        let own = self.version();
        if own.pre.is_empty() {
            compatible(&own, found)
        } else {
            own == *found
        }
    }

    /// Its range for messages: `rlhost:env@0.1.0..<0.2.0` (a pre-release: just itself).
    fn describe(self) -> String {
        let v = self.version();
        if !v.pre.is_empty() {
            return format!("rlhost:env@{v}");
        }
        let next = if v.major == 0 {
            Version::new(0, v.minor + 1, 0)
        } else {
            Version::new(v.major + 1, 0, 0)
        };
        format!("rlhost:env@{v}..<{next}")
    }
}

/// What a plugin exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportedWorld {
    /// `rlhost:env/env@…`: an environment.
    Environment,
    /// `rlhost:env/reward-fn@…`: a reward function.
    Reward,
}

impl std::fmt::Display for ExportedWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExportedWorld::Environment => "an environment",
            ExportedWorld::Reward => "a reward function",
        })
    }
}

/// `a` and `b` are in the same semver compatibility range (for 0.x: same minor).
pub fn compatible(a: &Version, b: &Version) -> bool {
    if a.major == 0 || b.major == 0 {
        a.major == b.major && a.minor == b.minor
    } else {
        a.major == b.major
    }
}

/// The adapter that speaks `found`, if any.
pub fn supported_for(found: &Version) -> Option<AbiVersion> {
    AbiVersion::ALL.iter().copied().find(|a| a.speaks(found))
}

/// Human form of what this host supports, e.g. `rlhost:env@0.1.0..<0.2.0`.
pub fn supported_description() -> String {
    AbiVersion::ALL
        .iter()
        .map(|a| a.describe())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The ABI strings for reports (`host doctor`).
pub fn supported_names() -> Vec<String> {
    AbiVersion::ALL
        .iter()
        .map(|a| format!("rlhost:env@{}", a.version()))
        .collect()
}

/// Checks the version an artifact reports (`found`, read from the artifact itself, so it cannot
/// disagree with the code) against what this host supports and what `plugin.toml` declares;
/// returns the adapter that speaks it. `artifact_says` completes "plugin.toml says … but", e.g.
/// "the component exports".
pub(crate) fn check_reported(
    found: Version,
    declared: &Version,
    artifact_says: &str,
) -> Result<AbiVersion, PluginErrorKind> {
    let Some(adapter) = supported_for(&found) else {
        return Err(PluginErrorKind::AbiMismatch {
            found,
            supported: supported_description(),
        });
    };
    if !adapter.speaks(declared) {
        return Err(PluginErrorKind::Malformed(format!(
            "plugin.toml says rlhost:env@{declared} but {artifact_says} rlhost:env@{found}"
        )));
    }
    Ok(adapter)
}

/// Why the world and ABI version of an artifact cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum AbiReadError {
    /// The bytes do not parse as WebAssembly.
    #[error("not a valid WebAssembly binary: {0}")]
    NotWasm(#[source] wasmparser::BinaryReaderError),
    /// A core module where a component is needed.
    #[error(
        "is a core WebAssembly module, not a component: build it with `cargo build --target \
         wasm32-wasip2` and rlhost-sdk"
    )]
    CoreModule,
    /// The component's export section does not parse.
    #[error("bad export section: {0}")]
    BadExports(#[source] wasmparser::BinaryReaderError),
    /// The component exports both worlds' interfaces.
    #[error("exports both an environment and a reward function")]
    BothWorlds,
    /// The component exports no `rlhost:env` interface.
    #[error("exports no rlhost:env interface (was it built with rlhost-sdk's export macro?)")]
    NoInterface,
    /// An `rlhost:env` export name without `@version`.
    #[error("export {0:?} has no version")]
    NoVersion(String),
    /// A native library's `rlhost_abi_version` that is not semver.
    #[error("`rlhost_abi_version` is {text:?}: {source}")]
    NativeVersion {
        /// What the library returned.
        text: String,
        /// The parser's error.
        #[source]
        source: semver::Error,
    },
    /// An `rlhost:env` export name whose version is not semver.
    #[error("export {name:?} has a bad version: {source}")]
    BadVersion {
        /// The export name.
        name: String,
        /// The parser's error.
        #[source]
        source: semver::Error,
    },
}

/// Reads the world and ABI version a component exports, without compiling it.
pub fn read_component_abi(bytes: &[u8]) -> Result<(ExportedWorld, Version), AbiReadError> {
    use wasmparser::{Encoding, Parser, Payload};

    let mut depth = 0usize;
    let mut found = None;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(AbiReadError::NotWasm)? {
            Payload::Version { encoding, .. } if depth == 0 => {
                if encoding != Encoding::Component {
                    return Err(AbiReadError::CoreModule);
                }
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    let export = export.map_err(AbiReadError::BadExports)?;
                    if let Some(hit) = parse_export_name(export.name.name)? {
                        if found.is_some_and(|f: (ExportedWorld, Version)| f.0 != hit.0) {
                            return Err(AbiReadError::BothWorlds);
                        }
                        found = Some(hit);
                    }
                }
            }
            _ => {}
        }
    }
    found.ok_or(AbiReadError::NoInterface)
}

/// `rlhost:env/env@0.1.0` → (environment, 0.1.0); `None` for a name outside `rlhost:env`.
pub(crate) fn parse_export_name(
    name: &str,
) -> Result<Option<(ExportedWorld, Version)>, AbiReadError> {
    let Some(rest) = name.strip_prefix("rlhost:env/") else {
        return Ok(None);
    };
    let (iface, version) = rest
        .split_once('@')
        .ok_or_else(|| AbiReadError::NoVersion(name.to_owned()))?;
    let world = match iface {
        "env" => ExportedWorld::Environment,
        "reward-fn" => ExportedWorld::Reward,
        _ => return Ok(None),
    };
    let version = Version::parse(version).map_err(|source| AbiReadError::BadVersion {
        name: name.to_owned(),
        source,
    })?;
    Ok(Some((world, version)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_major_versions_are_compatible_within_a_minor() {
        let v = |s: &str| Version::parse(s).unwrap();
        assert!(compatible(&v("0.1.0"), &v("0.1.7")));
        assert!(!compatible(&v("0.1.0"), &v("0.2.0")));
        assert!(!compatible(&v("0.1.0"), &v("1.1.0")));
        assert!(compatible(&v("1.0.0"), &v("1.4.2")));
        assert!(!compatible(&v("1.0.0"), &v("2.0.0")));
    }

    #[test]
    fn each_version_maps_to_one_adapter_or_none() {
        let v = |s: &str| Version::parse(s).unwrap();
        assert_eq!(supported_for(&v("0.1.0")), Some(AbiVersion::V0_1_0));
        assert_eq!(supported_for(&v("0.1.3")), Some(AbiVersion::V0_1_0));
        assert_eq!(supported_for(&v("0.2.0")), None);
        assert_eq!(supported_for(&v("9.0.0")), None);
        // A pre-release adapter speaks exactly its own version.
        assert_eq!(
            supported_for(&v("0.2.0-fixture")),
            Some(AbiVersion::V0_2_0Fixture)
        );
        assert_eq!(supported_for(&v("0.2.0-other")), None);
        assert_eq!(supported_for(&v("0.2.1")), None);
    }

    #[test]
    fn describes_the_supported_range() {
        // Test builds add the fixture version; a release build says `rlhost:env@0.1.0..<0.2.0`.
        assert_eq!(
            supported_description(),
            "rlhost:env@0.1.0..<0.2.0, rlhost:env@0.2.0-fixture"
        );
        assert_eq!(
            supported_names(),
            ["rlhost:env@0.1.0", "rlhost:env@0.2.0-fixture"]
        );
    }

    #[test]
    fn reported_versions_are_checked_against_the_host_and_the_manifest() {
        let v = |s: &str| Version::parse(s).unwrap();
        let ok = check_reported(v("0.1.1"), &v("0.1.0"), "the component exports").unwrap();
        assert_eq!(ok, AbiVersion::V0_1_0);
        let err = check_reported(v("0.3.0"), &v("0.1.0"), "the component exports").unwrap_err();
        assert_eq!(
            err.to_string(),
            "targets rlhost:env@0.3.0, this host supports rlhost:env@0.1.0..<0.2.0, \
             rlhost:env@0.2.0-fixture"
        );
        let err =
            check_reported(v("0.2.0-fixture"), &v("0.1.0"), "the library reports").unwrap_err();
        assert_eq!(
            err.to_string(),
            "plugin.toml says rlhost:env@0.1.0 but the library reports rlhost:env@0.2.0-fixture"
        );
    }

    #[test]
    fn export_names_carry_world_and_version() {
        assert_eq!(
            parse_export_name("rlhost:env/env@0.1.0").unwrap(),
            Some((ExportedWorld::Environment, Version::new(0, 1, 0)))
        );
        assert_eq!(
            parse_export_name("rlhost:env/reward-fn@0.3.1").unwrap(),
            Some((ExportedWorld::Reward, Version::new(0, 3, 1)))
        );
        assert_eq!(parse_export_name("wasi:cli/run@0.2.0").unwrap(), None);
        assert!(parse_export_name("rlhost:env/env").is_err());
        assert!(parse_export_name("rlhost:env/env@x").is_err());
    }

    #[test]
    fn garbage_and_core_modules_are_refused() {
        assert!(read_component_abi(b"not wasm").is_err());
        // The smallest core module: magic + version 1.
        let core = b"\0asm\x01\0\0\0";
        let err = read_component_abi(core).unwrap_err();
        assert!(matches!(err, AbiReadError::CoreModule), "{err}");
        assert!(err.to_string().contains("core WebAssembly module"), "{err}");
    }
}
