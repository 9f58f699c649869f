//! Training curves as a PNG, with no plotting or image dependency: one panel per series (a
//! frame, the curve, its min/max and the step range written in a built-in 5×7 pixel font), RGB
//! pixels deflated with zlib into a standard PNG.

use std::io::Write;
use std::path::Path;

const W: usize = 720;
const PANEL_H: usize = 220;
const MARGIN_L: usize = 86;
const MARGIN_R: usize = 20;
const MARGIN_T: usize = 24;
const MARGIN_B: usize = 26;

struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Self {
        Self {
            w,
            h,
            px: vec![255; w * h * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if x >= 0 && y >= 0 && (x as usize) < self.w && (y as usize) < self.h {
            let i = (y as usize * self.w + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    /// A line (Bresenham), `thick` pixels wide.
    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3], thick: i64) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            for t in 0..thick {
                self.set(x, y + t, c);
                self.set(x + t, y, c);
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Text in the built-in font, scale 2 (10×14 pixel glyphs).
    fn text(&mut self, x: i64, y: i64, s: &str, c: [u8; 3]) {
        for (k, ch) in s.chars().enumerate() {
            let Some(rows) = glyph(ch) else { continue };
            for (r, bits) in rows.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0b10000 >> col) != 0 {
                        for (ox, oy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                            self.set(x + k as i64 * 12 + col * 2 + ox, y + r as i64 * 2 + oy, c);
                        }
                    }
                }
            }
        }
    }
}

/// 5×7 glyphs (one byte per row, low five bits, high bit left): digits, lower-case letters
/// (upper case drawn as lower) and the punctuation labels use.
fn glyph(c: char) -> Option<[u8; 7]> {
    Some(match c.to_ascii_lowercase() {
        '0' => [14, 17, 19, 21, 25, 17, 14],
        '1' => [4, 12, 4, 4, 4, 4, 14],
        '2' => [14, 17, 1, 2, 4, 8, 31],
        '3' => [30, 1, 1, 14, 1, 1, 30],
        '4' => [2, 6, 10, 18, 31, 2, 2],
        '5' => [31, 16, 30, 1, 1, 17, 14],
        '6' => [6, 8, 16, 30, 17, 17, 14],
        '7' => [31, 1, 2, 4, 8, 8, 8],
        '8' => [14, 17, 17, 14, 17, 17, 14],
        '9' => [14, 17, 17, 15, 1, 2, 12],
        '.' => [0, 0, 0, 0, 0, 12, 12],
        '-' => [0, 0, 0, 14, 0, 0, 0],
        '+' => [0, 4, 4, 31, 4, 4, 0],
        ' ' => [0; 7],
        ':' => [0, 12, 12, 0, 12, 12, 0],
        '=' => [0, 0, 31, 0, 31, 0, 0],
        '@' => [14, 17, 1, 13, 21, 21, 14],
        '(' => [2, 4, 8, 8, 8, 4, 2],
        ')' => [8, 4, 2, 2, 2, 4, 8],
        'a' => [0, 0, 14, 1, 15, 17, 15],
        'b' => [16, 16, 22, 25, 17, 17, 30],
        'c' => [0, 0, 14, 16, 16, 17, 14],
        'd' => [1, 1, 13, 19, 17, 17, 15],
        'e' => [0, 0, 14, 17, 31, 16, 14],
        'f' => [6, 9, 8, 28, 8, 8, 8],
        'g' => [0, 15, 17, 17, 15, 1, 14],
        'h' => [16, 16, 22, 25, 17, 17, 17],
        'i' => [4, 0, 12, 4, 4, 4, 14],
        'j' => [2, 0, 6, 2, 2, 18, 12],
        'k' => [16, 16, 18, 20, 24, 20, 18],
        'l' => [12, 4, 4, 4, 4, 4, 14],
        'm' => [0, 0, 26, 21, 21, 17, 17],
        'n' => [0, 0, 22, 25, 17, 17, 17],
        'o' => [0, 0, 14, 17, 17, 17, 14],
        'p' => [0, 0, 30, 17, 30, 16, 16],
        'q' => [0, 0, 13, 19, 15, 1, 1],
        'r' => [0, 0, 22, 25, 16, 16, 16],
        's' => [0, 0, 15, 16, 14, 1, 30],
        't' => [8, 8, 28, 8, 8, 9, 6],
        'u' => [0, 0, 17, 17, 17, 19, 13],
        'v' => [0, 0, 17, 17, 17, 10, 4],
        'w' => [0, 0, 17, 17, 21, 21, 10],
        'x' => [0, 0, 17, 10, 4, 10, 17],
        'y' => [0, 0, 17, 17, 15, 1, 14],
        'z' => [0, 0, 31, 2, 4, 8, 31],
        '/' => [1, 2, 2, 4, 8, 8, 16],
        '_' => [0, 0, 0, 0, 0, 0, 31],
        _ => return None,
    })
}

