//! Hand-written SVG line plots: axes, "nice" ticks, grid, legend, several series per plot,
//! optional log-scale y axis, and figures that lay several plots out in a grid.
//!
//! No plotting dependency: an SVG line plot is a few rectangles, lines, polylines and text
//! elements. Ticks follow the usual 1-2-5 rule (the smallest step from {1, 2, 5} x 10^k giving
//! at most the requested number of intervals); log axes tick at powers of ten. Non-finite
//! points (and non-positive ones on a log axis) break a series' line instead of distorting the
//! axes.

use std::fmt::Write as _;
use std::path::Path;

pub use super::svg_frame::escape;
use super::svg_frame::Frame;
use crate::error::{Result, SchedError};

/// Line colours, in series order (Tableau 10).
pub const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One named line.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// `(x, y)` points in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// One plot: title, axis labels, series.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plot {
    /// Title above the plot area.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
    /// Logarithmic y axis.
    pub log_y: bool,
}

/// Relative slack when snapping data limits to ticks: 0.1 + 1e-17 still ends at the 0.1 tick.
const EPS: f64 = 1e-9;

/// Tick positions covering `[lo, hi]` with at most `max_intervals` steps of 1, 2 or 5 x 10^k:
/// the first tick is at or below `lo`, the last at or above `hi`.
pub fn nice_ticks(lo: f64, hi: f64, max_intervals: usize) -> Vec<f64> {
    let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
    let span = (hi - lo).max(f64::MIN_POSITIVE);
    let max_intervals = max_intervals.max(1) as f64;
    let mut magnitude = 10f64.powf((span / max_intervals).log10().floor());
    let step = loop {
        if let Some(s) = [1.0, 2.0, 5.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|s| ((hi / s - EPS).ceil() - (lo / s + EPS).floor()) <= max_intervals)
        {
            break s;
        }
        magnitude *= 10.0;
    };
    let first = (lo / step + EPS).floor() as i64;
    let last = (hi / step - EPS).ceil() as i64;
    (first..=last).map(|k| k as f64 * step).collect()
}

/// Tick label for `v` on an axis with tick spacing `step`.
pub fn format_tick(v: f64, step: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        let s = format!("{v:.1e}");
        return s.replace(".0e", "e");
    }
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$}")
}

impl Plot {
    /// An empty plot titled `title`.
    pub fn new(title: &str) -> Self {
        Self {
            title: title.into(),
            ..Default::default()
        }
    }

    /// Set the x-axis label.
    pub fn x_label(mut self, label: &str) -> Self {
        self.x_label = label.into();
        self
    }

    /// Set the y-axis label.
    pub fn y_label(mut self, label: &str) -> Self {
        self.y_label = label.into();
        self
    }

    /// Use a logarithmic y axis.
    pub fn log_y(mut self, on: bool) -> Self {
        self.log_y = on;
        self
    }

    /// Add a line.
    pub fn series(mut self, label: &str, points: Vec<(f64, f64)>) -> Self {
        self.series.push(Series {
            label: label.into(),
            points,
        });
        self
    }

    fn usable(&self, (x, y): (f64, f64)) -> bool {
        x.is_finite() && y.is_finite() && (!self.log_y || y > 0.0)
    }

    fn ranges(&self) -> ((f64, f64), (f64, f64)) {
        let mut xr = (f64::INFINITY, f64::NEG_INFINITY);
        let mut yr = xr;
        for s in &self.series {
            for &p in s.points.iter().filter(|&&p| self.usable(p)) {
                xr = (xr.0.min(p.0), xr.1.max(p.0));
                yr = (yr.0.min(p.1), yr.1.max(p.1));
            }
        }
        let fix = |(lo, hi): (f64, f64), log: bool| {
            if lo > hi {
                if log {
                    (0.1, 1.0)
                } else {
                    (0.0, 1.0)
                }
            } else if lo == hi {
                if log {
                    (lo / 2.0, hi * 2.0)
                } else {
                    let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
                    (lo - pad, hi + pad)
                }
            } else {
                (lo, hi)
            }
        };
        (fix(xr, false), fix(yr, self.log_y))
    }

