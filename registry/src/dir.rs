//! The directory registry (`file://PATH`): the index and artifacts as plain files, which any
//! static file server can also serve. Writers take a lock file and replace files atomically, so
//! readers never see half an index line or half an artifact.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::index::{IndexEntry, RegistryConfig};
use crate::name::{NameError, PackageName};
use crate::package::{self, PackageError, checksum};
use crate::sign::PublisherKey;

/// Errors of a registry (any backend) and of verifying what it serves.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A file of the registry cannot be read or written.
    #[error("registry {root}: {path}: {message}")]
    Io {
        /// The registry.
        root: String,
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
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

/// A registry stored in a folder.
#[derive(Debug, Clone)]
pub struct DirRegistry {
    root: PathBuf,
}

impl DirRegistry {
    /// Opens (and, if `create`, initialises) the registry at `root`.
    pub fn open(root: &Path, create: bool) -> Result<Self, RegistryError> {
        let reg = Self {
            root: root.to_owned(),
        };
        let config = root.join("config.json");
        if !config.is_file() {
            if !create {
                return Err(reg.corrupt(format!(
                    "no config.json: not a registry (create one with `host registry init --root {}`)",
                    root.display()
                )));
            }
            reg.write_config(&RegistryConfig::standard())?;
        }
        Ok(reg)
    }

    /// The registry's root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn io(&self, path: &Path, e: impl std::fmt::Display) -> RegistryError {
        RegistryError::Io {
            root: self.root.display().to_string(),
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }

    fn corrupt(&self, message: String) -> RegistryError {
        RegistryError::Corrupt {
            root: self.root.display().to_string(),
            message,
        }
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), RegistryError> {
        crate::fs::write_atomically(path, bytes).map_err(|e| self.io(path, e))
    }

    /// Holds the registry's write lock until dropped.
    fn lock(&self) -> Result<File, RegistryError> {
        let path = self.root.join(".lock");
        std::fs::create_dir_all(&self.root).map_err(|e| self.io(&self.root, e))?;
        let f = File::create(&path).map_err(|e| self.io(&path, e))?;
        f.lock().map_err(|e| self.io(&path, e))?;
        Ok(f)
    }

    /// `config.json`.
    pub fn config(&self) -> Result<RegistryConfig, RegistryError> {
        let path = self.root.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| self.io(&path, e))?;
        serde_json::from_str(&text).map_err(|e| self.corrupt(format!("config.json: {e}")))
    }

    fn write_config(&self, config: &RegistryConfig) -> Result<(), RegistryError> {
        let text = serde_json::to_string_pretty(config).expect("serialisable");
        self.write_atomically(&self.root.join("config.json"), text.as_bytes())
    }

    /// Accepts `public_key` (hex) as a publisher key for `owner`.
    pub fn add_key(&self, owner: &str, public_key: &str) -> Result<(), RegistryError> {
        let _lock = self.lock()?;
        let mut config = self.config()?;
        let keys = config.keys.entry(owner.to_owned()).or_default();
        if !keys.iter().any(|k| k == public_key) {
            keys.push(public_key.to_owned());
        }
        self.write_config(&config)
    }

    /// `<root>/index/<owner>/<name>`: inside the root by construction (see
    /// [`PackageName::path_under`]).
    fn index_path(&self, name: &PackageName) -> PathBuf {
        name.path_under(&self.root.join("index"))
    }

    /// Every published version of `owner/name` (empty if none).
    pub fn entries(&self, name: &PackageName) -> Result<Vec<IndexEntry>, RegistryError> {
        let full_name = name.as_str();
        let path = self.index_path(name);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.io(&path, e)),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| self.corrupt(format!("index/{full_name} line {}: {e}", i + 1)))
            })
            .collect()
    }

    /// Every `owner/name` in the registry.
    pub fn packages(&self) -> Result<Vec<String>, RegistryError> {
        let index = self.root.join("index");
        let mut out = Vec::new();
        let Ok(owners) = std::fs::read_dir(&index) else {
            return Ok(out);
        };
        for owner in owners.flatten().filter(|e| e.path().is_dir()) {
            for pkg in std::fs::read_dir(owner.path())
                .map_err(|e| self.io(&owner.path(), e))?
                .flatten()
            {
                // Temporaries of atomic writes and anything else that is not a package name.
                let full = format!(
                    "{}/{}",
                    owner.file_name().to_string_lossy(),
                    pkg.file_name().to_string_lossy()
                );
                if full.parse::<PackageName>().is_ok() {
                    out.push(full);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The artifact with checksum `cksum`.
    pub fn artifact(&self, cksum: &str) -> Result<Vec<u8>, RegistryError> {
        if !cksum.bytes().all(|b| b.is_ascii_hexdigit()) || cksum.len() != 64 {
            return Err(self.corrupt(format!("bad checksum {cksum:?} in the index")));
        }
        let config = self.config()?;
        let rel = config.dl.replace("{cksum}", cksum);
        let path = self.root.join(rel);
        std::fs::read(&path).map_err(|e| self.io(&path, e))
    }

    /// Publishes a package signed with `key`, whose public half the registry must accept for
    /// the package's owner. Re-publishing the same bytes is a no-op; different bytes under an
    /// existing version are refused.
    pub fn publish(
        &self,
        packed: &[u8],
        key: &PublisherKey,
        min_host: Option<semver::Version>,
    ) -> Result<IndexEntry, RegistryError> {
        let manifest = self.read_package(packed)?;
        let sig = key.sign(
            &manifest.full_name(),
            &manifest.plugin.version,
            &checksum(packed),
        );
        self.add(packed, &manifest, &sig, &key.public_hex(), min_host)
    }

    /// Publishes a package with a signature made elsewhere (by the publisher, for an upload):
    /// the signature must verify and its key must be accepted for the package's owner.
    pub fn publish_signed(
        &self,
        packed: &[u8],
        sig: &str,
        public_key: &str,
        min_host: Option<semver::Version>,
    ) -> Result<IndexEntry, RegistryError> {
        let manifest = self.read_package(packed)?;
        self.add(packed, &manifest, sig, public_key, min_host)
    }

    /// Validates package bytes by unpacking them into a scratch folder; returns the manifest.
    pub fn read_package(&self, packed: &[u8]) -> Result<crate::Manifest, RegistryError> {
        let staging = tempfile::tempdir().map_err(|e| self.io(Path::new("(temp)"), e))?;
        Ok(package::unpack(packed, staging.path())?)
    }

    /// [`DirRegistry::publish_signed`] for bytes already checked by [`DirRegistry::read_package`].
    pub fn add(
        &self,
        packed: &[u8],
        manifest: &crate::Manifest,
        sig: &str,
        public_key: &str,
        min_host: Option<semver::Version>,
    ) -> Result<IndexEntry, RegistryError> {
        let package_name = manifest.package_name();
        let name = manifest.full_name();
        let version = manifest.plugin.version.clone();
        let package = format!("{name}@{version}");
        let cksum = checksum(packed);
        crate::sign::verify(public_key, sig, &name, &version, &cksum).map_err(|e| {
            RegistryError::Refused {
                package: package.clone(),
                reason: e.to_string(),
            }
        })?;
        let _lock = self.lock()?;
        let config = self.config()?;
        let accepted = config
            .keys
            .get(&manifest.plugin.owner)
            .is_some_and(|keys| keys.iter().any(|k| k == public_key));
        if !accepted {
            return Err(RegistryError::Refused {
                package,
                reason: format!(
                    "key {public_key} is not accepted for owner {:?} by this registry",
                    manifest.plugin.owner
                ),
            });
        }
        let mut entries = self.entries(&package_name)?;
        if let Some(existing) = entries.iter().find(|e| e.vers == version) {
            if existing.cksum == cksum {
                return Ok(existing.clone());
            }
            return Err(RegistryError::Conflict { package });
        }
        let rel = config.dl.replace("{cksum}", &cksum);
        self.write_atomically(&self.root.join(rel), packed)?;
        let entry = IndexEntry {
            sig: Some(sig.to_owned()),
            key: Some(public_key.to_owned()),
            name: name.clone(),
            vers: version,
            kind: manifest.plugin.kind,
            abi: manifest.plugin.abi.clone(),
            runtime: manifest.plugin.runtime,
            deps: manifest.dependencies.clone(),
            cksum,
            yanked: false,
            min_host,
            description: manifest.plugin.description.clone(),
            capabilities: manifest.plugin.capabilities.clone(),
        };
        entries.push(entry.clone());
        self.write_index(&package_name, &entries)?;
        Ok(entry)
    }

    fn write_index(&self, name: &PackageName, entries: &[IndexEntry]) -> Result<(), RegistryError> {
        let mut text = String::new();
        for e in entries {
            text.push_str(&serde_json::to_string(e).expect("serialisable"));
            text.push('\n');
        }
        self.write_atomically(&self.index_path(name), text.as_bytes())
    }

    /// Marks `owner/name@version` yanked (or not).
    pub fn yank(
        &self,
        name: &PackageName,
        version: &semver::Version,
        yanked: bool,
    ) -> Result<(), RegistryError> {
        let _lock = self.lock()?;
        let mut entries = self.entries(name)?;
        let entry = entries
            .iter_mut()
            .find(|e| e.vers == *version)
            .ok_or_else(|| RegistryError::NotPublished {
                package: format!("{name}@{version}"),
            })?;
        entry.yanked = yanked;
        self.write_index(name, &entries)
    }

    /// The newest non-yanked version of every package whose name or description contains
    /// `query` (all packages for an empty query).
    pub fn search(&self, query: &str) -> Result<Vec<IndexEntry>, RegistryError> {
        let q = query.to_lowercase();
        let mut out = Vec::new();
        for name in self.packages()? {
            let entries = self.entries(&name.parse()?)?;
            let newest = entries
                .iter()
                .filter(|e| !e.yanked)
                .max_by(|a, b| a.vers.cmp(&b.vers));
            if let Some(e) = newest
                && (e.name.contains(&q) || e.description.to_lowercase().contains(&q))
            {
                out.push(e.clone());
            }
        }
        Ok(out)
    }
}

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
                message: e.to_string(),
            }),
        }
    }

    /// Writes the store atomically.
    pub fn save(&self, path: &Path) -> Result<(), RegistryError> {
        let text = serde_json::to_string_pretty(self).expect("serialisable");
        crate::fs::write_atomically(path, text.as_bytes()).map_err(|e| RegistryError::Io {
            root: "trust store".into(),
            path: path.display().to_string(),
            message: e.to_string(),
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
