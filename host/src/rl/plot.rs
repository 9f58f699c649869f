//! Training curves as one PNG: a column of [`Panel`]s, each with a title, axes with ticks and
//! tick labels, axis titles and a legend beside the plot, drawn with `plotters` into an RGB
//! buffer and encoded with `png`. The text is DejaVu Sans compiled into the binary
//! (`host/assets/fonts/`, with its licence) and set with `ab_glyph`, so drawing never looks for
//! system fonts and a plot looks the same on every machine.
//!
//! This module draws what it is given and must never read a log: which panels and series a run
//! shows is decided by `metrics::curves`.

use std::path::Path;

use ab_glyph::{Font, FontRef, ScaleFont};
use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
// Not `BackendStyle`: its `stroke_width` would clash with plotters' `Color::stroke_width`.
use plotters_backend::{BackendColor, BackendCoord, BackendTextStyle, DrawingErrorKind};

/// Width of the image in pixels.
pub const WIDTH: u32 = 1000;
/// Height of one panel in pixels: the image is `panels × PANEL_HEIGHT` tall.
pub const PANEL_HEIGHT: u32 = 300;
/// Width of the legend column at the right of every panel; the chart takes the rest.
pub const LEGEND_WIDTH: u32 = 220;
/// Rows at the top of a panel that hold its title and nothing else.
pub const TITLE_HEIGHT: u32 = 34;

/// Series colours, in the order a panel's series take them (Tableau 10, which stays distinct
/// for the colour-blind better than pure hues).
pub const PALETTE: [(u8, u8, u8); 8] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (23, 190, 207),
];

/// Weight of the exponential moving average drawn over a per-step series (TensorBoard's
/// default): per-step RL rewards and losses are noisy enough to hide their trend.
pub const SMOOTHING: f64 = 0.6;
/// Fewest points a per-step series needs before it is smoothed: on a handful of steps the
/// average only lags.
const SMOOTH_FROM: usize = 10;

/// The family the text styles name: [`Canvas`] sets every text in the bundled font whatever
/// the family, this one only says what it looks like.
const FAMILY: &str = "sans-serif";
/// DejaVu Sans 2.37 (licence: `host/assets/fonts/LICENSE-DejaVu.txt`).
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Measured at every step (training reward, loss): a line, faint under its moving average
    /// (weight [`SMOOTHING`]) once it has enough points.
    PerStep,
    /// Measured at some steps only (evaluations): a line through the points, each one marked.
    Sparse,
}

/// One curve of a panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Its legend entry.
    pub label: String,
    /// `(step, value)` points, joined in order; non-finite values (and beyond ±1e300) are left
    /// out when drawn.
    pub points: Vec<(u64, f64)>,
    /// How it is drawn.
    pub mark: Mark,
}

/// One panel of the image: a chart with its own y-range; every panel of an image spans the
/// same steps, so panels line up.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Its title, above the chart.
    pub title: String,
    /// The y axis' title (the x axis' is `step`).
    pub y_desc: String,
    /// Its curves; the i-th takes colour `PALETTE[i % PALETTE.len()]`.
    pub series: Vec<Series>,
}

/// Draws `panels` in a column to `path` as a PNG `WIDTH` wide and `PANEL_HEIGHT` per panel tall
/// (one empty panel for none), replacing the file atomically so a viewer never reads half a
/// picture. A panel without a finite point says so instead of drawing a curve.
pub fn write_png(path: &Path, panels: &[Panel]) -> anyhow::Result<()> {
    let (w, h, rgb) = render(panels)?;
    let mut png = Vec::new();
    let mut encoder = png::Encoder::new(&mut png, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut writer| writer.write_image_data(&rgb))
        .context("encoding the PNG")?;
    rlhost_fs::write_atomically(path, &png)?;
    Ok(())
}

