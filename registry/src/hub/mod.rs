//! The registry as a hub people browse: the data of its web pages, built from the same index and
//! packages the CLI reads, and the pages themselves (server-rendered HTML from minijinja
//! templates compiled into the binary; no JavaScript needed, no resource from elsewhere).
//!
//! Every page has a JSON twin with the same data ([`IndexPage`], [`OwnerPage`],
//! [`PackagePage`]), so what a person sees and what a script reads cannot disagree.

pub mod markdown;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::dir::DirRegistry;
use crate::error::RegistryError;
use crate::index::IndexEntry;
use crate::manifest::{DatasetSource, EnvArg, Manifest, PluginKind, Runtime};
use crate::name::PackageName;

/// One package in a list: its newest version that is not yanked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListedPackage {
    /// `owner/name`.
    pub name: String,
    /// The publisher.
    pub owner: String,
    /// The version listed.
    pub version: semver::Version,
    /// One line for humans.
    pub description: String,
    /// Environment or reward function.
    pub kind: PluginKind,
    /// ABI targeted.
    pub abi: String,
    /// How it runs: `component`, `extism`, `python` or `native`.
    pub runtime: String,
    /// Capabilities it asks for.
    pub capabilities: Vec<String>,
    /// Evaluations published for it.
    pub evaluations: usize,
}

/// `/`: the search box and what matches it.
#[derive(Debug, Clone, Serialize)]
pub struct IndexPage {
    /// The query (empty: everything).
    pub query: String,
    /// Matching environments, by name.
    pub environments: Vec<ListedPackage>,
    /// Matching reward functions, by name.
    pub rewards: Vec<ListedPackage>,
}

/// A publisher key accepted by the registry.
#[derive(Debug, Clone, Serialize)]
pub struct KeyRow {
    /// Hex ed25519 public key.
    pub key: String,
    /// Its short name ([`crate::sign::fingerprint`]).
    pub fingerprint: String,
}

/// `/owner`: one publisher's packages.
#[derive(Debug, Clone, Serialize)]
pub struct OwnerPage {
    /// The publisher.
    pub owner: String,
    /// Keys the registry accepts for the publisher.
    pub keys: Vec<KeyRow>,
    /// Every package of the publisher (its newest version; fully yanked ones included).
    pub packages: Vec<ListedPackage>,
}

/// Whether a version's signature holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SignatureState {
    /// Verifies with its key over the package's name, version and checksum.
    Verified,
    /// Carries no signature.
    Unsigned,
    /// Present but does not verify.
    Invalid,
}

/// The signature of one version.
#[derive(Debug, Clone, Serialize)]
pub struct Signature {
    /// Verified, unsigned or invalid.
    pub state: SignatureState,
    /// The signing key (hex), if any.
    pub key: Option<String>,
    /// Its fingerprint.
    pub fingerprint: Option<String>,
    /// The key is one the registry accepts for the owner: the key clients pin on first use.
    pub pinned: bool,
}

/// One published version.
#[derive(Debug, Clone, Serialize)]
pub struct VersionRow {
    /// The version.
    pub version: semver::Version,
    /// Withdrawn from ranges.
    pub yanked: bool,
    /// ABI targeted.
    pub abi: String,
    /// Oldest host that runs it.
    pub min_host: Option<semver::Version>,
    /// Hex sha256 of the package.
    pub sha256: String,
    /// Its signature.
    pub signature: Signature,
}

/// A capability a plugin asks for, and what granting it means.
#[derive(Debug, Clone, Serialize)]
pub struct CapabilityRow {
    /// The capability.
    pub name: String,
    /// What the host grants with it.
    pub meaning: String,
}

/// A reward plugin a package uses.
#[derive(Debug, Clone, Serialize)]
pub struct DependencyRow {
    /// `owner/name`.
    pub name: String,
    /// Semver requirement.
    pub req: String,
}

/// One published evaluation, as the package page's table shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EvalRow {
    /// Its id: the hex sha256 of the summary's bytes.
    pub id: String,
    /// The environment version evaluated.
    pub version: semver::Version,
    /// The model.
    pub model: String,
    /// The split.
    pub split: String,
    /// Examples evaluated.
    pub examples: usize,
    /// Rollouts per example (k).
    pub rollouts_per_example: usize,
    /// Mean reward.
    pub reward: f64,
    /// Avg@k.
    pub avg_at_k: f64,
    /// Pass@k by k.
    pub pass_at_k: Vec<(usize, f64)>,
    /// Every metric's mean.
    pub metrics: Vec<(String, f64)>,
    /// Sampling.
    pub sampling: crate::evals::EvalSampling,
    /// Environment arguments.
    pub env_args: String,
    /// When it finished.
    pub date: String,
    /// The host version that ran it.
    pub host_version: String,
    /// The owner who published it.
    pub publisher: String,
    /// The fingerprint of the key that signed it.
    pub fingerprint: String,
}

