//! Plugin ABI versions: which ones this host loads, and reading the one a component targets
//! **before** compiling it, so an incompatible plugin is refused with a clear message instead of
//! a link error.
//!
//! The version travels inside the component itself: the exported interface names carry it
//! (`rlhost:env/env@0.1.0`), so it cannot disagree with what the code was built against.

use semver::Version;

/// The WIT package versions this host has adapters for (one module per version in
/// `component/`). Each accepts its semver-compatible range: for 0.x that is the same minor.
pub const SUPPORTED: &[Version] = &[Version::new(0, 1, 0)];

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

/// The supported version compatible with `found`, if any.
pub fn supported_for(found: &Version) -> Option<&'static Version> {
    SUPPORTED.iter().find(|s| compatible(s, found))
}

/// Human form of what this host supports, e.g. `rlhost:env@0.1.0..<0.2.0`.
pub fn supported_description() -> String {
    SUPPORTED
        .iter()
        .map(|v| {
            let next = if v.major == 0 {
                Version::new(0, v.minor + 1, 0)
            } else {
                Version::new(v.major + 1, 0, 0)
            };
            format!("rlhost:env@{v}..<{next}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The ABI strings for reports (`host doctor`).
pub fn supported_names() -> Vec<String> {
    SUPPORTED
        .iter()
        .map(|v| format!("rlhost:env@{v}"))
        .collect()
}

/// Reads the world and ABI version a component exports, without compiling it.
pub fn read_component_abi(bytes: &[u8]) -> Result<(ExportedWorld, Version), String> {
    use wasmparser::{Encoding, Parser, Payload};

    let mut depth = 0usize;
    let mut found = None;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("not a valid WebAssembly binary: {e}"))?;
        match payload {
            Payload::Version { encoding, .. } if depth == 0 => {
                if encoding != Encoding::Component {
                    return Err(
                        "is a core WebAssembly module, not a component: build it with \
                                `cargo build --target wasm32-wasip2` and rlhost-sdk"
                            .into(),
                    );
                }
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    let export = export.map_err(|e| format!("bad export section: {e}"))?;
                    if let Some(hit) = parse_export_name(export.name.name)? {
                        if found.is_some_and(|f: (ExportedWorld, Version)| f.0 != hit.0) {
                            return Err("exports both an environment and a reward function".into());
                        }
                        found = Some(hit);
                    }
                }
            }
            _ => {}
        }
    }
    found.ok_or_else(|| {
        "exports no rlhost:env interface (was it built with rlhost-sdk's export macro?)".into()
    })
}

/// `rlhost:env/env@0.1.0` → (environment, 0.1.0); `None` for a name outside `rlhost:env`.
pub(crate) fn parse_export_name(name: &str) -> Result<Option<(ExportedWorld, Version)>, String> {
    let Some(rest) = name.strip_prefix("rlhost:env/") else {
        return Ok(None);
    };
    let (iface, version) = rest
        .split_once('@')
        .ok_or_else(|| format!("export {name:?} has no version"))?;
    let world = match iface {
        "env" => ExportedWorld::Environment,
        "reward-fn" => ExportedWorld::Reward,
        _ => return Ok(None),
    };
    let version =
        Version::parse(version).map_err(|e| format!("export {name:?} has a bad version: {e}"))?;
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
        assert!(supported_for(&v("0.1.3")).is_some());
        assert!(supported_for(&v("0.2.0")).is_none());
    }

    #[test]
    fn describes_the_supported_range() {
        assert_eq!(supported_description(), "rlhost:env@0.1.0..<0.2.0");
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
        assert!(err.contains("core WebAssembly module"), "{err}");
    }
}
