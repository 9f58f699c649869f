//! What a client trusts: publisher keys pinned per registry and owner (trust on first use), and
//! the check of downloaded bytes against their index entry (checksum, then signature).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::RegistryError;
use crate::index::{IndexEntry, RegistryConfig};
use crate::package::checksum;

/// The largest trust store read: a pinned key takes about 100 bytes of JSON, so this holds some
/// 160,000 of them.
const MAX_TRUST_STORE: rlhost_fs::FileLimit = rlhost_fs::FileLimit::new("trust store", 16 << 20);

/// Keys a client has pinned per registry and owner (trust on first use, like SSH).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrustStore {
    /// registry URL → owner → keys.
    pub registries: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl TrustStore {
    /// Reads the store (empty when the file does not exist).
    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        match rlhost_fs::read_optional_text(path, MAX_TRUST_STORE) {
            Ok(Some(t)) => serde_json::from_str(&t).map_err(|e| RegistryError::Corrupt {
                root: path.display().to_string(),
                message: e.to_string(),
            }),
            Ok(None) => Ok(Self::default()),
            Err(source) => Err(RegistryError::Read {
                root: "trust store".into(),
                source,
            }),
        }
    }

    /// Writes the store atomically.
    pub fn save(&self, path: &Path) -> Result<(), RegistryError> {
        let text = serde_json::to_string_pretty(self).expect("serialisable");
        rlhost_fs::write_atomically(path, text.as_bytes()).map_err(|e| RegistryError::Io {
            root: "trust store".into(),
            path: path.display().to_string(),
            source: e,
        })
    }

    /// The keys to trust for `owner` at `registry`: the pinned ones, or — the first time —
    /// the ones the registry lists, which are then pinned. A registry that later lists other
    /// keys for a pinned owner is not believed.
    pub fn keys_for(
        &mut self,
        registry: &str,
        config: &RegistryConfig,
        owner: &str,
    ) -> (Vec<String>, bool) {
        let pinned = self.registries.entry(registry.to_owned()).or_default();
        match pinned.get(owner) {
            Some(keys) => (keys.clone(), false),
            None => {
                // Pinned canonical (see `crate::sign`); a key that is not one is not pinned.
                let offered: Vec<String> = config
                    .keys
                    .get(owner)
                    .into_iter()
                    .flatten()
                    .filter_map(|k| crate::sign::canonical_public_key(k).ok())
                    .collect();
                if !offered.is_empty() {
                    pinned.insert(owner.to_owned(), offered.clone());
                }
                (offered, true)
            }
        }
    }
}

/// Checks downloaded bytes against their index entry: the checksum, then the signature by a
/// key trusted for the owner. `allow_unsigned` admits entries with no signature at all (never a
/// bad or untrusted one).
pub fn verify_artifact(
    entry: &IndexEntry,
    bytes: &[u8],
    trusted_keys: &[String],
    allow_unsigned: bool,
) -> Result<(), RegistryError> {
    let package = format!("{}@{}", entry.name, entry.vers);
    let actual = checksum(bytes);
    if actual != entry.cksum {
        return Err(RegistryError::Checksum {
            package,
            expected: entry.cksum.clone(),
            actual,
        });
    }
    match (&entry.sig, &entry.key) {
        (Some(sig), Some(key)) => {
            // The index comes from the registry: its key is shown only once known to be hex
            // (a hostile one could carry terminal escapes), and compared however it is spelt.
            let key =
                crate::sign::canonical_public_key(key).map_err(|e| RegistryError::Untrusted {
                    package: package.clone(),
                    reason: format!("the index's signing key is malformed: {e}"),
                })?;
            if !trusted_keys.iter().any(|k| crate::sign::same_key(k, &key)) {
                let trusted: Vec<String> = trusted_keys
                    .iter()
                    .map(|k| {
                        crate::sign::canonical_public_key(k)
                            .unwrap_or_else(|_| "(a malformed key)".into())
                    })
                    .collect();
                return Err(RegistryError::Untrusted {
                    package,
                    reason: format!(
                        "signed by key {key}, which is not trusted for this owner (trusted: {})",
                        if trusted.is_empty() {
                            "none".to_owned()
                        } else {
                            trusted.join(", ")
                        }
                    ),
                });
            }
            crate::sign::verify(&key, sig, &entry.name, &entry.vers, &entry.cksum).map_err(|e| {
                RegistryError::Untrusted {
                    package,
                    reason: e.to_string(),
                }
            })
        }
        _ if allow_unsigned => Ok(()),
        _ => Err(RegistryError::Untrusted {
            package,
            reason: "is not signed (pass --allow-unsigned to install it anyway)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{PluginKind, Runtime};

    fn signed_entry(key: &crate::PublisherKey, bytes: &[u8]) -> IndexEntry {
        let vers = semver::Version::new(0, 1, 0);
        let cksum = checksum(bytes);
        IndexEntry {
            sig: Some(key.sign("acme/demo", &vers, &cksum)),
            key: Some(key.public_hex()),
            name: "acme/demo".into(),
            vers,
            kind: PluginKind::Environment,
            abi: "rlhost:env@0.1.0".into(),
            runtime: Runtime::Wasm,
            deps: Default::default(),
            cksum,
            yanked: false,
            min_host: None,
            description: String::new(),
            capabilities: Vec::new(),
        }
    }

    /// A key pinned in another spelling (upper case, a trailing newline from a copy) is the same
    /// key; a hostile index's key with a non-ASCII character is an error, not a panic, and is
    /// never echoed.
    #[test]
    fn keys_compare_canonically_and_malformed_ones_are_refused() {
        let key = crate::PublisherKey::generate().unwrap();
        let bytes = b"package bytes";
        let entry = signed_entry(&key, bytes);
        let pinned = format!("{}\n", key.public_hex().to_uppercase());
        verify_artifact(&entry, bytes, &[pinned], false).unwrap();
        let mut hostile = entry.clone();
        hostile.key = Some(format!("\u{1b}[2J{}", &key.public_hex()[5..]));
        let e = verify_artifact(&hostile, bytes, &[key.public_hex()], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("malformed") && e.contains("U+001B"), "{e}");
        assert!(!e.contains('\u{1b}'), "{e:?}");
        let other = crate::PublisherKey::generate().unwrap();
        let e = verify_artifact(&entry, bytes, &[other.public_hex()], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not trusted for this owner"), "{e}");
    }

    /// Keys offered by a registry on first use are pinned canonical; malformed ones are not.
    #[test]
    fn first_use_pins_canonical_keys_only() {
        let key = crate::PublisherKey::generate().unwrap();
        let mut config = RegistryConfig::standard();
        config.keys.insert(
            "acme".into(),
            vec![
                format!(" {} ", key.public_hex().to_uppercase()),
                "zz\u{202E}".into(),
            ],
        );
        let mut store = TrustStore::default();
        let (keys, first) = store.keys_for("http://r", &config, "acme");
        assert!(first);
        assert_eq!(keys, vec![key.public_hex()]);
        assert_eq!(store.registries["http://r"]["acme"], vec![key.public_hex()]);
    }
}