/// The panels as RGB pixels: `(width, height, pixels)`.
fn render(panels: &[Panel]) -> anyhow::Result<(u32, u32, Vec<u8>)> {
    let font =
        FontRef::try_from_slice(FONT).context("the bundled font (DejaVu Sans) did not parse")?;
    let empty = [Panel {
        title: "no curves yet".into(),
        y_desc: "value".into(),
        series: Vec::new(),
    }];
    let panels = if panels.is_empty() {
        &empty[..]
    } else {
        panels
    };
    let (w, h) = (WIDTH, PANEL_HEIGHT * panels.len() as u32);
    let mut rgb = vec![255u8; (w * h * 3) as usize];
    {
        let canvas = Canvas {
            bitmap: BitMapBackend::with_buffer(&mut rgb, (w, h)),
            font,
        };
        let root = canvas.into_drawing_area();
        root.fill(&WHITE)?;
        let steps = step_range(panels);
        for (panel, area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
            draw_panel(&area, panel, steps.clone())?;
        }
        root.present()?;
    }
    Ok((w, h, rgb))
}

/// The steps every panel spans: the smallest to the largest step of any finite point, widened
/// by one each way around a single step.
fn step_range(panels: &[Panel]) -> std::ops::Range<u64> {
    let steps = panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| finite(&s.points))
        .map(|(x, _)| x);
    let (lo, hi) = steps.fold((u64::MAX, u64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    match (lo, hi) {
        (u64::MAX, u64::MIN) => 0..1,
        (lo, hi) if lo == hi => lo.saturating_sub(1)..hi.saturating_add(1),
        range => range.0..range.1,
    }
}

/// The value range of a panel's finite points, padded so no curve runs along the frame; a
/// constant series gets a band around its value.
fn value_range(panel: &Panel) -> Option<std::ops::Range<f64>> {
    let values = panel.series.iter().flat_map(|s| finite(&s.points));
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, v)| {
        (lo.min(v), hi.max(v))
    });
    if lo > hi {
        return None;
    }
    let span = hi - lo;
    let pad = if span > 1e-12 * hi.abs().max(lo.abs()) {
        span * 0.06
    } else if hi.abs() > 1e-6 {
        hi.abs() * 0.1
    } else {
        0.5
    };
    Some(lo - pad..hi + pad)
}

/// The points that can be drawn: finite, and within ±1e300, past which the axis' arithmetic
/// (a range, its padding) would overflow to infinity; no metric gets there without being a
/// blow-up that the log shows anyway.
fn finite(points: &[(u64, f64)]) -> impl Iterator<Item = (u64, f64)> + '_ {
    points.iter().copied().filter(|(_, v)| v.abs() <= 1e300)
}

/// The debiased exponential moving average of `points` (TensorBoard's smoothing).
fn smoothed(points: &[(u64, f64)]) -> Vec<(u64, f64)> {
    let mut avg = 0.0;
    let mut weight = 1.0;
    points
        .iter()
        .map(|&(x, v)| {
            avg = avg * SMOOTHING + (1.0 - SMOOTHING) * v;
            weight *= SMOOTHING;
            (x, avg / (1.0 - weight))
        })
        .collect()
}

/// The y axis' tick labels `y_labels(Y_TICKS)` asks for at most.
const Y_TICKS: usize = 6;

/// The spacing of the ticks plotters puts on the value axis `range` (a 1, 2 or 5 times a power
/// of ten), so labels get the decimals the ticks need, no more.
fn tick_spacing(range: &std::ops::Range<f64>) -> f64 {
    let ticks = plotters::coord::types::RangedCoordf64::from(range.clone()).key_points(Y_TICKS);
    let gaps = ticks.windows(2).map(|w| w[1] - w[0]);
    gaps.fold(range.end - range.start, f64::min)
}

/// A tick label for `v` on an axis with ticks every `spacing`: as many decimals as the spacing
/// needs; scientific notation, with as many digits, for very large or very small values.
fn tick_label(v: f64, spacing: f64) -> String {
    if v.abs() < spacing * 1e-6 {
        // A tick at zero computed as a multiple of the spacing can be off by a rounding error.
        return "0".into();
    }
    // The tolerance keeps 0.1's spacing (log10 a hair off -1) at one decimal.
    let places = |x: f64| (x.log10() - 1e-6).ceil();
    if v.abs() >= 1e5 || v.abs() < 1e-3 {
        let digits = (v.abs().log10().floor() + places(1.0 / spacing)).clamp(0.0, 6.0) as usize;
        return format!("{v:.digits$e}");
    }
    let decimals = places(1.0 / spacing).clamp(0.0, 10.0) as usize;
    format!("{v:.decimals$}")
}

