//! Bounded reads of files someone else names: a request (`lora_path`, `model_path`), a flag, a
//! config. Such a path may be a FIFO (an open or a read that never returns), a device
//! (`/dev/zero`: a read that never ends), a folder, a socket, or a file far larger than what it
//! claims to be (a sparse file of terabytes). Every read here therefore
//!
//! - opens without blocking (`O_NONBLOCK`, so a FIFO cannot hold the open) and without becoming
//!   a controlling terminal (`O_NOCTTY`), and takes regular files only: the type is checked on
//!   the path before the open (a device is never even opened) and again on the opened
//!   descriptor (the path may have changed in between);
//! - refuses a file whose size is over the caller's limit ([`FileLimit`]) from its metadata,
//!   before reading a byte, and reads at most that many bytes (a file that grows while read, or
//!   reports no size, as `/proc` files do, is cut there and refused);
//! - reads in chunks, each with a deadline ([`FileLimit::stall`]): a read that stops making
//!   progress (a stuck network mount, a FUSE file that trickles) is refused at the next chunk.
//!   A single `read(2)` stuck inside the kernel cannot be interrupted from the same thread; the
//!   deadline bounds everything else.
//!
//! Errors ([`ReadError`]) name the file, what it was for and what was wrong with it.
//!
//! This module must never decide what a file means: parsing and per-format checks (a
//! safetensors header before its tensors, say) belong to the callers, which read headers with
//! [`RegularFile::read_prefix`] and ranges with [`RegularFile::read_exact_at`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long one chunk of a read may take before the read is refused as stalled: a disk or
/// network mount that delivers less than one [`CHUNK`] (4 MiB) in 30 s (about 140 KB/s) is
/// broken for any file rlhost reads, and a client waiting on it should hear so.
pub const DEFAULT_STALL: Duration = Duration::from_secs(30);

/// Bytes asked of the kernel per read call: large enough that a 16 GB checkpoint takes 4,000
/// calls (nothing against the copy), small enough that the stall deadline is checked often.
pub const CHUNK: usize = 4 << 20;

/// What a file is for and how much of it may be read: the caller's statement, carried into
/// every error about the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimit {
    /// What the file is, for messages: "adapter config", "tokenizer".
    pub what: &'static str,
    /// The largest size accepted, in bytes; a larger file is refused before it is read.
    pub max_bytes: u64,
    /// The longest one chunk of the read may take ([`DEFAULT_STALL`] unless set).
    pub stall: Duration,
}

impl FileLimit {
    /// A limit of `max_bytes` for a file that is `what`, with the default stall deadline.
    pub const fn new(what: &'static str, max_bytes: u64) -> Self {
        Self {
            what,
            max_bytes,
            stall: DEFAULT_STALL,
        }
    }

    /// The same limit with another stall deadline.
    pub const fn with_stall(self, stall: Duration) -> Self {
        Self { stall, ..self }
    }
}

