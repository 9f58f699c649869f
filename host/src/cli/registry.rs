//! `host registry …`: create registries and publisher keys.

use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Not built yet (serve arrives with the HTTP registry).
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
        RegistryCommand::Other(words) => {
            let sub = words.first().map(String::as_str).unwrap_or("");
            return Err(super::not_implemented(&format!("registry {sub}")));
        }
    }
    Ok(ExitCode::SUCCESS)
}
