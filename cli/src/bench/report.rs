//! Records of a sweep: the JSON written by `--json` and the table printed at the end.

use std::fmt::Write as _;

use serde::Serialize;

use crate::bench::memory::MemorySource;

/// Median, minimum and maximum of a list of milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// Median (the mean of the middle two for an even count), ms.
    pub median: f64,
    /// Fastest, ms.
    pub min: f64,
    /// Slowest, ms.
    pub max: f64,
}

impl Stats {
    /// `None` for an empty list. The median of an even count is the mean of the middle two.
    pub fn of(xs: &[f64]) -> Option<Stats> {
        if xs.is_empty() {
            return None;
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        };
        Some(Stats {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// What happened to a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Checked against the oracle and timed.
    Ok,
    /// The shape does not fit this device (e.g. a buffer over the binding limit); not timed.
    Skipped,
    /// This build's kernels do not take the requested dtype (or op); not timed.
    Unsupported,
    /// The kernel's result on the check shape was wrong: no number is reported.
    CheckFailed,
    /// A device or runtime error.
    Error,
}

impl Status {
    /// The status as the table prints it (`check failed` with a space; JSON uses snake_case).
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skipped => "skipped",
            Status::Unsupported => "unsupported",
            Status::CheckFailed => "check failed",
            Status::Error => "error",
        }
    }
}

/// The shape of a case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShapeRecord {
    /// `"16/64 1x32768"`, `"16/32 B=64"` (decode).
    pub label: String,
    /// `"1x32768"`, `"4096x8"`, `"28672+4096"`; decode: `"B=64"`.
    pub seqs: String,
    /// H, the q/k heads.
    pub heads_qk: usize,
    /// HV, the v heads.
    pub heads_v: usize,
    /// K, the key head dimension.
    pub key_dim: usize,
    /// V, the value head dimension.
    pub value_dim: usize,
    /// B of the call (1 for packed sequences).
    pub batch: usize,
    /// N, the number of sequences.
    pub sequences: usize,
    /// B·T: every token of the call (decode: one per sequence).
    pub total_tokens: usize,
}

/// GPU time of one pass (median over repetitions).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PassTime {
    /// The pass (its launcher's name, e.g. `state_scan`), or `tail`: the copies after the last pass.
    pub name: String,
    /// Median GPU time of the pass over the repetitions, ms.
    pub median_ms: f64,
}

/// Which path a segmented forward's (segment, v-head) pairs took (docs/sequence-parallelism.md).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SegmentPathsRecord {
    /// Pairs on the gate-driven window (a warm-up instead of the transition).
    pub windowed: usize,
    /// Pairs on the exact transition.
    pub exact: usize,
    /// The longest warm-up a windowed pair ran, in chunks.
    pub longest_warmup_chunks: usize,
}

/// What one backward holds on the device, counted from the buffers the library allocated
/// (`wgpu_backend::backward::backward_memory`): each buffer once, at its allocated size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackwardMemoryRecord {
    /// The caller's inputs it reads: q, k, v, g, β, h0, do, dht.
    pub inputs_bytes: u64,
    /// What `forward_saved` kept for it (intermediates, or checkpoints when windowed).
    pub saved_bytes: u64,
    /// The `BackwardWorkspace` (scratch of the largest window, tables).
    pub workspace_bytes: u64,
    /// The gradients it writes.
    pub gradients_bytes: u64,
    /// The memory budget the plan was made for (null: unbounded).
    pub budget_bytes: Option<u64>,
    /// Token windows of the plan.
    pub windows: usize,
    /// The device allocator's figure for the same call, where wgpu has a report: the
    /// library's count plus the allocator's alignment padding.
    pub allocator_bytes: Option<u64>,
}

/// The oracle check that gated a case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckRecord {
    /// The small shape and kernel variant that was checked.
    pub shape: String,
    /// Largest relative L2 error against the f64 oracle over the op's outputs.
    pub max_rel_l2: f64,
    /// The largest relative L2 error that passes.
    pub tolerance: f64,
}

