//! The registry's errors, one type for every backend (directory, HTTP client, server) and for
//! verifying what a registry serves.

use crate::name::{NameError, OwnerError};
use crate::package::PackageError;
use crate::sign::SignError;

/// Errors of a registry (any backend) and of verifying what it serves.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A file of the registry cannot be read or written.
    #[error("registry {root}: {path}")]
    Io {
        /// The registry.
        root: String,
        /// The file.
        path: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A file of the registry (or a client's trust store) could not be read within its limits:
    /// not a regular file, larger than its kind may be, or a read that stalled.
    #[error("registry {root}")]
    Read {
        /// The registry (or "trust store").
        root: String,
        /// Which file and why, by the bounded reader.
        #[source]
        source: rlhost_fs::ReadError,
    },
    /// The registry's data is malformed.
    #[error("registry {root}: {message}")]
    Corrupt {
        /// The registry.
        root: String,
        /// What is wrong.
        message: String,
    },
    /// The package to publish is invalid.
    #[error(transparent)]
    Package(#[from] PackageError),
    /// Publishing was refused.
    #[error("cannot publish {package}: {reason}")]
    Refused {
        /// `owner/name@version`.
        package: String,
        /// Why.
        reason: String,
    },
    /// The version exists with other bytes.
    #[error(
        "cannot publish {package}: this version is already published with different bytes; bump the version"
    )]
    Conflict {
        /// `owner/name@version`.
        package: String,
    },
    /// An evaluation summary that cannot be published: not a summary, interrupted, or its
    /// signature does not verify.
    #[error("cannot publish an evaluation of {package}: {reason}")]
    InvalidEval {
        /// `owner/name` (or what the summary named).
        package: String,
        /// Why.
        reason: String,
    },
    /// The registry refused a request (HTTP status and message).
    #[error("registry {url}: {status}: {message}")]
    Http {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// A package name that is not `owner/name` slugs (it never reaches a path or URL).
    #[error(transparent)]
    Name(#[from] NameError),
    /// A publisher name given alone (for a key or a token) that is not a slug.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// A key or signature sent with a publication is not hex of the right length (or not a
    /// key): refused before anything is checked or stored.
    #[error("{context}: malformed `{field}`")]
    Malformed {
        /// What was refused (`cannot publish owner/name@version`).
        context: String,
        /// The field as the client sends it (`key`, `sig`).
        field: &'static str,
        /// What is wrong with it.
        #[source]
        source: SignError,
    },
    /// The version is not published in this registry.
    #[error("{package} is not published here")]
    NotPublished {
        /// `owner/name@version`.
        package: String,
    },
    /// A downloaded artifact does not match its index entry.
    #[error("checksum mismatch for {package}: the index says {expected}, the download is {actual}")]
    Checksum {
        /// `owner/name@version`.
        package: String,
        /// From the index.
        expected: String,
        /// Of the bytes received.
        actual: String,
    },
    /// A signature is missing, invalid or by an untrusted key.
    #[error("{package}: {reason}")]
    Untrusted {
        /// `owner/name@version`.
        package: String,
        /// Why.
        reason: String,
    },
}
