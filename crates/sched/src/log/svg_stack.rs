//! A stacked step-area plot (layers summed bottom to top, each value holding until the next x),
//! with overlay lines, one marked point and a side panel of notes: the shape of kiln's memory
//! timeline. Ticks, escaping and the document are [`svg`](super::svg)'s; the frame and axes are
//! `svg_frame`'s, shared with the line plots.
//!
//! Invariants: one `<polygon>` per layer that has a point, one `<polyline>` per overlay line;
//! layers are never drawn below 0 or re-ordered; with more points than the plot has pixel
//! columns, each column keeps the point of its highest stack (so peaks are never smoothed
//! away), plus the first and last point.

use std::fmt::Write as _;
use std::path::Path;

use super::svg::{escape, format_tick, nice_ticks, svg_document, write_svg, Series};
use super::svg_frame::Frame;
use crate::error::Result;

/// One stacked layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// Legend label.
    pub label: String,
    /// Fill colour (`#rrggbb`).
    pub colour: String,
    /// One value per x, not below 0.
    pub values: Vec<f64>,
}

/// A point to mark, with its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// Position.
    pub x: f64,
    /// Height.
    pub y: f64,
    /// Text beside it.
    pub label: String,
}

/// A stacked step-area plot; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StackedPlot {
    /// Title above the plot.
    pub title: String,
    /// Label under the x axis.
    pub x_label: String,
    /// Label beside the y axis.
    pub y_label: String,
    /// The x of every point, increasing.
    pub x: Vec<f64>,
    /// Layers, bottom first.
    pub layers: Vec<Layer>,
    /// Lines drawn over the stack (same x), dashed grey.
    pub lines: Vec<Series>,
    /// The marked point.
    pub marker: Option<Marker>,
    /// Heading of the notes panel.
    pub notes_title: String,
    /// Lines of the notes panel, under the legend.
    pub notes: Vec<String>,
}

/// Width of the legend / notes panel at the right.
const SIDE: f64 = 270.0;
/// Longest note or label drawn, in characters (longer ones end in `…`).
const MAX_CHARS: usize = 46;

fn clip(text: &str) -> String {
    if text.chars().count() <= MAX_CHARS {
        return text.to_owned();
    }
    let head: String = text.chars().take(MAX_CHARS - 1).collect();
    format!("{head}…")
}