/// One line of a package's leaderboard: a model's best Avg@k on a split.
#[derive(Debug, Clone, Serialize)]
pub struct LeaderRow {
    /// The model.
    pub model: String,
    /// The split.
    pub split: String,
    /// The environment version of that evaluation.
    pub version: semver::Version,
    /// Its best Avg@k there.
    pub avg_at_k: f64,
    /// k (rollouts per example) of that evaluation.
    pub k: usize,
    /// Examples of that evaluation.
    pub examples: usize,
    /// The evaluation it comes from.
    pub id: String,
}

/// The leaderboard of `evals`: each (model, split)'s best Avg@k (ties: the earlier one), best
/// first.
pub fn leaderboard(evals: &[EvalRow]) -> Vec<LeaderRow> {
    let mut best: Vec<LeaderRow> = Vec::new();
    // Oldest first, so a later tie does not displace the first to reach a score.
    for e in evals.iter().rev() {
        let row = LeaderRow {
            model: e.model.clone(),
            split: e.split.clone(),
            version: e.version.clone(),
            avg_at_k: e.avg_at_k,
            k: e.rollouts_per_example,
            examples: e.examples,
            id: e.id.clone(),
        };
        match best
            .iter_mut()
            .find(|b| b.model == e.model && b.split == e.split)
        {
            Some(b) if e.avg_at_k > b.avg_at_k => *b = row,
            Some(_) => {}
            None => best.push(row),
        }
    }
    best.sort_by(|a, b| {
        b.avg_at_k
            .total_cmp(&a.avg_at_k)
            .then_with(|| a.model.cmp(&b.model))
    });
    best
}

/// `/owner/name`: everything about a package.
#[derive(Debug, Clone, Serialize)]
pub struct PackagePage {
    /// `owner/name`.
    pub name: String,
    /// The publisher.
    pub owner: String,
    /// The plugin's name without its owner.
    pub plugin: String,
    /// The version shown (`?version=`, else the newest not yanked, else the newest).
    pub version: semver::Version,
    /// The version shown is yanked.
    pub yanked: bool,
    /// The newest version that is not yanked, if any.
    pub latest: Option<semver::Version>,
    /// The command that installs the version shown.
    pub install: String,
    /// Environment or reward function.
    pub kind: PluginKind,
    /// `component`, `extism`, `python` or `native`.
    pub runtime: String,
    /// ABI targeted by the version shown.
    pub abi: String,
    /// Oldest host that runs the version shown.
    pub min_host: Option<semver::Version>,
    /// One line for humans.
    pub description: String,
    /// SPDX license.
    pub license: Option<String>,
    /// Search tags.
    pub tags: Vec<String>,
    /// Every version, newest first.
    pub versions: Vec<VersionRow>,
    /// Capabilities the version shown asks for.
    pub capabilities: Vec<CapabilityRow>,
    /// Dataset splits it ships.
    pub datasets: Vec<DatasetSource>,
    /// Environment arguments it accepts.
    pub args: Vec<EnvArg>,
    /// Reward plugins it uses.
    pub dependencies: Vec<DependencyRow>,
    /// The package's README.md (Markdown), if it has one.
    pub readme: Option<String>,
    /// How to pass the first environment argument to `host eval`, quoted for a shell.
    pub args_example: Option<String>,
    /// Published evaluations, newest first (at most [`MAX_LISTED_EVALS`]).
    pub evaluations: Vec<EvalRow>,
    /// Evaluations published in all.
    pub evaluations_total: usize,
    /// Each model's best Avg@k per split, best first.
    pub leaderboard: Vec<LeaderRow>,
}

/// What the hub reads from inside a package (cached by checksum: packages never change).
#[derive(Debug)]
struct PackageFiles {
    manifest: Manifest,
    readme: Option<String>,
}

/// The hub over a directory registry.
pub struct Hub {
    registry: DirRegistry,
    files: Mutex<HashMap<String, Arc<PackageFiles>>>,
    /// Published evaluations by id (their bytes never change).
    evals: Mutex<HashMap<String, Arc<EvalRow>>>,
    /// Signature checks by (checksum, key, signature).
    signatures: Mutex<HashMap<(String, String, String), bool>>,
}

