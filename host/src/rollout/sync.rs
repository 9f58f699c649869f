//! Weight updates for remote inference servers, per server kind (`orchestrator.client.
//! weight_sync`): each kind loads a folder of new weights (config.json + safetensors, written by
//! the trainer) through its own route, measured against the real servers where they run here:
//!
//! | kind | route | notes |
//! |---|---|---|
//! | `rlhost` | `POST /update_weights {"model_path"}` | reports the policy version it serves |
//! | `vllm` | `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}`, then `POST /reset_prefix_cache` and `POST /update_weight_version` | routes exist only with `VLLM_SERVER_DEV_MODE=1` |
//! | `sglang` | `POST /update_weights_from_disk {"model_path"}` | flushes its cache itself |
//! | `prime-rl` | `POST /update_weights {"weight_dir"}` | prime-rl's vLLM server; resets the prefix cache itself |
//!
//! With LoRA (`trainer.model.lora`) the trainer publishes its adapter's PEFT folder instead
//! (megabytes, not the model), loaded by rlhost and vLLM servers alike through vLLM's `POST
//! /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace": true}` (vLLM started with
//! `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`; its prefix cache is reset after, as
//! its cached blocks of the adapter's old values would otherwise be reused).
//!
//! Servers other than rlhost's report no policy version in their completions: the client then
//! stamps each completion with the version it tracks ([`OpenAiClient::track_versions`]: the
//! version of the last update that had *returned* when the request was sent), so a rollout
//! requested after the reload of step s returned is version s, and one in flight across a
//! reload counts as the older version.

use std::path::Path;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{GenError, OpenAiClient};
use crate::openai::{self, LoadLoraAdapterRequest, UpdateWeightsRequest, UpdateWeightsResponse};

/// How `host rl` hands each step's weights to remote servers.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum WeightSync {
    /// rlhost's `host inference`: `POST /update_weights {"model_path"}`.
    #[default]
    Rlhost,
    /// Stock vLLM (started with `VLLM_SERVER_DEV_MODE=1`): `POST /collective_rpc`
    /// `reload_weights`, then `POST /reset_prefix_cache`. The served model must have untied
    /// embeddings (`host model untie`): vLLM cannot reload a tied output layer.
    Vllm,
    /// SGLang: `POST /update_weights_from_disk {"model_path"}`.
    Sglang,
    /// prime-rl's vLLM server (`uv run inference`): `POST /update_weights {"weight_dir"}`.
    PrimeRl,
    /// Ask each server what it is (`GET /v1/models`' `owned_by`, then vLLM's `/openapi.json`
    /// routes) and use its kind.
    Auto,
}

impl WeightSync {
    /// The name in configs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rlhost => "rlhost",
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
            Self::PrimeRl => "prime-rl",
            Self::Auto => "auto",
        }
    }
}

/// `POST /collective_rpc` of vLLM's dev-mode server.
#[derive(Debug, Serialize)]
struct CollectiveRpc<'a> {
    method: &'a str,
    kwargs: ReloadKwargs<'a>,
}

/// The arguments of vLLM's `reload_weights`.
#[derive(Debug, Serialize)]
struct ReloadKwargs<'a> {
    weights_path: &'a str,
}

/// `POST /update_weight_version` of vLLM's dev-mode server (read back by `GET /weight_info`).
#[derive(Debug, Serialize)]
struct WeightVersion {
    new_version: String,
}

/// `POST /update_weights_from_disk` of SGLang.
#[derive(Debug, Serialize)]
struct SglangUpdate<'a> {
    model_path: &'a str,
}

/// SGLang's answer to `/update_weights_from_disk`.
#[derive(Debug, Deserialize)]
struct SglangUpdated {
    success: bool,
    #[serde(default)]
    message: String,
}

/// `POST /update_weights` of prime-rl's server.
#[derive(Debug, Serialize)]
struct PrimeRlUpdate<'a> {
    weight_dir: &'a str,
}

