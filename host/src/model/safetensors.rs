//! The safetensors format (what Hugging Face checkpoints use): an 8-byte little-endian header
//! length, a JSON header (`name → {dtype, shape, data_offsets}`, plus `__metadata__`), then the
//! raw little-endian tensor bytes. Written atomically (tmp + rename).
//!
//! Read header first ([`SafetensorsFile`]), because the file may come from anyone (a request's
//! `lora_path`, say): the file is opened by the bounded reader ([`rlhost_fs`]: regular files
//! only, a size limit), its 8-byte length is checked against the file's size and
//! [`MAX_HEADER_BYTES`], and every tensor the header describes is validated (a known dtype, no
//! negative dimension, an element count that fits with checked multiplication, a byte length
//! equal to elements × dtype size, offsets inside the file, no overlap and no gap, as the
//! reference implementation requires) before a byte of tensor data is read or libtorch is
//! called. A malformed file is an error naming it and the tensor at fault, never a crash, a
//! panic or a read of gigabytes.

use std::collections::BTreeMap;
use std::path::Path;

use rlhost_fs::{FileLimit, RegularFile};
use tch::{Kind, Tensor};

use super::{ModelError, files};

/// The longest header accepted: the limit of the reference implementation (Hugging Face's
/// `safetensors`, `MAX_HEADER_SIZE`), which refuses longer ones, so no checkpoint it wrote is
/// over it; a header claiming more is garbage and is refused before it is read.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

fn dtype_name(kind: Kind) -> Option<&'static str> {
    Some(match kind {
        Kind::Float => "F32",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Double => "F64",
        Kind::Int64 => "I64",
        Kind::Int => "I32",
        Kind::Uint8 => "U8",
        Kind::Bool => "BOOL",
        _ => return None,
    })
}

fn kind_of(name: &str) -> Option<(Kind, u64)> {
    Some(match name {
        "F32" => (Kind::Float, 4),
        "BF16" => (Kind::BFloat16, 2),
        "F16" => (Kind::Half, 2),
        "F64" => (Kind::Double, 8),
        "I64" => (Kind::Int64, 8),
        "I32" => (Kind::Int, 4),
        "U8" => (Kind::Uint8, 1),
        "BOOL" => (Kind::Bool, 1),
        _ => return None,
    })
}

/// One tensor as a validated header describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub kind: Kind,
    /// Its shape: every dimension at least 0, the product checked to fit.
    pub shape: Vec<i64>,
    /// Where its bytes start in the data section (after the header).
    pub start: u64,
    /// Where they end (exclusive): `start` + elements × dtype size.
    pub end: u64,
}

/// The tensors of a header (`__metadata__` skipped), validated against a data section of
/// `data_len` bytes, in name order; the message names the tensor at fault.
fn parse_header(header: &[u8], data_len: u64) -> Result<Vec<TensorEntry>, String> {
    let map: BTreeMap<String, serde_json::Value> = serde_json::from_slice(header)
        .map_err(|e| format!("the header is not a JSON object: {e}"))?;
    let mut out = Vec::with_capacity(map.len());
    for (name, info) in map {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"].as_str().unwrap_or_default();
        let (kind, size) =
            kind_of(dtype).ok_or_else(|| format!("{name}: unsupported dtype {dtype:?}"))?;
        let dims = info["shape"]
            .as_array()
            .ok_or_else(|| format!("{name}: shape {}: not a list", info["shape"]))?;
        let mut shape = Vec::with_capacity(dims.len());
        let mut elements: u64 = 1;
        for d in dims {
            // Negative, fractional or over i64: libtorch would abort on them.
            let n = d.as_i64().filter(|n| *n >= 0).ok_or_else(|| {
                format!(
                    "{name}: shape {}: dimension {d} is not a whole number ≥ 0",
                    info["shape"]
                )
            })?;
            elements = elements.checked_mul(n as u64).ok_or_else(|| {
                format!(
                    "{name}: shape {}: the element count overflows 64 bits",
                    info["shape"]
                )
            })?;
            shape.push(n);
        }
        let bytes = elements
            .checked_mul(size)
            .filter(|b| *b <= i64::MAX as u64)
            .ok_or_else(|| {
                format!(
                    "{name}: shape {}: {elements} {dtype} elements overflow 64 bits of bytes",
                    info["shape"]
                )
            })?;
        let offsets = info["data_offsets"]
            .as_array()
            .filter(|a| a.len() == 2)
            .and_then(|a| Some([a[0].as_u64()?, a[1].as_u64()?]))
            .ok_or_else(|| {
                format!(
                    "{name}: data_offsets {}: not two byte offsets",
                    info["data_offsets"]
                )
            })?;
        let [start, end] = offsets;
        if end < start || end - start != bytes {
            return Err(format!(
                "{name}: data_offsets {start}..{end} ({} bytes) for shape {shape:?} {dtype} \
                 ({bytes} bytes)",
                end.saturating_sub(start)
            ));
        }
        if end > data_len {
            return Err(format!(
                "{name}: data ends at byte {end}, the file has {data_len} after its header \
                 (truncated?)"
            ));
        }
        out.push(TensorEntry {
            name,
            kind,
            shape,
            start,
            end,
        });
    }
    // Every byte of the data section belongs to exactly one tensor: overlaps would alias two
    // tensors, gaps hide bytes no tensor accounts for (the reference reader refuses both).
    let mut by_offset: Vec<&TensorEntry> = out.iter().collect();
    by_offset.sort_by_key(|e| (e.start, e.end));
    let mut at = 0u64;
    for e in by_offset {
        if e.start < at {
            return Err(format!(
                "{}: its bytes {}..{} overlap another tensor's",
                e.name, e.start, e.end
            ));
        }
        if e.start > at {
            return Err(format!(
                "{}: bytes {at}..{} before it belong to no tensor",
                e.name, e.start
            ));
        }
        at = e.end;
    }
    if at != data_len {
        return Err(format!(
            "the tensors end at byte {at} of the data, the file has {data_len} bytes after its header"
        ));
    }
    Ok(out)
}

