//! File primitives shared by rlhost's crates.
//!
//! - Writes that are never seen half-done ([`write_atomically`]): every file rlhost writes
//!   (checkpoints, models, results, registry indexes, caches) goes through a temporary file
//!   beside it and a rename, so a reader, or a run that was killed mid-write, sees the old file
//!   or the whole new one.
//! - Bounded reads of files someone else names ([`read`], [`read_to_string`], [`read_prefix`],
//!   [`RegularFile`]): regular files only, a size limit the caller states ([`FileLimit`]),
//!   checked before reading and kept while reading, and a deadline on every chunk. Every file a
//!   request, a config or a flag names is read through them.
//!
//! This crate must never grow beyond file primitives: what a file means is its caller's.
#![deny(missing_docs)]

mod read;

pub use read::{
    CHUNK, DEFAULT_STALL, FileLimit, ReadError, RegularFile, read, read_optional_text, read_prefix,
    read_to_string,
};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` through a temporary file beside it and a rename, creating the parent
/// folders: readers see the old file or the whole new one, never a part. Concurrent writers of
/// the same path (threads or processes) each write their own temporary file; the last rename
/// wins.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = temporary_beside(path);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// A temporary name beside `path`, unique to this process and call.
fn temporary_beside(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp.{}.{n}", std::process::id()));
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_files_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/file.bin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
    }

    #[test]
    fn concurrent_writers_of_one_path_never_leave_a_mixed_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared.txt");
        let payloads: Vec<Vec<u8>> = (0..8u8).map(|i| vec![b'a' + i; 64 * 1024]).collect();
        std::thread::scope(|s| {
            for p in &payloads {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..10 {
                        write_atomically(path, p).unwrap();
                    }
                });
            }
        });
        let got = std::fs::read(&path).unwrap();
        assert!(payloads.contains(&got), "the file mixes writers");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_rename_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        // A folder where the file should go: the rename fails.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("x"), b"x").unwrap();
        assert!(write_atomically(&path, b"data").is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
