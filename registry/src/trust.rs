//! What a client trusts: publisher keys pinned per registry and owner (trust on first use), and
//! the check of downloaded bytes against their index entry (checksum, then signature).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::RegistryError;
use crate::index::{IndexEntry, RegistryConfig};
use crate::package::checksum;

/// Keys a client has pinned per registry and owner (trust on first use, like SSH).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrustStore {
    /// registry URL → owner → keys.
    pub registries: BTreeMap<String, BTreeMap<String, Vec<String>>>,
}

impl TrustStore {
    /// Reads the store (empty when the file does not exist).
    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        match std::fs::read_to_string(path) {
            Ok(t) => serde_json::from_str(&t).map_err(|e| RegistryError::Corrupt {
                root: path.display().to_string(),
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(RegistryError::Io {
                root: "trust store".into(),
                path: path.display().to_string(),
                source: e,
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
                let offered = config.keys.get(owner).cloned().unwrap_or_default();
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
            if !trusted_keys.iter().any(|k| k == key) {
                return Err(RegistryError::Untrusted {
                    package,
                    reason: format!(
                        "signed by key {key}, which is not trusted for this owner (trusted: {})",
                        if trusted_keys.is_empty() {
                            "none".to_owned()
                        } else {
                            trusted_keys.join(", ")
                        }
                    ),
                });
            }
            crate::sign::verify(key, sig, &entry.name, &entry.vers, &entry.cksum).map_err(|e| {
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