/// The routes a FastAPI server (vLLM, SGLang, prime-rl) lists in `GET /openapi.json`.
#[derive(Debug, Deserialize)]
struct OpenApi {
    #[serde(default)]
    paths: serde_json::Map<String, serde_json::Value>,
}

/// What [`OpenAiClient::prepare_sync`] found out about a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncTarget {
    /// The kind whose route updates it (never `Auto`).
    pub kind: WeightSync,
    /// The folder the server loaded its model from, where it says (vLLM's `root`).
    pub root: Option<String>,
    /// vLLM: the server has `POST /update_weight_version` (its `GET /weight_info` then reports
    /// the step of the weights it serves).
    pub version_route: bool,
}

impl SyncTarget {
    /// Whether weight folders for this server must carry an explicit output layer: vLLM's
    /// `reload_weights` loads every layer from the folder, and a folder of a tied model has no
    /// `lm_head.weight`.
    pub fn needs_untied(&self) -> bool {
        matches!(self.kind, WeightSync::Vllm | WeightSync::PrimeRl)
    }
}

impl OpenAiClient {
    /// The server root (`base_url` without the trailing `/v1`).
    fn root(&self) -> &str {
        self.base_url.trim_end_matches("/v1")
    }

    /// Stamps completions that carry no policy version with the version this client tracks,
    /// starting at `version`; [`Self::update_weights`] moves it on once a reload returned.
    pub fn track_versions(self, version: u64) -> Self {
        self.tracked.store(version, Ordering::SeqCst);
        self
    }

    /// Stamps the tracked version on every completion, even where the server reports its own
    /// (in a pool whose other servers report none, so all count versions the same way).
    pub fn pin_versions(&self) {
        self.pinned.store(true, Ordering::SeqCst);
    }

    /// Resolves `sync` for this server (asking it under `auto`) and checks that the server can
    /// take weights that way: the route exists (else the error names the flag or variable that
    /// adds it) and, for vLLM, that the served model's output layer is untied (read from the
    /// `config.json` of the folder it says it loaded, when that folder is readable here).
    /// With `adapters` (LoRA), the base model is never reloaded: its untied layers do not
    /// matter, and only rlhost and vLLM servers take adapters.
    pub async fn prepare_sync(
        &self,
        sync: WeightSync,
        adapters: bool,
    ) -> Result<SyncTarget, GenError> {
        let models = self.models().await?;
        let card = models.data.first();
        let owned_by = card.map(|c| c.owned_by.as_str()).unwrap_or_default();
        let root = card.and_then(|c| c.root.clone());
        let kind = match sync {
            WeightSync::Auto => match owned_by {
                "rlhost" => WeightSync::Rlhost,
                "sglang" => WeightSync::Sglang,
                _ => {
                    let routes = self.routes().await?;
                    if routes.iter().any(|r| r == "/init_broadcaster") {
                        WeightSync::PrimeRl
                    } else if routes.iter().any(|r| r == "/update_weights_from_disk") {
                        WeightSync::Sglang
                    } else if owned_by == "vllm" {
                        WeightSync::Vllm
                    } else {
                        return Err(GenError::Fatal(format!(
                            "weight_sync = \"auto\": {} is neither rlhost, vLLM, SGLang nor \
                             prime-rl (its models are owned by {owned_by:?}); set \
                             orchestrator.client.weight_sync",
                            self.root()
                        )));
                    }
                }
            },
            other => other,
        };
        let mut target = SyncTarget {
            kind,
            root,
            version_route: false,
        };
        if adapters && !matches!(kind, WeightSync::Rlhost | WeightSync::Vllm) {
            return Err(GenError::Fatal(format!(
                "{} is a {} server: LoRA adapters are loaded into rlhost and vLLM servers \
                 (vLLM's /v1/load_lora_adapter)",
                self.root(),
                kind.name()
            )));
        }
        match kind {
            WeightSync::Vllm => {
                let routes = self.routes().await?;
                target.version_route = routes.iter().any(|r| r == "/update_weight_version");
                for needed in ["/collective_rpc", "/reset_prefix_cache"] {
                    if !routes.iter().any(|r| r == needed) {
                        return Err(GenError::Fatal(format!(
                            "{} has no {needed} route: start vLLM with VLLM_SERVER_DEV_MODE=1 \
                             (weight_sync = \"vllm\" reloads weights through it)",
                            self.root()
                        )));
                    }
                }
                if let Some(root) = target.root.as_ref().filter(|_| !adapters) {
                    let cfg = Path::new(root).join("config.json");
                    // The path is the remote server's: bounded like any named file.
                    if let Ok(text) = rlhost_fs::read_to_string(&cfg, crate::model::files::CONFIG)
                        && let Ok(c) = serde_json::from_str::<TieConfig>(&text)
                        && c.tie_word_embeddings
                    {
                        return Err(GenError::Fatal(format!(
                            "{} serves {root}, whose embeddings are tied (tie_word_embeddings in \
                             {}): vLLM's reload_weights cannot reload a tied output layer and \
                             would keep the old one. Serve an untied copy with the same \
                             outputs: `host model untie {root} --out {root}-untied`",
                            self.root(),
                            cfg.display()
                        )));
                    }
                }
            }
            WeightSync::PrimeRl if !self.routes().await?.iter().any(|r| r == "/update_weights") => {
                return Err(GenError::Fatal(format!(
                    "{} has no /update_weights route: start it with prime-rl's `inference` entry \
                     point, not plain vLLM (or set weight_sync = \"vllm\")",
                    self.root()
                )));
            }
            _ => {}
        }
        Ok(target)
    }

