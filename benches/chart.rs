//! A horizontal bar chart as SVG, drawn from a bench's own figures, so the chart in docs/benchmarks.md comes
//! from the same run as the tables beside it. Plain text output: no plotting dependency for one picture.

use std::fmt::Write as _;

/// Who a bar is: decides its colour, the same in every chart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    Ours,
    Raw,
    Peer,
}

impl Contender {
    fn colour(self) -> &'static str {
        match self {
            Self::Ours => "#2b6cb0",
            Self::Raw => "#8795a1",
            Self::Peer => "#dd6b20",
        }
    }
}

/// One bar: a label left of it, its value at its end.
#[derive(Debug, Clone)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub who: Contender,
}

/// Bars under a heading (one batch size).
#[derive(Debug, Clone)]
pub struct Group {
    pub heading: String,
    pub bars: Vec<Bar>,
}

const WIDTH: f64 = 760.0;
const LABEL_WIDTH: f64 = 250.0;
const VALUE_WIDTH: f64 = 110.0;
const BAR_HEIGHT: f64 = 18.0;
const BAR_GAP: f64 = 5.0;
const HEADING_HEIGHT: f64 = 22.0;
const GROUP_GAP: f64 = 12.0;
const TITLE_HEIGHT: f64 = 34.0;
const FOOT_HEIGHT: f64 = 26.0;

/// The chart: one linear scale for all groups (so bars compare across groups), each bar labelled with
/// `format(value)`. Non-finite or negative values draw no bar and say so.
pub fn horizontal_bars(title: &str, note: &str, groups: &[Group], format: impl Fn(f64) -> String) -> String {
    let max = groups.iter().flat_map(|g| &g.bars).map(|b| b.value).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let scale = if max > 0.0 { (WIDTH - LABEL_WIDTH - VALUE_WIDTH) / max } else { 0.0 };
    let bars: usize = groups.iter().map(|g| g.bars.len()).sum();
    let height = TITLE_HEIGHT
        + groups.len() as f64 * (HEADING_HEIGHT + GROUP_GAP)
        + bars as f64 * (BAR_HEIGHT + BAR_GAP)
        + FOOT_HEIGHT;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="13">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#, escape(title));
    let mut y = TITLE_HEIGHT;
    for group in groups {
        let _ = writeln!(svg, r#"<text x="10" y="{}" font-weight="bold">{}</text>"#, y + 15.0, escape(&group.heading));
        y += HEADING_HEIGHT;
        for bar in &group.bars {
            let text_y = y + BAR_HEIGHT - 5.0;
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{text_y}" text-anchor="end">{}</text>"#,
                LABEL_WIDTH - 8.0,
                escape(&bar.label)
            );
            if bar.value.is_finite() && bar.value >= 0.0 {
                let length = (bar.value * scale).max(1.0);
                let _ = writeln!(
                    svg,
                    r#"<rect x="{LABEL_WIDTH}" y="{y}" width="{length:.1}" height="{BAR_HEIGHT}" fill="{}"/>"#,
                    bar.who.colour()
                );
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{text_y}">{}</text>"#,
                    LABEL_WIDTH + length + 6.0,
                    escape(&format(bar.value))
                );
            } else {
                let _ = writeln!(svg, r##"<text x="{LABEL_WIDTH}" y="{text_y}" fill="#999">not measured</text>"##);
            }
            y += BAR_HEIGHT + BAR_GAP;
        }
        y += GROUP_GAP;
    }
    let _ = writeln!(svg, r##"<text x="10" y="{}" font-size="11" fill="#555">{}</text>"##, y + 12.0, escape(note));
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