fn label(v: f64) -> String {
    if v == 0.0 || (v.abs() >= 0.01 && v.abs() < 1e4) {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

/// Writes one panel per `(name, points)` series to `path` as a PNG: points are `(step, value)`,
/// every panel spans the same steps (the smallest to the largest of any series), and a
/// series' points are joined in order, so one measured at some steps only (an evaluation every
/// N steps) is still a line. Non-finite values are left out.
pub fn write_png(path: &Path, series: &[(&str, Vec<(f64, f64)>)]) -> std::io::Result<()> {
    let colors = [
        [31, 119, 180],
        [214, 39, 40],
        [44, 160, 44],
        [148, 103, 189],
    ];
    let steps = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(x, _)| x))
        .filter(|x| x.is_finite());
    let (x_lo, x_hi) = steps.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let h = PANEL_H * series.len().max(1);
    let mut cv = Canvas::new(W, h);
    for (p, (name, points)) in series.iter().enumerate() {
        let top = (p * PANEL_H + MARGIN_T) as i64;
        let bottom = ((p + 1) * PANEL_H - MARGIN_B) as i64;
        let (left, right) = (MARGIN_L as i64, (W - MARGIN_R) as i64);
        let grey = [90, 90, 90];
        cv.line((left, top), (right, top), grey, 1);
        cv.line((left, bottom), (right, bottom), grey, 1);
        cv.line((left, top), (left, bottom), grey, 1);
        cv.line((right, top), (right, bottom), grey, 1);
        cv.text(left + 6, top - 18, name, [0, 0, 0]);
        let finite: Vec<(f64, f64)> = points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        if finite.is_empty() {
            continue;
        }
        let (mut lo, mut hi) = finite
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &(_, v)| {
                (a.min(v), b.max(v))
            });
        if hi - lo < 1e-12 {
            lo -= 0.5;
            hi += 0.5;
        }
        cv.text(2, top, &label(hi), grey);
        cv.text(2, bottom - 14, &label(lo), grey);
        cv.text(left, bottom + 6, &format!("step {x_lo}"), grey);
        let last = format!("{x_hi}");
        cv.text(right - 12 * last.len() as i64, bottom + 6, &last, grey);
        let span = (x_hi - x_lo).max(1.0);
        let xy = |x: f64, v: f64| {
            let x = left + ((right - left) as f64 * (x - x_lo) / span).round() as i64;
            let y = bottom - ((bottom - top) as f64 * (v - lo) / (hi - lo)).round() as i64;
            (x, y)
        };
        let color = colors[p % colors.len()];
        let mut prev: Option<(i64, i64)> = None;
        for &(x, v) in &finite {
            let pt = xy(x, v);
            match prev {
                Some(q) => cv.line(q, pt, color, 2),
                None => cv.line(pt, pt, color, 3),
            }
            prev = Some(pt);
        }
    }
    encode(path, &cv)
}

fn encode(path: &Path, cv: &Canvas) -> std::io::Result<()> {
    let mut raw = Vec::with_capacity(cv.h * (cv.w * 3 + 1));
    for row in cv.px.chunks(cv.w * 3) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(&raw)?;
    let idat = z.finish()?;
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8; 4], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(kind);
        crc.update(data);
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        out.extend_from_slice(&crc.finalize().to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(cv.w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(cv.h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, deflate, no filter, no interlace
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &idat);
    chunk(b"IEND", &[]);
    rlhost_fs::write_atomically(path, &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Curve names (`eval/<id>/reward`, ids with any letters) and axis labels are drawn whole.
    #[test]
    fn every_label_character_has_a_glyph() {
        let text =
            "abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789 .-+_/@():= eval/will/math-python/reward";
        let missing: String = text.chars().filter(|&c| glyph(c).is_none()).collect();
        assert_eq!(missing, "");
    }

    #[test]
    fn a_valid_png_with_the_curves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curves.png");
        let reward: Vec<(f64, f64)> = (1..=30)
            .map(|i| (i as f64, (i as f64 / 30.0).sqrt()))
            .collect();
        let loss: Vec<(f64, f64)> = (1..=30).map(|i| (i as f64, 1.0 / i as f64)).collect();
        write_png(&path, &[("reward", reward), ("loss", loss)]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&bytes[12..16], b"IHDR");
        let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
        let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap()) as usize;
        assert_eq!((w, h), (W, 2 * PANEL_H));
        // IDAT inflates to exactly the image, and the curve's colour is present.
        let len = u32::from_be_bytes(bytes[33..37].try_into().unwrap()) as usize;
        assert_eq!(&bytes[37..41], b"IDAT");
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&bytes[41..41 + len])
            .read_to_end(&mut raw)
            .unwrap();
        assert_eq!(raw.len(), h * (1 + 3 * w));
        assert!(raw.windows(3).any(|p| p == [31, 119, 180]));
        // The CRC of IHDR checks out.
        let mut crc = crc32fast::Hasher::new();
        crc.update(&bytes[12..29]);
        assert_eq!(crc.finalize().to_be_bytes(), bytes[29..33]);
    }
}
