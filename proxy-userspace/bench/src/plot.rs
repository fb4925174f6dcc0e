//! Plots of a run, as plain SVG written from its results.json (so a stored
//! results.json can be plotted again): new connections per second against
//! the service count, one line per variant; and the control plane's start
//! time and RSS against the service count. Plain text, no plotting crate:
//! a few lines and labels are all docs/performance.md needs.
use std::fmt::Write as _;

use serde_json::Value;

/// One line of a plot: its name and its points.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// Colours of the lines, in order (distinct in print and for most colour
/// blindness: the Okabe-Ito palette).
const COLOURS: &[&str] = &["#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#F0E442"];

const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Every plot the results hold: `(file name, SVG)`. A plot without points
/// (a control-only run has no datapath rows) is left out.
#[must_use]
pub fn plots(results: &Value) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let machine = machine(results);
    let connections = rows_by_variant(results, "datapath", "short");
    if !connections.is_empty() {
        out.push((
            "connections.svg",
            svg(&format!("New connections per second ({machine})"), "services", "connections/s", &connections),
        ));
    }
    let control = |field: &str| -> Vec<Series> {
        let points: Vec<(f64, f64)> = results["control"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| Some((c["services"].as_f64()?, c[field].as_f64()?)))
            .collect();
        if points.is_empty() { Vec::new() } else { vec![Series { name: "ebpf-proxy".into(), points }] }
    };
    let start = control("cold_start_seconds");
    if !start.is_empty() {
        out.push(("start.svg", svg(&format!("Start to every map written ({machine})"), "services", "seconds", &start)));
    }
    let mut rss = control("peak_rss_mib");
    if let Some(peak) = rss.first_mut() {
        peak.name = "peak".into();
        let steady = control("rss_mib").pop().map(|s| Series { name: "after the changes".into(), points: s.points });
        rss.extend(steady);
        out.push(("rss.svg", svg(&format!("Agent RSS ({machine})"), "services", "MiB", &rss)));
    }
    out
}

fn machine(results: &Value) -> String {
    let m = &results["machine"];
    format!("{} cores, kernel {}", m["cores"].as_u64().unwrap_or(0), m["kernel"].as_str().unwrap_or("unknown"))
}

/// The rows of `table` in `mode`, one series per variant in first-seen
/// order, points sorted by service count.
fn rows_by_variant(results: &Value, table: &str, mode: &str) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for row in results[table].as_array().into_iter().flatten().filter(|r| r["mode"] == mode) {
        let (Some(variant), Some(services), Some(rate)) =
            (row["variant"].as_str(), row["services"].as_f64(), row["ops_per_second"].as_f64())
        else {
            continue;
        };
        match series.iter_mut().find(|s| s.name == variant) {
            Some(s) => s.points.push((services, rate)),
            None => series.push(Series { name: variant.to_owned(), points: vec![(services, rate)] }),
        }
    }
    for s in &mut series {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}

