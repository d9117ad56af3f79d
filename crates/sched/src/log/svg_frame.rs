//! The furniture shared by kiln's SVG plots ([`svg`](super::svg)'s line plots and
//! [`svg_stack`](super::svg_stack)'s stacked plots): the plotting area's frame and title, tick
//! marks with their labels and optional grid lines, and the axis labels.
//!
//! Invariants: every element is written as one line of `out`; the frame opens a `<g>` element
//! that the caller closes; coordinates are printed with two decimals, so the same figure always
//! gives the same bytes.

use std::fmt::Write as _;

/// Where one plot sits in the document: the box it was given starts at (`x0`, `y0`), and its
/// plotting area is `pw` x `ph` at (`px`, `py`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frame {
    /// Left edge of the whole box.
    pub x0: f64,
    /// Top edge of the whole box.
    pub y0: f64,
    /// Left edge of the plotting area.
    pub px: f64,
    /// Top edge of the plotting area.
    pub py: f64,
    /// Width of the plotting area.
    pub pw: f64,
    /// Height of the plotting area.
    pub ph: f64,
}

impl Frame {
    /// Opens the plot's group, draws the plotting area's white frame and centres `title` above.
    pub fn open(&self, out: &mut String, title: &str) {
        let Self { px, py, pw, ph, .. } = *self;
        let _ = writeln!(
            out,
            r##"<g font-family="sans-serif" font-size="11"><rect x="{px:.2}" y="{py:.2}" width="{pw:.2}" height="{ph:.2}" fill="#ffffff" stroke="#333333"/>"##
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.2}" y="{:.2}" text-anchor="middle" font-size="13" font-weight="bold">{}</text>"#,
            px + pw / 2.0,
            self.y0 + 17.0,
            escape(title)
        );
    }

    /// One tick under the x axis at `x` (already scaled) with its `label`; with `grid`, a light
    /// vertical line across the plotting area too.
    pub fn x_tick(&self, out: &mut String, x: f64, label: &str, grid: bool) {
        let (py, bottom) = (self.py, self.py + self.ph);
        if grid {
            let _ = write!(
                out,
                r##"<line x1="{x:.2}" y1="{py:.2}" x2="{x:.2}" y2="{bottom:.2}" stroke="#e5e5e5"/>"##
            );
        }
        let _ = writeln!(
            out,
            r##"<line x1="{x:.2}" y1="{bottom:.2}" x2="{x:.2}" y2="{:.2}" stroke="#333333"/><text x="{x:.2}" y="{:.2}" text-anchor="middle">{}</text>"##,
            bottom + 4.0,
            bottom + 15.0,
            escape(label)
        );
    }

    /// One tick left of the y axis at `y` (already scaled) with its `label`, and a light
    /// horizontal grid line across the plotting area.
    pub fn y_tick(&self, out: &mut String, y: f64, label: &str) {
        let px = self.px;
        let _ = writeln!(
            out,
            r##"<line x1="{px:.2}" y1="{y:.2}" x2="{:.2}" y2="{y:.2}" stroke="#e5e5e5"/><line x1="{:.2}" y1="{y:.2}" x2="{px:.2}" y2="{y:.2}" stroke="#333333"/><text x="{:.2}" y="{:.2}" text-anchor="end">{}</text>"##,
            px + self.pw,
            px - 4.0,
            px - 6.0,
            y + 4.0,
            escape(label)
        );
    }

    /// The label centred under the x axis.
    pub fn x_label(&self, out: &mut String, label: &str) {
        let _ = writeln!(
            out,
            r#"<text x="{:.2}" y="{:.2}" text-anchor="middle">{}</text>"#,
            self.px + self.pw / 2.0,
            self.py + self.ph + 32.0,
            escape(label)
        );
    }

    /// The label beside the y axis, turned a quarter left, `inset` from the box's left edge.
    pub fn y_label(&self, out: &mut String, label: &str, inset: f64) {
        let (lx, ly) = (self.x0 + inset, self.py + self.ph / 2.0);
        let _ = writeln!(
            out,
            r#"<text x="{lx:.2}" y="{ly:.2}" text-anchor="middle" transform="rotate(-90 {lx:.2} {ly:.2})">{}</text>"#,
            escape(label)
        );
    }
}

/// `text` with the XML special characters escaped.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
