//! Publisher signatures: ed25519 over the package's identity and checksum, so an index entry
//! cannot be moved to another name or version, nor point at other bytes.
//!
//! Keys and signatures travel as hex. Input is read leniently and stored strictly: ASCII
//! whitespace around the digits (a trailing newline from `cat key.pub`) is ignored and upper-case
//! digits are accepted, anything else (a non-hex or non-ASCII character, whitespace inside, the
//! wrong length) is refused by name; what a registry keeps is always the canonical form
//! ([`canonical_public_key`], [`canonical_signature`]): lowercase hex of the decoded bytes, so a
//! stored value is safe anywhere (an HTTP header, a file name, a page) and two spellings of one
//! key compare equal ([`same_key`]). Decoding never panics, whatever the input.

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

/// How an error message shows one character of untrusted input: printable ASCII as itself,
/// anything else as its code point, so a message never carries a control or bidi character.
pub(crate) fn describe_char(c: char) -> String {
    if c.is_ascii_graphic() {
        format!("'{c}'")
    } else {
        format!("U+{:04X}", u32::from(c))
    }
}

/// The value of one hex digit.
fn nibble(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes exactly `N` bytes of hex (either case, ASCII whitespace around it ignored). Works on
/// bytes after checking every character, so no input can make it slice inside a character (the
/// panic a non-ASCII character once caused); errors name `what` and the first bad character by
/// position and code point, never echoing the input.
fn unhex<const N: usize>(s: &str, what: &'static str) -> Result<[u8; N], SignError> {
    let bad = |message: String| SignError::Malformed { what, message };
    let digits = s.trim_matches(|c: char| c.is_ascii_whitespace());
    if let Some((at, c)) = digits
        .chars()
        .enumerate()
        .find(|(_, c)| !c.is_ascii_hexdigit())
    {
        return Err(bad(format!(
            "character {} is {}, not a hex digit (expected {} hex digits, 0-9 and a-f)",
            at + 1,
            describe_char(c),
            2 * N
        )));
    }
    // Every character is an ASCII hex digit here, so bytes are characters.
    let bytes = digits.as_bytes();
    if bytes.len() != 2 * N {
        return Err(bad(format!(
            "expected {} hex digits, got {}",
            2 * N,
            bytes.len()
        )));
    }
    let mut out = [0u8; N];
    for (byte, &[hi, lo]) in out.iter_mut().zip(bytes.as_chunks::<2>().0) {
        let (Some(hi), Some(lo)) = (nibble(hi), nibble(lo)) else {
            return Err(bad("not hex".into()));
        };
        *byte = hi << 4 | lo;
    }
    Ok(out)
}

/// `key` (hex) as a registry stores it: a valid ed25519 public key in lowercase hex, without
/// surrounding whitespace. Refuses anything that is not 64 hex digits of a curve point.
pub fn canonical_public_key(key: &str) -> Result<String, SignError> {
    let bytes = unhex::<32>(key, "public key")?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| SignError::Malformed {
        what: "public key",
        message: format!("not an ed25519 public key ({e})"),
    })?;
    Ok(hex(&bytes))
}

/// `sig` (hex) as a registry stores it: 128 lowercase hex digits, without surrounding
/// whitespace. Refuses anything else; whether it verifies is [`verify`]'s question.
pub fn canonical_signature(sig: &str) -> Result<String, SignError> {
    Ok(hex(&unhex::<64>(sig, "signature")?))
}