/// One measured (or refused) case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Record {
    /// `"forward"`, `"backward"`, `"decode"`.
    pub op: String,
    /// The backend's name as `--backend` takes it: `"wgpu"`, `"cpu"` (the f64 oracle).
    pub backend: String,
    /// Storage dtype of q, k, v, o: `"F32"`, `"F16"`, `"BF16"`.
    pub dtype: String,
    /// Adapter name and API, e.g. `"NVIDIA H200 (Vulkan)"`.
    pub adapter: String,
    /// The case's shape.
    pub shape: ShapeRecord,
    /// Whether the case was timed, and if not why.
    pub status: Status,
    /// Why a case was not timed, or other remarks.
    pub note: Option<String>,
    /// The kernel variant timed (V-block width, decode tiling).
    pub variant: Option<String>,
    /// Forward on wgpu: the algorithm timed, `"chunked"` or `"recurrent"`
    /// (`wgpu_backend::forward_algorithm`); null for other ops and backends.
    pub algorithm: Option<String>,
    /// Why that algorithm: forced, the sequence lengths, or the adapter's type.
    pub algorithm_reason: Option<String>,
    /// Untimed runs before timing.
    pub warmup: usize,
    /// Timed repetitions (after any `--max-seconds` trimming).
    pub reps: usize,
    /// Copies of the inputs the repetitions rotate through (cache-cold timing).
    pub input_sets: usize,
    /// GPU time from timestamp queries (first to last pass), when the adapter has them.
    pub gpu_ms: Option<Stats>,
    /// GPU ms of each timed repetition, in order (a slow stretch or a clock ramp shows here,
    /// not in the median).
    pub gpu_ms_reps: Vec<f64>,
    /// Wall clock of a repetition: encode (including per-call scratch allocation), submit, and
    /// wait for completion.
    pub wall_ms: Option<Stats>,
    /// Host time to encode and submit a repetition (before waiting).
    pub host_ms: Option<Stats>,
    /// Per-pass GPU time, in pass order.
    pub passes: Vec<PassTime>,
    /// The algorithm's FLOPs for this call (formulas in BENCHMARKS.md).
    pub flops: f64,
    /// Compulsory bytes: inputs read once + outputs written once.
    pub bytes: f64,
    /// `flops` / median time (GPU time where available, else wall).
    pub tflops: Option<f64>,
    /// `bytes` / median time, GB/s (10⁹ B/s).
    pub gbps: Option<f64>,
    /// `"gpu"` or `"wall"`: which median the rates divide by.
    pub rate_basis: Option<String>,
    /// Tokens per second: every sequence's tokens of one call / median time (decode: the
    /// batch's tokens of one step).
    pub tokens_per_s: Option<f64>,
    /// Decode: GB/s of a streaming copy of a buffer the size of the state pool, measured in
    /// the same process (the bandwidth a step over every slot could reach); null elsewhere
    /// and without timestamp queries.
    pub copy_ceiling_gbps: Option<f64>,
    /// GPU memory one call holds at its peak (inputs + outputs + scratch, one input set):
    /// measured by the device's allocator, or estimated where the backend has no allocator
    /// report (`memory_source` says which); null for the CPU backend and untimed cases.
    pub peak_memory_bytes: Option<u64>,
    /// `"allocator"` (measured), `"estimate"` (buffer sizes the launchers are known to
    /// allocate; BENCHMARKS.md, "Memory") or `"library"` (the backward: the buffers the call
    /// holds, counted by the library, `backward_memory`).
    pub memory_source: Option<MemorySource>,
    /// The backward: what one call holds, by part (null for other ops).
    pub backward_memory: Option<BackwardMemoryRecord>,
    /// The segmented chunked forward: how many (segment, v-head) pairs of the last timed
    /// call took the gate-driven window and how many the exact transition
    /// (`ForwardWorkspace::segment_paths`); null without segments and for other ops.
    pub segment_paths: Option<SegmentPathsRecord>,
    /// The oracle check that gated the case (`None` when it never ran).
    pub check: Option<CheckRecord>,
}

impl Record {
    /// The median the rates use: GPU time when measured, else wall clock.
    pub fn time_ms(&self) -> Option<f64> {
        self.gpu_ms.or(self.wall_ms).map(|s| s.median)
    }
}

/// The adapter a sweep ran on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterRecord {
    /// Adapter name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Graphics API, as `wgpu::Backend` debug-prints it (`Vulkan`, `Metal`, …).
    pub backend: String,
    /// `wgpu::DeviceType` debug-printed (`DiscreteGpu`, `Cpu`, …).
    pub device_type: String,
    /// Driver name, as the adapter reports it.
    pub driver: String,
    /// Driver version and details, as the adapter reports them.
    pub driver_info: String,
    /// Whether GPU timestamps inside encoders are available (else records have wall time only).
    pub timestamp_queries: bool,
}

/// The whole `--json` document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `"gdn bench"`.
    pub tool: String,
    /// The gdn-cli version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// UTC, ISO 8601.
    pub date_utc: String,
    /// The commit the binary was built from (`+dirty` with uncommitted changes), or `git
    /// rev-parse --short HEAD` where it ran when unknown at build time.
    pub commit: Option<String>,
    /// The command line that produced the report.
    pub command: String,
    /// The adapter of the sweep (`None` off wgpu).
    pub adapter: Option<AdapterRecord>,
    /// Cache size the input rotation aims past (0: no rotation).
    pub rotate_bytes: f64,
    /// Every case, in run order.
    pub records: Vec<Record>,
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.1}")
    } else if ms >= 1.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.4}")
    }
}

/// A rate with about three significant digits.
fn fmt_rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else if x >= 0.01 {
        format!("{x:.3}")
    } else {
        format!("{x:.1e}")
    }
}

