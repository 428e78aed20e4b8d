//! `--plot PATH.svg`: latency against tokens, one line per head configuration, one panel per
//! op (log-log). Shapes with the same token count but other packings (1×32768, 4096×8,
//! 28672+4096, …) share an x position, so a vertical run of points shows what packing costs.

use plotters::prelude::*;

use crate::bench::report::{Report, Status};

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Draw the report's timed records into an SVG file.
pub fn write_svg(report: &Report, path: &str) -> Result<(), String> {
    let ok: Vec<_> = report
        .records
        .iter()
        .filter(|r| r.status == Status::Ok && r.time_ms().is_some())
        .collect();
    let mut ops: Vec<&str> = ok.iter().map(|r| r.op.as_str()).collect();
    ops.dedup();
    ops.sort_by_key(|op| {
        ["forward", "backward", "decode"]
            .iter()
            .position(|o| o == op)
    });
    ops.dedup();
    if ops.is_empty() {
        return Err("no timed records to plot".into());
    }
    let adapter = report
        .adapter
        .as_ref()
        .map_or("cpu".to_string(), |a| format!("{} ({})", a.name, a.backend));
    let root = SVGBackend::new(path, (900, 380 * ops.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((ops.len(), 1));
    for (panel, op) in panels.iter().zip(&ops) {
        let recs: Vec<_> = ok.iter().filter(|r| r.op == *op).collect();
        let basis = if recs.iter().all(|r| r.gpu_ms.is_some()) {
            "GPU ms (timestamps)"
        } else {
            "ms (GPU where measured, else wall)"
        };
        let xs: Vec<f64> = recs.iter().map(|r| r.shape.total_tokens as f64).collect();
        let ys: Vec<f64> = recs.iter().filter_map(|r| r.time_ms()).collect();
        let (x0, x1) = bounds(&xs);
        let (y0, y1) = bounds(&ys);
        let xlabel = if *op == "decode" {
            "sequences per step (1 token each)"
        } else {
            "tokens per call (B·T)"
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{op}: median latency, {adapter}"),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_desc(xlabel)
            .y_desc(basis)
            .x_label_formatter(&|x| trim(*x))
            .y_label_formatter(&|y| trim(*y))
            .draw()
            .map_err(|e| e.to_string())?;
        let mut heads: Vec<(usize, usize)> = recs
            .iter()
            .map(|r| (r.shape.heads_qk, r.shape.heads_v))
            .collect();
        heads.sort_unstable_by(|a, b| b.cmp(a));
        heads.dedup();
        for (i, &(h, hv)) in heads.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let mut pts: Vec<(f64, f64)> = recs
                .iter()
                .filter(|r| (r.shape.heads_qk, r.shape.heads_v) == (h, hv))
                .filter_map(|r| Some((r.shape.total_tokens as f64, r.time_ms()?)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(format!("heads {h}/{hv}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| e.to_string())?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// A log-scale axis range around `v` (half a decade of margin, never empty).
fn bounds(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0.0f64, f64::max);
    if !(lo > 0.0 && hi.is_finite()) {
        return (1e-3, 1.0);
    }
    (lo / 1.6, hi * 1.6)
}

/// An axis label without trailing zeros: 2048, 0.25, 1.5e-3.
fn trim(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !(1e-3..1e7).contains(&x.abs()) {
        return format!("{x:.1e}");
    }
    let s = format!("{x:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