    /// Draw this plot into the `w` x `h` box at (`x0`, `y0`) of an SVG document.
    pub fn render_into(&self, out: &mut String, x0: f64, y0: f64, w: f64, h: f64) {
        let (left, right, top, bottom) = (62.0, 14.0, 26.0, 40.0);
        let (px, py) = (x0 + left, y0 + top);
        let (pw, ph) = ((w - left - right).max(10.0), (h - top - bottom).max(10.0));
        let ((xlo, xhi), (ylo, yhi)) = self.ranges();
        let xticks = nice_ticks(xlo, xhi, 6);
        let (xa, xb) = (xticks[0], *xticks.last().expect("ticks"));
        let xstep = xticks.get(1).map_or(1.0, |t| t - xticks[0]);
        let (yticks, ya, yb, ystep): (Vec<f64>, f64, f64, f64) = if self.log_y {
            let (a, b) = (
                ylo.log10().floor(),
                yhi.log10().ceil().max(ylo.log10().floor() + 1.0),
            );
            let every = ((b - a) / 6.0).ceil().max(1.0);
            let ticks = (0..)
                .map(|k| a + k as f64 * every)
                .take_while(|e| *e <= b)
                .map(|e| 10f64.powf(e))
                .collect();
            (ticks, a, b, 1.0)
        } else {
            let t = nice_ticks(ylo, yhi, 5);
            let step = t.get(1).map_or(1.0, |v| v - t[0]);
            // A line on the first or last tick would run along the frame: leave 3% headroom
            // (without adding a tick).
            let (a, b) = (t[0], *t.last().expect("ticks"));
            let pad = (b - a) * 0.03;
            let a = if ylo <= a { a - pad } else { a };
            let b = if yhi >= b { b + pad } else { b };
            (t, a, b, step)
        };
        let sx = |x: f64| px + (x - xa) / (xb - xa) * pw;
        let sy = |y: f64| {
            let v = if self.log_y { y.log10() } else { y };
            py + ph - (v - ya) / (yb - ya) * ph
        };
        let frame = Frame {
            x0,
            y0,
            px,
            py,
            pw,
            ph,
        };
        frame.open(out, &self.title);
        for &t in &xticks {
            frame.x_tick(out, sx(t), &format_tick(t, xstep), true);
        }
        for &t in &yticks {
            let label = if self.log_y {
                format_tick(t, t)
            } else {
                format_tick(t, ystep)
            };
            frame.y_tick(out, sy(t), &label);
        }
        if !self.x_label.is_empty() {
            frame.x_label(out, &self.x_label);
        }
        if !self.y_label.is_empty() {
            frame.y_label(out, &self.y_label, 12.0);
        }
        for (i, s) in self.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            for run in s
                .points
                .split(|&p| !self.usable(p))
                .filter(|r| !r.is_empty())
            {
                let mut pts = String::with_capacity(run.len() * 14);
                for &(x, y) in run {
                    let _ = write!(pts, "{:.2},{:.2} ", sx(x), sy(y));
                }
                let _ = writeln!(
                    out,
                    r#"<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{}"/>"#,
                    pts.trim_end()
                );
            }
        }
        if !self.series.is_empty() {
            let longest = self
                .series
                .iter()
                .map(|s| s.label.chars().count())
                .max()
                .unwrap_or(0);
            let lw = 30.0 + longest as f64 * 6.2;
            let lh = 6.0 + 15.0 * self.series.len() as f64;
            // Put the legend in the corner that hides the fewest points.
            let corners = [
                (px + pw - lw - 6.0, py + 6.0),
                (px + 6.0, py + 6.0),
                (px + pw - lw - 6.0, py + ph - lh - 6.0),
                (px + 6.0, py + ph - lh - 6.0),
            ];
            let hidden = |&(cx, cy): &(f64, f64)| {
                self.series
                    .iter()
                    .flat_map(|s| s.points.iter())
                    .filter(|&&p| self.usable(p))
                    .filter(|&&(x, y)| {
                        let (x, y) = (sx(x), sy(y));
                        x >= cx - 4.0 && x <= cx + lw + 4.0 && y >= cy - 4.0 && y <= cy + lh + 4.0
                    })
                    .count()
            };
            let (lx, ly) = corners
                .iter()
                .min_by_key(|c| hidden(c))
                .copied()
                .expect("four corners");
            let _ = writeln!(
                out,
                r##"<rect x="{lx:.2}" y="{ly:.2}" width="{lw:.2}" height="{lh:.2}" fill="#ffffff" fill-opacity="0.85" stroke="#bbbbbb"/>"##
            );
            for (i, s) in self.series.iter().enumerate() {
                let y = ly + 13.0 + 15.0 * i as f64;
                let _ = writeln!(
                    out,
                    r#"<line x1="{:.2}" y1="{:.2}" x2="{:.2}" y2="{:.2}" stroke="{}" stroke-width="2.5"/><text x="{:.2}" y="{:.2}">{}</text>"#,
                    lx + 5.0,
                    y - 4.0,
                    lx + 22.0,
                    y - 4.0,
                    PALETTE[i % PALETTE.len()],
                    lx + 26.0,
                    y,
                    escape(&s.label)
                );
            }
        }
        out.push_str("</g>\n");
    }

    /// A standalone SVG document of this plot, `width` x `height` pixels.
    pub fn to_svg(&self, width: f64, height: f64) -> String {
        let mut out = header(width, height);
        self.render_into(&mut out, 0.0, 0.0, width, height);
        out.push_str("</svg>\n");
        out
    }

    /// Write [`to_svg`](Self::to_svg) at 720 x 420 to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        write_file(path.as_ref(), &self.to_svg(720.0, 420.0))
    }
}