/// Bytes as MiB/GiB.
pub fn fmt_bytes(b: f64) -> String {
    let mib = b / (1024.0 * 1024.0);
    if mib >= 1024.0 {
        format!("{:.2} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}

/// The table printed after a sweep, then the per-pass breakdown and any notes.
pub fn table(report: &Report) -> String {
    let header = [
        "op",
        "dtype",
        "heads",
        "seqs",
        "tokens",
        "GPU ms",
        "(min-max)",
        "wall ms",
        "host ms",
        "TFLOP/s",
        "GB/s",
        "tok/s",
        "memory",
        "check",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for r in &report.records {
        let s = &r.shape;
        let mut row = vec![
            r.op.clone(),
            r.dtype.clone(),
            format!("{}/{}", s.heads_qk, s.heads_v),
            s.seqs.clone(),
            s.total_tokens.to_string(),
        ];
        if r.status == Status::Ok {
            let med = |x: &Option<Stats>| x.map_or("-".into(), |s| fmt_ms(s.median));
            row.push(med(&r.gpu_ms));
            row.push(r.gpu_ms.or(r.wall_ms).map_or("-".into(), |s| {
                format!("{}-{}", fmt_ms(s.min), fmt_ms(s.max))
            }));
            row.push(med(&r.wall_ms));
            row.push(med(&r.host_ms));
            row.push(r.tflops.map_or("-".into(), fmt_rate));
            row.push(r.gbps.map_or("-".into(), fmt_rate));
            row.push(r.tokens_per_s.map_or("-".into(), fmt_count));
            row.push(match (r.peak_memory_bytes, r.memory_source) {
                (Some(b), Some(MemorySource::Estimate)) => format!("~{}", fmt_bytes(b as f64)),
                (Some(b), _) => fmt_bytes(b as f64),
                (None, _) => "-".into(),
            });
            row.push(
                r.check
                    .as_ref()
                    .map_or("oracle".into(), |c| format!("{:.1e}", c.max_rel_l2)),
            );
        } else {
            row.push(r.status.name().into());
            row.extend(std::iter::repeat_n(String::new(), header.len() - row.len()));
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |cells: &[String], out: &mut String| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i < 4 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(&header.map(String::from), &mut out);
    line(
        &widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>(),
        &mut out,
    );
    for row in &rows {
        line(row, &mut out);
    }
    let with_passes: Vec<&Record> = report
        .records
        .iter()
        .filter(|r| r.passes.len() > 1)
        .collect();
    if !with_passes.is_empty() {
        let _ = writeln!(out, "\nper-pass GPU ms (median):");
        for r in with_passes {
            let passes: Vec<String> = r
                .passes
                .iter()
                .map(|p| format!("{} {}", p.name, fmt_ms(p.median_ms)))
                .collect();
            let _ = writeln!(
                out,
                "  {:<8} {:<22} {}",
                r.op,
                r.shape.label,
                passes.join(" | ")
            );
        }
    }
    let ceilings: Vec<(&Record, f64, f64)> = report
        .records
        .iter()
        .filter_map(|r| Some((r, r.gbps?, r.copy_ceiling_gbps?)))
        .collect();
    if !ceilings.is_empty() {
        let _ = writeln!(
            out,
            "\ndecode against the copy ceiling (a copy of a buffer the pool's size, this process):"
        );
        for (r, gbps, ceiling) in ceilings {
            let _ = writeln!(
                out,
                "  {:<22} {} GB/s of {} GB/s ({:.0} %)",
                r.shape.label,
                fmt_rate(gbps),
                fmt_rate(ceiling),
                100.0 * gbps / ceiling
            );
        }
    }
    let notes: Vec<&Record> = report
        .records
        .iter()
        .filter(|r| r.status != Status::Ok && r.note.is_some())
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(out, "\nnot timed:");
        for r in notes {
            let _ = writeln!(
                out,
                "  {} {} {}: {}: {}",
                r.op,
                r.dtype,
                r.shape.label,
                r.status.name(),
                r.note.as_deref().unwrap_or("")
            );
        }
    }
    out
}

/// A count per second with an SI suffix: `950`, `12.3k`, `4.56M`.
pub fn fmt_count(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.3}G", x / 1e9),
        x if x >= 1e6 => format!("{:.3}M", x / 1e6),
        x if x >= 1e3 => format!("{:.3}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time (civil-from-days, proleptic Gregorian).
pub fn iso_utc(unix_seconds: u64) -> String {
    let days = (unix_seconds / 86400) as i64;
    let secs = unix_seconds % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_dates() {
        assert_eq!(
            Stats::of(&[3.0, 1.0, 2.0]),
            Some(Stats {
                median: 2.0,
                min: 1.0,
                max: 3.0
            })
        );
        assert_eq!(Stats::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert_eq!(Stats::of(&[]), None);
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso_utc(1_798_675_200 + 3661), "2026-12-31T01:01:01Z");
    }
}
