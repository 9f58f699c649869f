//! `host registry …`: create registries and publisher keys.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use rlhost_registry::{DirRegistry, PublisherKey};

/// Arguments of `host registry`.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    #[command(subcommand)]
    command: RegistryCommand,
}

#[derive(Debug, Subcommand)]
enum RegistryCommand {
    /// Create a directory registry (config.json, index/, artifacts/).
    Init {
        /// Its folder.
        #[arg(long)]
        root: PathBuf,
    },
    /// Create a publisher key pair: the secret key file (mode 0600); prints the public key.
    Keygen {
        /// Where to write the secret key.
        #[arg(long)]
        out: PathBuf,
    },
    /// Accept a publisher key for an owner in a directory registry.
    AddKey {
        /// The registry's folder.
        #[arg(long)]
        root: PathBuf,
        /// The owner the key may publish for.
        #[arg(long)]
        owner: String,
        /// The public key (hex), or use --key-file.
        #[arg(long, conflicts_with = "key_file")]
        key: Option<String>,
        /// A secret key file whose public half to accept.
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Issue a publish token for an owner (stored hashed; printed once).
    Token {
        /// The registry's folder.
        #[arg(long)]
        root: PathBuf,
        /// The owner the token publishes for.
        #[arg(long)]
        owner: String,
    },
    /// Serve a directory registry over HTTP until interrupted.
    Serve {
        /// The registry's folder.
        #[arg(long)]
        root: PathBuf,
        /// Address to listen on (port 0 picks a free one; the chosen address is printed).
        #[arg(long, default_value = "127.0.0.1:8730")]
        addr: String,
    },
    /// Not built yet.
    #[command(external_subcommand)]
    Other(Vec<String>),
}

pub(super) fn run(args: RegistryArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        RegistryCommand::Init { root } => {
            DirRegistry::open(&root, true)?;
            println!(
                "registry ready at file://{}",
                root.canonicalize()?.display()
            );
        }
        RegistryCommand::Keygen { out } => {
            if out.exists() {
                anyhow::bail!("{} exists: refusing to overwrite a key", out.display());
            }
            let key = PublisherKey::generate()?;
            key.save(&out)?;
            println!("{}", key.public_hex());
        }
        RegistryCommand::AddKey {
            root,
            owner,
            key,
            key_file,
        } => {
            let public = match (key, key_file) {
                (Some(k), _) => k,
                (None, Some(f)) => PublisherKey::load(&f)?.public_hex(),
                (None, None) => anyhow::bail!("give --key HEX or --key-file FILE"),
            };
            DirRegistry::open(&root, false)?.add_key(&owner, &public)?;
            println!("{owner} may publish with key {public}");
        }
        RegistryCommand::Token { root, owner } => {
            DirRegistry::open(&root, false)?;
            println!(
                "{}",
                rlhost_registry::tokens::TokenStore::issue(&root, &owner)?
            );
        }
        RegistryCommand::Serve { root, addr } => {
            DirRegistry::open(&root, false)?;
            let runtime = super::async_runtime()?;
            runtime.block_on(async {
                let listener = tokio::net::TcpListener::bind(&addr)
                    .await
                    .with_context(|| format!("listening on {addr}"))?;
                let local = listener.local_addr()?;
                println!("listening on http://{local}");
                use std::io::Write;
                std::io::stdout().flush()?;
                let shutdown = async {
                    let _ = tokio::signal::ctrl_c().await;
                };
                rlhost_registry::server::serve(&root, listener, shutdown).await?;
                anyhow::Ok(())
            })?;
        }
        RegistryCommand::Other(words) => {
            let sub = words.first().map(String::as_str).unwrap_or("");
            return Err(super::not_implemented(&format!("registry {sub}")));
        }
    }
    Ok(ExitCode::SUCCESS)
}