/// A region of the image, in pixels from its top left corner.
type Area<'a> = DrawingArea<Canvas<'a>, Shift>;

fn rgb((r, g, b): (u8, u8, u8)) -> RGBColor {
    RGBColor(r, g, b)
}

fn draw_panel(area: &Area, panel: &Panel, steps: std::ops::Range<u64>) -> anyhow::Result<()> {
    let (chart_area, legend_area) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let values = value_range(panel);
    let y = values.clone().unwrap_or(0.0..1.0);
    let spacing = tick_spacing(&y);
    let label = |v: &f64| tick_label(*v, spacing);
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(&panel.title, (FAMILY, 22))
        .margin_top(10)
        .margin_right(16)
        .x_label_area_size(44)
        .y_label_area_size(78)
        .build_cartesian_2d(steps, y)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(&panel.y_desc)
        .x_labels(10)
        .y_labels(Y_TICKS)
        .y_label_formatter(&label)
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 15))
        .max_light_lines(1)
        .light_line_style(RGBColor(242, 242, 242))
        .bold_line_style(RGBColor(222, 222, 222))
        .draw()?;
    if values.is_none() {
        let plot = chart.plotting_area().strip_coord_spec();
        let (pw, ph) = plot.dim_in_pixel();
        let style = TextStyle::from((FAMILY, 18))
            .color(&RGBColor(120, 120, 120))
            .pos(Pos::new(HPos::Center, VPos::Center));
        plot.draw(&Text::new(
            "no data yet",
            (pw as i32 / 2, ph as i32 / 2),
            style,
        ))?;
    }
    let mut any_smoothed = false;
    for (i, series) in panel.series.iter().enumerate() {
        let color = rgb(PALETTE[i % PALETTE.len()]);
        let points: Vec<(u64, f64)> = finite(&series.points).collect();
        match series.mark {
            Mark::PerStep if points.len() >= SMOOTH_FROM => {
                any_smoothed = true;
                chart.draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.mix(0.35).stroke_width(2),
                ))?;
                chart.draw_series(LineSeries::new(smoothed(&points), color.stroke_width(3)))?;
            }
            Mark::PerStep | Mark::Sparse => {
                chart.draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))?;
            }
        }
        if series.mark == Mark::Sparse || points.len() == 1 {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
    }
    draw_legend(&legend_area, panel, any_smoothed)?;
    Ok(())
}

/// The legend column: a swatch and the label of each series, then how per-step series are
/// drawn when one was smoothed.
fn draw_legend(area: &Area, panel: &Panel, any_smoothed: bool) -> anyhow::Result<()> {
    const ROW: i32 = 24;
    let text = TextStyle::from((FAMILY, 15)).pos(Pos::new(HPos::Left, VPos::Center));
    let max_text = LEGEND_WIDTH as i32 - 48;
    let mut y = TITLE_HEIGHT as i32 + 18;
    for (i, series) in panel.series.iter().enumerate() {
        let color = rgb(PALETTE[i % PALETTE.len()]);
        area.draw(&PathElement::new(
            vec![(4, y), (30, y)],
            color.stroke_width(3),
        ))?;
        if series.mark == Mark::Sparse {
            area.draw(&Circle::new((17, y), 4, color.filled()))?;
        }
        let label = fit(area, &series.label, &text, max_text)?;
        area.draw(&Text::new(label, (38, y), text.clone()))?;
        y += ROW;
    }
    if any_smoothed {
        let note = TextStyle::from((FAMILY, 13))
            .color(&RGBColor(110, 110, 110))
            .pos(Pos::new(HPos::Left, VPos::Center));
        let weight = format!("bold: moving average ({SMOOTHING})");
        for line in ["faint: each step", weight.as_str()] {
            area.draw(&Text::new(line.to_owned(), (4, y), note.clone()))?;
            y += ROW - 6;
        }
    }
    Ok(())
}

/// `label`, shortened with an ellipsis until it is at most `max` pixels wide in `style`.
fn fit(area: &Area, label: &str, style: &TextStyle, max: i32) -> anyhow::Result<String> {
    let mut chars: Vec<char> = label.chars().collect();
    let mut text = label.to_owned();
    while area.estimate_text_size(&text, style)?.0 as i32 > max && chars.len() > 1 {
        chars.pop();
        text = chars.iter().collect::<String>() + "…";
    }
    Ok(text)
}

