//! The directory registry (`file://PATH`): the index and artifacts as plain files, which any
//! static file server can also serve. Writers take a lock file and replace files atomically, so
//! readers never see half an index line or half an artifact.

use std::fs::File;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::backend::{Publication, RegistryBackend};
use crate::error::RegistryError;
use crate::index::{IndexEntry, RegistryConfig};
use crate::name::PackageName;
use crate::package::{self, checksum};
use crate::sign::PublisherKey;

/// `config.json`: a registry's URL templates and publisher keys (a key takes about 100 bytes).
const MAX_CONFIG: rlhost_fs::FileLimit = rlhost_fs::FileLimit::new("registry config", 4 << 20);
/// One package's index file: a line per version of under 2 KB, so some 30,000 versions.
const MAX_INDEX_FILE: rlhost_fs::FileLimit = rlhost_fs::FileLimit::new("package index", 64 << 20);
/// A stored evaluation: an accepted summary ([`crate::evals::MAX_EVAL_BYTES`]) with what the
/// registry adds to it (who, when, the signature), well under twice its size.
const MAX_STORED_EVAL: rlhost_fs::FileLimit =
    rlhost_fs::FileLimit::new("stored evaluation", 2 * crate::evals::MAX_EVAL_BYTES as u64);
/// An artifact: a package as published ([`package::MAX_PACKED_BYTES`]).
const MAX_ARTIFACT: rlhost_fs::FileLimit =
    rlhost_fs::FileLimit::new("package artifact", package::MAX_PACKED_BYTES);

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

    fn io(&self, path: &Path, source: std::io::Error) -> RegistryError {
        RegistryError::Io {
            root: self.root.display().to_string(),
            path: path.display().to_string(),
            source,
        }
    }

    fn read_error(&self, source: rlhost_fs::ReadError) -> RegistryError {
        RegistryError::Read {
            root: self.root.display().to_string(),
            source,
        }
    }

    fn corrupt(&self, message: String) -> RegistryError {
        RegistryError::Corrupt {
            root: self.root.display().to_string(),
            message,
        }
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), RegistryError> {
        rlhost_fs::write_atomically(path, bytes).map_err(|e| self.io(path, e))
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
        let text = rlhost_fs::read_to_string(&path, MAX_CONFIG).map_err(|e| self.read_error(e))?;
        serde_json::from_str(&text).map_err(|e| self.corrupt(format!("config.json: {e}")))
    }

    fn write_config(&self, config: &RegistryConfig) -> Result<(), RegistryError> {
        let text = serde_json::to_string_pretty(config).expect("serialisable");
        self.write_atomically(&self.root.join("config.json"), text.as_bytes())
    }

    /// Accepts `public_key` (hex, stored canonical: see [`crate::sign`]) as a publisher key for
    /// `owner`, a publisher name (`[a-z0-9-]`).
    pub fn add_key(&self, owner: &str, public_key: &str) -> Result<(), RegistryError> {
        crate::name::check_owner(owner)?;
        let public_key = crate::sign::canonical_public_key(public_key).map_err(|source| {
            RegistryError::Malformed {
                context: format!("cannot accept a key for {owner}"),
                field: "key",
                source,
            }
        })?;
        if crate::server::RESERVED_OWNERS.contains(&owner) {
            return Err(self.corrupt(format!(
                "the owner name {owner:?} is reserved: it is a route of the registry's web pages"
            )));
        }
        let _lock = self.lock()?;
        let mut config = self.config()?;
        let keys = config.keys.entry(owner.to_owned()).or_default();
        if !keys.iter().any(|k| crate::sign::same_key(k, &public_key)) {
            keys.push(public_key);
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
        let text = match rlhost_fs::read_optional_text(&path, MAX_INDEX_FILE) {
            Ok(Some(t)) => t,
            Ok(None) => return Ok(Vec::new()),
            Err(e) => return Err(self.read_error(e)),
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
        rlhost_fs::read(&path, MAX_ARTIFACT).map_err(|e| self.read_error(e))
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
    /// The key and signature are stored canonical (lowercase hex, see [`crate::sign`]): a
    /// malformed one is [`RegistryError::Malformed`].
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
        let malformed = |field, source| RegistryError::Malformed {
            context: format!("cannot publish {package}"),
            field,
            source,
        };
        // Canonical before anything else: what is stored (and served, perhaps in a header) is
        // exactly lowercase hex, however the publisher spelt it.
        let public_key =
            &crate::sign::canonical_public_key(public_key).map_err(|e| malformed("key", e))?;
        let sig = &crate::sign::canonical_signature(sig).map_err(|e| malformed("sig", e))?;
        crate::sign::verify(public_key, sig, &name, &version, &cksum).map_err(|e| {
            RegistryError::Refused {
                package: package.clone(),
                reason: e.to_string(),
            }
        })?;
        if crate::server::RESERVED_OWNERS.contains(&manifest.plugin.owner.as_str()) {
            return Err(RegistryError::Refused {
                package,
                reason: format!(
                    "the owner name {:?} is reserved: it is a route of the registry's web pages",
                    manifest.plugin.owner
                ),
            });
        }
        let _lock = self.lock()?;
        let config = self.config()?;
        let accepted = config
            .keys
            .get(&manifest.plugin.owner)
            .is_some_and(|keys| keys.iter().any(|k| crate::sign::same_key(k, public_key)));
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

    /// `<root>/evals/<owner>/<name>`.
    fn evals_dir(&self, name: &PackageName) -> PathBuf {
        name.path_under(&self.root.join("evals"))
    }

    /// Publishes an evaluation summary of a package published here, signed by `public_key`,
    /// which must be accepted for `publisher` (a server's authenticated owner), or, when no
    /// publisher is given (a folder registry, authorised by file permissions), for some owner.
    /// The same bytes published twice are one evaluation.
    pub fn add_eval(
        &self,
        summary: &[u8],
        sig: &str,
        public_key: &str,
        publisher: Option<&str>,
    ) -> Result<crate::evals::StoredEval, RegistryError> {
        let parsed =
            crate::evals::check_summary(summary).map_err(|reason| RegistryError::InvalidEval {
                package: "(unknown)".into(),
                reason,
            })?;
        let name: PackageName = parsed.plugin.parse()?;
        let invalid = |reason: String| RegistryError::InvalidEval {
            package: name.to_string(),
            reason,
        };
        let cksum = checksum(summary);
        let malformed = |field, source| RegistryError::Malformed {
            context: format!("cannot publish an evaluation of {name}"),
            field,
            source,
        };
        // Stored canonical, as a package's: the stored values are served in HTTP headers.
        let public_key =
            &crate::sign::canonical_public_key(public_key).map_err(|e| malformed("key", e))?;
        let sig = &crate::sign::canonical_signature(sig).map_err(|e| malformed("sig", e))?;
        crate::sign::verify_eval(
            public_key,
            sig,
            name.as_str(),
            &parsed.plugin_version,
            &cksum,
        )
        .map_err(|e| invalid(e.to_string()))?;
        let _lock = self.lock()?;
        if !self
            .entries(&name)?
            .iter()
            .any(|e| e.vers == parsed.plugin_version)
        {
            return Err(RegistryError::NotPublished {
                package: format!("{name}@{}", parsed.plugin_version),
            });
        }
        let config = self.config()?;
        let accepted = |owner: &str| {
            config
                .keys
                .get(owner)
                .is_some_and(|keys| keys.iter().any(|k| crate::sign::same_key(k, public_key)))
        };
        let publisher = match publisher {
            Some(owner) if accepted(owner) => owner.to_owned(),
            Some(owner) => {
                return Err(RegistryError::Refused {
                    package: format!("an evaluation of {name}"),
                    reason: format!(
                        "key {public_key} is not accepted for owner {owner:?} by this registry"
                    ),
                });
            }
            None => config
                .keys
                .keys()
                .find(|o| accepted(o))
                .cloned()
                .ok_or_else(|| RegistryError::Refused {
                    package: format!("an evaluation of {name}"),
                    reason: format!("key {public_key} is not accepted for any owner"),
                })?,
        };
        let text = String::from_utf8(summary.to_vec())
            .map_err(|_| invalid("the summary is not UTF-8".into()))?;
        let stored = crate::evals::StoredEval {
            cksum: cksum.clone(),
            publisher,
            key: public_key.to_owned(),
            sig: sig.to_owned(),
            summary: text,
        };
        let path = self.evals_dir(&name).join(format!("{cksum}.json"));
        if let Some(existing) = self.eval(&name, &cksum)? {
            return Ok(existing);
        }
        let mine = self
            .evals(&name)?
            .iter()
            .filter(|e| e.publisher == stored.publisher)
            .count();
        if mine >= crate::evals::MAX_EVALS_PER_PUBLISHER {
            return Err(RegistryError::Refused {
                package: format!("an evaluation of {name}"),
                reason: format!(
                    "{} has published {mine} evaluations of {name}, the most this registry keeps \
                     per publisher and package",
                    stored.publisher
                ),
            });
        }
        let bytes = serde_json::to_vec_pretty(&stored).expect("serialisable");
        self.write_atomically(&path, &bytes)?;
        Ok(stored)
    }

    /// The evaluation of `name` with id `cksum`, if published.
    pub fn eval(
        &self,
        name: &PackageName,
        cksum: &str,
    ) -> Result<Option<crate::evals::StoredEval>, RegistryError> {
        if cksum.len() != 64 || !cksum.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(None);
        }
        let path = self.evals_dir(name).join(format!("{cksum}.json"));
        match rlhost_fs::read_optional_text(&path, MAX_STORED_EVAL) {
            Ok(Some(text)) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| self.corrupt(format!("evals/{name}/{cksum}.json: {e}"))),
            Ok(None) => Ok(None),
            Err(e) => Err(self.read_error(e)),
        }
    }

    /// The ids of `name`'s evaluations (file names only: nothing is parsed).
    pub fn eval_ids(&self, name: &PackageName) -> Result<Vec<String>, RegistryError> {
        let dir = self.evals_dir(name);
        let Ok(files) = std::fs::read_dir(&dir) else {
            return Ok(Vec::new());
        };
        let mut ids: Vec<String> = files
            .flatten()
            .filter_map(|f| {
                let file = f.file_name().to_string_lossy().into_owned();
                let id = file.strip_suffix(".json")?;
                (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
            })
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Every evaluation of `name`, newest first (by the date the evaluation finished).
    pub fn evals(
        &self,
        name: &PackageName,
    ) -> Result<Vec<crate::evals::StoredEval>, RegistryError> {
        let mut out = Vec::new();
        for id in self.eval_ids(name)? {
            if let Some(e) = self.eval(name, &id)? {
                let date = e.parsed().map(|s| s.date).unwrap_or_default();
                out.push((date, e));
            }
        }
        out.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cksum.cmp(&b.1.cksum)));
        Ok(out.into_iter().map(|(_, e)| e).collect())
    }

    /// The newest listed version (see [`newest_listed`]) of every package whose name or description contains
    /// `query` (all packages for an empty query).
    pub fn search(&self, query: &str) -> Result<Vec<IndexEntry>, RegistryError> {
        let q = query.to_lowercase();
        let mut out = Vec::new();
        for name in self.packages()? {
            let entries = self.entries(&name.parse()?)?;
            if let Some(e) = newest_listed(&entries)
                && (e.name.contains(&q) || e.description.to_lowercase().contains(&q))
            {
                out.push(e.clone());
            }
        }
        Ok(out)
    }
}