/// A safetensors file opened with its header read and validated (see the module's
/// documentation); tensors are read one at a time ([`SafetensorsFile::read`]).
#[derive(Debug)]
pub struct SafetensorsFile {
    file: RegularFile,
    data_start: u64,
    entries: Vec<TensorEntry>,
}

impl SafetensorsFile {
    /// Opens `path` under `limit` and validates its header; no tensor data is read.
    pub fn open(path: &Path, limit: FileLimit) -> Result<Self, ModelError> {
        let bad = |message: String| ModelError::Malformed {
            path: path.to_owned(),
            message,
        };
        let file = RegularFile::open(path, limit)?;
        let len = file.len();
        if len < 8 {
            return Err(bad(format!("{len} bytes: too short for a header")));
        }
        let mut head = [0u8; 8];
        file.read_exact_at(0, &mut head)?;
        let n = u64::from_le_bytes(head);
        if n > MAX_HEADER_BYTES {
            return Err(bad(format!(
                "the header claims {n} bytes, over the {MAX_HEADER_BYTES} any safetensors \
                 reader accepts"
            )));
        }
        if n > len - 8 {
            return Err(bad(format!(
                "the header claims {n} bytes, the file has {len}"
            )));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact_at(8, &mut header)?;
        let entries = parse_header(&header, len - 8 - n).map_err(bad)?;
        Ok(Self {
            file,
            data_start: 8 + n,
            entries,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Every tensor the header describes, in name order.
    pub fn entries(&self) -> &[TensorEntry] {
        &self.entries
    }

    /// The tensor `name`, if the header has it.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Reads one tensor (on the CPU).
    pub fn read(&self, e: &TensorEntry) -> Result<Tensor, ModelError> {
        // The header was validated: the length fits the file, which fits the limit.
        let mut raw = vec![0u8; (e.end - e.start) as usize];
        self.file
            .read_exact_at(self.data_start + e.start, &mut raw)?;
        Ok(Tensor::f_from_data_size(&raw, &e.shape, e.kind)?)
    }

    /// Reads every tensor, in name order.
    pub fn read_all(&self) -> Result<Vec<(String, Tensor)>, ModelError> {
        self.entries
            .iter()
            .map(|e| Ok((e.name.clone(), self.read(e)?)))
            .collect()
    }
}

/// Reads every tensor of a safetensors file (on the CPU), under the limit of one checkpoint
/// file ([`files::CHECKPOINT`]), header first.
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>, ModelError> {
    SafetensorsFile::open(path, files::CHECKPOINT)?.read_all()
}

/// Writes `tensors` (any device; converted to `kind` when given) to `path` atomically.
pub fn write(
    path: &Path,
    tensors: &[(String, Tensor)],
    kind: Option<Kind>,
) -> Result<(), ModelError> {
    let io = |e: std::io::Error| ModelError::Io {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    let mut offset = 0usize;
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, t) in sorted {
        let t = t.to_device(tch::Device::Cpu);
        let t = match kind {
            Some(k) => t.to_kind(k),
            None => t,
        }
        .contiguous();
        let dtype = dtype_name(t.kind()).ok_or_else(|| ModelError::Malformed {
            path: path.to_owned(),
            message: format!("{name}: cannot store dtype {:?}", t.kind()),
        })?;
        let numel = t.numel();
        let mut buf = vec![0u8; numel * t.kind().elt_size_in_bytes()];
        t.copy_data_u8(&mut buf, numel);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": t.size(), "data_offsets": [offset, offset + buf.len()]}),
        );
        offset += buf.len();
        blobs.push(buf);
    }
    let mut head = serde_json::to_vec(&header).expect("a JSON map serialises");
    while !head.len().is_multiple_of(8) {
        head.push(b' ');
    }
    let mut file = Vec::with_capacity(8 + head.len() + offset);
    file.extend_from_slice(&(head.len() as u64).to_le_bytes());
    file.extend_from_slice(&head);
    for b in blobs {
        file.extend_from_slice(&b);
    }
    rlhost_fs::write_atomically(path, &file).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        let a = Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).view([2, 3]);
        let b = Tensor::from_slice(&[1i64, -2]);
        write(
            &p,
            &[
                ("b".into(), b.shallow_clone()),
                ("a".into(), a.shallow_clone()),
            ],
            None,
        )
        .unwrap();
        let back = read(&p).unwrap();
        assert_eq!(back[0].0, "a");
        assert!(back[0].1.equal(&a));
        assert!(back[1].1.equal(&b));
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        let err = read(&p).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        std::fs::write(&p, b"\xff\xff\xff\xff\xff\xff\xff\x7f{}").unwrap();
        assert!(read(&p).unwrap_err().to_string().contains("header claims"));
    }

    /// A file of `header` (padded as the format writes it) and `data` bytes of zeros.
    fn raw(dir: &Path, header: &str, data: usize) -> std::path::PathBuf {
        let p = dir.join("raw.safetensors");
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + data, 0);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn refusal(dir: &Path, header: &str, data: usize) -> String {
        let p = raw(dir, header, data);
        match SafetensorsFile::open(&p, files::CHECKPOINT) {
            Ok(f) => panic!("accepted: {:?}", f.entries()),
            Err(e) => {
                assert!(matches!(e, ModelError::Malformed { .. }), "{e}");
                e.to_string()
            }
        }
    }

    /// Shapes libtorch would abort on (element counts that overflow, wrapping to a small or zero
    /// byte length, negative or fractional dimensions) are refused from the header with the
    /// tensor named, before libtorch is called: no panic text can reach anyone.
    #[test]
    fn impossible_shapes_are_refused_before_libtorch() {
        let dir = tempfile::tempdir().unwrap();
        for (shape, offsets, data, says) in [
            // 2^62 · 4 wraps to 0 in i64: the old reader took it as an empty tensor.
            ("[4611686018427387904, 4]", "[0, 0]", 0, "overflows 64 bits"),
            (
                "[4294967296, 4294967296, 4]",
                "[0, 0]",
                0,
                "overflows 64 bits",
            ),
            // 2^61 elements fit; their 2^63 bytes do not fit in i64.
            (
                "[2305843009213693952]",
                "[0, 0]",
                0,
                "overflow 64 bits of bytes",
            ),
            // (-1)·(-4) = 4 elements, 16 bytes present: libtorch was handed [-1, -4].
            ("[-1, -4]", "[0, 16]", 16, "dimension -1"),
            ("[2.5]", "[0, 10]", 10, "dimension 2.5"),
            (
                "[18446744073709551615]",
                "[0, 0]",
                0,
                "dimension 18446744073709551615",
            ),
            ("4", "[0, 4]", 4, "not a list"),
        ] {
            let header = format!(
                r#"{{"w": {{"dtype": "F32", "shape": {shape}, "data_offsets": {offsets}}}}}"#
            );
            let err = refusal(dir.path(), &header, data);
            assert!(
                err.contains("w: shape") && err.contains(says),
                "{shape}: {err}"
            );
        }
    }

    /// Offsets outside the data, overlapping tensors, gaps, bytes after the last tensor, a
    /// length that disagrees with the shape, an unknown dtype: each refused, naming the tensor.
    #[test]
    fn offsets_and_dtypes_are_checked_against_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let t = |name: &str, dtype: &str, shape: &str, a: u64, b: u64| {
            format!(
                r#""{name}": {{"dtype": "{dtype}", "shape": {shape}, "data_offsets": [{a}, {b}]}}"#
            )
        };
        let cases = [
            (
                format!("{{{}}}", t("a", "F32", "[4]", 0, 16)),
                8,
                "data ends at byte 16",
            ),
            (
                format!(
                    "{{{}, {}}}",
                    t("a", "F32", "[4]", 0, 16),
                    t("b", "F32", "[2]", 8, 16)
                ),
                16,
                "overlap",
            ),
            (
                format!(
                    "{{{}, {}}}",
                    t("a", "F32", "[2]", 0, 8),
                    t("b", "F32", "[2]", 12, 20)
                ),
                20,
                "belong to no tensor",
            ),
            (
                format!("{{{}}}", t("a", "F32", "[2]", 0, 8)),
                9,
                "the tensors end at byte 8",
            ),
            (
                format!("{{{}}}", t("a", "F32", "[2]", 0, 12)),
                12,
                "(8 bytes)",
            ),
            (
                format!("{{{}}}", t("a", "F32", "[2]", 8, 0)),
                8,
                "data_offsets 8..0",
            ),
            (
                format!("{{{}}}", t("a", "Q4", "[2]", 0, 8)),
                8,
                "unsupported dtype",
            ),
            (
                r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}"#.into(),
                4,
                "data_offsets",
            ),
            ("[1, 2]".into(), 0, "not a JSON object"),
        ];
        for (header, data, says) in cases {
            let err = refusal(dir.path(), &header, data);
            assert!(err.contains(says), "{header}: {err}");
        }
        // Empty tensors take no bytes and may share an offset; metadata is skipped.
        let header = format!(
            r#"{{"__metadata__": {{"format": "pt"}}, {}, {}, {}}}"#,
            t("e", "F32", "[0, 3]", 0, 0),
            t("f", "BF16", "[0]", 0, 0),
            t("g", "I64", "[]", 0, 8)
        );
        let p = raw(dir.path(), &header, 8);
        let f = SafetensorsFile::open(&p, files::CHECKPOINT).unwrap();
        let names: Vec<&str> = f.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["e", "f", "g"]);
        let all = f.read_all().unwrap();
        assert_eq!(all[0].1.size(), [0, 3]);
        assert_eq!(all[2].1.int64_value(&[]), 0);
    }

    /// A 1.5 GiB sparse file with a garbage header is refused after reading 8 bytes, and one
    /// with a valid header and a 1.5 GiB tail no tensor accounts for without reading the tail.
    /// Either would take seconds and 1.5 GiB of memory if read whole first.
    #[test]
    fn a_sparse_giant_is_refused_from_its_header() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.safetensors");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(3 << 29).unwrap();
        f.write_at(b"\x01\x00\x00\x00\x00\x00\x00\x00junk", 0)
            .unwrap();
        let err = SafetensorsFile::open(&p, files::CHECKPOINT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a JSON object"), "{err}");
        f.write_at(&(MAX_HEADER_BYTES + 1).to_le_bytes(), 0)
            .unwrap();
        let err = SafetensorsFile::open(&p, files::CHECKPOINT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("over the 100000000"), "{err}");
        let header = br#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}"#;
        f.write_at(&(header.len() as u64).to_le_bytes(), 0).unwrap();
        f.write_at(header, 8).unwrap();
        let started = std::time::Instant::now();
        let err = SafetensorsFile::open(&p, files::CHECKPOINT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("the tensors end at byte 1"), "{err}");
        // Under a smaller limit, its size alone refuses it.
        let err = SafetensorsFile::open(&p, files::ADAPTER_CONFIG).unwrap_err();
        assert!(
            matches!(err, ModelError::Read(rlhost_fs::ReadError::TooLarge { .. })),
            "{err}"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    /// A FIFO or a link to `/dev/zero` where a tensor file should be is refused at once.
    #[test]
    fn fifos_and_devices_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let zero = dir.path().join("zero.safetensors");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = read(&zero).unwrap_err().to_string();
        assert!(
            err.contains("character device") && err.contains("zero.safetensors"),
            "{err}"
        );
        let fifo = dir.path().join("fifo.safetensors");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read(&fifo).map(|_| ()).unwrap_err().to_string());
        });
        let err = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO blocked");
        assert!(err.contains("FIFO"), "{err}");
    }
}
