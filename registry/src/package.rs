//! The `.rlpkg` package: a zstd-compressed tar of a plugin folder (`plugin.toml`, the artifact,
//! `data/`, `README.md`). Packing is deterministic — entries sorted, times, owners and modes
//! fixed — so the same folder always gives the same bytes and checksum. Unpacking trusts nothing:
//! only plain files and folders with relative paths inside the package, bounded in count and
//! size (a decompression bomb is refused), into a folder the caller then renames into place.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::manifest::{Manifest, ManifestError};

/// Largest unpacked package.
pub const MAX_UNPACKED_BYTES: u64 = 2 << 30;
/// Most entries in a package.
pub const MAX_ENTRIES: usize = 100_000;
/// Largest packed package accepted for unpacking or upload.
pub const MAX_PACKED_BYTES: u64 = 1 << 30;

/// Errors packing or unpacking.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file of the folder could not be read within the package's limits (not a regular
    /// file, or larger than a package may unpack to).
    #[error(transparent)]
    Read(#[from] rlhost_fs::ReadError),
    /// The folder's manifest is invalid.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The folder lacks something a package needs.
    #[error("{0}")]
    Incomplete(String),
    /// The archive is malformed or unsafe.
    #[error("refusing package: {0}")]
    Unsafe(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PackageError + '_ {
    move |source| PackageError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Hex sha256 of `bytes`.
pub fn checksum(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Files of a plugin folder that go into its package, as (path inside the package, path on
/// disk), sorted: `plugin.toml`, the artifact, `README.md` if present, everything under the
/// data folder. Symlinks and special files are refused.
fn package_files(dir: &Path, manifest: &Manifest) -> Result<Vec<(String, PathBuf)>, PackageError> {
    let mut files = vec![("plugin.toml".to_owned(), dir.join("plugin.toml"))];
    let artifact = manifest.artifact();
    if !dir.join(&artifact).is_file() {
        return Err(PackageError::Incomplete(format!(
            "{} is missing its artifact {}",
            dir.display(),
            artifact.display()
        )));
    }
    files.push((slash_path(&artifact), dir.join(&artifact)));
    let readme = dir.join("README.md");
    if readme.is_file() {
        let size = std::fs::metadata(&readme).map_err(io(&readme))?.len();
        if size > MAX_READ_FILE_BYTES {
            return Err(PackageError::Incomplete(format!(
                "{} is {size} bytes: a README may be at most {MAX_READ_FILE_BYTES} bytes",
                readme.display()
            )));
        }
        files.push(("README.md".into(), readme));
    }
    let data = manifest.data_dir();
    if dir.join(&data).is_dir() {
        let mut stack = vec![data];
        while let Some(rel) = stack.pop() {
            let abs = dir.join(&rel);
            for entry in std::fs::read_dir(&abs).map_err(io(&abs))? {
                let entry = entry.map_err(io(&abs))?;
                let kind = entry.file_type().map_err(io(&entry.path()))?;
                let rel = rel.join(entry.file_name());
                if kind.is_dir() {
                    stack.push(rel);
                } else if kind.is_file() {
                    files.push((slash_path(&rel), entry.path()));
                } else {
                    return Err(PackageError::Incomplete(format!(
                        "{} is not a plain file (symlinks are not packed)",
                        entry.path().display()
                    )));
                }
            }
        }
    }
    files.sort();
    files.dedup_by(|a, b| a.0 == b.0);
    Ok(files)
}

fn slash_path(p: &Path) -> String {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Packs the plugin folder `dir` into `.rlpkg` bytes; returns them and the manifest.
pub fn pack(dir: &Path) -> Result<(Vec<u8>, Manifest), PackageError> {
    let manifest = Manifest::load(&dir.join("plugin.toml"))?;
    let files = package_files(dir, &manifest)?;
    let mut tar = tar::Builder::new(Vec::new());
    tar.mode(tar::HeaderMode::Deterministic);
    let mut left = MAX_UNPACKED_BYTES;
    for (name, path) in files {
        // What a package may unpack to bounds what packing it may read.
        let limit = rlhost_fs::FileLimit::new("package file", left);
        let bytes = rlhost_fs::read(&path, limit)?;
        left -= bytes.len() as u64;
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, &name, bytes.as_slice())
            .map_err(io(&path))?;
    }
    let tarball = tar.into_inner().map_err(io(dir))?;
    let packed = zstd::encode_all(tarball.as_slice(), 19).map_err(io(dir))?;
    Ok((packed, manifest))
}

/// Unpacks `.rlpkg` bytes into the empty folder `dest` (which the caller creates inside a
/// temporary location and renames into place), refusing anything unsafe. Returns the manifest.
pub fn unpack(packed: &[u8], dest: &Path) -> Result<Manifest, PackageError> {
    if packed.len() as u64 > MAX_PACKED_BYTES {
        return Err(PackageError::Unsafe(format!(
            "{} bytes is over the {MAX_PACKED_BYTES}-byte package limit",
            packed.len()
        )));
    }
    let decoder = zstd::Decoder::new(packed)
        .map_err(|e| PackageError::Unsafe(format!("not a zstd stream: {e}")))?;
    // A bomb stops at the limit instead of filling the disk.
    let limited = decoder.take(MAX_UNPACKED_BYTES + 1);
    let mut archive = tar::Archive::new(limited);
    let mut total = 0u64;
    let mut count = 0usize;
    let entries = archive
        .entries()
        .map_err(|e| PackageError::Unsafe(format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| PackageError::Unsafe(format!("corrupt archive: {e}")))?;
        count += 1;
        if count > MAX_ENTRIES {
            return Err(PackageError::Unsafe(format!(
                "more than {MAX_ENTRIES} entries"
            )));
        }
        let path = entry
            .path()
            .map_err(|e| PackageError::Unsafe(format!("bad entry name: {e}")))?
            .into_owned();
        let shown = path.display().to_string();
        let plain = path.components().next().is_some()
            && path
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !plain {
            return Err(PackageError::Unsafe(format!(
                "entry {shown:?} is not a relative path inside the package"
            )));
        }
        match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            tar::EntryType::Directory => {
                let target = dest.join(&path);
                std::fs::create_dir_all(&target).map_err(io(&target))?;
                continue;
            }
            other => {
                return Err(PackageError::Unsafe(format!(
                    "entry {shown:?} is a {other:?}, not a plain file (links are refused)"
                )));
            }
        }
        let size = entry.header().size().unwrap_or(u64::MAX);
        total = total.saturating_add(size);
        if total > MAX_UNPACKED_BYTES {
            return Err(PackageError::Unsafe(format!(
                "unpacks to more than {MAX_UNPACKED_BYTES} bytes"
            )));
        }
        let target = dest.join(&path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let mut bytes = Vec::with_capacity(size.min(1 << 26) as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| PackageError::Unsafe(format!("entry {shown:?} is truncated: {e}")))?;
        if bytes.len() as u64 != size {
            return Err(PackageError::Unsafe(format!(
                "entry {shown:?} is truncated"
            )));
        }
        std::fs::write(&target, bytes).map_err(io(&target))?;
    }
    let manifest_path = dest.join("plugin.toml");
    if !manifest_path.is_file() {
        return Err(PackageError::Unsafe("no plugin.toml in the package".into()));
    }
    let manifest = Manifest::load(&manifest_path)?;
    if !dest.join(manifest.artifact()).is_file() {
        return Err(PackageError::Unsafe(format!(
            "the package lacks its artifact {}",
            manifest.artifact().display()
        )));
    }
    Ok(manifest)
}

/// Largest file [`read_files`] returns (a README or a manifest).
pub const MAX_READ_FILE_BYTES: u64 = 1 << 20;

/// The files named in `wanted` (paths inside the package, e.g. `README.md`) read from `.rlpkg`
/// bytes in memory, without unpacking the rest; a file absent from the package, or over
/// [`MAX_READ_FILE_BYTES`] (packages made elsewhere), is absent from the answer. Entries are
/// checked as [`unpack`] checks them.
pub fn read_files(
    packed: &[u8],
    wanted: &[&str],
) -> Result<std::collections::BTreeMap<String, Vec<u8>>, PackageError> {
    if packed.len() as u64 > MAX_PACKED_BYTES {
        return Err(PackageError::Unsafe(format!(
            "{} bytes is over the {MAX_PACKED_BYTES}-byte package limit",
            packed.len()
        )));
    }
    let decoder = zstd::stream::read::Decoder::new(packed)
        .map_err(|e| PackageError::Unsafe(format!("not zstd: {e}")))?;
    let mut archive = tar::Archive::new(decoder.take(MAX_UNPACKED_BYTES + (1 << 20)));
    let entries = archive
        .entries()
        .map_err(|e| PackageError::Unsafe(format!("not a tar archive: {e}")))?;
    let mut out = std::collections::BTreeMap::new();
    for (count, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| PackageError::Unsafe(format!("corrupt archive: {e}")))?;
        if count >= MAX_ENTRIES {
            return Err(PackageError::Unsafe(format!(
                "more than {MAX_ENTRIES} entries"
            )));
        }
        let path = entry
            .path()
            .map_err(|e| PackageError::Unsafe(format!("bad entry name: {e}")))?;
        let name = slash_path(&path);
        if !wanted.contains(&name.as_str())
            || entry.header().entry_type() != tar::EntryType::Regular
        {
            continue;
        }
        let size = entry.header().size().unwrap_or(u64::MAX);
        if size > MAX_READ_FILE_BYTES {
            tracing::warn!(
                "{name} is {size} bytes, over the {MAX_READ_FILE_BYTES}-byte limit: left out"
            );
            continue;
        }
        let mut bytes = Vec::with_capacity(size as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| PackageError::Unsafe(format!("entry {name:?} is truncated: {e}")))?;
        out.insert(name, bytes);
        if out.len() == wanted.len() {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_files_are_read_in_memory() {
        let dir = plugin_dir();
        let (packed, _) = pack(dir.path()).unwrap();
        let files = read_files(&packed, &["README.md", "plugin.toml", "missing.md"]).unwrap();
        assert_eq!(files["README.md"], b"# demo");
        assert!(files["plugin.toml"].starts_with(b"[plugin]"));
        assert!(!files.contains_key("missing.md"));
        assert!(read_files(b"not a package", &["README.md"]).is_err());
    }

    fn plugin_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("plugin.toml"),
            "[plugin]\nowner = \"will\"\nname = \"demo\"\nversion = \"0.1.0\"\nkind = \"environment\"\n\
             abi = \"rlhost:env@0.1.0\"\nruntime = \"wasm\"\n",
        )
        .unwrap();
        std::fs::write(d.join("plugin.wasm"), b"\0asm fake").unwrap();
        std::fs::write(d.join("README.md"), "# demo").unwrap();
        std::fs::create_dir_all(d.join("data/sub")).unwrap();
        std::fs::write(d.join("data/train.jsonl"), "{}\n").unwrap();
        std::fs::write(d.join("data/sub/b.txt"), "b").unwrap();
        std::fs::write(d.join("ignored.txt"), "not packed").unwrap();
        dir
    }

    #[test]
    fn packing_is_deterministic_and_round_trips() {
        let dir = plugin_dir();
        let (a, manifest) = pack(dir.path()).unwrap();
        // Touch every file: times must not matter.
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(dir.path().join("data/train.jsonl"), "{}\n").unwrap();
        let (b, _) = pack(dir.path()).unwrap();
        assert_eq!(checksum(&a), checksum(&b));
        assert_eq!(manifest.full_name(), "will/demo");

        let out = tempfile::tempdir().unwrap();
        let m = unpack(&a, out.path()).unwrap();
        assert_eq!(m, manifest);
        assert_eq!(
            std::fs::read(out.path().join("data/sub/b.txt")).unwrap(),
            b"b"
        );
        assert!(out.path().join("README.md").is_file());
        assert!(!out.path().join("ignored.txt").exists());
    }

    #[test]
    fn missing_artifact_is_named() {
        let dir = plugin_dir();
        std::fs::remove_file(dir.path().join("plugin.wasm")).unwrap();
        let err = pack(dir.path()).unwrap_err().to_string();
        assert!(err.contains("missing its artifact plugin.wasm"), "{err}");
    }

    fn raw_tar(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        zstd::encode_all(b.into_inner().unwrap().as_slice(), 1).unwrap()
    }

    fn file_header(size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h
    }

    #[test]
    fn escaping_entries_are_refused_and_nothing_lands_outside() {
        let outer = tempfile::tempdir().unwrap();
        let dest = outer.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        // `tar::Builder` refuses to write `..` names, so forge them in the raw header.
        let evil = raw_tar(|b| {
            let mut h = file_header(4);
            h.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../escape");
            h.set_cksum();
            b.append(&h, &b"evil"[..]).unwrap();
        });
        let err = unpack(&evil, &dest).unwrap_err().to_string();
        assert!(err.contains("not a relative path"), "{err}");
        assert!(!outer.path().join("escape").exists());

        let absolute = raw_tar(|b| {
            let mut h = file_header(4);
            h.as_gnu_mut().unwrap().name[..11].copy_from_slice(b"/tmp/escape");
            h.set_cksum();
            b.append(&h, &b"evil"[..]).unwrap();
        });
        assert!(unpack(&absolute, &dest).is_err());

        let link = raw_tar(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, "data", "/etc").unwrap();
        });
        let err = unpack(&link, &dest).unwrap_err().to_string();
        assert!(err.contains("links are refused"), "{err}");
        let hard = raw_tar(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Link);
            h.set_size(0);
            b.append_link(&mut h, "x", "../../etc/passwd").unwrap();
        });
        assert!(unpack(&hard, &dest).is_err());
        assert_eq!(std::fs::read_dir(&dest).unwrap().count(), 0);
    }

    #[test]
    fn garbage_and_bombs_are_refused() {
        let dest = tempfile::tempdir().unwrap();
        assert!(unpack(b"not zstd", dest.path()).is_err());
        // A header claiming a huge size over a tiny body: truncated, refused.
        let liar = raw_tar(|b| {
            let h = file_header(1 << 40);
            let mut raw = Vec::new();
            raw.extend_from_slice(h.as_bytes());
            b.get_mut().extend_from_slice(&raw);
        });
        assert!(unpack(&liar, dest.path()).is_err());
        // An entry that claims more than the limit is refused before its bytes are read (so
        // a tiny package cannot fill the disk).
        let mut enc = zstd::Encoder::new(Vec::new(), 3).unwrap();
        let mut header = file_header(MAX_UNPACKED_BYTES + 1024);
        header.set_path("data/zeros").unwrap();
        header.set_cksum();
        std::io::Write::write_all(&mut enc, header.as_bytes()).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..8 {
            std::io::Write::write_all(&mut enc, &zeros).unwrap();
        }
        let bomb = enc.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "the bomb is small when packed");
        let err = unpack(&bomb, dest.path()).unwrap_err().to_string();
        assert!(err.contains("more than"), "{err}");
    }
}