    /// The routes the server lists in `GET /openapi.json` (empty when it lists none).
    async fn routes(&self) -> Result<Vec<String>, GenError> {
        let url = format!("{}/openapi.json", self.root());
        let (status, text) = self.send(self.http.get(&url)).await?;
        if status != 200 {
            return Ok(Vec::new());
        }
        let api: OpenApi =
            serde_json::from_str(&text).map_err(|e| GenError::Fatal(format!("GET {url}: {e}")))?;
        Ok(api.paths.keys().cloned().collect())
    }

    /// POSTs `body` to `route` of the server root and fails unless it answers 200; returns the
    /// answer's text.
    async fn post_ok<T: Serialize>(&self, route: &str, body: &T) -> Result<String, GenError> {
        let url = format!("{}{route}", self.root());
        let (status, text) = self.post(&url, body).await?;
        match status {
            200 => Ok(text),
            404 => Err(GenError::Fatal(format!(
                "POST {url}: HTTP 404: the server has no such route ({text})"
            ))),
            _ => Err(GenError::Fatal(format!(
                "POST {url}: HTTP {status}: {text}"
            ))),
        }
    }

    /// Makes the server load the PEFT folder `dir` as adapter `name` (in place when it holds
    /// one of that name), as policy `version`; returns the version the server reports
    /// (rlhost), else `version`. Completions requested from now on are stamped with it where
    /// the server reports none.
    pub async fn load_adapter(
        &self,
        name: &str,
        dir: &Path,
        target: &SyncTarget,
        version: u64,
    ) -> Result<u64, GenError> {
        let body = LoadLoraAdapterRequest {
            lora_name: name.to_owned(),
            lora_path: dir.to_string_lossy().into_owned(),
            load_inplace: true,
        };
        let text = self.post_ok("/v1/load_lora_adapter", &body).await?;
        let served = match target.kind {
            WeightSync::Vllm => {
                // vLLM keys cached blocks by the adapter's id, which an in-place load keeps.
                self.vllm_reloaded(target, version).await?
            }
            _ => {
                let r: UpdateWeightsResponse = openai::parse_response(&text).map_err(|e| {
                    GenError::Fatal(format!("POST {}/v1/load_lora_adapter: {e}", self.root()))
                })?;
                r.policy_version.unwrap_or(version)
            }
        };
        self.tracked.store(served, Ordering::SeqCst);
        Ok(served)
    }