/// Whether two public keys (hex) are the same key, however each is spelt; a malformed key is
/// the same as no other.
pub fn same_key(a: &str, b: &str) -> bool {
    match (canonical_public_key(a), canonical_public_key(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
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

    /// Reads a key file (64 hex digits; a regular file of at most 4 KiB, so a `--key` naming a
    /// FIFO or a device fails at once).
    pub fn load(path: &Path) -> Result<Self, SignError> {
        let limit = rlhost_fs::FileLimit::new("publisher key", 4 << 10);
        let text = rlhost_fs::read_to_string(path, limit).map_err(|e| SignError::KeyFile {
            path: path.display().to_string(),
            message: e.reason(),
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

/// Checks that `key` is a well-formed ed25519 public key (hex); see [`canonical_public_key`]
/// for the form to store.
pub fn verify_key(key: &str) -> Result<(), SignError> {
    canonical_public_key(key).map(|_| ())
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
    let key = canonical_public_key(key)?;
    let vk = VerifyingKey::from_bytes(&unhex::<32>(&key, "public key")?).map_err(|e| {
        SignError::Malformed {
            what: "public key",
            message: e.to_string(),
        }
    })?;
    let sig = Signature::from_bytes(&unhex::<64>(sig, "signature")?);
    // The key in the message is the canonical one: only hex digits reach a terminal or a page.
    vk.verify(message, &sig)
        .map_err(|_| SignError::BadSignature {
            package: format!("{name}@{version}"),
            key,
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

    /// A non-ASCII character in a key or signature once made the decoder slice inside it and
    /// panic (exit 101 in the CLI, a 500 from the server): every position, every width.
    #[test]
    fn malformed_hex_is_an_error_naming_the_field_never_a_panic() {
        let key = PublisherKey::generate().unwrap();
        let v = semver::Version::new(0, 1, 0);
        let public = key.public_hex();
        let sig = key.sign("will/demo", &v, "ab12");
        let check = |result: Result<(), SignError>, what: &str, odd: char| {
            let e = result.expect_err("malformed hex was accepted");
            let m = e.to_string();
            assert!(
                matches!(e, SignError::Malformed { what: w, .. } if w == what),
                "{m}"
            );
            assert!(m.contains(what) && m.contains("not a hex digit"), "{m}");
            // Named by code point: the message never carries the character itself.
            assert!(!m.contains(odd), "{m}");
        };
        for odd in ['é', '€', '😀', '\u{202e}'] {
            let width = odd.len_utf8();
            // Same byte length as a good value: the old length check let these through.
            for at in 0..=public.len() - width {
                let mut bad = public.clone();
                bad.replace_range(at..at + width, odd.encode_utf8(&mut [0; 4]));
                check(verify_key(&bad), "public key", odd);
                check(
                    verify(&bad, &sig, "will/demo", &v, "ab12"),
                    "public key",
                    odd,
                );
                check(
                    verify_eval(&bad, &sig, "will/demo", &v, "ab12"),
                    "public key",
                    odd,
                );
                assert!(!same_key(&bad, &public));
            }
            for at in 0..=sig.len() - width {
                let mut bad = sig.clone();
                bad.replace_range(at..at + width, odd.encode_utf8(&mut [0; 4]));
                check(canonical_signature(&bad).map(|_| ()), "signature", odd);
                check(
                    verify(&public, &bad, "will/demo", &v, "ab12"),
                    "signature",
                    odd,
                );
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("me.key");
        std::fs::write(&path, format!("é{}", "0".repeat(62))).unwrap();
        let e = PublisherKey::load(&path).err().unwrap().to_string();
        assert!(e.contains("secret key") && e.contains("U+00E9"), "{e}");
        let e = verify_key(&"a".repeat(63)).unwrap_err().to_string();
        assert!(e.contains("expected 64 hex digits, got 63"), "{e}");
    }

    /// A signature sent with a trailing newline verified and was stored as sent, and a stored
    /// value that later went into an HTTP header broke every answer about it.
    #[test]
    fn keys_and_signatures_have_one_canonical_form() {
        let key = PublisherKey::generate().unwrap();
        let v = semver::Version::new(0, 1, 0);
        let public = key.public_hex();
        let sig = key.sign("will/demo", &v, "ab12");
        let loose_key = format!("  {}\n", public.to_uppercase());
        let loose_sig = format!("{}\r\n", sig.to_uppercase());
        assert_eq!(canonical_public_key(&loose_key).unwrap(), public);
        assert_eq!(canonical_signature(&loose_sig).unwrap(), sig);
        assert!(same_key(&loose_key, &public));
        verify(&loose_key, &loose_sig, "will/demo", &v, "ab12").unwrap();
        for canonical in [
            canonical_public_key(&loose_key).unwrap(),
            canonical_signature(&loose_sig).unwrap(),
        ] {
            assert!(
                canonical
                    .bytes()
                    .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            );
            assert!(axum::http::HeaderValue::from_str(&canonical).is_ok());
        }
        // Whitespace inside is not a spelling of the same value.
        let split = format!("{} {}", &sig[..64], &sig[64..]);
        assert!(canonical_signature(&split).is_err());
        assert!(canonical_signature(&sig[..126]).is_err());
        // A message about a bad signature shows the key as stored, whatever was sent.
        let other = PublisherKey::generate().unwrap();
        let e = verify(
            &loose_key,
            &other.sign("will/demo", &v, "ab12"),
            "will/demo",
            &v,
            "ab12",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(&public) && !e.contains('\n'), "{e}");
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
