//! Publisher signatures: ed25519 over the package's identity and checksum, so an index entry
//! cannot be moved to another name or version, nor point at other bytes.

use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

/// Errors with keys and signatures.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// A key file cannot be read or written.
    #[error("{path}: {message}")]
    KeyFile {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// A key or signature is not valid hex of the right length.
    #[error("invalid {what}: {message}")]
    Malformed {
        /// Key or signature.
        what: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The signature does not match.
    #[error("signature of {package} does not verify with key {key}")]
    BadSignature {
        /// `owner/name@version`.
        package: String,
        /// The public key (hex).
        key: String,
    },
}

/// The bytes a publisher signs for a package.
pub fn signed_message(name: &str, version: &semver::Version, cksum: &str) -> Vec<u8> {
    format!("rlhost-package-v1\n{name}\n{version}\n{cksum}\n").into_bytes()
}

/// The bytes a publisher signs for an evaluation summary of `name@version` whose bytes hash to
/// `cksum`: bound to the environment, so a summary cannot be moved to another package.
pub fn eval_message(name: &str, version: &semver::Version, cksum: &str) -> Vec<u8> {
    format!("rlhost-eval-v1\n{name}\n{version}\n{cksum}\n").into_bytes()
}

/// A short, readable name of a public key (hex): the first 16 hex digits of its sha256, in
/// groups of four (`3f2a 9c01 …`). Two keys with the same fingerprint are almost surely one.
pub fn fingerprint(key: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.trim().to_lowercase().as_bytes());
    let h = hex(&digest[..8]);
    (0..4)
        .map(|i| &h[4 * i..4 * i + 4])
        .collect::<Vec<_>>()
        .join(" ")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str, what: &'static str) -> Result<[u8; N], SignError> {
    let bad = |message: String| SignError::Malformed { what, message };
    let s = s.trim();
    if s.len() != 2 * N {
        return Err(bad(format!(
            "expected {} hex digits, got {}",
            2 * N,
            s.len()
        )));
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| bad(format!("{s:?} is not hex")))?;
    }
    Ok(out)
}

/// A publisher's secret key.
pub struct PublisherKey {
    key: SigningKey,
}

impl PublisherKey {
    /// A new random key.
    pub fn generate() -> Result<Self, SignError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| SignError::KeyFile {
            path: "(system randomness)".into(),
            message: e.to_string(),
        })?;
        Ok(Self {
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// Reads a key file (64 hex digits).
    pub fn load(path: &Path) -> Result<Self, SignError> {
        let text = std::fs::read_to_string(path).map_err(|e| SignError::KeyFile {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Self {
            key: SigningKey::from_bytes(&unhex::<32>(&text, "secret key")?),
        })
    }

    /// Writes the key file, readable by its owner only, atomically.
    pub fn save(&self, path: &Path) -> Result<(), SignError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let fail = |e: std::io::Error| SignError::KeyFile {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(fail)?;
        }
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(fail)?;
        writeln!(f, "{}", hex(&self.key.to_bytes())).map_err(fail)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(fail)
    }

    /// The public key, hex.
    pub fn public_hex(&self) -> String {
        hex(self.key.verifying_key().as_bytes())
    }

    /// Signs a package identity; hex signature.
    pub fn sign(&self, name: &str, version: &semver::Version, cksum: &str) -> String {
        hex(&self
            .key
            .sign(&signed_message(name, version, cksum))
            .to_bytes())
    }

    /// Signs an evaluation summary of `name@version` with checksum `cksum`; hex signature.
    pub fn sign_eval(&self, name: &str, version: &semver::Version, cksum: &str) -> String {
        hex(&self
            .key
            .sign(&eval_message(name, version, cksum))
            .to_bytes())
    }
}

/// Checks that `key` is a well-formed ed25519 public key (hex).
pub fn verify_key(key: &str) -> Result<(), SignError> {
    VerifyingKey::from_bytes(&unhex::<32>(key, "public key")?)
        .map(|_| ())
        .map_err(|e| SignError::Malformed {
            what: "public key",
            message: e.to_string(),
        })
}

/// Checks `sig` (hex) by `key` (hex) over the package identity.
pub fn verify(
    key: &str,
    sig: &str,
    name: &str,
    version: &semver::Version,
    cksum: &str,
) -> Result<(), SignError> {
    verify_message(
        key,
        sig,
        &signed_message(name, version, cksum),
        name,
        version,
    )
}

/// Checks `sig` (hex) by `key` (hex) over an evaluation summary's identity.
pub fn verify_eval(
    key: &str,
    sig: &str,
    name: &str,
    version: &semver::Version,
    cksum: &str,
) -> Result<(), SignError> {
    verify_message(key, sig, &eval_message(name, version, cksum), name, version)
}

fn verify_message(
    key: &str,
    sig: &str,
    message: &[u8],
    name: &str,
    version: &semver::Version,
) -> Result<(), SignError> {
    let vk = VerifyingKey::from_bytes(&unhex::<32>(key, "public key")?).map_err(|e| {
        SignError::Malformed {
            what: "public key",
            message: e.to_string(),
        }
    })?;
    let sig = Signature::from_bytes(&unhex::<64>(sig, "signature")?);
    vk.verify(message, &sig)
        .map_err(|_| SignError::BadSignature {
            package: format!("{name}@{version}"),
            key: key.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_name_version_and_checksum() {
        let key = PublisherKey::generate().unwrap();
        let v = semver::Version::new(0, 1, 0);
        let sig = key.sign("will/demo", &v, "ab12");
        let public = key.public_hex();
        verify(&public, &sig, "will/demo", &v, "ab12").unwrap();
        assert!(verify(&public, &sig, "will/other", &v, "ab12").is_err());
        assert!(
            verify(
                &public,
                &sig,
                "will/demo",
                &semver::Version::new(0, 1, 1),
                "ab12"
            )
            .is_err()
        );
        assert!(verify(&public, &sig, "will/demo", &v, "ab13").is_err());
        let other = PublisherKey::generate().unwrap();
        assert!(verify(&other.public_hex(), &sig, "will/demo", &v, "ab12").is_err());
        assert!(verify("zz", &sig, "will/demo", &v, "ab12").is_err());
        // A package signature is not an evaluation's, nor the other way round.
        assert!(verify_eval(&public, &sig, "will/demo", &v, "ab12").is_err());
        let eval = key.sign_eval("will/demo", &v, "ab12");
        verify_eval(&public, &eval, "will/demo", &v, "ab12").unwrap();
        assert!(verify(&public, &eval, "will/demo", &v, "ab12").is_err());
        assert_eq!(fingerprint(&public).len(), 19);
        assert_ne!(fingerprint(&public), fingerprint(&other.public_hex()));
    }

    #[test]
    fn key_files_round_trip_and_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys/me.key");
        let key = PublisherKey::generate().unwrap();
        key.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            PublisherKey::load(&path).unwrap().public_hex(),
            key.public_hex()
        );
        std::fs::write(&path, "nothex").unwrap();
        assert!(PublisherKey::load(&path).is_err());
    }
}