/// Why a bounded read was refused. Each says what the file was for, names it, and says what
/// was wrong: `adapter /srv/a/adapter_model.safetensors: a character device, not a regular
/// file` ([`ReadError::reason`] is the part after the path).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be looked at or opened (absent, not allowed, ...).
    #[error("{what} {}: {}", .path.display(), self.reason())]
    Open {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The system's reason.
        #[source]
        source: io::Error,
    },
    /// The path is a FIFO, a device, a socket or a folder.
    #[error("{what} {}: {}", .path.display(), self.reason())]
    NotRegular {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What it is instead ("a FIFO (named pipe)", "a character device", ...).
        kind: &'static str,
    },
    /// The file's size is over the limit; nothing was read.
    #[error("{what} {}: {}", .path.display(), self.reason())]
    TooLarge {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The file held more than the limit although its size said otherwise (it grew while it
    /// was read, or reports no size); the read stopped at the limit.
    #[error("{what} {}: {}", .path.display(), self.reason())]
    Grew {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The size its metadata reported when opened.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// One chunk of the read took longer than the stall deadline.
    #[error("{what} {}: {}", .path.display(), self.reason())]
    Stalled {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// How long the chunk took.
        waited: Duration,
        /// The deadline.
        allowed: Duration,
    },
    /// A read failed.
    #[error("{what} {}: {}", .path.display(), self.reason())]
    Read {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The system's reason.
        #[source]
        source: io::Error,
    },
    /// The file ended before a range the caller asked for (it shrank after it was opened).
    #[error("{what} {}: {}", .path.display(), self.reason())]
    Truncated {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Where the range started.
        offset: u64,
        /// Its length.
        wanted: u64,
        /// Where the file ended.
        end: u64,
    },
    /// The file was to be text and is not UTF-8.
    #[error("{what} {}: {}", .path.display(), self.reason())]
    NotText {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Where the encoding broke.
        #[source]
        source: std::str::Utf8Error,
    },
}

impl ReadError {
    /// What was wrong, without the file's purpose and path: for a message that names the file
    /// its own way (relative to a plugin's folder, say).
    pub fn reason(&self) -> String {
        match self {
            Self::Open { source, .. } => format!("cannot open it: {source}"),
            Self::NotRegular { kind, .. } => format!("{kind}, not a regular file"),
            Self::TooLarge { size, limit, .. } => {
                format!("{}, over the limit of {}", human(*size), human(*limit))
            }
            Self::Grew { size, limit, .. } => format!(
                "holds more than the limit of {} (it grew while read, or its size of {} is \
                 not what it holds)",
                human(*limit),
                human(*size)
            ),
            Self::Stalled {
                waited, allowed, ..
            } => format!(
                "the read stalled: one read took {:.1} s, over the {:.1} s allowed",
                waited.as_secs_f64(),
                allowed.as_secs_f64()
            ),
            Self::Read { source, .. } => format!("cannot read it: {source}"),
            Self::Truncated {
                offset,
                wanted,
                end,
                ..
            } => format!(
                "it ended at byte {end}, before the {wanted} bytes wanted from byte {offset} \
                 (changed while read?)"
            ),
            Self::NotText { source, .. } => format!("not UTF-8 text: {source}"),
        }
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Open { path, .. }
            | Self::NotRegular { path, .. }
            | Self::TooLarge { path, .. }
            | Self::Grew { path, .. }
            | Self::Stalled { path, .. }
            | Self::Read { path, .. }
            | Self::Truncated { path, .. }
            | Self::NotText { path, .. } => path,
        }
    }

    /// Whether the file does not exist (optional files are skipped on this error alone: a
    /// FIFO or an oversized file where an optional file should be is still an error).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// As an I/O error, for callers whose errors hold one and name the file themselves: the
/// system's own error when there is one, else one of the kind that fits with
/// [`ReadError::reason`] as its text (no path: the caller adds it).
impl From<ReadError> for io::Error {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Open { source, .. } | ReadError::Read { source, .. } => source,
            other => {
                let kind = match &other {
                    ReadError::NotRegular { .. } => io::ErrorKind::InvalidInput,
                    ReadError::Stalled { .. } => io::ErrorKind::TimedOut,
                    ReadError::Truncated { .. } => io::ErrorKind::UnexpectedEof,
                    _ => io::ErrorKind::InvalidData,
                };
                io::Error::new(kind, other.reason())
            }
        }
    }
}

/// `n` bytes for a person: "1.50 GiB (1610612736 bytes)".
fn human(n: u64) -> String {
    let (unit, size) = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
        .into_iter()
        .find(|&(_, s)| n >= s)
        .unwrap_or(("", 1));
    if unit.is_empty() {
        format!("{n} bytes")
    } else {
        format!("{:.2} {unit} ({n} bytes)", n as f64 / size as f64)
    }
}

/// What a file type is, when it is not a regular file.
fn irregular(t: std::fs::FileType) -> Option<&'static str> {
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "neither a file nor a folder"
    })
}

/// A regular file opened for bounded reads ([`RegularFile::open`]): its size was checked
/// against the limit when opened, and every read of it keeps to that size and the stall
/// deadline.
#[derive(Debug)]
pub struct RegularFile {
    file: File,
    path: PathBuf,
    limit: FileLimit,
    len: u64,
}

impl RegularFile {
    /// Opens `path` (symbolic links followed) if it is a regular file of at most
    /// `limit.max_bytes`; see the module's documentation for how.
    pub fn open(path: &Path, limit: FileLimit) -> Result<Self, ReadError> {
        let what = limit.what;
        let open_error = |source| ReadError::Open {
            what,
            path: path.to_owned(),
            source,
        };
        let not_regular = |kind| ReadError::NotRegular {
            what,
            path: path.to_owned(),
            kind,
        };
        // Before the open: a device is never opened (opening some has effects).
        let meta = std::fs::metadata(path).map_err(open_error)?;
        if let Some(kind) = irregular(meta.file_type()) {
            return Err(not_regular(kind));
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(open_error)?;
        // After the open, on the descriptor: the path may have been swapped for a FIFO or a
        // link to a device in between; O_NONBLOCK kept the open itself from waiting.
        let meta = file.metadata().map_err(open_error)?;
        if let Some(kind) = irregular(meta.file_type()) {
            return Err(not_regular(kind));
        }
        // Regular files ignore O_NONBLOCK on Linux, but the descriptor should say what it is
        // (blocking reads) to whoever else uses it, e.g. a library handed the file.
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor this function owns, with no pointers passed.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
            return Err(open_error(io::Error::last_os_error()));
        }
        let len = meta.len();
        if len > limit.max_bytes {
            return Err(ReadError::TooLarge {
                what,
                path: path.to_owned(),
                size: len,
                limit: limit.max_bytes,
            });
        }
        Ok(Self {
            file,
            path: path.to_owned(),
            limit,
            len,
        })
    }