impl StackedPlot {
    /// Indices of the points drawn in `columns` pixel columns (module docs).
    fn kept(&self, columns: usize) -> Vec<usize> {
        let n = self.x.len();
        if n <= columns.max(2) {
            return (0..n).collect();
        }
        let total = |i: usize| {
            self.layers
                .iter()
                .map(|l| l.values.get(i).copied().unwrap_or(0.0))
                .sum::<f64>()
        };
        let (x0, x1) = (self.x[0], self.x[n - 1]);
        let span = (x1 - x0).max(f64::MIN_POSITIVE);
        let mut best: Vec<Option<usize>> = vec![None; columns];
        for i in 0..n {
            let col = (((self.x[i] - x0) / span) * (columns - 1) as f64) as usize;
            let col = col.min(columns - 1);
            if best[col].is_none_or(|b| total(i) > total(b)) {
                best[col] = Some(i);
            }
        }
        let mut out: Vec<usize> = std::iter::once(0)
            .chain(best.into_iter().flatten())
            .chain(std::iter::once(n - 1))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Draw into the `w` x `h` box at (`x0`, `y0`) of an SVG document.
    pub fn render_into(&self, out: &mut String, x0: f64, y0: f64, w: f64, h: f64) {
        let (left, top, bottom) = (70.0, 26.0, 40.0);
        let (px, py) = (x0 + left, y0 + top);
        let pw = (w - left - SIDE - 10.0).max(10.0);
        let ph = (h - top - bottom).max(10.0);
        let kept = self.kept(pw as usize);
        let xs: Vec<f64> = kept.iter().map(|&i| self.x[i]).collect();
        let value = |l: &Layer, i: usize| l.values.get(i).copied().unwrap_or(0.0).max(0.0);
        let mut ymax = kept
            .iter()
            .map(|&i| self.layers.iter().map(|l| value(l, i)).sum::<f64>())
            .fold(0.0, f64::max);
        for s in &self.lines {
            ymax = s
                .points
                .iter()
                .map(|p| p.1)
                .filter(|v| v.is_finite())
                .fold(ymax, f64::max);
        }
        if let Some(m) = &self.marker {
            ymax = ymax.max(m.y);
        }
        let (xlo, xhi) = match (xs.first(), xs.last()) {
            (Some(&a), Some(&b)) if b > a => (a, b),
            (Some(&a), _) => (a, a + 1.0),
            _ => (0.0, 1.0),
        };
        let xticks = nice_ticks(xlo, xhi, 6);
        let xstep = xticks.get(1).map_or(1.0, |t| t - xticks[0]);
        let yticks = nice_ticks(0.0, if ymax > 0.0 { ymax } else { 1.0 }, 5);
        let ystep = yticks.get(1).map_or(1.0, |t| t - yticks[0]);
        let (xa, xb) = (xticks[0], *xticks.last().expect("ticks"));
        let yb = *yticks.last().expect("ticks");
        let sx = |x: f64| px + (x - xa) / (xb - xa) * pw;
        let sy = |y: f64| py + ph - y / yb * ph;
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
            frame.x_tick(out, sx(t), &format_tick(t, xstep), false);
        }
        for &t in &yticks {
            frame.y_tick(out, sy(t), &format_tick(t, ystep));
        }
        frame.x_label(out, &self.x_label);
        frame.y_label(out, &self.y_label, 14.0);
        // Layers: the top edge runs right in steps, the bottom edge (the layer below) back left.
        let mut below = vec![0.0f64; kept.len()];
        for layer in &self.layers {
            if kept.is_empty() {
                break;
            }
            let above: Vec<f64> = kept
                .iter()
                .zip(&below)
                .map(|(&i, b)| b + value(layer, i))
                .collect();
            let edge = |vals: &[f64]| {
                let mut pts = Vec::with_capacity(vals.len() * 2);
                for (k, v) in vals.iter().enumerate() {
                    pts.push((sx(xs[k]), sy(*v)));
                    let next = xs.get(k + 1).copied().unwrap_or(xs[k]);
                    pts.push((sx(next), sy(*v)));
                }
                pts
            };
            let mut pts = edge(&above);
            pts.extend(edge(&below).into_iter().rev());
            let mut text = String::with_capacity(pts.len() * 14);
            for (x, y) in pts {
                let _ = write!(text, "{x:.2},{y:.2} ");
            }
            let _ = writeln!(
                out,
                r#"<polygon fill="{}" fill-opacity="0.85" stroke="none" points="{}"/>"#,
                escape(&layer.colour),
                text.trim_end()
            );
            below = above;
        }
        for s in &self.lines {
            let mut pts = String::new();
            for &(x, y) in s
                .points
                .iter()
                .filter(|p| p.0.is_finite() && p.1.is_finite())
            {
                let _ = write!(pts, "{:.2},{:.2} ", sx(x), sy(y));
            }
            let _ = writeln!(
                out,
                r##"<polyline fill="none" stroke="#555555" stroke-width="1.2" stroke-dasharray="5,3" points="{}"/>"##,
                pts.trim_end()
            );
        }
        if let Some(m) = &self.marker {
            let (mx, my) = (sx(m.x), sy(m.y));
            let anchor = if mx > px + pw * 0.7 { "end" } else { "start" };
            let dx = if anchor == "end" { -6.0 } else { 6.0 };
            let _ = writeln!(
                out,
                r##"<line x1="{mx:.2}" y1="{py:.2}" x2="{mx:.2}" y2="{:.2}" stroke="#d62728" stroke-dasharray="3,3"/><circle cx="{mx:.2}" cy="{my:.2}" r="4" fill="#d62728"/><text x="{:.2}" y="{:.2}" text-anchor="{anchor}" fill="#d62728" font-weight="bold">{}</text>"##,
                py + ph,
                mx + dx,
                (my - 6.0).max(py + 12.0),
                escape(&m.label)
            );
        }
        // Side panel: legend (top layer first, as stacked), overlay lines, then the notes.
        let sx0 = px + pw + 14.0;
        let mut y = py + 10.0;
        for layer in self.layers.iter().rev() {
            let _ = writeln!(
                out,
                r#"<rect x="{sx0:.2}" y="{:.2}" width="12" height="10" fill="{}"/><text x="{:.2}" y="{y:.2}">{}</text>"#,
                y - 9.0,
                escape(&layer.colour),
                sx0 + 18.0,
                escape(&clip(&layer.label))
            );
            y += 15.0;
        }
        for s in &self.lines {
            let _ = writeln!(
                out,
                r##"<line x1="{sx0:.2}" y1="{:.2}" x2="{:.2}" y2="{:.2}" stroke="#555555" stroke-dasharray="5,3"/><text x="{:.2}" y="{y:.2}">{}</text>"##,
                y - 4.0,
                sx0 + 12.0,
                y - 4.0,
                sx0 + 18.0,
                escape(&clip(&s.label))
            );
            y += 15.0;
        }
        if !self.notes.is_empty() {
            y += 8.0;
            let _ = writeln!(
                out,
                r#"<text x="{sx0:.2}" y="{y:.2}" font-weight="bold">{}</text>"#,
                escape(&clip(&self.notes_title))
            );
            for note in &self.notes {
                y += 14.0;
                let _ = writeln!(
                    out,
                    r#"<text x="{sx0:.2}" y="{y:.2}" font-size="10">{}</text>"#,
                    escape(&clip(note))
                );
            }
        }
        out.push_str("</g>\n");
    }