/// The version a package is listed with: its newest release that is not yanked, else (only
/// pre-releases left) its newest pre-release that is not yanked — what `host env install
/// owner/name` picks when it picks a release.
pub fn newest_listed(entries: &[IndexEntry]) -> Option<&IndexEntry> {
    let live = || entries.iter().filter(|e| !e.yanked);
    live()
        .filter(|e| e.vers.pre.is_empty())
        .max_by(|a, b| a.vers.cmp(&b.vers))
        .or_else(|| live().max_by(|a, b| a.vers.cmp(&b.vers)))
}

/// A folder registry behind [`RegistryBackend`], at its `file://` URL.
pub struct DirBackend {
    url: String,
    dir: DirRegistry,
}

impl DirBackend {
    /// The registry in `dir`, known to clients as `url`.
    pub fn new(url: String, dir: DirRegistry) -> Self {
        Self { url, dir }
    }
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
    /// A folder registry is authorised by file permissions: whoever can write it publishes
    /// (the token is not needed).
    async fn publish(&self, p: Publication<'_>) -> Result<IndexEntry, RegistryError> {
        self.dir
            .publish_signed(p.packed, p.sig, p.public_key, p.min_host.cloned())
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
    async fn publish_eval(
        &self,
        e: crate::evals::EvalPublication<'_>,
    ) -> Result<crate::evals::StoredEval, RegistryError> {
        self.dir.add_eval(e.summary, e.sig, e.public_key, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key was accepted for any owner string (shown on pages, sent in headers) and stored as
    /// typed, so the same key in upper case was a second key that matched nothing.
    #[test]
    fn keys_are_accepted_for_publisher_names_and_stored_canonical() {
        let dir = tempfile::tempdir().unwrap();
        let registry = DirRegistry::open(dir.path(), true).unwrap();
        let key = PublisherKey::generate().unwrap();
        let public = key.public_hex();
        for owner in ["ac\u{202E}me", "Acme", "acme\nx", ""] {
            let e = registry.add_key(owner, &public).unwrap_err().to_string();
            assert!(e.contains("not a publisher name"), "{e}");
        }
        let e = registry
            .add_key("acme", &format!("{}é", &public[..62]))
            .unwrap_err();
        assert!(
            matches!(e, RegistryError::Malformed { field: "key", .. }),
            "{e}"
        );
        registry.add_key("acme", &format!("{public}\n")).unwrap();
        registry.add_key("acme", &public.to_uppercase()).unwrap();
        assert_eq!(registry.config().unwrap().keys["acme"], vec![public]);
    }

    /// What a publisher signs is stored canonical whatever its spelling; a malformed signature
    /// is an error naming the field, not a panic and not a refusal as if it did not verify.
    #[test]
    fn signatures_are_stored_canonical() {
        let dir = tempfile::tempdir().unwrap();
        let registry = DirRegistry::open(&dir.path().join("r"), true).unwrap();
        let key = PublisherKey::generate().unwrap();
        registry.add_key("acme", &key.public_hex()).unwrap();
        let plugin = dir.path().join("plugin");
        std::fs::create_dir_all(&plugin).unwrap();
        std::fs::write(
            plugin.join("plugin.toml"),
            "[plugin]\nowner = \"acme\"\nname = \"demo\"\nversion = \"0.1.0\"\n\
             kind = \"environment\"\nabi = \"rlhost:env@0.1.0\"\nruntime = \"wasm\"\n",
        )
        .unwrap();
        std::fs::write(plugin.join("plugin.wasm"), b"\0asm fake").unwrap();
        let (packed, _) = package::pack(&plugin).unwrap();
        let version = semver::Version::new(0, 1, 0);
        let sig = key.sign("acme/demo", &version, &checksum(&packed));
        let e = registry
            .publish_signed(
                &packed,
                &format!("{}ü", &sig[..126]),
                &key.public_hex(),
                None,
            )
            .unwrap_err();
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(
            matches!(e, RegistryError::Malformed { field: "sig", .. }),
            "{chain}"
        );
        assert!(
            chain.contains("invalid signature") && chain.contains("U+00FC"),
            "{chain}"
        );
        let loose_sig = format!("{}\n", sig.to_uppercase());
        let loose_key = format!("\t{}\n", key.public_hex().to_uppercase());
        let entry = registry
            .publish_signed(&packed, &loose_sig, &loose_key, None)
            .unwrap();
        assert_eq!(entry.sig.as_deref(), Some(sig.as_str()));
        assert_eq!(entry.key, Some(key.public_hex()));
        let name: PackageName = "acme/demo".parse().unwrap();
        assert_eq!(registry.entries(&name).unwrap(), vec![entry]);
    }
}