    /// The file's path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size when opened, in bytes (at most the limit).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether its size was 0 when opened (`/proc` files report 0 and still hold text).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The limit it was opened under.
    pub fn limit(&self) -> FileLimit {
        self.limit
    }

    /// The first `n` bytes, or the whole file when it is shorter: a header, read without
    /// reading what follows it.
    pub fn read_prefix(&self, n: usize) -> Result<Vec<u8>, ReadError> {
        let cap = usize::try_from(self.len).unwrap_or(usize::MAX).min(n);
        let mut out = Vec::with_capacity(cap);
        self.read_to(&mut out, n as u64, false)?;
        Ok(out)
    }

    /// Exactly `buf.len()` bytes from byte `offset`, in chunks under the stall deadline; a file
    /// that ends first (it shrank) is [`ReadError::Truncated`].
    pub fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        let mut done = 0usize;
        let wanted = buf.len() as u64;
        while done < buf.len() {
            let end = buf.len().min(done + CHUNK);
            let at = offset + done as u64;
            let n = self.timed(&mut |c| self.file.read_at(c, at), &mut buf[done..end])?;
            if n == 0 {
                return Err(ReadError::Truncated {
                    what: self.limit.what,
                    path: self.path.clone(),
                    offset,
                    wanted,
                    end: offset + done as u64,
                });
            }
            done += n;
        }
        Ok(())
    }

    /// The whole file, at most the limit: a file that holds more (it grew, or reports no size)
    /// is [`ReadError::Grew`].
    pub fn read_all(&self) -> Result<Vec<u8>, ReadError> {
        let mut out = Vec::with_capacity(self.len as usize);
        self.read_to(&mut out, self.limit.max_bytes, true)?;
        Ok(out)
    }

    /// The whole file as UTF-8 text, as [`RegularFile::read_all`].
    pub fn read_text(&self) -> Result<String, ReadError> {
        let bytes = self.read_all()?;
        String::from_utf8(bytes).map_err(|e| ReadError::NotText {
            what: self.limit.what,
            path: self.path.clone(),
            source: e.utf8_error(),
        })
    }

    /// Appends the file from its start to `out`, at most `max` bytes; with `refuse_more`, a
    /// file holding more than `max` is an error rather than cut.
    fn read_to(&self, out: &mut Vec<u8>, max: u64, refuse_more: bool) -> Result<(), ReadError> {
        let mut chunk =
            vec![0u8; usize::try_from(max.saturating_add(1)).map_or(CHUNK, |m| m.min(CHUNK))];
        let mut at = 0u64;
        loop {
            // One byte past `max`, to tell a file of exactly `max` bytes from a longer one.
            let room = max
                .saturating_add(u64::from(refuse_more))
                .saturating_sub(at);
            if room == 0 {
                return Ok(());
            }
            let take = chunk.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            let n = self.timed(&mut |c| self.file.read_at(c, at), &mut chunk[..take])?;
            if n == 0 {
                return Ok(());
            }
            if refuse_more && at + n as u64 > max {
                return Err(ReadError::Grew {
                    what: self.limit.what,
                    path: self.path.clone(),
                    size: self.len,
                    limit: max,
                });
            }
            out.extend_from_slice(&chunk[..n]);
            at += n as u64;
        }
    }

    /// One read call into `chunk` under the stall deadline (interrupted calls retried).
    fn timed(
        &self,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
        chunk: &mut [u8],
    ) -> Result<usize, ReadError> {
        timed_read(read, chunk, self.limit.stall).map_err(|e| match e {
            ChunkError::Io(source) => ReadError::Read {
                what: self.limit.what,
                path: self.path.clone(),
                source,
            },
            ChunkError::Stalled(waited) => ReadError::Stalled {
                what: self.limit.what,
                path: self.path.clone(),
                waited,
                allowed: self.limit.stall,
            },
        })
    }
}