/// A line chart: x on a log scale (service counts span 1 to 100,000), y
/// linear from 0.
fn svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let points = series.iter().flat_map(|s| s.points.iter());
    let (x_min, x_max) = points.clone().fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    let y_max = nice_step(points.fold(0.0_f64, |hi, p| hi.max(p.1)) / 5.0) * 5.0;
    let (lx_min, lx_max) = (x_min.max(1.0).log10(), x_max.max(1.0).log10());
    let span = if lx_max > lx_min { lx_max - lx_min } else { 1.0 };
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |v: f64| LEFT + (v.max(1.0).log10() - lx_min) / span * plot_w;
    let y = |v: f64| TOP + plot_h - v / y_max * plot_h;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
        WIDTH / 2.0,
        escape(title)
    );
    // Axes, with ticks at each service count measured and five on y.
    let _ = writeln!(
        out,
        "<path d=\"M{LEFT} {TOP} V{} H{}\" stroke=\"black\" fill=\"none\"/>",
        TOP + plot_h,
        LEFT + plot_w
    );
    let mut xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    for v in xs {
        let _ =
            writeln!(out, "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{v}</text>", x(v), TOP + plot_h + 16.0);
    }
    for i in 0..=5 {
        let v = y_max * f64::from(i) / 5.0;
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 6.0,
            y(v) + 4.0,
            tick(v)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{} (log scale)</text>",
        LEFT + plot_w / 2.0,
        HEIGHT - 12.0,
        escape(x_label)
    );
    let _ = writeln!(
        out,
        "<text transform=\"translate(16 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        TOP + plot_h / 2.0,
        escape(y_label)
    );
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = s.points.iter().map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1))).collect();
        let _ = writeln!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
            path.join(" ")
        );
        for p in &s.points {
            let _ = writeln!(out, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>", x(p.0), y(p.1));
        }
        let ly = TOP + 10.0 + 18.0 * f64::from(u8::try_from(i).unwrap_or(u8::MAX));
        let _ = writeln!(
            out,
            "<line x1=\"{0:.1}\" y1=\"{ly:.1}\" x2=\"{1:.1}\" y2=\"{ly:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/>\
             <text x=\"{2:.1}\" y=\"{3:.1}\">{4}</text>",
            LEFT + plot_w + 12.0,
            LEFT + plot_w + 32.0,
            LEFT + plot_w + 38.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The smallest of 1, 2 and 5 times a power of ten at or above `v`, so
/// the five ticks on y are round numbers.
fn nice_step(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let power = 10_f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|step| *step >= v).unwrap_or(10.0 * power)
}

/// A tick label: whole numbers as such, small ones with what decimals
/// they need.
fn tick(v: f64) -> String {
    if v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> Value {
        serde_json::json!({
            "machine": {"cpu": "x", "cores": 2, "kernel": "6.18", "memory_gib": 24.0},
            "datapath": [
                {"services": 1, "mode": "short", "variant": "direct", "ops_per_second": 100.0},
                {"services": 1000, "mode": "short", "variant": "direct", "ops_per_second": 90.0},
                {"services": 1000, "mode": "short", "variant": "ebpf-proxy", "ops_per_second": 80.0},
                {"services": 1, "mode": "short", "variant": "ebpf-proxy", "ops_per_second": 85.0},
                {"services": 1, "mode": "keep", "variant": "direct", "ops_per_second": 500.0},
            ],
            "control": [
                {"services": 10000, "cold_start_seconds": 0.6, "peak_rss_mib": 45.0, "rss_mib": 42.0},
                {"services": 100_000, "cold_start_seconds": 4.5, "peak_rss_mib": 263.0, "rss_mib": 253.0},
            ],
        })
    }

    #[test]
    fn one_line_per_variant_sorted_by_service_count() {
        let series = rows_by_variant(&results(), "datapath", "short");
        let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["direct", "ebpf-proxy"], "kept connections are not new connections");
        assert_eq!(series[1].points, [(1.0, 85.0), (1000.0, 80.0)]);
    }

    #[test]
    fn every_plot_is_an_svg_with_its_lines() {
        let plots = plots(&results());
        let names: Vec<&str> = plots.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["connections.svg", "start.svg", "rss.svg"]);
        for (name, svg) in &plots {
            assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"), "{name}");
        }
        assert_eq!(plots[0].1.matches("<polyline").count(), 2);
        assert_eq!(plots[2].1.matches("<polyline").count(), 2, "peak and after the changes");
        assert!(plots[2].1.contains(">100000<"), "a tick at each service count");
    }

    #[test]
    fn ticks_are_round_numbers() {
        assert!((nice_step(3_874.2) - 5_000.0).abs() < 1e-9);
        assert!((nice_step(0.9) - 1.0).abs() < 1e-9);
        assert!((nice_step(11.0) - 20.0).abs() < 1e-9);
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(0.25), "0.25");
    }

    #[test]
    fn a_control_only_run_has_no_connections_plot() {
        let mut r = results();
        r["datapath"] = serde_json::json!([]);
        assert_eq!(plots(&r).len(), 2);
    }
}
