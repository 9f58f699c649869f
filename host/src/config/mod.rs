//! Config files on the command line, prime-rl style: `host inference @ infer.toml --port 8001`
//! and `host rl --trainer @ train.toml`. A `@ FILE` pair is replaced by the flags its TOML
//! holds, where it stands, so flags written after it override the file. Tables give dotted
//! names (`[model] name = "x"` → `--model.name x`), underscores become hyphens
//! (`max_model_len` → `--max-model-len`), `true` is a bare switch, `false` unsets it (the same switch given earlier is taken
//! back), arrays
//! repeat the flag. After `--PREFIX`, a file's keys are read under that prefix
//! (`--trainer @ f.toml` → `--trainer.…`). A key that names no flag of the command is an error
//! naming the file and the key.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Errors reading config files.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `@` with nothing after it.
    #[error("`@` must be followed by a TOML file")]
    MissingFile,
    /// The file cannot be read within its bounds ([`CONFIG_FILE`]): absent, not a regular
    /// file, too large.
    #[error(transparent)]
    Read(#[from] rlhost_fs::ReadError),
    /// The file is not valid TOML.
    #[error("config {path} is not valid TOML: {message}")]
    Toml {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A key names no flag.
    #[error("config {path}: unknown key `{key}` (`host {command}` has no --{flag} flag)")]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key as written.
        key: String,
        /// The flag it would be.
        flag: String,
        /// The subcommand whose flags the keys are checked against (`rl`, `eval`).
        command: String,
    },
    /// A value that cannot be a flag value (a table inside an array, a date).
    #[error("config {path}: key `{key}` has a value that cannot be passed as a flag")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
}