/// Why one chunk failed.
#[derive(Debug)]
enum ChunkError {
    Io(io::Error),
    Stalled(Duration),
}

/// One read call into `chunk`: its byte count, or an error when it failed or took longer than
/// `stall` (what it read then is dropped: the file is refused).
fn timed_read(
    read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
    chunk: &mut [u8],
    stall: Duration,
) -> Result<usize, ChunkError> {
    loop {
        let started = Instant::now();
        let r = read(chunk);
        let waited = started.elapsed();
        if waited > stall {
            return Err(ChunkError::Stalled(waited));
        }
        match r {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ChunkError::Io(e)),
        }
    }
}

/// The whole of the regular file `path`, at most `limit.max_bytes` ([`RegularFile`]).
pub fn read(path: &Path, limit: FileLimit) -> Result<Vec<u8>, ReadError> {
    RegularFile::open(path, limit)?.read_all()
}

/// The whole of the regular file `path` as UTF-8 text, at most `limit.max_bytes`.
pub fn read_to_string(path: &Path, limit: FileLimit) -> Result<String, ReadError> {
    RegularFile::open(path, limit)?.read_text()
}

/// [`read_to_string`] for a file that may be absent: `None` when it does not exist, an error
/// for anything else (a FIFO or an oversized file where an optional file should be is not
/// "absent").
pub fn read_optional_text(path: &Path, limit: FileLimit) -> Result<Option<String>, ReadError> {
    match read_to_string(path, limit) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// The first `n` bytes of the regular file `path` (all of it when shorter), which must be at
/// most `limit.max_bytes` long: a header, without reading the rest.
pub fn read_prefix(path: &Path, n: usize, limit: FileLimit) -> Result<Vec<u8>, ReadError> {
    RegularFile::open(path, limit)?.read_prefix(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;
    use std::sync::mpsc;

    const SMALL: FileLimit = FileLimit::new("test file", 1 << 20);

    /// Runs `f` on another thread and fails the test if it has not returned within 10 s: a read
    /// that blocks (the bug) fails instead of hanging the suite.
    fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the read blocked for 10 s")
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn reads_a_regular_file_whole_and_as_text() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ok.json");
        std::fs::write(&p, b"{\"a\": 1}").unwrap();
        assert_eq!(read(&p, SMALL).unwrap(), b"{\"a\": 1}");
        assert_eq!(read_to_string(&p, SMALL).unwrap(), "{\"a\": 1}");
        assert_eq!(read_prefix(&p, 3, SMALL).unwrap(), b"{\"a");
        assert_eq!(read_prefix(&p, 100, SMALL).unwrap(), b"{\"a\": 1}");
        // Exactly the limit is accepted; one byte over is not.
        let exact = FileLimit::new("test file", 8);
        assert_eq!(read(&p, exact).unwrap().len(), 8);
        let f = RegularFile::open(&p, SMALL).unwrap();
        let mut buf = [0u8; 3];
        f.read_exact_at(5, &mut buf).unwrap();
        assert_eq!(&buf, b" 1}");
        let err = f.read_exact_at(6, &mut buf).unwrap_err();
        assert!(matches!(err, ReadError::Truncated { end: 8, .. }), "{err}");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        let err = read_to_string(&p, SMALL).unwrap_err();
        assert!(matches!(err, ReadError::NotText { .. }), "{err}");
    }

    #[test]
    fn a_fifo_is_refused_at_once_without_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("adapter_config.json");
        mkfifo(&p);
        let q = p.clone();
        let err = promptly(move || read(&q, SMALL).unwrap_err());
        assert!(matches!(err, ReadError::NotRegular { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("FIFO") && text.contains("adapter_config.json"),
            "{text}"
        );
        // The check on the descriptor, without the one on the path: the open itself must not
        // wait for a writer (O_NONBLOCK), and the descriptor's type refuses it.
        let q = p.clone();
        let opened = promptly(move || {
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&q)
                .unwrap()
                .metadata()
                .unwrap()
                .file_type()
        });
        assert_eq!(irregular(opened), Some("a FIFO (named pipe)"));
    }

    #[test]
    fn a_link_to_dev_zero_is_refused_without_reading() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("adapter_model.safetensors");
        std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
        let q = p.clone();
        let err = promptly(move || read(&q, FileLimit::new("adapter", u64::MAX)).unwrap_err());
        assert!(
            matches!(
                err,
                ReadError::NotRegular {
                    kind: "a character device",
                    ..
                }
            ),
            "{err}"
        );
        let q = p.clone();
        let err = promptly(move || read_prefix(&q, 8, SMALL).unwrap_err());
        assert!(matches!(err, ReadError::NotRegular { .. }), "{err}");
    }

    #[test]
    fn a_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = read(dir.path(), SMALL).unwrap_err();
        assert!(
            matches!(
                err,
                ReadError::NotRegular {
                    kind: "a folder",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn an_absent_file_is_not_found_and_optional() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("absent.json");
        assert!(read(&p, SMALL).unwrap_err().is_not_found());
        assert_eq!(read_optional_text(&p, SMALL).unwrap(), None);
        // A FIFO where an optional file should be is still an error.
        mkfifo(&p);
        let err = promptly(move || read_optional_text(&p, SMALL).unwrap_err());
        assert!(!err.is_not_found(), "{err}");
    }

    #[test]
    fn an_oversized_file_is_refused_from_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.json");
        std::fs::write(&p, vec![b' '; 100]).unwrap();
        let err = read(&p, FileLimit::new("config", 99)).unwrap_err();
        assert!(
            matches!(
                err,
                ReadError::TooLarge {
                    size: 100,
                    limit: 99,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("big.json"), "{err}");
    }

    /// A 1.5 GiB sparse file (what an attacker can make in no time): refused by its size under
    /// a 1 GiB limit from the metadata (`TooLarge`, not `Grew`, which would mean it was read up
    /// to the limit), and its 8-byte header read alone under a larger one.
    #[test]
    fn a_sparse_big_file_is_refused_or_read_by_its_header_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.safetensors");
        let f = File::create(&p).unwrap();
        f.set_len(3 << 29).unwrap();
        f.write_at(&[7u8; 8], 0).unwrap();
        let err = read(&p, FileLimit::new("checkpoint", 1 << 30)).unwrap_err();
        assert!(matches!(err, ReadError::TooLarge { .. }), "{err}");
        assert!(err.to_string().contains("1.50 GiB"), "{err}");
        let file = RegularFile::open(&p, FileLimit::new("checkpoint", 2 << 30)).unwrap();
        assert_eq!(file.len(), 3 << 29);
        assert_eq!(file.read_prefix(8).unwrap(), [7u8; 8]);
    }

    /// `/proc` files are regular and report a size of 0: the read stops at the limit and
    /// refuses the file, rather than trusting the size.
    #[test]
    fn a_file_holding_more_than_its_size_is_cut_at_the_limit() {
        let p = Path::new("/proc/self/status");
        let limit = FileLimit::new("status", 16);
        let f = RegularFile::open(p, limit).unwrap();
        assert_eq!(f.len(), 0);
        let err = f.read_all().unwrap_err();
        assert!(matches!(err, ReadError::Grew { limit: 16, .. }), "{err}");
        // Under a limit it fits in, it is read whole.
        let text = read_to_string(p, SMALL).unwrap();
        assert!(text.contains("VmRSS") || text.contains("Name:"), "{text}");
        // A prefix reads no further than asked.
        assert_eq!(f.read_prefix(5).unwrap(), b"Name:");
    }

    #[test]
    fn a_chunk_slower_than_the_deadline_stalls_the_read() {
        let mut slow = |c: &mut [u8]| {
            std::thread::sleep(Duration::from_millis(50));
            c[0] = 1;
            Ok(1)
        };
        let mut buf = [0u8; 4];
        let err = timed_read(&mut slow, &mut buf, Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, ChunkError::Stalled(w) if w >= Duration::from_millis(50)));
        assert_eq!(
            timed_read(&mut slow, &mut buf, Duration::from_secs(5)).unwrap(),
            1
        );
        // Interrupted calls are retried, other errors end the read.
        let mut calls = 0;
        let mut flaky = |_: &mut [u8]| {
            calls += 1;
            if calls == 1 {
                Err(io::Error::from(io::ErrorKind::Interrupted))
            } else {
                Err(io::Error::other("gone"))
            }
        };
        let err = timed_read(&mut flaky, &mut buf, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(err, ChunkError::Io(e) if e.to_string() == "gone"));
        let message = ReadError::Stalled {
            what: "adapter",
            path: "/x/a.safetensors".into(),
            waited: Duration::from_millis(31_000),
            allowed: DEFAULT_STALL,
        }
        .to_string();
        assert_eq!(
            message,
            "adapter /x/a.safetensors: the read stalled: one read took 31.0 s, over the 30.0 s \
             allowed"
        );
    }
}