/// Errors building a page.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// No such package, version or owner.
    #[error("{0}")]
    NotFound(String),
    /// The registry failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

fn runtime_label(entry: &IndexEntry, manifest: Option<&Manifest>) -> String {
    let python = manifest
        .is_some_and(|m| m.python.is_some() || m.plugin.language.as_deref() == Some("python"));
    match (entry.runtime, python) {
        (Runtime::Wasm, true) => "python",
        (Runtime::Wasm, false) => "component",
        (Runtime::Extism, _) => "extism",
        (Runtime::Native, _) => "native",
    }
    .to_owned()
}

/// What granting a capability means, for the page.
pub fn capability_meaning(name: &str) -> &'static str {
    match name {
        "sandbox.python" => {
            "runs model-written Python in the host's WebAssembly sandbox (CPython for WASI, no \
             network, no host files, time and memory limits per call)"
        }
        _ => "unknown to this registry",
    }
}

/// The shell command that passes `args` to `host eval` (`-a '{…}'`), quoted for a POSIX shell.
fn args_example(plugin: &str, args: &[EnvArg]) -> Option<String> {
    let first = args.first()?;
    let value: serde_json::Value = first
        .default
        .as_deref()
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or(serde_json::Value::Null);
    let json = serde_json::json!({ first.name.clone(): value }).to_string();
    Some(format!(
        "host eval {plugin} -a '{}'",
        json.replace('\'', "'\\''")
    ))
}

/// Most evaluations a page lists (the leaderboard ranks them all).
pub const MAX_LISTED_EVALS: usize = 100;
impl Hub {
    /// The hub of `registry`.
    pub fn new(registry: DirRegistry) -> Self {
        Self {
            registry,
            files: Mutex::new(HashMap::new()),
            evals: Mutex::new(HashMap::new()),
            signatures: Mutex::new(HashMap::new()),
        }
    }

    fn files(&self, entry: &IndexEntry) -> Result<Arc<PackageFiles>, RegistryError> {
        if let Some(f) = self.files.lock().expect("lock").get(&entry.cksum) {
            return Ok(f.clone());
        }
        let packed = self.registry.artifact(&entry.cksum)?;
        let corrupt = |message: String| RegistryError::Corrupt {
            root: self.registry.root().display().to_string(),
            message: format!("{}@{}: {message}", entry.name, entry.vers),
        };
        let mut found = crate::package::read_files(&packed, &["plugin.toml", "README.md"])
            .map_err(|e| corrupt(e.to_string()))?;
        let manifest_text = found
            .remove("plugin.toml")
            .ok_or_else(|| corrupt("no plugin.toml".into()))?;
        let manifest = Manifest::parse(&String::from_utf8_lossy(&manifest_text), &entry.name)
            .map_err(|e| corrupt(e.to_string()))?;
        let readme = found
            .remove("README.md")
            .map(|b| String::from_utf8_lossy(&b).into_owned());
        let files = Arc::new(PackageFiles { manifest, readme });
        self.files
            .lock()
            .expect("lock")
            .insert(entry.cksum.clone(), files.clone());
        Ok(files)
    }

    fn listed(&self, entry: &IndexEntry) -> Result<ListedPackage, RegistryError> {
        let name: PackageName = entry.name.parse()?;
        let files = self.files(entry).ok();
        Ok(ListedPackage {
            name: entry.name.clone(),
            owner: name.owner().to_owned(),
            version: entry.vers.clone(),
            description: entry.description.clone(),
            kind: entry.kind,
            abi: entry.abi.clone(),
            runtime: runtime_label(entry, files.as_ref().map(|f| &f.manifest)),
            capabilities: entry.capabilities.clone(),
            evaluations: self.registry.eval_ids(&name)?.len(),
        })
    }

