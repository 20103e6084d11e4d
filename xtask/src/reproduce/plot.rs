//! Curves as PNG: one line per variant, as in the papers' figures.
//!
//! Text is drawn with DejaVu Sans from the system (Debian's
//! fonts-dejavu-core, which CI installs) through plotters' pure-Rust
//! ab_glyph backend, so no font library is linked.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context as _, Result, anyhow};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::Context;
use super::runner::RunLog;

/// Where Debian puts the font.
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One line of a plot.
pub struct Series {
    /// Legend entry.
    pub label: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart's title and axes.
pub struct Chart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// x axis label.
    pub x_label: &'a str,
    /// y axis label.
    pub y_label: &'a str,
    /// Logarithmic y axis (values spanning orders of magnitude).
    pub log_y: bool,
    /// A loss-like chart on a linear axis: a curve that rises above 1.5×
    /// the highest starting value is drawn up to that ceiling and marked
    /// "diverged" there, so that it does not flatten every other curve. Off
    /// for scores, which rise.
    pub clip_above_start: bool,
    /// Tick labels of the x axis (default [`human`]: 2k, 4k, 1.5M).
    pub x_ticks: Option<fn(f64) -> String>,
    /// Tick labels of the y axis (default [`human`]).
    pub y_ticks: Option<fn(f64) -> String>,
    /// A logarithmic x axis with its ticks at these values (e.g. the link
    /// rates measured, rather than plotters' 316 Mbit/s); `None`: linear.
    pub x_key_points: Option<Vec<f64>>,
}

impl<'a> Chart<'a> {
    /// A chart with linear axes, nothing clipped and the default ticks; the
    /// other fields are set with `Chart { log_y: true, ..Chart::new(…) }`.
    pub fn new(title: &'a str, x_label: &'a str, y_label: &'a str) -> Self {
        Self {
            title,
            x_label,
            y_label,
            log_y: false,
            clip_above_start: false,
            x_ticks: None,
            y_ticks: None,
            x_key_points: None,
        }
    }

    /// A chart of values spanning orders of magnitude (step times,
    /// speed-ups): a logarithmic y axis, and x ticks labelled by `x_ticks`.
    pub fn logarithmic(
        title: &'a str,
        x_label: &'a str,
        y_label: &'a str,
        x_ticks: fn(f64) -> String,
    ) -> Self {
        Self {
            log_y: true,
            x_ticks: Some(x_ticks),
            ..Self::new(title, x_label, y_label)
        }
    }
}

/// Ticks of a logarithmic axis over `lo..hi` at 1, 2 and 5 times the
/// powers of ten, so every decade is labelled (plotters' own choice can
/// leave a decade with none).
fn one_two_five(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * decade;
            if t >= lo && t <= hi {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// A number as a person writes it on an axis: 2k, 12.5k, 1.5M, 0.25, 7.
pub fn human(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(format!("{:.2}", v / 1e6)))
    } else if a >= 1e3 {
        format!("{}k", trim(format!("{:.2}", v / 1e3)))
    } else if a >= 1.0 || a == 0.0 {
        trim(format!("{v:.2}"))
    } else {
        // Three significant digits below 1 (0.25, 0.0123, 1.5e-4).
        let digits = (2 - a.log10().floor() as i32).clamp(0, 8) as usize;
        if digits > 6 {
            format!("{v:.1e}")
        } else {
            trim(format!("{v:.digits$}"))
        }
    }
}

/// Ticks for a count (seeds, steps): whole numbers only, no 1.5 between.
pub fn whole(v: f64) -> String {
    if v.fract() == 0.0 {
        human(v)
    } else {
        String::new()
    }
}

/// A ratio as a speed-up: 2×, 10×, 0.5×.
pub fn times(v: f64) -> String {
    format!("{}×", human(v))
}

