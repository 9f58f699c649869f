//! Publish tokens of a registry server: one or more per owner, stored only as sha256 hashes in
//! `<root>/tokens.json`, shown once when issued.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::RegistryError;
use crate::package::checksum;

/// Hashed tokens by owner.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenStore {
    /// owner → sha256 hashes of its tokens.
    pub owners: BTreeMap<String, Vec<String>>,
}

/// The largest `tokens.json` read: a token's hash and its JSON take under 80 bytes, so this
/// holds some 200,000 tokens, far more than any registry issues.
const MAX_TOKENS_FILE: rlhost_fs::FileLimit = rlhost_fs::FileLimit::new("publish tokens", 16 << 20);

fn path(root: &Path) -> PathBuf {
    root.join("tokens.json")
}

impl TokenStore {
    /// Reads `<root>/tokens.json` (empty if absent).
    pub fn load(root: &Path) -> Result<Self, RegistryError> {
        match rlhost_fs::read_optional_text(&path(root), MAX_TOKENS_FILE) {
            Ok(Some(t)) => serde_json::from_str(&t).map_err(|e| RegistryError::Corrupt {
                root: root.display().to_string(),
                message: format!("tokens.json: {e}"),
            }),
            Ok(None) => Ok(Self::default()),
            Err(source) => Err(RegistryError::Read {
                root: root.display().to_string(),
                source,
            }),
        }
    }

    /// Issues a new token for `owner` (a publisher name, `[a-z0-9-]`: the owner of the packages
    /// it publishes, shown on pages and sent in headers), stores its hash, returns the token
    /// (shown once).
    pub fn issue(root: &Path, owner: &str) -> Result<String, RegistryError> {
        crate::name::check_owner(owner)?;
        let mut store = Self::load(root)?;
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| RegistryError::Io {
            root: root.display().to_string(),
            path: "(system randomness)".into(),
            source: std::io::Error::other(e),
        })?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        store
            .owners
            .entry(owner.to_owned())
            .or_default()
            .push(checksum(token.as_bytes()));
        let text = serde_json::to_string_pretty(&store).expect("serialisable");
        rlhost_fs::write_atomically(&path(root), text.as_bytes()).map_err(|e| {
            RegistryError::Io {
                root: root.display().to_string(),
                path: "tokens.json".into(),
                source: e,
            }
        })?;
        Ok(token)
    }

    /// The owner a token belongs to.
    pub fn owner_of(&self, token: &str) -> Option<&str> {
        let hash = checksum(token.as_bytes());
        self.owners
            .iter()
            .find(|(_, hashes)| hashes.contains(&hash))
            .map(|(owner, _)| owner.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any string became a token's owner, then an evaluation's publisher: shown on pages and
    /// sent in a header.
    #[test]
    fn tokens_are_issued_for_publisher_names_only() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["acme\u{202E}", "acme\r\nx-evil: 1", "Acme", ""] {
            let e = TokenStore::issue(dir.path(), bad).unwrap_err().to_string();
            assert!(e.contains("not a publisher name"), "{e}");
        }
        assert!(!dir.path().join("tokens.json").exists());
        let token = TokenStore::issue(dir.path(), "acme").unwrap();
        let store = TokenStore::load(dir.path()).unwrap();
        assert_eq!(store.owner_of(&token), Some("acme"));
    }

    /// The registry's own files are read bounded: a `tokens.json` that is a FIFO, a folder or a
    /// sparse file over its limit is refused at once, by name, where a plain read would hang
    /// or fill the memory; the trust store likewise.
    #[test]
    fn token_and_trust_stores_are_read_bounded() {
        fn chain(e: &dyn std::error::Error) -> String {
            let mut out = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                out.push_str(&format!(": {s}"));
                source = s.source();
            }
            out
        }
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.json");
        let trust = dir.path().join("trust.json");
        let fifo = std::process::Command::new("mkfifo")
            .arg(&tokens)
            .arg(&trust)
            .status()
            .unwrap();
        assert!(fifo.success());
        let e = chain(&TokenStore::load(dir.path()).unwrap_err());
        assert!(e.contains("tokens.json") && e.contains("FIFO"), "{e}");
        let e = chain(&crate::TrustStore::load(&trust).unwrap_err());
        assert!(e.contains("trust.json") && e.contains("FIFO"), "{e}");
        for path in [&tokens, &trust] {
            std::fs::remove_file(path).unwrap();
            let f = std::fs::File::create(path).unwrap();
            f.set_len((16 << 20) + 1).unwrap();
        }
        let e = chain(&TokenStore::load(dir.path()).unwrap_err());
        assert!(
            e.contains("publish tokens") && e.contains("tokens.json"),
            "{e}"
        );
        let e = chain(&crate::TrustStore::load(&trust).unwrap_err());
        assert!(e.contains("trust store") && e.contains("trust.json"), "{e}");
    }
}