/// Replaces every `@ FILE` in `args` (program name first) by the flags of FILE, checking
/// the keys against the flags of the subcommand `args` selects in `root`.
pub fn expand(args: Vec<OsString>, root: &clap::Command) -> Result<Vec<OsString>, ConfigError> {
    if !args.iter().any(|a| a == "@") {
        return Ok(args);
    }
    // The subcommand path: leading words that name subcommands.
    let mut cmd = root.clone();
    let mut path = Vec::new();
    for a in args.iter().skip(1) {
        let Some(s) = a.to_str() else { break };
        if s.starts_with('-') {
            continue;
        }
        match cmd.find_subcommand(s) {
            Some(sub) => {
                path.push(s.to_string());
                let sub = sub.clone();
                cmd = sub;
            }
            None => break,
        }
    }
    // Commands that read their own config files (`host rl`) take `@` as it is.
    if cmd.get_arguments().any(|a| a.is_trailing_var_arg_set()) {
        return Ok(args);
    }
    let longs: Vec<(String, bool)> = cmd
        .get_arguments()
        .filter_map(|a| {
            let switch = matches!(
                a.get_action(),
                clap::ArgAction::SetTrue | clap::ArgAction::SetFalse
            );
            a.get_long().map(|l| (l.to_string(), switch))
        })
        .collect();
    let mut out: Vec<OsString> = Vec::with_capacity(args.len());
    let mut it = args.into_iter().peekable();
    while let Some(a) = it.next() {
        if a != "@" {
            out.push(a);
            continue;
        }
        let file = PathBuf::from(it.next().ok_or(ConfigError::MissingFile)?);
        // `--prefix @ file`: the previous word is a prefix, not a flag of its own.
        let prefix = match out.last().and_then(|p| p.to_str()) {
            Some(p) if p.starts_with("--") && !longs.iter().any(|(l, _)| l == &p[2..]) => {
                let p = p[2..].to_string();
                out.pop();
                Some(p)
            }
            _ => None,
        };
        let table = read(&file)?;
        let mut flat = Vec::new();
        flatten(&table, prefix.as_deref().unwrap_or(""), &mut flat);
        for (key, value) in flat {
            let flag = key.replace('_', "-");
            let Some((_, switch)) = longs.iter().find(|(l, _)| *l == flag || *l == key) else {
                return Err(ConfigError::UnknownKey {
                    path: file,
                    key,
                    flag,
                    command: path.join(" "),
                });
            };
            let name = OsString::from(format!("--{flag}"));
            let values: Vec<&toml::Value> = match &value {
                toml::Value::Array(items) => items.iter().collect(),
                v => vec![v],
            };
            for v in values {
                match v {
                    // A switch takes no value: `true` sets it, `false` takes back what came
                    // before (an earlier file's or flag's `--switch`), as a later value would.
                    toml::Value::Boolean(b) if *switch => {
                        out.retain(|a| a != &name);
                        if *b {
                            out.push(name.clone());
                        }
                    }
                    toml::Value::String(s) => out.extend([name.clone(), s.into()]),
                    toml::Value::Integer(i) => out.extend([name.clone(), i.to_string().into()]),
                    toml::Value::Float(f) => out.extend([name.clone(), f.to_string().into()]),
                    toml::Value::Boolean(b) => out.extend([name.clone(), b.to_string().into()]),
                    _ => {
                        return Err(ConfigError::BadValue {
                            path: file.clone(),
                            key: key.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A config file (`@ FILE`, `host rl -c FILE`): hand-written TOML of flags, a few KB. 4 MiB
/// leaves room for generated ones (long environment mixtures, argument tables) and refuses a
/// file that cannot be a config before it is read.
pub const CONFIG_FILE: rlhost_fs::FileLimit = rlhost_fs::FileLimit::new("config file", 4 << 20);

/// The text of the config file `file` someone named, read bounded ([`CONFIG_FILE`]: a regular
/// file, at most 4 MiB).
pub fn read_text(file: &Path) -> Result<String, rlhost_fs::ReadError> {
    rlhost_fs::read_to_string(file, CONFIG_FILE)
}

fn read(file: &Path) -> Result<toml::Table, ConfigError> {
    let text = read_text(file)?;
    text.parse::<toml::Table>().map_err(|e| ConfigError::Toml {
        path: file.to_owned(),
        message: e.to_string(),
    })
}

fn flatten(table: &toml::Table, prefix: &str, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => flatten(t, &key, out),
            other => out.push((key, other.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Debug, Parser)]
    struct Root {
        #[command(subcommand)]
        cmd: Sub,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        #[command(args_override_self = true)]
        Serve {
            #[arg(long = "model.name")]
            model_name: String,
            #[arg(long)]
            max_model_len: Option<usize>,
            #[arg(long)]
            enable_auto_tool_choice: bool,
            #[arg(long)]
            port: Option<u16>,
        },
    }

    fn expand_str(args: &[&str]) -> Result<Vec<String>, ConfigError> {
        let args = args.iter().map(OsString::from).collect();
        Ok(expand(args, &Root::command())?
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect())
    }

    #[test]
    fn files_become_flags_and_later_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("infer.toml");
        std::fs::write(
            &f,
            "max_model_len = 2048\nenable_auto_tool_choice = true\nport = 8000\n[model]\nname = \"m\"\n",
        )
        .unwrap();
        let args = expand_str(&["host", "serve", "@", f.to_str().unwrap(), "--port", "9"]).unwrap();
        let Sub::Serve {
            model_name,
            max_model_len,
            enable_auto_tool_choice,
            port,
        } = Root::try_parse_from(&args).unwrap().cmd;
        assert_eq!(model_name, "m");
        assert_eq!(max_model_len, Some(2048));
        assert!(enable_auto_tool_choice);
        assert_eq!(port, Some(9), "the flag after the file wins");
        // `false` in a later file takes back an earlier `true`.
        let off = dir.path().join("off.toml");
        std::fs::write(&off, "enable_auto_tool_choice = false\n").unwrap();
        let args = expand_str(&[
            "host",
            "serve",
            "--enable-auto-tool-choice",
            "@",
            f.to_str().unwrap(),
            "@",
            off.to_str().unwrap(),
        ])
        .unwrap();
        let Sub::Serve {
            enable_auto_tool_choice,
            ..
        } = Root::try_parse_from(&args).unwrap().cmd;
        assert!(!enable_auto_tool_choice, "{args:?}");
    }

    #[test]
    fn unknown_keys_and_bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, "[model]\nnmae = \"m\"\n").unwrap();
        let e = expand_str(&["host", "serve", "@", f.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown key `model.nmae`") && e.contains("bad.toml"),
            "{e}"
        );
        std::fs::write(&f, "port = ").unwrap();
        let e = expand_str(&["host", "serve", "@", f.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not valid TOML"), "{e}");
        let e = expand_str(&["host", "serve", "@", "/nonexistent.toml"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent.toml"), "{e}");
    }

    /// `@ FILE` naming a FIFO, a device or a folder is refused at once with the file named
    /// (reading a FIFO without a writer used to wait forever; `/dev/zero` to fill memory).
    #[test]
    fn config_files_that_are_not_regular_files_are_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.toml");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let zero = dir.path().join("zero.toml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for (path, says) in [
            (fifo, "FIFO"),
            (zero, "character device"),
            (dir.path().to_owned(), "folder"),
        ] {
            let (tx, rx) = std::sync::mpsc::channel();
            let arg = path.to_str().unwrap().to_owned();
            std::thread::spawn(move || {
                let _ = tx.send(expand_str(&["host", "serve", "@", &arg]).map(|_| ()));
            });
            let e = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("reading the config blocked")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(says) && e.contains(path.to_str().unwrap()) && e.contains("config file"),
                "{e}"
            );
        }
        let big = dir.path().join("big.toml");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(CONFIG_FILE.max_bytes + 1)
            .unwrap();
        let e = expand_str(&["host", "serve", "@", big.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("over the limit"), "{e}");
    }
}