/// Draws `series` into a PNG at `path`.
pub fn draw(path: &Path, chart: &Chart<'_>, series: &[Series]) -> Result<()> {
    register_font()?;
    let finite = |v: f64| v.is_finite() && (!chart.log_y || v > 0.0);
    let ceiling = ceiling(chart, series, &finite);
    let (clamped, diverged) = clamp_to(chart, series, ceiling);
    let series = &clamped[..];
    let points = || {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|&&(_, y)| finite(y))
    };
    let (x_min, x_max) = bounds(points().map(|&(x, _)| x)).context("nothing to plot")?;
    let (y_min, y_max) = bounds(points().map(|&(_, y)| y)).context("nothing to plot")?;
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(chart.title, ("sans-serif", 22))
        .margin(14)
        // Room for the last x tick's label, centred on the right edge.
        .margin_right(44)
        .x_label_area_size(46)
        .y_label_area_size(72);
    let x_range = x_min..x_max.max(x_min + 1e-12);
    let (y_lo, y_hi) = y_range(chart, y_min, y_max);
    let y_log = || {
        (y_lo..y_hi)
            .log_scale()
            .with_key_points(one_two_five(y_lo, y_hi))
    };
    let frame = Frame {
        x: (x_range.start, x_range.end),
        y: (y_lo, y_hi),
        log_x: chart.x_key_points.is_some(),
        log_y: chart.log_y,
    };
    let points_at = points_along(series, &frame, &finite);
    let marks_at: Vec<(f64, f64)> = diverged.iter().map(|p| frame.at(p)).collect();
    let plot = Plot {
        chart,
        series,
        diverged: &diverged,
        x_ticks: chart.x_ticks.unwrap_or(human),
        y_ticks: chart.y_ticks.unwrap_or(human),
        finite: &finite,
        legend_at: quietest_place(&points_at, &marks_at, series.len()),
    };
    // Four axis types, one drawing: each combination is its own type.
    match (&chart.x_key_points, chart.log_y) {
        (Some(points), true) => plot.on(
            &mut builder,
            x_range.log_scale().with_key_points(points.clone()),
            y_log(),
        )?,
        (Some(points), false) => plot.on(
            &mut builder,
            x_range.log_scale().with_key_points(points.clone()),
            y_lo..y_hi,
        )?,
        (None, true) => plot.on(&mut builder, x_range, y_log())?,
        (None, false) => plot.on(&mut builder, x_range, y_lo..y_hi)?,
    }
    root.present()
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    Ok(())
}

/// Draws the training loss of pre-training runs against the samples seen
/// (`batch` per step, smoothed over 20 steps, 5 in the quick run) into the
/// report's `file`, on a linear axis clipped above the start: the chart of
/// every BERT pre-training comparison.
pub fn draw_pretraining_loss(
    ctx: &Context,
    file: &str,
    logs: &[RunLog],
    batch: usize,
    title: &str,
    y_label: &str,
) -> Result<()> {
    draw(
        &ctx.report.path(file),
        &Chart {
            clip_above_start: true,
            ..Chart::new(title, "samples", y_label)
        },
        &loss_curves(logs, batch as f64, ctx.pick(20, 5)),
    )
}

/// Where the y axis stops. On a linear axis a diverging run would flatten
/// every other curve: the axis stops at 1.5× the highest starting value,
/// and a curve that leaves it runs along the top edge.
fn ceiling(chart: &Chart<'_>, series: &[Series], finite: &dyn Fn(f64) -> bool) -> f64 {
    if chart.log_y || !chart.clip_above_start {
        f64::INFINITY
    } else {
        1.5 * series
            .iter()
            .filter_map(|s| s.points.first().map(|p| p.1))
            .filter(|&y| finite(y))
            .fold(f64::MIN, f64::max)
    }
}

/// The series cut at `ceiling`: a curve that leaves the axis stops there,
/// at the ceiling, and the place is returned to be marked.
fn clamp_to(chart: &Chart<'_>, series: &[Series], ceiling: f64) -> (Vec<Series>, Vec<(f64, f64)>) {
    let mut diverged = Vec::new();
    let clamped = series
        .iter()
        .map(|s| {
            let mut points = Vec::new();
            for &(x, y) in &s.points {
                if y > ceiling || (chart.clip_above_start && y.is_nan()) {
                    points.push((x, ceiling));
                    diverged.push((x, ceiling));
                    break;
                }
                points.push((x, y));
            }
            Series {
                label: s.label.clone(),
                points,
            }
        })
        .collect();
    (clamped, diverged)
}

/// The y axis's ends around the data's `y_min..y_max`, with a margin.
fn y_range(chart: &Chart<'_>, y_min: f64, y_max: f64) -> (f64, f64) {
    if chart.log_y {
        (y_min * 0.8, y_max * 1.25)
    } else {
        let pad = (y_max - y_min).max(1e-12) * 0.05;
        (y_min - pad, y_max + pad)
    }
}

/// The plot's axes, for placing the legend.
struct Frame {
    x: (f64, f64),
    y: (f64, f64),
    log_x: bool,
    log_y: bool,
}

