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
    /// Trust a publisher key for an owner of a registry (replacing the pinned keys), or list
    /// what is trusted. Keys are otherwise pinned the first time a registry is used.
    Trust {
        /// The registry URL (default: the configured registry).
        #[arg(long)]
        registry: Option<String>,
        /// The owner.
        #[arg(long, requires = "key")]
        owner: Option<String>,
        /// The public key (hex) to trust for the owner.
        #[arg(long)]
        key: Option<String>,
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
        /// Connection cap and deadlines.
        #[command(flatten)]
        limits: rlhost_serve::ServeLimits,
    },
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
        RegistryCommand::Trust {
            registry,
            owner,
            key,
        } => {
            let home = crate::home::RlhostHome::from_env()?;
            let url = match registry {
                Some(u) => u,
                None => {
                    home.registry(std::env::var(crate::home::REGISTRY_ENV).ok())?
                        .url
                }
            };
            let path = home.root().join("trust.json");
            let mut store = rlhost_registry::TrustStore::load(&path)?;
            if let (Some(owner), Some(key)) = (owner, key) {
                // Pinned in its canonical spelling (lowercase hex), as the registry stores keys.
                let key = rlhost_registry::sign::canonical_public_key(&key)
                    .context("--key: not a publisher key")?;
                store
                    .registries
                    .entry(url.clone())
                    .or_default()
                    .insert(owner.clone(), vec![key.clone()]);
                store.save(&path)?;
                println!("trusting {key} for {owner} at {url}");
            } else {
                for (owner, keys) in store.registries.get(&url).into_iter().flatten() {
                    println!("{owner}: {}", keys.join(", "));
                }
            }
        }
        RegistryCommand::Token { root, owner } => {
            DirRegistry::open(&root, false)?;
            println!(
                "{}",
                rlhost_registry::tokens::TokenStore::issue(&root, &owner)?
            );
        }
        RegistryCommand::Serve { root, addr, limits } => {
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
                rlhost_registry::server::serve(&root, listener, limits, shutdown).await?;
                anyhow::Ok(())
            })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