/// The bitmap backend with text set by `ab_glyph` in the bundled font: everything else is
/// `BitMapBackend`'s own drawing. plotters' `ab_glyph` text (0.3.7) leaves out each glyph's left
/// side bearing, which spaces letters unevenly at label sizes ("m ath"); here every glyph sits
/// at its pen position plus its bearing, with kerning, as the font says.
struct Canvas<'a> {
    bitmap: BitMapBackend<'a>,
    font: FontRef<'static>,
}

/// A line of text laid out from its top left corner: the glyphs, its width and its height
/// (ascent to descent).
struct Line {
    glyphs: Vec<ab_glyph::Glyph>,
    width: f32,
    height: f32,
}

impl Canvas<'_> {
    /// `text` on one line, `size` pixels from ascent to descent (plotters' font size).
    fn layout(&self, text: &str, size: f64) -> Line {
        let font = self.font.as_scaled(size as f32);
        let mut glyphs = Vec::with_capacity(text.len());
        let mut pen = 0.0;
        let mut previous = None;
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(previous) = previous {
                pen += font.kern(previous, id);
            }
            glyphs.push(
                id.with_scale_and_position(font.scale(), ab_glyph::point(pen, font.ascent())),
            );
            pen += font.h_advance(id);
            previous = Some(id);
        }
        Line {
            glyphs,
            width: pen,
            height: font.ascent() - font.descent(),
        }
    }
}

type CanvasError = DrawingErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>;

impl DrawingBackend for Canvas<'_> {
    type ErrorType = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.bitmap.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), CanvasError> {
        self.bitmap.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), CanvasError> {
        self.bitmap.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), CanvasError> {
        self.bitmap.draw_pixel(point, color)
    }

    fn draw_line<S: plotters_backend::BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), CanvasError> {
        self.bitmap.draw_line(from, to, style)
    }

    fn draw_rect<S: plotters_backend::BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), CanvasError> {
        self.bitmap.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: plotters_backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), CanvasError> {
        self.bitmap.draw_path(path, style)
    }

    fn draw_circle<S: plotters_backend::BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), CanvasError> {
        self.bitmap.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: plotters_backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), CanvasError> {
        self.bitmap.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), CanvasError> {
        self.bitmap.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), CanvasError> {
        let line = self.layout(text, style.size());
        Ok((line.width.ceil() as u32, line.height.ceil() as u32))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), CanvasError> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let line = self.layout(text, style.size());
        let anchor = style.anchor();
        let dx = match anchor.h_pos {
            HPos::Left => 0.0,
            HPos::Center => -line.width / 2.0,
            HPos::Right => -line.width,
        };
        let dy = match anchor.v_pos {
            VPos::Top => 0.0,
            VPos::Center => -line.height / 2.0,
            VPos::Bottom => -line.height,
        };
        let (dx, dy) = (dx.round() as i32, dy.round() as i32);
        let rotation = style.transform();
        let (w, h) = self.get_size();
        let font = self.font.as_scaled(style.size() as f32);
        for glyph in line.glyphs {
            let Some(outline) = font.outline_glyph(glyph) else {
                continue; // a space
            };
            let bounds = outline.px_bounds();
            let (left, top) = (bounds.min.x as i32 + dx, bounds.min.y as i32 + dy);
            let mut drawn = Ok(());
            outline.draw(|x, y, coverage| {
                let (x, y) = rotation.transform(left + x as i32, top + y as i32);
                let (x, y) = (pos.0 + x, pos.1 + y);
                if coverage > 0.0
                    && drawn.is_ok()
                    && (0..w as i32).contains(&x)
                    && (0..h as i32).contains(&y)
                {
                    let alpha = color.alpha * f64::from(coverage.min(1.0));
                    drawn = self.bitmap.draw_pixel(
                        (x, y),
                        BackendColor {
                            alpha,
                            rgb: color.rgb,
                        },
                    );
                }
            });
            drawn?;
        }
        Ok(())
    }
}

