//! The host side of the `host` interface plugins import, shared by every backend (component,
//! native): logging tagged with the plugin's identity, the plugin's data files, the Python
//! sandbox behind its capability, and the rollout seed (kept by each backend's session).

use std::sync::Arc;

use rlhost_sdk::types::{LogLevel, PythonLimits, PythonOutput};

use super::capability::{CapabilityLost, CapabilityStatus, DataDir};
use super::{PluginId, SandboxOffer};
use crate::sandbox::Sandbox;

/// Largest data file a plugin may read in one call.
pub const MAX_DATA_FILE_BYTES: u64 = 256 << 20;

/// What a loaded plugin's host imports act on.
pub(crate) struct HostContext {
    pub plugin: PluginId,
    pub data: Option<DataDir>,
    /// The plugin declared `sandbox.python` and the host granted it.
    pub python_granted: bool,
    pub sandbox: SandboxOffer,
    /// What it runs without, and what it lost while running.
    pub capabilities: CapabilityStatus,
}

impl HostContext {
    pub fn log(&self, level: LogLevel, message: &str) {
        let plugin = &self.plugin;
        match level {
            LogLevel::Trace => tracing::trace!(%plugin, "{message}"),
            LogLevel::Debug => tracing::debug!(%plugin, "{message}"),
            LogLevel::Info => tracing::info!(%plugin, "{message}"),
            LogLevel::Warn => tracing::warn!(%plugin, "{message}"),
            LogLevel::Error => tracing::error!(%plugin, "{message}"),
        }
    }

    pub fn read_data(&self, path: &str) -> Result<Vec<u8>, String> {
        let dir = self
            .data
            .as_ref()
            .ok_or_else(|| super::capability::DataAccessError::NoDataDir.to_string())?;
        dir.read(path, MAX_DATA_FILE_BYTES)
            .map_err(|e| e.to_string())
    }

    pub async fn run_python(
        &self,
        code: &str,
        limits: PythonLimits,
    ) -> Result<PythonOutput, String> {
        if !self.python_granted {
            return Err("capability `sandbox.python` is not granted to this plugin \
                        (declare it in plugin.toml; the host must allow it)"
                .into());
        }
        let sandbox: &Arc<dyn Sandbox> = match &self.sandbox {
            SandboxOffer::Ready(s) => s,
            SandboxOffer::Located(path) => {
                return Err(format!(
                    "the Python sandbox at {} is not started by this host (it only validates \
                     plugins)",
                    path.display()
                ));
            }
            SandboxOffer::Missing(e) => return Err(format!("no Python sandbox: {e}")),
        };
        match sandbox.run_python(code, limits).await {
            Ok(out) => Ok(out),
            Err(e) => {
                // The sandbox itself failed, not the program: every later call would fail too,
                // so the capability is gone and whoever runs rollouts must stop.
                self.capabilities.lose(CapabilityLost {
                    plugin: self.plugin.to_string(),
                    capability: "sandbox.python".into(),
                    source: e.clone(),
                });
                Err(e.to_string())
            }
        }
    }
}