impl Frame {
    /// A point's position as fractions of the plot, from the lower left
    /// (a value that is not finite at the top).
    fn at(&self, &(x, y): &(f64, f64)) -> (f64, f64) {
        let fraction = |v: f64, (lo, hi): (f64, f64), log: bool| {
            if log {
                (v.ln() - lo.ln()) / (hi.ln() - lo.ln())
            } else {
                (v - lo) / (hi - lo)
            }
        };
        let y = if y.is_finite() { y } else { self.y.1 };
        (
            fraction(x, self.x, self.log_x),
            fraction(y, self.y, self.log_y),
        )
    }
}

/// Each curve as points along its segments, as fractions of the plot (a
/// 3-point curve crosses as much of the plot as a 3,000-point one).
fn points_along(series: &[Series], frame: &Frame, finite: &dyn Fn(f64) -> bool) -> Vec<(f64, f64)> {
    series
        .iter()
        .flat_map(|s| {
            let curve: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|&&(_, y)| finite(y))
                .map(|p| frame.at(p))
                .collect();
            let along: Vec<(f64, f64)> = curve
                .windows(2)
                .flat_map(|pair| {
                    let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
                    let steps = (((x1 - x0).hypot(y1 - y0)) * 100.0).ceil().max(1.0) as usize;
                    (0..steps).map(move |i| {
                        let t = i as f64 / steps as f64;
                        (x0 + t * (x1 - x0), y0 + t * (y1 - y0))
                    })
                })
                .collect();
            if along.is_empty() { curve } else { along }
        })
        .collect()
}

/// The place (a corner, or the middle of a side) for a legend of `entries`
/// lines that covers the fewest of the curves' points and none of the
/// divergence marks, if it can (points and marks as fractions of the plot,
/// from the lower left); upper right on a tie, as plotters places it.
fn quietest_place(
    points: &[(f64, f64)],
    marks: &[(f64, f64)],
    entries: usize,
) -> SeriesLabelPosition {
    let width = 0.4;
    let height = (0.06 * entries as f64 + 0.04).min(0.5);
    // (position, box right of centre, box's vertical place: 1 top, 0
    // middle, -1 bottom)
    let places = [
        (SeriesLabelPosition::UpperRight, true, 1),
        (SeriesLabelPosition::LowerLeft, false, -1),
        (SeriesLabelPosition::UpperLeft, false, 1),
        (SeriesLabelPosition::LowerRight, true, -1),
        (SeriesLabelPosition::MiddleRight, true, 0),
        (SeriesLabelPosition::MiddleLeft, false, 0),
    ];
    let covered = |&(x, y): &(f64, f64), right: bool, vertical: i32| {
        let in_x = if right { x >= 1.0 - width } else { x <= width };
        let in_y = match vertical {
            1 => y >= 1.0 - height,
            -1 => y <= height,
            _ => (y - 0.5).abs() <= height / 2.0,
        };
        in_x && in_y
    };
    places
        .into_iter()
        .min_by_key(|&(_, right, vertical)| {
            let hidden_points = points
                .iter()
                .filter(|p| covered(p, right, vertical))
                .count();
            let hidden_marks = marks.iter().filter(|p| covered(p, right, vertical)).count();
            // A hidden mark costs more than every point.
            hidden_marks * (points.len() + 1) + hidden_points
        })
        .map(|(place, _, _)| place)
        .expect("six places")
}

/// What [`draw`] hands to the chart of whichever axis types it built.
struct Plot<'a, 'c> {
    chart: &'a Chart<'c>,
    series: &'a [Series],
    diverged: &'a [(f64, f64)],
    x_ticks: fn(f64) -> String,
    y_ticks: fn(f64) -> String,
    finite: &'a dyn Fn(f64) -> bool,
    legend_at: SeriesLabelPosition,
}

impl Plot<'_, '_> {
    fn on<DB, X, Y>(
        &self,
        builder: &mut ChartBuilder<'_, '_, DB>,
        x: impl AsRangedCoord<CoordDescType = X, Value = f64>,
        y: impl AsRangedCoord<CoordDescType = Y, Value = f64>,
    ) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        let mut ctx = builder.build_cartesian_2d(x, y).map_err(plot_error)?;
        ctx.configure_mesh()
            .x_desc(self.chart.x_label)
            .y_desc(self.chart.y_label)
            .x_label_formatter(&|v| (self.x_ticks)(*v))
            .y_label_formatter(&|v| (self.y_ticks)(*v))
            .draw()
            .map_err(plot_error)?;
        lines(&mut ctx, self.series, self.finite, self.legend_at.clone())?;
        // The word sits left of its cross, so a mark at the right edge
        // stays inside the picture.
        let label = TextStyle::from(("sans-serif", 15).into_font())
            .pos(Pos::new(HPos::Right, VPos::Center));
        for &(x, y) in self.diverged {
            ctx.draw_series([Cross::new((x, y), 7, BLACK.stroke_width(2))])
                .map_err(plot_error)?;
            ctx.plotting_area()
                .draw(&(EmptyElement::at((x, y)) + Text::new("diverged", (-10, 0), label.clone())))
                .map_err(plot_error)?;
        }
        Ok(())
    }
}

