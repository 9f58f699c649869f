//! The safetensors format (what Hugging Face checkpoints use): an 8-byte little-endian header
//! length, a JSON header (`name → {dtype, shape, data_offsets}`, plus `__metadata__`), then the
//! raw little-endian tensor bytes. Read with full validation (a truncated or corrupted file is an
//! error naming it, never a crash) and written atomically (tmp + rename).

use std::collections::BTreeMap;
use std::path::Path;

use tch::{Kind, Tensor};

use super::ModelError;

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

fn kind_of(name: &str) -> Option<(Kind, usize)> {
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

/// Reads every tensor of a safetensors file (on the CPU).
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>, ModelError> {
    let bad = |message: String| ModelError::Malformed {
        path: path.to_owned(),
        message,
    };
    let bytes = std::fs::read(path).map_err(|e| ModelError::Io {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    if bytes.len() < 8 {
        return Err(bad(format!(
            "{} bytes: too short for a header",
            bytes.len()
        )));
    }
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = bytes.get(8..8usize.saturating_add(n)).ok_or_else(|| {
        bad(format!(
            "the header claims {n} bytes, the file has {}",
            bytes.len()
        ))
    })?;
    let data = &bytes[8 + n..];
    let header: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(header).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let mut out = Vec::new();
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"].as_str().unwrap_or_default();
        let (kind, size) =
            kind_of(dtype).ok_or_else(|| bad(format!("{name}: unsupported dtype {dtype:?}")))?;
        let shape: Vec<i64> = serde_json::from_value(info["shape"].clone())
            .map_err(|e| bad(format!("{name}: bad shape: {e}")))?;
        let offsets: [usize; 2] = serde_json::from_value(info["data_offsets"].clone())
            .map_err(|e| bad(format!("{name}: bad data_offsets: {e}")))?;
        let numel: i64 = shape.iter().product();
        let want = usize::try_from(numel)
            .unwrap_or(usize::MAX)
            .saturating_mul(size);
        if offsets[1] < offsets[0] || offsets[1] - offsets[0] != want {
            return Err(bad(format!(
                "{name}: {} bytes for shape {shape:?} {dtype}",
                offsets[1].saturating_sub(offsets[0])
            )));
        }
        let raw = data.get(offsets[0]..offsets[1]).ok_or_else(|| {
            bad(format!(
                "{name}: data ends at byte {}, the file has {} (truncated?)",
                offsets[1],
                data.len()
            ))
        })?;
        out.push((name, Tensor::from_data_size(raw, &shape, kind)));
    }
    Ok(out)
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
}
