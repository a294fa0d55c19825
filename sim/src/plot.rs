//! A small SVG line chart, written by hand (no plotting dependency).

use std::fmt::Write as _;

/// One line of the chart.
pub struct Series<'a> {
    /// Its legend.
    pub name: &'a str,
    /// Its points `(x, y)`.
    pub points: Vec<(f64, f64)>,
}

const COLOURS: [&str; 6] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

/// Each series' line, by its index: wide solid lines and thin dashed ones in turn. Lines are
/// drawn widest first, so that series with the same points all stay visible: wide lines as
/// bands around narrower ones, dashed lines over them.
const STROKES: [(f64, &str); 6] = [(7.0, ""), (3.0, "10 5"), (5.0, ""), (2.0, "3 3"), (3.5, ""), (1.5, "6 3")];

/// A step between axis labels: 1, 2 or 5 times a power of ten, giving about `count` labels
/// over `span`.
fn nice_step(span: f64, count: f64) -> f64 {
    let raw = (span / count).max(1e-9);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|step| *step >= raw).unwrap_or(10.0 * power)
}

/// A marker of shape `i` at `(x, y)`.
fn marker(i: usize, x: f64, y: f64, colour: &str) -> String {
    match i % 4 {
        0 => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="{colour}"/>"#),
        1 => format!(r#"<rect x="{:.1}" y="{:.1}" width="7" height="7" fill="{colour}"/>"#, x - 3.5, y - 3.5),
        2 => format!(
            r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{colour}"/>"#,
            x,
            y - 5.0,
            x - 4.5,
            y + 3.5,
            x + 4.5,
            y + 3.5
        ),
        _ => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="white" stroke="{colour}" stroke-width="2"/>"#),
    }
}

/// An SVG document plotting `series` (log-scaled y axis when `log_y`). Series with many points
/// are drawn without markers.
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series<'_>], log_y: bool) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 460.0, 80.0, 200.0, 40.0, 60.0);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (x_min, x_max) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (y_min, y_max) = ys.fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(y), b.max(y)));
    let fy = |y: f64| if log_y { y.max(1.0).log10() } else { y };
    let (y_lo, y_hi) = if log_y { (0.0, fy(y_max).ceil().max(1.0)) } else { (0.0_f64.min(y_min), y_max * 1.05) };
    let px = |x: f64| left + (x - x_min) / (x_max - x_min).max(1e-9) * (w - left - right);
    let py = |y: f64| h - bottom - (fy(y) - y_lo) / (y_hi - y_lo).max(1e-9) * (h - top - bottom);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{title}</text>"#,
        (w - right + left) / 2.0
    );
    let _ = writeln!(
        svg,
        r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
        h - bottom,
        w - right,
        h - bottom
    );
    let _ = writeln!(svg, r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"#, h - bottom);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#,
        (w - right + left) / 2.0,
        h - 15.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">{y_label}</text>"#,
        h / 2.0,
        h / 2.0
    );
    let ticks: std::collections::BTreeSet<u64> =
        series.iter().flat_map(|s| s.points.iter()).map(|p| p.0 as u64).collect();
    let x_ticks: Vec<f64> = if ticks.len() <= 12 {
        ticks.into_iter().map(|x| x as f64).collect()
    } else {
        let step = nice_step(x_max - x_min, 8.0);
        (0..).map(|k| (x_min / step).ceil() * step + f64::from(k) * step).take_while(|x| *x <= x_max).collect()
    };
    for s in x_ticks {
        let _ = writeln!(svg, r#"<text x="{}" y="{}" text-anchor="middle">{s}</text>"#, px(s), h - bottom + 16.0);
    }
    // Horizontal grid lines with their labels: every decade on a log axis, a round step on a
    // linear one.
    let grid: Vec<f64> = if log_y {
        (0..=y_hi as i32).map(|decade| 10f64.powi(decade)).collect()
    } else {
        let step = nice_step(y_hi - y_lo, 6.0);
        let first = (y_lo / step).ceil();
        (0..).map(|k| (first + f64::from(k)) * step).take_while(|y| *y <= y_hi).collect()
    };
    for y in grid {
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{0}" x2="{1}" y2="{0}" stroke="#ddd"/><text x="{2}" y="{3}" text-anchor="end">{4}</text>"##,
            py(y),
            w - right,
            left - 6.0,
            py(y) + 4.0,
            (y * 1e6).round() / 1e6
        );
    }
    let mut order: Vec<usize> = (0..series.len()).collect();
    order.sort_by(|a, b| STROKES[b % STROKES.len()].0.total_cmp(&STROKES[a % STROKES.len()].0));
    for &i in &order {
        let s = &series[i];
        let colour = COLOURS[i % COLOURS.len()];
        let (width, dash) = STROKES[i % STROKES.len()];
        let path: Vec<String> = s.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="{width}" stroke-dasharray="{dash}" stroke-opacity="0.85" points="{}"/>"#,
            path.join(" ")
        );
        if s.points.len() <= 20 {
            for &(x, y) in &s.points {
                let _ = writeln!(svg, "{}", marker(i, px(x), py(y), colour));
            }
        }
    }
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let (width, dash) = STROKES[i % STROKES.len()];
        let ly = top + 20.0 + 20.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{colour}" stroke-width="{width}" stroke-dasharray="{dash}"/><text x="{2}" y="{3}">{4}</text>"#,
            w - right + 15.0,
            w - right + 40.0,
            w - right + 46.0,
            ly + 4.0,
            s.name
        );
    }
    svg.push_str("</svg>\n");
    svg
}
