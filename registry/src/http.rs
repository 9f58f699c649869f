//! The HTTP client of an rlhost registry server (see [`crate::server`] for the routes).

use async_trait::async_trait;

use crate::backend::{Publication, RegistryBackend};
use crate::error::RegistryError;
use crate::index::{IndexEntry, RegistryConfig};
use crate::name::PackageName;

/// A registry served over HTTP.
pub struct HttpRegistry {
    url: String,
    base: String,
    client: reqwest::Client,
}

impl HttpRegistry {
    /// A client for the registry at `url`.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            base: url.trim_end_matches('/').to_owned(),
            client: reqwest::Client::new(),
        }
    }

    fn fail(&self, message: impl std::fmt::Display) -> RegistryError {
        RegistryError::Http {
            url: self.url.clone(),
            status: 0,
            message: message.to_string(),
        }
    }

    /// Sends a request; a non-success status becomes an error carrying the server's message.
    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, RegistryError> {
        let resp = req.send().await.map_err(|e| self.fail(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or(body);
        Err(RegistryError::Http {
            url: self.url.clone(),
            status,
            message,
        })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T, RegistryError> {
        let resp = self
            .send(self.client.get(format!("{}{path}", self.base)))
            .await?;
        let bytes = resp.bytes().await.map_err(|e| self.fail(e))?;
        serde_json::from_slice(&bytes).map_err(|e| self.fail(format!("{path}: {e}")))
    }
}

#[async_trait]
impl RegistryBackend for HttpRegistry {
    fn url(&self) -> &str {
        &self.url
    }

    async fn config(&self) -> Result<RegistryConfig, RegistryError> {
        self.get_json("/config.json").await
    }

    async fn entries(&self, name: &PackageName) -> Result<Vec<IndexEntry>, RegistryError> {
        let full_name = name.as_str();
        let req = self.client.get(format!("{}/index/{full_name}", self.base));
        let resp = match self.send(req).await {
            Ok(r) => r,
            Err(RegistryError::Http { status: 404, .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let text = resp.text().await.map_err(|e| self.fail(e))?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).map_err(|e| self.fail(format!("index/{full_name}: {e}")))
            })
            .collect()
    }

    async fn packages(&self) -> Result<Vec<String>, RegistryError> {
        self.get_json("/api/v1/packages").await
    }

    async fn artifact(&self, cksum: &str) -> Result<Vec<u8>, RegistryError> {
        if cksum.len() != 64 || !cksum.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.fail(format!("bad checksum {cksum:?} in the index")));
        }
        let config = self.config().await?;
        let rel = config.dl.replace("{cksum}", cksum);
        let url = if rel.starts_with("http://") || rel.starts_with("https://") {
            rel
        } else {
            format!("{}/{}", self.base, rel.trim_start_matches('/'))
        };
        let resp = self.send(self.client.get(url)).await?;
        let len = resp.content_length().unwrap_or(0);
        if len > crate::package::MAX_PACKED_BYTES {
            return Err(self.fail(format!("artifact of {len} bytes is over the limit")));
        }
        Ok(resp.bytes().await.map_err(|e| self.fail(e))?.to_vec())
    }

    async fn search(&self, query: &str) -> Result<Vec<IndexEntry>, RegistryError> {
        let req = self
            .client
            .get(format!("{}/api/v1/search", self.base))
            .query(&[("q", query)]);
        let resp = self.send(req).await?;
        let bytes = resp.bytes().await.map_err(|e| self.fail(e))?;
        serde_json::from_slice(&bytes).map_err(|e| self.fail(e))
    }

    async fn publish(&self, p: Publication<'_>) -> Result<IndexEntry, RegistryError> {
        let mut query = vec![("sig", p.sig.to_owned()), ("key", p.public_key.to_owned())];
        if let Some(v) = p.min_host {
            query.push(("min_host", v.to_string()));
        }
        let mut req = self
            .client
            .put(format!("{}/api/v1/publish", self.base))
            .query(&query)
            .body(p.packed.to_vec());
        if let Some(t) = p.token {
            req = req.bearer_auth(t);
        }
        let resp = self.send(req).await?;
        let bytes = resp.bytes().await.map_err(|e| self.fail(e))?;
        serde_json::from_slice(&bytes).map_err(|e| self.fail(e))
    }

    async fn yank(
        &self,
        full_name: &PackageName,
        version: &semver::Version,
        yanked: bool,
        token: Option<&str>,
    ) -> Result<(), RegistryError> {
        let body = serde_json::json!({"name": full_name.as_str(), "version": version.to_string(), "yanked": yanked});
        let mut req = self
            .client
            .post(format!("{}/api/v1/yank", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        self.send(req).await.map(|_| ())
    }

    async fn publish_eval(
        &self,
        e: crate::evals::EvalPublication<'_>,
    ) -> Result<crate::evals::StoredEval, RegistryError> {
        let mut req = self
            .client
            .put(format!("{}/api/v1/evals", self.base))
            .query(&[("sig", e.sig), ("key", e.public_key)])
            .header("content-type", "application/json")
            .body(e.summary.to_vec());
        if let Some(t) = e.token {
            req = req.bearer_auth(t);
        }
        let resp = self.send(req).await?;
        let bytes = resp.bytes().await.map_err(|e| self.fail(e))?;
        serde_json::from_slice(&bytes).map_err(|e| self.fail(e))
    }
}