    /// Every evaluation of `name`, newest first (parsed once per process).
    fn eval_rows(&self, name: &PackageName) -> Result<Vec<Arc<EvalRow>>, RegistryError> {
        let mut rows = Vec::new();
        for id in self.registry.eval_ids(name)? {
            if let Some(row) = self.evals.lock().expect("lock").get(&id) {
                rows.push(row.clone());
                continue;
            }
            let Some(stored) = self.registry.eval(name, &id)? else {
                continue;
            };
            let Ok(s) = stored.parsed() else {
                continue;
            };
            let row = Arc::new(EvalRow {
                id: stored.cksum.clone(),
                version: s.plugin_version,
                model: s.model,
                split: s.split,
                examples: s.examples,
                rollouts_per_example: s.rollouts_per_example,
                reward: s.reward,
                avg_at_k: s.avg_at_k,
                pass_at_k: s.pass_at_k,
                metrics: s.metrics,
                sampling: s.sampling,
                env_args: s.env_args,
                date: s.date,
                host_version: s.host_version,
                publisher: stored.publisher.clone(),
                fingerprint: crate::sign::fingerprint(&stored.key),
            });
            self.evals.lock().expect("lock").insert(id, row.clone());
            rows.push(row);
        }
        rows.sort_by(|a, b| b.date.cmp(&a.date).then_with(|| a.id.cmp(&b.id)));
        Ok(rows)
    }

    fn signature_holds(&self, e: &IndexEntry, key: &str, sig: &str) -> bool {
        let k = (e.cksum.clone(), key.to_owned(), sig.to_owned());
        if let Some(&ok) = self.signatures.lock().expect("lock").get(&k) {
            return ok;
        }
        let ok = crate::sign::verify(key, sig, &e.name, &e.vers, &e.cksum).is_ok();
        self.signatures.lock().expect("lock").insert(k, ok);
        ok
    }

    /// The index page: packages whose name or description contains `query`, as
    /// `host env search` finds them.
    pub fn index(&self, query: &str) -> Result<IndexPage, HubError> {
        let mut page = IndexPage {
            query: query.to_owned(),
            environments: Vec::new(),
            rewards: Vec::new(),
        };
        for entry in self.registry.search(query)? {
            let listed = self.listed(&entry)?;
            match entry.kind {
                PluginKind::Environment => page.environments.push(listed),
                PluginKind::Reward => page.rewards.push(listed),
            }
        }
        Ok(page)
    }

    /// One publisher's page.
    pub fn owner(&self, owner: &str) -> Result<OwnerPage, HubError> {
        let mut packages = Vec::new();
        for full in self.registry.packages()? {
            let name: PackageName = full.parse().map_err(RegistryError::from)?;
            if name.owner() != owner {
                continue;
            }
            let entries = self.registry.entries(&name)?;
            let shown = crate::dir::newest_listed(&entries)
                .or_else(|| entries.iter().max_by(|a, b| a.vers.cmp(&b.vers)));
            if let Some(e) = shown {
                packages.push(self.listed(e)?);
            }
        }
        let config = self.registry.config()?;
        let keys: Vec<KeyRow> = config
            .keys
            .get(owner)
            .into_iter()
            .flatten()
            .map(|k| KeyRow {
                key: k.clone(),
                fingerprint: crate::sign::fingerprint(k),
            })
            .collect();
        if packages.is_empty() && keys.is_empty() {
            return Err(HubError::NotFound(format!("no publisher {owner:?} here")));
        }
        Ok(OwnerPage {
            owner: owner.to_owned(),
            keys,
            packages,
        })
    }

