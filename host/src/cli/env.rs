//! `host env …`: environment plugins.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::plugin::template::{self, SdkSource};

/// Arguments of `host env`.
#[derive(Debug, Args)]
pub struct EnvArgs {
    #[command(subcommand)]
    command: EnvCommand,
}

#[derive(Debug, Subcommand)]
enum EnvCommand {
    /// Create a new environment plugin project from the SDK template.
    Init {
        /// Plugin name (`[a-z0-9-]`, starting with a letter).
        name: String,
        /// Folder to create (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Publisher name written into plugin.toml.
        #[arg(long, default_value = "me")]
        owner: String,
        /// Path of the rlhost SDK to depend on (default: the SDK this host was built from, if
        /// present, else the published SDK).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Not built yet: install, list, remove, pack, publish arrive with the registry.
    #[command(external_subcommand)]
    Other(Vec<String>),
}

pub(super) fn run(args: EnvArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        EnvCommand::Init {
            name,
            dir,
            owner,
            sdk,
        } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            let sdk = match sdk {
                Some(path) => SdkSource::Path(
                    path.canonicalize()
                        .with_context(|| format!("--sdk {}", path.display()))?,
                ),
                None => SdkSource::default_for_this_host(),
            };
            let files = template::init(&dir, &name, &owner, &sdk)
                .with_context(|| format!("creating plugin project {}", dir.display()))?;
            println!("created {} ({} files)", dir.display(), files.len());
            println!(
                "next: cd {} && cargo build --release   # builds target/wasm32-wasip2/release/{}.wasm",
                dir.display(),
                name.replace('-', "_")
            );
            Ok(ExitCode::SUCCESS)
        }
        EnvCommand::Other(words) => {
            let sub = words.first().map(String::as_str).unwrap_or("");
            Err(super::not_implemented(&format!("env {sub}")))
        }
    }
}