fn header(width: f64, height: f64) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n"
    )
}

/// A standalone SVG document of `width` x `height` pixels (white background) around `body`.
pub fn svg_document(width: f64, height: f64, body: &str) -> String {
    let mut out = header(width, height);
    out.push_str(body);
    out.push_str("</svg>\n");
    out
}

/// Writes the SVG text `svg` to `path`, creating its folder.
pub fn write_svg(path: &Path, svg: &str) -> Result<()> {
    write_file(path, svg)
}

fn write_file(path: &Path, svg: &str) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| SchedError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::write(path, svg).map_err(|source| SchedError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Several plots in a grid, under one title, in one SVG document.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Title across the top.
    pub title: String,
    /// The panels, filled row by row.
    pub plots: Vec<Plot>,
    /// Panels per row.
    pub columns: usize,
    /// Size of one panel in pixels.
    pub panel_size: (f64, f64),
}

impl Figure {
    /// An empty figure: 3 columns of 360 x 240 panels.
    pub fn new(title: &str) -> Self {
        Self {
            title: title.into(),
            plots: Vec::new(),
            columns: 3,
            panel_size: (360.0, 240.0),
        }
    }

    /// Add a panel.
    pub fn push(&mut self, plot: Plot) {
        self.plots.push(plot);
    }

