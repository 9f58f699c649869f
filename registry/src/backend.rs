//! One interface over every kind of registry: a folder (`file://PATH`, [`crate::dir`]) or an
//! rlhost registry server (`http://HOST:PORT`, [`crate::http`]); [`crate::open`] picks one by URL.

use async_trait::async_trait;

use crate::error::RegistryError;
use crate::index::{IndexEntry, RegistryConfig};
use crate::name::PackageName;

/// A signed package to publish.
#[derive(Debug, Clone, Copy)]
pub struct Publication<'a> {
    /// The `.rlpkg` bytes.
    pub packed: &'a [u8],
    /// The publisher's signature over name, version and checksum (hex).
    pub sig: &'a str,
    /// The publisher's public key (hex).
    pub public_key: &'a str,
    /// The oldest host version the package works with, if it says.
    pub min_host: Option<&'a semver::Version>,
    /// Authenticates the publisher to a server (a folder registry needs none).
    pub token: Option<&'a str>,
}

/// What clients need of a registry.
#[async_trait]
pub trait RegistryBackend: Send + Sync {
    /// The registry's URL.
    fn url(&self) -> &str;
    /// `config.json`.
    async fn config(&self) -> Result<RegistryConfig, RegistryError>;
    /// Every version of `owner/name` (empty if none).
    async fn entries(&self, name: &PackageName) -> Result<Vec<IndexEntry>, RegistryError>;
    /// Every `owner/name`.
    async fn packages(&self) -> Result<Vec<String>, RegistryError>;
    /// The package bytes with checksum `cksum`.
    async fn artifact(&self, cksum: &str) -> Result<Vec<u8>, RegistryError>;
    /// Newest version of each package matching `query`.
    async fn search(&self, query: &str) -> Result<Vec<IndexEntry>, RegistryError>;
    /// Publishes a signed package.
    async fn publish(&self, p: Publication<'_>) -> Result<IndexEntry, RegistryError>;
    /// Yanks (or un-yanks) a version; `token` authenticates to a server.
    async fn yank(
        &self,
        name: &PackageName,
        version: &semver::Version,
        yanked: bool,
        token: Option<&str>,
    ) -> Result<(), RegistryError>;
    /// Publishes a signed evaluation summary of a package published here.
    async fn publish_eval(
        &self,
        e: crate::evals::EvalPublication<'_>,
    ) -> Result<crate::evals::StoredEval, RegistryError>;
}
