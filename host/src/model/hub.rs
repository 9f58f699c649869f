//! Model names: a local folder, or a Hugging Face hub id (`Qwen/Qwen3-8B`, `Qwen/Qwen3-8B@rev`)
//! resolved like `transformers` does — a folder of that name wins; otherwise the snapshot in the
//! local HF cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`); otherwise
//! a download from the hub (`$HF_ENDPOINT`, default `https://huggingface.co`; `$HF_TOKEN` or the
//! cached token for gated models) into that cache, unless `$HF_HUB_OFFLINE` is set. A name that
//! cannot be resolved is an error listing every place that was tried.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use super::ModelError;

/// Files fetched with the weights: a folder needs the first; the rest are taken when present.
const REQUIRED: &str = "config.json";
const OPTIONAL: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "vocab.json",
];

/// Whether `name` has the shape of a hub id: `owner/name`, optionally `@revision`.
pub fn is_hub_id(name: &str) -> bool {
    let id = name.split_once('@').map_or(name, |(id, _)| id);
    let mut parts = id.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The hub cache folder: `$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE").filter(|v| !v.is_empty()) {
        return dir.into();
    }
    if let Some(home) = std::env::var_os("HF_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home).join("hub");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/huggingface/hub")
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "TRUE" | "yes"))
}

/// Whether `dir` holds a loadable checkpoint: config + single or sharded safetensors.
fn complete(dir: &Path) -> bool {
    if !dir.join(REQUIRED).is_file() {
        return false;
    }
    if dir.join("model.safetensors").is_file() {
        return true;
    }
    match shards(&dir.join("model.safetensors.index.json")) {
        Some(files) => files.iter().all(|f| dir.join(f).is_file()),
        None => false,
    }
}

/// The shard files a `model.safetensors.index.json` names.
fn shards(index: &Path) -> Option<Vec<String>> {
    let text = rlhost_fs::read_to_string(index, super::files::CHECKPOINT_INDEX).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let mut files: Vec<String> = v["weight_map"]
        .as_object()?
        .values()
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    files.sort();
    files.dedup();
    Some(files)
}

fn repo(id: &str) -> Repo {
    match id.split_once('@') {
        Some((id, rev)) => Repo::with_revision(id.into(), RepoType::Model, rev.into()),
        None => Repo::new(id.into(), RepoType::Model),
    }
}

/// The folder of model `name` (see the module docs), downloading it when needed and allowed.
pub fn resolve(name: &str) -> Result<PathBuf, ModelError> {
    let as_path = Path::new(name);
    if as_path.is_dir() {
        return Ok(as_path.to_owned());
    }
    let mut looked = vec![format!("no folder {}", as_path.display())];
    if !is_hub_id(name) {
        return Err(ModelError::NotFound {
            name: name.into(),
            looked,
        });
    }
    let cache = Cache::new(cache_dir());
    let cached = cache.repo(repo(name)).get(REQUIRED);
    if let Some(dir) = cached.as_deref().and_then(Path::parent)
        && complete(dir)
    {
        return Ok(dir.to_owned());
    }
    looked.push(format!(
        "no complete snapshot in the Hugging Face cache {} (set HF_HOME or HF_HUB_CACHE to use another)",
        cache.path().display()
    ));
    if offline() {
        looked.push("HF_HUB_OFFLINE is set: no download tried".into());
        return Err(ModelError::NotFound {
            name: name.into(),
            looked,
        });
    }
    download(name, cache).map_err(|why| {
        looked.push(why);
        ModelError::NotFound {
            name: name.into(),
            looked,
        }
    })
}

/// Fetches config, tokenizer files and weights of `id` into `cache`; returns the snapshot folder.
fn download(id: &str, cache: Cache) -> Result<PathBuf, String> {
    let endpoint =
        std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".to_string());
    let token = std::env::var("HF_TOKEN").ok().or_else(|| cache.token());
    let api = ApiBuilder::from_cache(cache)
        .with_endpoint(endpoint.clone())
        .with_token(token)
        .with_progress(true)
        .with_retries(2)
        .build()
        .map_err(|e| format!("cannot start a hub client: {e}"))?;
    let remote = api.repo(repo(id));
    let failed = |file: &str, e: hf_hub::api::sync::ApiError| {
        format!("downloading {file} from {endpoint} failed: {e}")
    };
    let not_found = |e: &hf_hub::api::sync::ApiError| e.to_string().contains("404");
    tracing::info!(model = id, %endpoint, "downloading from the Hugging Face hub");
    let config = remote.get(REQUIRED).map_err(|e| failed(REQUIRED, e))?;
    let dir = config
        .parent()
        .ok_or_else(|| "the cache returned a path without a folder".to_string())?
        .to_owned();
    for file in OPTIONAL {
        match remote.get(file) {
            Ok(_) => {}
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(failed(file, e)),
        }
    }
    match remote.get("model.safetensors.index.json") {
        Ok(index) => {
            let files =
                shards(&index).ok_or_else(|| format!("{} names no shards", index.display()))?;
            for file in files {
                remote.get(&file).map_err(|e| failed(&file, e))?;
            }
        }
        Err(e) if not_found(&e) => {
            remote
                .get("model.safetensors")
                .map_err(|e| failed("model.safetensors", e))?;
        }
        Err(e) => return Err(failed("model.safetensors.index.json", e)),
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_are_told_from_paths() {
        for id in ["Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B@main", "a_b/c.d-e"] {
            assert!(is_hub_id(id), "{id}");
        }
        for p in [
            "model",
            "./a/b",
            "/abs/path",
            "a/b/c",
            "../x",
            "a/",
            "a b/c",
            "./x",
        ] {
            assert!(!is_hub_id(p), "{p}");
        }
    }
}
