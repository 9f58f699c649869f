//! TensorBoard event files, written without TensorFlow or a protobuf library: the format is
//! TFRecord framing (length, masked CRC-32C of the length, the record, masked CRC-32C of the
//! record) around `tensorflow.Event` messages, of which a writer needs only a handful of
//! fields, encoded here by hand:
//!
//! - `Event`: `wall_time` (1, double), `step` (2, int64), `file_version` (3, string),
//!   `summary` (5), `session_log` (7);
//! - `Summary`: repeated `value` (1); `Summary.Value`: `tag` (1), `simple_value` (2, float),
//!   `tensor` (8), `metadata` (9);
//! - `SummaryMetadata.plugin_data` (1) → `plugin_name` (1): `"text"` for the text plugin,
//!   whose tensor is a `DT_STRING` (dtype 1 = 7) scalar with its bytes in `string_val` (8);
//! - `SessionLog.status` (1) = `START` (1): TensorBoard drops the points at and after its step
//!   that an earlier, interrupted run wrote (what a resumed run redoes).
//!
//! TensorBoard's own reader checks these files in `host/tests/e2e/monitor.rs`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord.
pub fn crc32c(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// TFRecord's masked CRC: rotated right by 15 bits plus a constant, so a CRC of data that
/// holds CRCs stays well spread.
pub fn masked_crc32c(bytes: &[u8]) -> u32 {
    let c = crc32c(bytes);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// A protobuf message being encoded: fields appended in any order.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    fn int(&mut self, field: u32, v: i64) {
        self.key(field, 0);
        self.varint(v as u64);
    }

    fn double(&mut self, field: u32, v: f64) {
        self.key(field, 1);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn float(&mut self, field: u32, v: f32) {
        self.key(field, 5);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn bytes(&mut self, field: u32, v: &[u8]) {
        self.key(field, 2);
        self.varint(v.len() as u64);
        self.0.extend_from_slice(v);
    }

    fn msg(&mut self, field: u32, m: Msg) {
        self.bytes(field, &m.0);
    }
}

/// An `Event` at `step` and `wall_time` (seconds since the epoch) around `body`'s fields.
fn event(wall_time: f64, step: u64, body: impl FnOnce(&mut Msg)) -> Vec<u8> {
    let mut e = Msg::default();
    e.double(1, wall_time);
    e.int(2, step as i64);
    body(&mut e);
    e.0
}

/// One TFRecord: the framing TensorBoard's reader checks before parsing the event.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// Seconds since the epoch, as events stamp them.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One event file in a log folder (`events.out.tfevents.<time>.<host>.<pid>.<n>`, the name
/// TensorBoard looks for), flushed after every call so a live TensorBoard shows each step.
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it, starting with the file-version
    /// event every reader expects first. `n` tells apart files one process makes in a folder.
    pub fn create(dir: &Path, n: u32) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().replace(['/', '.'], "_"))
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}.{n}",
            now() as u64,
            std::process::id()
        ));
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)?;
        let mut w = Self {
            file: BufWriter::new(file),
            path,
        };
        w.write(&event(now(), 0, |e| e.bytes(3, b"brain.Event:2")))?;
        Ok(w)
    }

    /// The event file being written, `events.out.tfevents.<time>.<host>.<pid>.<n>` in its folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, event: &[u8]) -> std::io::Result<()> {
        self.file.write_all(&record(event))?;
        self.file.flush()
    }

    /// One event holding every scalar of `step` (TensorBoard keeps them as 32-bit floats).
    pub fn scalars(&mut self, step: u64, values: &BTreeMap<String, f64>) -> std::io::Result<()> {
        let mut summary = Msg::default();
        for (tag, v) in values {
            let mut value = Msg::default();
            value.bytes(1, tag.as_bytes());
            value.float(2, *v as f32);
            summary.msg(1, value);
        }
        self.write(&event(now(), step, |e| e.msg(5, summary)))
    }

    /// Text under `tag` at `step`, shown by TensorBoard's text plugin (markdown).
    pub fn text(&mut self, step: u64, tag: &str, markdown: &str) -> std::io::Result<()> {
        let mut plugin = Msg::default();
        plugin.bytes(1, b"text");
        let mut metadata = Msg::default();
        metadata.msg(1, plugin);
        let mut tensor = Msg::default();
        tensor.int(1, 7); // DT_STRING
        tensor.msg(2, Msg::default()); // a scalar: no dimensions
        tensor.bytes(8, markdown.as_bytes());
        let mut value = Msg::default();
        value.bytes(1, tag.as_bytes());
        value.msg(8, tensor);
        value.msg(9, metadata);
        let mut summary = Msg::default();
        summary.msg(1, value);
        self.write(&event(now(), step, |e| e.msg(5, summary)))
    }

    /// A session start at `step`: readers drop what earlier files logged at `step` and after
    /// (the steps a resumed run redoes).
    pub fn session_start(&mut self, step: u64) -> std::io::Result<()> {
        let mut log = Msg::default();
        log.int(1, 1); // START
        self.write(&event(now(), step, |e| e.msg(7, log)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check values of CRC-32C (RFC 3720's and the usual "123456789") and TFRecord's
    /// framing of an empty record.
    #[test]
    fn crc32c_matches_the_standard_check_values() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let r = record(b"");
        assert_eq!(r.len(), 16);
        assert_eq!(&r[..8], &0u64.to_le_bytes());
        assert_eq!(
            u32::from_le_bytes(r[8..12].try_into().unwrap()),
            crc32c(&0u64.to_le_bytes())
                .rotate_right(15)
                .wrapping_add(0xa282_ead8)
        );
    }

    /// Varints and field keys as protobuf encodes them (the spec's 150 example).
    #[test]
    fn protobuf_fields_encode_as_the_spec_says() {
        let mut m = Msg::default();
        m.int(1, 150);
        assert_eq!(m.0, [0x08, 0x96, 0x01]);
        let mut m = Msg::default();
        m.bytes(2, b"testing");
        assert_eq!(m.0, [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']);
        let mut m = Msg::default();
        m.float(2, 1.0);
        assert_eq!(m.0, [0x15, 0, 0, 0x80, 0x3f]);
    }
}