/// Moving average over `window` points (the papers plot smoothed loss).
pub fn smooth(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let window = window.max(1);
    points
        .iter()
        .enumerate()
        .map(|(i, &(x, _))| {
            let from = (i + 1).saturating_sub(window);
            let slice = &points[from..=i];
            (
                x,
                slice.iter().map(|&(_, y)| y).sum::<f64>() / slice.len() as f64,
            )
        })
        .collect()
}

/// Each run's training loss, smoothed over `window` steps, against steps ×
/// `x_per_step` (the batch, for sample-wise curves as in the papers).
pub fn loss_curves(logs: &[RunLog], x_per_step: f64, window: usize) -> Vec<Series> {
    logs.iter()
        .map(|log| {
            let loss = log.series("loss");
            let mut points = smooth(
                &loss
                    .iter()
                    .map(|&(s, l)| (s as f64 * x_per_step, l))
                    .collect::<Vec<_>>(),
                window,
            );
            // A diverged run's next step had no finite loss: a NaN there
            // makes `draw` end the curve at that step with its mark, even
            // when the loss had not yet climbed (a sudden divergence).
            if log.diverged
                && let Some(&(last, _)) = loss.last()
            {
                points.push(((last + 1) as f64 * x_per_step, f64::NAN));
            }
            Series {
                label: log.label.clone(),
                points,
            }
        })
        .collect()
}

/// One coloured line per series (its finite points) and the legend.
fn lines<'a, DB, CT>(
    ctx: &mut ChartContext<'a, DB, CT>,
    series: &[Series],
    finite: impl Fn(f64) -> bool,
    legend_at: SeriesLabelPosition,
) -> Result<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: plotters::coord::CoordTranslate<From = (f64, f64)>,
{
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        ctx.draw_series(LineSeries::new(
            s.points.iter().copied().filter(|&(_, y)| finite(y)),
            color.stroke_width(2),
        ))
        .map_err(plot_error)?
        .label(&s.label)
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    legend(ctx, legend_at)
}

fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    ctx: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    ctx.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(at)
        .draw()
        .map_err(plot_error)
}

fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT).map_err(|e| {
                format!("{FONT}: {e} (install Debian's fonts-dejavu-core for the plots' text)")
            })?;
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes.leak())
                .map_err(|_| format!("{FONT}: not a font plotters can read"))
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

fn plot_error<E: std::error::Error + Send + Sync + 'static>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diverged_run_ends_at_its_divergence_however_flat_it_was() {
        // Steps 1-3 at a steady loss, then the divergence line at step 4.
        let lines: Vec<serde_json::Value> = [
            r#"{"step":1,"loss":2.0}"#,
            r#"{"step":2,"loss":1.9}"#,
            r#"{"step":3,"loss":1.8}"#,
            r#"{"step":4,"diverged":true}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
        let dir = tempfile::tempdir().unwrap();
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.path().join("metrics.jsonl"), text).unwrap();
        let log = RunLog::read("run", dir.path()).unwrap();
        assert!(log.diverged);
        let curve = &loss_curves(std::slice::from_ref(&log), 1.0, 1)[0];
        assert_eq!(curve.points.len(), 4);
        assert_eq!(curve.points[2], (3.0, 1.8));
        assert_eq!(curve.points[3].0, 4.0);
        assert!(curve.points[3].1.is_nan(), "{:?}", curve.points);
        // A run that did not diverge gets no such point.
        std::fs::write(
            dir.path().join("metrics.jsonl"),
            r#"{"step":1,"loss":2.0}"#.to_string() + "\n",
        )
        .unwrap();
        let log = RunLog::read("run", dir.path()).unwrap();
        assert_eq!(loss_curves(&[log], 1.0, 1)[0].points, [(1.0, 2.0)]);
    }

    #[test]
    fn axis_numbers_read_as_a_person_writes_them() {
        for (v, text) in [
            (2000.0, "2k"),
            (12_500.0, "12.5k"),
            (1_500_000.0, "1.5M"),
            (7.0, "7"),
            (0.0, "0"),
            (0.25, "0.25"),
            (0.0123, "0.0123"),
            (16.5, "16.5"),
        ] {
            assert_eq!(human(v), text, "{v}");
        }
        assert_eq!(times(20.0), "20×");
    }
}