/// Reading a written PNG back, for the tests of this module and of `metrics`.
#[cfg(test)]
pub(crate) mod testing {
    use std::ops::Range;
    use std::path::Path;

    use super::{LEGEND_WIDTH, PANEL_HEIGHT, TITLE_HEIGHT, WIDTH};

    /// A decoded 8-bit RGB image.
    pub(crate) struct Image {
        pub(crate) width: u32,
        pub(crate) height: u32,
        rgb: Vec<u8>,
    }

    impl Image {
        /// Decodes the PNG at `path` with the `png` crate's decoder.
        pub(crate) fn read(path: &Path) -> Image {
            let file = std::fs::File::open(path).unwrap();
            let mut reader = png::Decoder::new(std::io::BufReader::new(file))
                .read_info()
                .unwrap();
            let mut rgb = vec![0; reader.output_buffer_size().unwrap()];
            let info = reader.next_frame(&mut rgb).unwrap();
            assert_eq!(
                (info.color_type, info.bit_depth),
                (png::ColorType::Rgb, png::BitDepth::Eight)
            );
            rgb.truncate(info.buffer_size());
            Image {
                width: info.width,
                height: info.height,
                rgb,
            }
        }

        /// Pixels in the rectangle `xs × ys` for which `pred` holds.
        pub(crate) fn count(
            &self,
            xs: Range<u32>,
            ys: Range<u32>,
            pred: impl Fn([u8; 3]) -> bool,
        ) -> usize {
            ys.flat_map(|y| xs.clone().map(move |x| (x, y)))
                .filter(|&(x, y)| {
                    let i = ((y * self.width + x) * 3) as usize;
                    pred([self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]])
                })
                .count()
        }

        /// Pixels of exactly `color` in the rectangle.
        pub(crate) fn count_color(
            &self,
            xs: Range<u32>,
            ys: Range<u32>,
            (r, g, b): (u8, u8, u8),
        ) -> usize {
            self.count(xs, ys, |p| p == [r, g, b])
        }