    /// The SVG document.
    pub fn to_svg(&self) -> String {
        let cols = self.columns.max(1);
        let rows = self.plots.len().div_ceil(cols).max(1);
        let (pw, ph) = self.panel_size;
        let title_h = if self.title.is_empty() { 0.0 } else { 34.0 };
        let (w, h) = (pw * cols as f64, title_h + ph * rows as f64);
        let mut out = header(w, h);
        if !self.title.is_empty() {
            let _ = writeln!(
                out,
                r#"<text x="{:.2}" y="23" text-anchor="middle" font-family="sans-serif" font-size="17" font-weight="bold">{}</text>"#,
                w / 2.0,
                escape(&self.title)
            );
        }
        for (i, plot) in self.plots.iter().enumerate() {
            let (r, c) = (i / cols, i % cols);
            plot.render_into(&mut out, c as f64 * pw, title_h + r as f64 * ph, pw, ph);
        }
        out.push_str("</svg>\n");
        out
    }

    /// Write the SVG document to `path` (creating its folder).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        write_file(path.as_ref(), &self.to_svg())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_ticks_follow_the_1_2_5_rule() {
        assert_eq!(
            nice_ticks(0.0, 100.0, 6),
            vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
        );
        assert_eq!(
            nice_ticks(0.0, 1000.0, 6),
            vec![0.0, 200.0, 400.0, 600.0, 800.0, 1000.0]
        );
        assert_eq!(
            nice_ticks(0.013, 0.1, 5),
            vec![0.0, 0.02, 0.04, 0.06, 0.08, 0.1]
        );
        let t = nice_ticks(-3.0, 7.0, 5);
        assert_eq!((t[0], *t.last().unwrap(), t[1] - t[0]), (-5.0, 10.0, 5.0));
    }

    #[test]
    fn tick_labels() {
        assert_eq!(format_tick(0.0, 0.02), "0");
        assert_eq!(format_tick(0.04, 0.02), "0.04");
        assert_eq!(format_tick(200.0, 200.0), "200");
        assert_eq!(format_tick(1e-5, 1e-5), "1e-5");
        assert_eq!(format_tick(2.5e-4, 1e-4), "2.5e-4");
    }

    #[test]
    fn plot_has_axes_ticks_legend_and_one_line_per_series() {
        let a: Vec<(f64, f64)> = (0..=100)
            .map(|i| (i as f64, 0.1 * i as f64 / 100.0))
            .collect();
        let b: Vec<(f64, f64)> = (0..=100)
            .map(|i| (i as f64, if i == 50 { f64::NAN } else { 0.05 }))
            .collect();
        let svg = Plot::new("lr <&>")
            .x_label("step")
            .series("up", a)
            .series("flat", b)
            .to_svg(600.0, 400.0);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("lr &lt;&amp;&gt;"), "title is escaped");
        // "up" is one line; "flat" is broken in two by its NaN.
        assert_eq!(svg.matches("<polyline").count(), 3);
        for label in [
            "0", "20", "40", "60", "80", "100", "0.02", "0.1", ">up<", ">flat<", ">step<",
        ] {
            assert!(svg.contains(label), "missing {label}");
        }
        assert_eq!(svg.matches("<g ").count(), svg.matches("</g>").count());
    }

    #[test]
    fn log_axis_ticks_decades_and_skips_non_positive_points() {
        let pts = vec![(0.0, 1e-4), (1.0, 1e-2), (2.0, 0.0), (3.0, 1.0)];
        let svg = Plot::new("log")
            .log_y(true)
            .series("s", pts)
            .to_svg(400.0, 300.0);
        assert!(svg.contains(">1e-4<") && svg.contains(">1<"), "{svg}");
        assert_eq!(
            svg.matches("<polyline").count(),
            2,
            "the 0.0 point breaks the line"
        );
    }

    #[test]
    fn figure_lays_out_panels_in_a_grid() {
        let mut fig = Figure::new("all");
        for i in 0..5 {
            fig.push(Plot::new(&format!("p{i}")).series("s", vec![(0.0, 1.0), (1.0, 2.0)]));
        }
        let svg = fig.to_svg();
        assert!(
            svg.contains(r#"width="1080" height="514""#),
            "3 columns x 2 rows + title"
        );
        assert_eq!(svg.matches("<polyline").count(), 5);
    }
}