    /// A package's page, for `version` (default: the newest not yanked, else the newest).
    pub fn package(
        &self,
        name: &PackageName,
        version: Option<&semver::Version>,
    ) -> Result<PackagePage, HubError> {
        let mut entries = self.registry.entries(name)?;
        if entries.is_empty() {
            return Err(HubError::NotFound(format!("no package {name} here")));
        }
        entries.sort_by(|a, b| b.vers.cmp(&a.vers));
        let latest = crate::dir::newest_listed(&entries).map(|e| e.vers.clone());
        let shown = match version {
            Some(v) => entries
                .iter()
                .find(|e| e.vers == *v)
                .ok_or_else(|| HubError::NotFound(format!("{name}@{v} is not published here")))?,
            None => crate::dir::newest_listed(&entries).unwrap_or(&entries[0]),
        };
        let files = self.files(shown)?;
        let config = self.registry.config()?;
        let pinned_keys = config.keys.get(name.owner());
        let versions = entries
            .iter()
            .map(|e| {
                let state = match (&e.sig, &e.key) {
                    (Some(sig), Some(key)) => match self.signature_holds(e, key, sig) {
                        true => SignatureState::Verified,
                        false => SignatureState::Invalid,
                    },
                    _ => SignatureState::Unsigned,
                };
                VersionRow {
                    version: e.vers.clone(),
                    yanked: e.yanked,
                    abi: e.abi.clone(),
                    min_host: e.min_host.clone(),
                    sha256: e.cksum.clone(),
                    signature: Signature {
                        state,
                        key: e.key.clone(),
                        fingerprint: e.key.as_deref().map(crate::sign::fingerprint),
                        pinned: e
                            .key
                            .as_ref()
                            .is_some_and(|k| pinned_keys.is_some_and(|keys| keys.contains(k))),
                    },
                }
            })
            .collect();
        // `owner/name@X` means `^X`: only the listed release resolves to itself.
        let exact =
            shown.yanked || latest.as_ref() != Some(&shown.vers) || !shown.vers.pre.is_empty();
        let install = format!(
            "host env install {name}@{}{}",
            if exact { "=" } else { "" },
            shown.vers
        );
        let m = &files.manifest;
        let all: Vec<EvalRow> = self
            .eval_rows(name)?
            .iter()
            .map(|r| EvalRow::clone(r))
            .collect();
        let board = leaderboard(&all);
        let evaluations_total = all.len();
        let evaluations: Vec<EvalRow> = all.into_iter().take(MAX_LISTED_EVALS).collect();
        Ok(PackagePage {
            name: name.to_string(),
            owner: name.owner().to_owned(),
            plugin: name.name().to_owned(),
            version: shown.vers.clone(),
            yanked: shown.yanked,
            latest,
            install,
            kind: shown.kind,
            runtime: runtime_label(shown, Some(m)),
            abi: shown.abi.clone(),
            min_host: shown.min_host.clone(),
            description: shown.description.clone(),
            license: m.plugin.license.clone(),
            tags: m.plugin.tags.clone(),
            versions,
            capabilities: m
                .plugin
                .capabilities
                .iter()
                .map(|c| CapabilityRow {
                    name: c.clone(),
                    meaning: capability_meaning(c).to_owned(),
                })
                .collect(),
            datasets: m.datasets.clone(),
            args: m.args.clone(),
            dependencies: m
                .dependencies
                .iter()
                .map(|(n, r)| DependencyRow {
                    name: n.clone(),
                    req: r.to_string(),
                })
                .collect(),
            readme: files.readme.clone(),
            args_example: args_example(name.name(), &m.args),
            leaderboard: board,
            evaluations_total,
            evaluations,
        })
    }
}

pub mod render;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, model: &str, split: &str, avg: f64) -> EvalRow {
        EvalRow {
            id: id.into(),
            version: semver::Version::new(0, 1, 0),
            model: model.into(),
            split: split.into(),
            examples: 10,
            rollouts_per_example: 4,
            reward: avg,
            avg_at_k: avg,
            pass_at_k: vec![],
            metrics: vec![],
            sampling: Default::default(),
            env_args: "{}".into(),
            date: String::new(),
            host_version: String::new(),
            publisher: "will".into(),
            fingerprint: String::new(),
        }
    }

    #[test]
    fn argument_examples_are_quoted_for_a_shell() {
        let arg = |name: &str, default: Option<&str>| EnvArg {
            name: name.into(),
            kind: crate::ArgType::String,
            default: default.map(str::to_owned),
            description: String::new(),
        };
        assert_eq!(
            args_example("m", &[arg("tools", Some("\"python\""))]).unwrap(),
            "host eval m -a '{\"tools\":\"python\"}'"
        );
        assert_eq!(
            args_example("m", &[arg("p", Some("\"it's $(id)\""))]).unwrap(),
            "host eval m -a '{\"p\":\"it'\\''s $(id)\"}'"
        );
        assert_eq!(
            args_example("m", &[arg("p", None)]).unwrap(),
            "host eval m -a '{\"p\":null}'"
        );
        assert!(args_example("m", &[]).is_none());
    }

    #[test]
    fn the_leaderboard_keeps_each_models_best_per_split() {
        // Newest first, as the page lists them.
        let evals = [
            row("e4", "b", "test", 0.5),
            row("e3", "a", "test", 0.7),
            row("e2", "a", "test", 0.7),
            row("e1", "a", "test", 0.4),
            row("e0", "a", "train", 0.9),
        ];
        let board: Vec<(String, String, f64, String)> = leaderboard(&evals)
            .into_iter()
            .map(|r| (r.model, r.split, r.avg_at_k, r.id))
            .collect();
        let want = [
            ("a", "train", 0.9, "e0"),
            ("a", "test", 0.7, "e2"),
            ("b", "test", 0.5, "e4"),
        ];
        assert_eq!(
            board,
            want.map(|(m, s, a, i)| (m.to_owned(), s.to_owned(), a, i.to_owned()))
        );
    }
}