        /// Near-black pixels (text, ticks, frame) in the rectangle.
        pub(crate) fn count_dark(&self, xs: Range<u32>, ys: Range<u32>) -> usize {
            self.count(xs, ys, |p| p.iter().all(|&c| c < 90))
        }
    }

    /// The rows of panel `i`.
    pub(crate) fn panel_rows(i: u32) -> Range<u32> {
        i * PANEL_HEIGHT..(i + 1) * PANEL_HEIGHT
    }

    /// The rows of panel `i` below its title.
    pub(crate) fn chart_rows(i: u32) -> Range<u32> {
        i * PANEL_HEIGHT + TITLE_HEIGHT..(i + 1) * PANEL_HEIGHT
    }

    /// The columns of the charts (left of the legends).
    pub(crate) fn chart_cols() -> Range<u32> {
        0..WIDTH - LEGEND_WIDTH
    }

    /// The columns of the legends.
    pub(crate) fn legend_cols() -> Range<u32> {
        WIDTH - LEGEND_WIDTH..WIDTH
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::testing::rounding::gamma;
    use tch::Kind;

    fn series(label: &str, points: Vec<(u64, f64)>, mark: Mark) -> Series {
        Series {
            label: label.into(),
            points,
            mark,
        }
    }

    fn panel(title: &str, series: Vec<Series>) -> Panel {
        Panel {
            title: title.into(),
            y_desc: "value".into(),
            series,
        }
    }

    fn rising(n: u64) -> Vec<(u64, f64)> {
        (1..=n).map(|i| (i, (i as f64 / n as f64).sqrt())).collect()
    }

    fn draw(panels: &[Panel]) -> (tempfile::TempDir, Image) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curves.png");
        write_png(&path, panels).unwrap();
        let image = Image::read(&path);
        (dir, image)
    }

    /// Each curve's colour is drawn inside the chart of its own panel, and in no other.
    #[test]
    fn each_curve_is_drawn_in_its_own_panel() {
        let panels = [
            panel(
                "Reward",
                vec![
                    series("train", rising(30), Mark::PerStep),
                    series(
                        "eval arith",
                        vec![(0, 0.1), (10, 0.4), (20, 0.6), (30, 0.7)],
                        Mark::Sparse,
                    ),
                ],
            ),
            panel(
                "Loss",
                vec![series(
                    "loss",
                    (1..=30).map(|i| (i, 1.0 / i as f64)).collect(),
                    Mark::PerStep,
                )],
            ),
        ];
        let (_dir, img) = draw(&panels);
        assert_eq!((img.width, img.height), (WIDTH, 2 * PANEL_HEIGHT));
        let (blue, orange) = (PALETTE[0], PALETTE[1]);
        for (i, wanted, absent) in [
            (0, vec![blue, orange], vec![]),
            (1, vec![blue], vec![orange]),
        ] {
            for c in wanted {
                let n = img.count_color(chart_cols(), chart_rows(i), c);
                assert!(n > 200, "panel {i}: {n} pixels of {c:?}");
            }
            for c in absent {
                let n = img.count_color(0..WIDTH, panel_rows(i), c);
                assert_eq!(n, 0, "panel {i} has no curve of colour {c:?}");
            }
        }
    }

    /// Titles, axis labels and legends are text: dark pixels where they are, none where the
    /// legend has no entry.
    #[test]
    fn titles_and_legends_are_written() {
        let panels = [
            panel("Reward", vec![series("train", rising(5), Mark::PerStep)]),
            panel("", vec![series("train", rising(5), Mark::PerStep)]),
        ];
        let (_dir, img) = draw(&panels);
        let title = |i| i * PANEL_HEIGHT..i * PANEL_HEIGHT + TITLE_HEIGHT;
        assert!(img.count_dark(chart_cols(), title(0)) > 100, "the title");
        assert_eq!(
            img.count_dark(chart_cols(), title(1)),
            0,
            "no title, no text"
        );
        // The legend's one entry, and nothing under it.
        let entry = TITLE_HEIGHT + 6..TITLE_HEIGHT + 30;
        assert!(
            img.count_dark(legend_cols(), entry.clone()) > 30,
            "the legend's label"
        );
        assert_eq!(img.count_dark(legend_cols(), entry.end..PANEL_HEIGHT), 0);
        // Tick labels and the axis titles, left of and under the plot.
        assert!(
            img.count_dark(0..60, chart_rows(0)) > 100,
            "y tick labels and title"
        );
        let under = PANEL_HEIGHT - 44..PANEL_HEIGHT;
        assert!(
            img.count_dark(chart_cols(), under) > 100,
            "x tick labels and title"
        );
    }

    /// No panels still make a valid image: one empty panel.
    #[test]
    fn no_panels_make_one_empty_panel() {
        let (_dir, img) = draw(&[]);
        assert_eq!((img.width, img.height), (WIDTH, PANEL_HEIGHT));
        assert!(
            img.count_dark(chart_cols(), 0..TITLE_HEIGHT) > 50,
            "its title says so"
        );
    }

    /// NaN and infinite values are left out: the curve goes on around them, and a series with
    /// nothing else says there is no data.
    #[test]
    fn non_finite_values_are_skipped() {
        let mut points = rising(12);
        points[3].1 = f64::NAN;
        points[7].1 = f64::INFINITY;
        points.push((13, f64::NEG_INFINITY));
        points.push((14, 1e308));
        points.push((15, -f64::MAX));
        let panels = [
            panel("Reward", vec![series("train", points, Mark::PerStep)]),
            panel(
                "Loss",
                vec![series("loss", vec![(1, f64::NAN)], Mark::PerStep)],
            ),
        ];
        let (_dir, img) = draw(&panels);
        assert!(img.count_color(chart_cols(), chart_rows(0), PALETTE[0]) > 200);
        assert_eq!(img.count_color(chart_cols(), chart_rows(1), PALETTE[0]), 0);
        let grey = |p: [u8; 3]| p.iter().all(|&c| (100..140).contains(&c));
        let middle = (WIDTH - LEGEND_WIDTH) / 2 - 60..(WIDTH - LEGEND_WIDTH) / 2 + 100;
        let rows = PANEL_HEIGHT + 120..PANEL_HEIGHT + 200;
        assert!(img.count(middle, rows, grey) > 30, "'no data yet'");
    }

    /// A constant series is drawn inside the chart (its range padded), not along the frame;
    /// a single point is marked.
    #[test]
    fn constant_series_and_single_points_are_visible() {
        let panels = [
            panel(
                "Constant",
                vec![series(
                    "c",
                    (1..=20).map(|i| (i, 0.5)).collect(),
                    Mark::PerStep,
                )],
            ),
            panel(
                "One point",
                vec![series("p", vec![(4, 2.0)], Mark::PerStep)],
            ),
        ];
        let (_dir, img) = draw(&panels);
        let rows_with = |i: u32| {
            chart_rows(i)
                .filter(|&y| img.count_color(chart_cols(), y..y + 1, PALETTE[0]) > 0)
                .collect::<Vec<_>>()
        };
        let constant = rows_with(0);
        assert!(constant.len() <= 6, "a flat line: {constant:?}");
        let mid = (chart_rows(0).start + chart_rows(0).end) / 2;
        assert!(
            constant.iter().all(|&y| y.abs_diff(mid) < 40),
            "{constant:?} near {mid}"
        );
        assert!(rows_with(1).len() >= 6, "a marker several pixels tall");
    }

    #[test]
    fn ranges_are_padded() {
        assert_eq!(value_range(&panel("", vec![])), None);
        let constant = |v| value_range(&panel("", vec![series("", vec![(1, v)], Mark::PerStep)]));
        assert_eq!(constant(0.0), Some(-0.5..0.5));
        assert_eq!(constant(2.0), Some(1.8..2.2));
        let r = value_range(&panel(
            "",
            vec![series(
                "",
                vec![(1, 0.0), (2, f64::NAN), (3, 1.0)],
                Mark::PerStep,
            )],
        ))
        .unwrap();
        // One f64 rounding of the padding and one of the sum, against the literals' own.
        let bound = gamma(3, Kind::Double) * 1.06;
        assert!(
            (r.start + 0.06).abs() <= bound && (r.end - 1.06).abs() <= bound,
            "{r:?}"
        );
        let steps = |points| step_range(&[panel("", vec![series("", points, Mark::PerStep)])]);
        assert_eq!(steps(vec![]), 0..1);
        assert_eq!(steps(vec![(0, 1.0)]), 0..1);
        assert_eq!(steps(vec![(5, 1.0)]), 4..6);
        assert_eq!(steps(vec![(5, f64::NAN), (2, 1.0), (9, 1.0)]), 2..9);
    }

    #[test]
    fn tick_labels_have_the_decimals_the_spacing_needs() {
        for (range, spacing) in [(-0.06..1.06, 0.2), (-0.03..0.53, 0.1), (0.0..0.25, 0.05)] {
            // A gap between two ticks plotters computes from the range's ends (a few f64
            // operations each; eight roundings, generously) relative to the ends' magnitude.
            let bound = gamma(8, Kind::Double) * (f64::abs(range.start) + f64::abs(range.end));
            let got = tick_spacing(&range);
            assert!((got - spacing).abs() <= bound, "{range:?}: {got}");
        }
        assert_eq!(tick_label(0.3, 0.1), "0.3");
        assert_eq!(tick_label(0.4, 0.2), "0.4");
        assert_eq!(tick_label(0.25, 0.05), "0.25");
        assert_eq!(tick_label(120.0, 20.0), "120");
        assert_eq!(tick_label(0.0, 1e-6), "0");
        assert_eq!(tick_label(5e-17, 0.2), "0", "zero off by a rounding error");
        assert_eq!(
            tick_label(0.5000002, 2e-7),
            "0.5000002",
            "a small span far from zero"
        );
        assert_eq!(tick_label(1.5e-5, 5e-7), "1.50e-5");
        assert_eq!(tick_label(2.5e6, 5e5), "2.5e6");
    }

    /// The moving average starts at the first value (debiased) and follows a step change.
    #[test]
    fn smoothing_is_debiased() {
        let s = smoothed(&[(1, 1.0), (2, 1.0), (3, 0.0), (4, 0.0)]);
        assert_eq!(s[0], (1, 1.0));
        // Six f64 roundings of values up to 1 in a ratio of two numbers near 0.64.
        assert!((s[1].1 - 1.0).abs() <= gamma(6, Kind::Double) * 2.0);
        assert!(s[2].1 < 1.0 && s[3].1 < s[2].1 && s[3].1 > 0.0, "{s:?}");
    }
}