    /// Makes the server load the PEFT folder `dir` (a path the server reads) as a new adapter
    /// `name`, never in place: an adapter already served under that name is refused by the
    /// server, not replaced. For `host eval -b --lora`, which asks for it by `name`.
    pub async fn load_new_adapter(&self, name: &str, dir: &Path) -> Result<(), GenError> {
        let body = LoadLoraAdapterRequest {
            lora_name: name.to_owned(),
            lora_path: dir.to_string_lossy().into_owned(),
            load_inplace: false,
        };
        self.post_ok("/v1/load_lora_adapter", &body).await.map(drop)
    }

    /// Makes the server stop serving the adapter `name` (`POST /v1/unload_lora_adapter`).
    pub async fn unload_adapter(&self, name: &str) -> Result<(), GenError> {
        let body = openai::UnloadLoraAdapterRequest {
            lora_name: name.to_owned(),
            lora_int_id: None,
        };
        self.post_ok("/v1/unload_lora_adapter", &body)
            .await
            .map(drop)
    }

    /// After vLLM reloaded weights or an adapter: its cached KV blocks of the old values are
    /// dropped, and it is told `version` where it has the route. Returns `version`.
    async fn vllm_reloaded(&self, target: &SyncTarget, version: u64) -> Result<u64, GenError> {
        self.post_ok("/reset_prefix_cache", &()).await?;
        if target.version_route {
            let v = WeightVersion {
                new_version: version.to_string(),
            };
            self.post_ok("/update_weight_version", &v).await?;
        }
        Ok(version)
    }

    /// Makes the server load the weights in `dir` the way `target` says, as policy `version`;
    /// returns the version the server reports (rlhost), else `version`. Completions requested
    /// from now on are stamped with it where the server reports none.
    pub async fn update_weights(
        &self,
        dir: &Path,
        target: &SyncTarget,
        version: u64,
    ) -> Result<u64, GenError> {
        let path = dir.to_string_lossy();
        let served = match target.kind {
            WeightSync::Rlhost | WeightSync::Auto => {
                let body = UpdateWeightsRequest {
                    model_path: path.clone().into_owned(),
                };
                let text = self.post_ok("/update_weights", &body).await?;
                let r: UpdateWeightsResponse = openai::parse_response(&text).map_err(|e| {
                    GenError::Fatal(format!("POST {}/update_weights: {e}", self.root()))
                })?;
                r.policy_version.unwrap_or(version)
            }
            WeightSync::Vllm => {
                let rpc = CollectiveRpc {
                    method: "reload_weights",
                    kwargs: ReloadKwargs {
                        weights_path: &path,
                    },
                };
                self.post_ok("/collective_rpc", &rpc).await?;
                self.vllm_reloaded(target, version).await?
            }
            WeightSync::Sglang => {
                let text = self
                    .post_ok(
                        "/update_weights_from_disk",
                        &SglangUpdate { model_path: &path },
                    )
                    .await?;
                let r: SglangUpdated = serde_json::from_str(&text).map_err(|e| {
                    GenError::Fatal(format!(
                        "POST {}/update_weights_from_disk: {e}: {text}",
                        self.root()
                    ))
                })?;
                if !r.success {
                    return Err(GenError::Fatal(format!(
                        "POST {}/update_weights_from_disk: {}",
                        self.root(),
                        r.message
                    )));
                }
                version
            }
            WeightSync::PrimeRl => {
                self.post_ok("/update_weights", &PrimeRlUpdate { weight_dir: &path })
                    .await?;
                version
            }
        };
        self.tracked.store(served, Ordering::SeqCst);
        Ok(served)
    }
}

/// The one field of a model's `config.json` that decides whether vLLM can reload it.
#[derive(Debug, Deserialize)]
struct TieConfig {
    #[serde(default)]
    tie_word_embeddings: bool,
}
