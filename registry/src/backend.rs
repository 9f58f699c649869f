//! One interface over every kind of registry: a folder (`file://PATH`) or an rlhost registry
//! server (`http://HOST:PORT`).

use async_trait::async_trait;

use crate::dir::{DirRegistry, RegistryError};
use crate::index::{IndexEntry, RegistryConfig};
use crate::name::PackageName;

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
    /// Publishes signed package bytes; `token` authenticates to a server.
    async fn publish(
        &self,
        packed: &[u8],
        sig: &str,
        public_key: &str,
        min_host: Option<semver::Version>,
        token: Option<&str>,
    ) -> Result<IndexEntry, RegistryError>;
    /// Yanks (or un-yanks) a version.
    async fn yank(
        &self,
        name: &PackageName,
        version: &semver::Version,
        yanked: bool,
        token: Option<&str>,
    ) -> Result<(), RegistryError>;
}

/// Opens the registry at `url`: `file://PATH` or `http(s)://…`.
pub fn open(url: &str) -> Result<Box<dyn RegistryBackend>, RegistryError> {
    if let Some(path) = url.strip_prefix("file://") {
        return Ok(Box::new(DirBackend {
            url: url.to_owned(),
            dir: DirRegistry::open(std::path::Path::new(path), false)?,
        }));
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Box::new(crate::http::HttpRegistry::new(url)));
    }
    Err(RegistryError::Corrupt {
        root: url.to_owned(),
        message: "expected a file://PATH, http:// or https:// registry URL".into(),
    })
}

struct DirBackend {
    url: String,
    dir: DirRegistry,
}

#[async_trait]
impl RegistryBackend for DirBackend {
    fn url(&self) -> &str {
        &self.url
    }
    async fn config(&self) -> Result<RegistryConfig, RegistryError> {
        self.dir.config()
    }
    async fn entries(&self, name: &PackageName) -> Result<Vec<IndexEntry>, RegistryError> {
        self.dir.entries(name)
    }
    async fn packages(&self) -> Result<Vec<String>, RegistryError> {
        self.dir.packages()
    }
    async fn artifact(&self, cksum: &str) -> Result<Vec<u8>, RegistryError> {
        self.dir.artifact(cksum)
    }
    async fn search(&self, query: &str) -> Result<Vec<IndexEntry>, RegistryError> {
        self.dir.search(query)
    }
    async fn publish(
        &self,
        packed: &[u8],
        sig: &str,
        public_key: &str,
        min_host: Option<semver::Version>,
        _token: Option<&str>,
    ) -> Result<IndexEntry, RegistryError> {
        // A folder registry is authorised by file permissions: whoever can write it publishes.
        self.dir.publish_signed(packed, sig, public_key, min_host)
    }
    async fn yank(
        &self,
        name: &PackageName,
        version: &semver::Version,
        yanked: bool,
        _token: Option<&str>,
    ) -> Result<(), RegistryError> {
        self.dir.yank(name, version, yanked)
    }
}