    /// A standalone SVG document, `width` x `height` pixels.
    pub fn to_svg(&self, width: f64, height: f64) -> String {
        let mut body = String::new();
        self.render_into(&mut body, 0.0, 0.0, width, height);
        svg_document(width, height, &body)
    }

    /// Write [`to_svg`](Self::to_svg) at 960 x 420 to `path` (creating its folder).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        write_svg(path.as_ref(), &self.to_svg(960.0, 420.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plot(n: usize) -> StackedPlot {
        let x: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let a: Vec<f64> = (0..n).map(|i| (i % 7) as f64).collect();
        let b: Vec<f64> = (0..n)
            .map(|i| if i == n / 2 { 100.0 } else { 1.0 })
            .collect();
        StackedPlot {
            title: "step <1>".into(),
            x_label: "ms".into(),
            y_label: "MiB".into(),
            x,
            layers: vec![
                Layer {
                    label: "parameter".into(),
                    colour: "#1f77b4".into(),
                    values: a,
                },
                Layer {
                    label: "activation".into(),
                    colour: "#ff7f0e".into(),
                    values: b,
                },
            ],
            lines: vec![Series {
                label: "reserved".into(),
                points: vec![(0.0, 120.0), ((n - 1) as f64, 120.0)],
            }],
            marker: Some(Marker {
                x: (n / 2) as f64,
                y: 103.0,
                label: "peak 103 MiB".into(),
            }),
            notes_title: "largest blocks at the peak".into(),
            notes: vec!["layer3.1.conv2 & friends".into(), "x".repeat(80)],
        }
    }

    #[test]
    fn stacked_plot_has_one_polygon_per_layer_the_marker_and_escaped_notes() {
        let svg = plot(50).to_svg(960.0, 420.0);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polygon").count(), 2);
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert_eq!(svg.matches("<circle").count(), 1);
        assert!(svg.contains("step &lt;1&gt;") && svg.contains("layer3.1.conv2 &amp; friends"));
        assert!(
            svg.contains(&format!("{}…", "x".repeat(MAX_CHARS - 1))),
            "long notes are clipped"
        );
    }

    #[test]
    fn many_points_are_thinned_but_the_peak_survives() {
        let p = plot(100_000);
        let kept = p.kept(600);
        assert!(kept.len() <= 602, "{}", kept.len());
        assert!(
            kept.contains(&50_000),
            "the column of the peak keeps the peak"
        );
        assert_eq!((kept[0], *kept.last().unwrap()), (0, 99_999));
        let svg = p.to_svg(960.0, 420.0);
        assert!(svg.len() < 200_000, "{} bytes", svg.len());
    }
}
