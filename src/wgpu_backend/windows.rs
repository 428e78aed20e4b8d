//! Token windows: how the forward runs over tensors and scratch larger than one storage
//! binding (docs/windows.md).
//!
//! A window is a run of whole chunks of the packed token axis (a chunk that crosses the
//! boundary between two buffers of a tensor larger than one buffer is cut there: the windows
//! on either side each hold one piece of it). Its passes bind the caller's
//! token-indexed tensors (q, k, v, g, β, o) at a byte offset — from the window's `base`, a
//! token at or before its first chunk chosen so every such offset is a multiple of the
//! device's `min_storage_buffer_offset_alignment` — and the state slots of the sequences it
//! touches. Windows run one after another in one encoder: a sequence cut by a window boundary
//! continues from the state the previous window left in its slot (the scans update states in
//! place), which is exactly the recurrence. Scratch is sized for the largest window, so it is
//! bounded by the binding limit, not by T.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::problem::{CHUNK, Problem};

/// What the bindings of one window cost, for [`plan`].
#[derive(Debug, Clone)]
pub(crate) struct WindowCosts {
    /// Bytes per token of every token-indexed binding (the caller's tensors and scratch).
    pub token_bytes: Vec<u64>,
    /// Bytes per token of the caller's tensors, which are bound at an offset: the window's
    /// base keeps each offset aligned.
    pub offset_token_bytes: Vec<u64>,
    /// Rows of padding the scratch carries past the window's last token.
    pub pad_tokens: usize,
    /// Bytes of one sequence's state slot (the states are bound per window).
    pub slot_bytes: u64,
    /// Bytes per chunk of a binding that also holds the window's states (the backward's
    /// chunk-start states and their gradients: one slot per chunk plus one per sequence).
    pub chunk_bytes: u64,
    /// Segmented scans: tokens per segment and bytes per segment of their scratch
    /// (transitions, end and start states), bounded per window too.
    pub segments: Option<(usize, u64)>,
    /// The most chunks, sequences or segments one window may hold: passes dispatch one
    /// workgroup row per chunk or segment (`max_compute_workgroups_per_dimension`).
    pub max_rows: usize,
    /// Tokens per buffer of the token-indexed tensors stored in several buffers (the least
    /// over them; a power of two, so every such tensor's boundaries are multiples of it):
    /// windows end at these boundaries, since a binding lies in one buffer.
    pub part_tokens: Option<usize>,
}

/// One window: sequences `first_seq..first_seq + pieces.len()`, each computed over its piece
/// (a range of the packed token axis, possibly empty), with token-indexed tensors bound from
/// `base` for `tokens` tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenWindow {
    /// The token where the window's token-indexed bindings start (≤ its first chunk).
    pub base: usize,
    /// Tokens bound from `base`; the last piece ends at `base + tokens`.
    pub tokens: usize,
    /// The first sequence (state slot) of the window.
    pub first_seq: usize,
    /// Per sequence from `first_seq` on: the tokens this window computes. A piece starts at
    /// a chunk boundary of its sequence, or at a buffer boundary (`WindowCosts::part_tokens`)
    /// that cut one of its chunks, after which the sequence's chunks count from that boundary:
    /// a window's chunks count from the start of each of its pieces.
    pub pieces: Vec<Range<usize>>,
}

impl WindowCosts {
    /// Costs that bound a window by both `self` and `other` (a forward whose windows the
    /// backward reuses).
    pub fn union(&self, other: &WindowCosts) -> WindowCosts {
        let cat = |a: &[u64], b: &[u64]| a.iter().chain(b).copied().collect();
        WindowCosts {
            token_bytes: cat(&self.token_bytes, &other.token_bytes),
            offset_token_bytes: cat(&self.offset_token_bytes, &other.offset_token_bytes),
            pad_tokens: self.pad_tokens.max(other.pad_tokens),
            slot_bytes: self.slot_bytes.max(other.slot_bytes),
            chunk_bytes: self.chunk_bytes.max(other.chunk_bytes),
            segments: self.segments.or(other.segments),
            max_rows: self.max_rows.min(other.max_rows),
            part_tokens: match (self.part_tokens, other.part_tokens) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

impl TokenWindow {
    /// The whole problem as one window.
    pub fn whole(problem: &Problem) -> Self {
        TokenWindow {
            base: 0,
            tokens: problem.total_tokens(),
            first_seq: 0,
            pieces: problem.sequences(),
        }
    }

    /// Sequences (state slots) the window binds.
    pub fn seqs(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the window's first piece continues a sequence an earlier window started (only
    /// the first piece can: the others start where their sequences start). Its start state is
    /// then where that window left it, which a windowed `forward_saved` checkpoints; every
    /// other piece starts from the initial state.
    pub fn continues(&self, sequences: &[Range<usize>]) -> bool {
        self.pieces
            .first()
            .is_some_and(|p| p.start > sequences[self.first_seq].start)
    }

    /// The chunk table (start relative to `base`, length) of the window's pieces.
    pub fn chunk_table(&self) -> Vec<u32> {
        self.pieces
            .iter()
            .flat_map(|p| {
                (p.start..p.end)
                    .step_by(CHUNK)
                    .flat_map(move |c| [(c - self.base) as u32, (CHUNK.min(p.end - c)) as u32])
            })
            .collect()
    }

    /// The segment table (start relative to `base`, length, state slot relative to
    /// `first_seq`): one segment per piece.
    pub fn segment_table(&self) -> Vec<u32> {
        self.pieces
            .iter()
            .enumerate()
            .flat_map(|(i, p)| [(p.start - self.base) as u32, p.len() as u32, i as u32])
            .collect()
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Segments of `span` tokens a piece of `len` tokens is cut into.
fn segments_of(len: usize, span: usize) -> usize {
    len.div_ceil(span)
}

/// The windows of `problem` under a binding limit of `limit` bytes with offsets aligned to
/// `align` bytes: the whole problem when everything fits one binding (then nothing changes),
/// else windows of whole chunks, each as long as its bindings allow, ending at every buffer
/// boundary of `costs.part_tokens` (which may cut a chunk of a varlen sequence: see
/// [`TokenWindow::pieces`]). A limit below one chunk's bindings, or below one sequence's
/// state, is an `Error::TooLarge` naming it.
pub(crate) fn plan(
    problem: &Problem,
    costs: &WindowCosts,
    limit: u64,
    align: u64,
) -> Result<Vec<TokenWindow>> {
    let per_token = costs.token_bytes.iter().copied().max().unwrap_or(4).max(1);
    let seg_count = |pieces: &[Range<usize>]| -> usize {
        costs.segments.map_or(0, |(span, _)| {
            pieces.iter().map(|p| segments_of(p.len(), span)).sum()
        })
    };
    let whole = TokenWindow::whole(problem);
    let seg_bytes = costs.segments.map_or(0, |(_, b)| b);
    let fits_rows =
        |chunks: usize, seqs: usize, segs: usize| chunks.max(seqs).max(segs) <= costs.max_rows;
    let fits = |tokens: usize, chunks: usize, seqs: usize, segs: usize| {
        (tokens + costs.pad_tokens) as u64 * per_token <= limit
            && seqs as u64 * costs.slot_bytes + chunks as u64 * costs.chunk_bytes <= limit
            && segs as u64 * seg_bytes <= limit
    };
    let all_chunks = problem.chunks().len();
    if costs.part_tokens.is_none()
        && fits(
            whole.tokens,
            all_chunks,
            whole.seqs(),
            seg_count(&whole.pieces),
        )
        && fits_rows(
            problem.chunks().len(),
            whole.seqs(),
            seg_count(&whole.pieces),
        )
    {
        return Ok(vec![whole]);
    }

    let too_large = |name: &str, bytes: u64| Error::TooLarge {
        name: name.into(),
        bytes,
        limit_name: "max_storage_buffer_binding_size",
        limit,
    };
    // Tokens of alignment slack a window's base may need before its first chunk.
    let granule = costs
        .offset_token_bytes
        .iter()
        .map(|&b| align / gcd(align, b))
        .max()
        .unwrap_or(1) as usize;
    let least_tokens = CHUNK + granule - 1;
    // The buffer a token lies in, when tensors span several.
    let part = |token: usize| costs.part_tokens.map_or(0, |p| token / p);
    if let Some(p) = costs.part_tokens
        && (p < CHUNK || !p.is_multiple_of(granule))
    {
        return Err(too_large(
            "a buffer of a token-indexed tensor (fewer tokens than one aligned chunk)",
            p as u64 * per_token,
        ));
    }
    if !fits(least_tokens, 1, 1, 1) {
        let bytes = [
            (least_tokens + costs.pad_tokens) as u64 * per_token,
            costs.slot_bytes + costs.chunk_bytes,
            seg_bytes,
        ];
        let names = [
            "the bindings of a window of one 64-token chunk",
            "the state of one sequence",
            "the scratch of one segment",
        ];
        let worst = (0..3).max_by_key(|&i| bytes[i]).unwrap_or(0);
        return Err(too_large(names[worst], bytes[worst]));
    }
    if !costs.slot_bytes.is_multiple_of(align) {
        return Err(Error::unsupported(
            "state",
            format!(
                "windows over states of {} bytes, not a multiple of the device's \
                 min_storage_buffer_offset_alignment ({align})",
                costs.slot_bytes
            ),
        ));
    }

    let span_segments = |len: usize| costs.segments.map_or(0, |(span, _)| segments_of(len, span));
    let sequences = problem.sequences();
    let mut windows = Vec::new();
    // The open window, its segment count and its chunk count.
    let mut open: Option<(TokenWindow, usize, usize)> = None;
    for (n, seq) in sequences.iter().enumerate() {
        // The sequence's chunks, 64 tokens from its start; a chunk across a buffer boundary
        // is cut there, and the chunks after the cut count from the boundary (which starts a
        // window, so every piece's chunks count from its start).
        let mut start = seq.start;
        while start < seq.end {
            let mut end = (start + CHUNK).min(seq.end);
            if let Some(p) = costs.part_tokens
                && part(start) != part(end - 1)
            {
                end = (part(start) + 1) * p;
            }
            if let Some((w, _, _)) = &open
                && part(w.base) != part(start)
            {
                windows.extend(open.take().map(|(w, _, _)| w));
            }
            if let Some((w, segs, chunks)) = &open {
                let segs = match w.pieces.get(n - w.first_seq) {
                    Some(p) => segs - span_segments(p.len()) + span_segments(end - p.start),
                    None => segs + span_segments(end - start),
                };
                let seqs = n - w.first_seq + 1;
                if !fits(end - w.base, chunks + 1, seqs, segs) || !fits_rows(chunks + 1, seqs, segs)
                {
                    windows.extend(open.take().map(|(w, _, _)| w));
                }
            }
            let (w, segs, chunks) = open.get_or_insert_with(|| {
                let window = TokenWindow {
                    base: start / granule * granule,
                    tokens: 0,
                    first_seq: n,
                    pieces: Vec::new(),
                };
                (window, 0, 0)
            });
            *chunks += 1;
            let before = w
                .pieces
                .get(n - w.first_seq)
                .map_or(0, |p| span_segments(p.len()));
            let first_seq = w.first_seq;
            extend(&mut w.pieces, first_seq, n, start..end, &sequences);
            *segs = *segs - before + span_segments(w.pieces[n - first_seq].len());
            w.tokens = end - w.base;
            start = end;
        }
    }
    windows.extend(open.map(|(w, _, _)| w));
    Ok(windows)
}

/// The token windows of a decode call over packed `sequences` (contiguous ranges of the
/// token axis, lengths 0 included): each binds at most `max_tokens` tokens from its `base`
/// (a multiple of `granule` tokens, so every offset stays aligned), lies inside one buffer of
/// the token-indexed tensors stored in several (boundaries every `part_tokens` tokens, a
/// multiple of `granule`), and holds at most `max_sequences` sequences (the kernel's uniform
/// tables). Unlike the forward's, decode windows cut anywhere: the kernel walks tokens one
/// at a time, and a sequence cut by a boundary continues from the state its slot holds.
/// `max_tokens ≥ granule ≥ 1` and `max_sequences ≥ 1`.
pub(crate) fn plan_decode(
    sequences: &[Range<usize>],
    max_tokens: usize,
    granule: usize,
    part_tokens: Option<usize>,
    max_sequences: usize,
) -> Vec<TokenWindow> {
    let total = sequences.last().map_or(0, |s| s.end);
    let mut windows: Vec<TokenWindow> = Vec::new();
    let (mut n, mut at) = (0, 0);
    while n < sequences.len() {
        // Sequences after the last token (empty ones) join the window before when it has room.
        if at == total
            && let Some(w) = windows.last_mut()
            && w.seqs() < max_sequences
            && w.first_seq + w.seqs() == n
        {
            w.pieces.push(total..total);
            n += 1;
            continue;
        }
        let base = if at == total {
            total.saturating_sub(1) / granule * granule
        } else {
            at / granule * granule
        };
        let mut limit = (base + max_tokens).min(total);
        if let Some(p) = part_tokens {
            limit = limit.min((base / p + 1) * p);
        }
        let first_seq = n;
        let mut pieces = Vec::new();
        while n < sequences.len() && pieces.len() < max_sequences {
            let s = &sequences[n];
            let start = at.max(s.start);
            if start >= limit && s.end > start {
                break;
            }
            let end = s.end.min(limit);
            pieces.push(start..end);
            if end < s.end {
                at = end;
                break;
            }
            at = s.end;
            n += 1;
        }
        let end = pieces
            .last()
            .map_or(base, |p| p.end)
            .max(base + 1)
            .min(total);
        windows.push(TokenWindow {
            base,
            tokens: end.saturating_sub(base),
            first_seq,
            pieces,
        });
    }
    windows
}

/// Add chunk `chunk` of sequence `n` to a window's pieces (sequences from `first_seq`),
/// with empty pieces for the (empty) sequences in between.
fn extend(
    pieces: &mut Vec<Range<usize>>,
    first_seq: usize,
    n: usize,
    chunk: Range<usize>,
    sequences: &[Range<usize>],
) {
    while first_seq + pieces.len() < n {
        let s = &sequences[first_seq + pieces.len()];
        pieces.push(s.start..s.start);
    }
    match pieces.get_mut(n - first_seq) {
        Some(p) => p.end = chunk.end,
        None => pieces.push(chunk),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    fn costs(token_bytes: u64, slot_bytes: u64) -> WindowCosts {
        WindowCosts {
            token_bytes: vec![token_bytes],
            offset_token_bytes: vec![4],
            pad_tokens: 0,
            slot_bytes,
            chunk_bytes: 0,
            segments: None,
            max_rows: 65535,
            part_tokens: None,
        }
    }

    fn varlen(cu: Vec<usize>) -> Problem {
        let t = *cu.last().unwrap();
        Problem::new(1, t, 1, 1, 16, 16, Some(cu), Options::default()).unwrap()
    }

    /// Every token of every sequence is in exactly one window, in order, each piece starting
    /// on a chunk boundary of its sequence (counted from its start, or from the last buffer
    /// boundary of `c.part_tokens` before the piece inside the sequence); no window crosses a
    /// buffer boundary; bindings stay within the limit.
    fn check_cover(p: &Problem, windows: &[TokenWindow], c: &WindowCosts, limit: u64) {
        let seqs = p.sequences();
        let mut next: Vec<usize> = seqs.iter().map(|s| s.start).collect();
        for w in windows {
            assert!(w.base <= w.pieces.iter().map(|r| r.start).min().unwrap());
            if let Some(part) = c.part_tokens {
                assert_eq!(w.base / part, (w.base + w.tokens - 1) / part, "{w:?}");
            }
            assert!(
                (w.tokens + c.pad_tokens) as u64 * c.token_bytes[0] <= limit,
                "{w:?}"
            );
            assert!(w.seqs() as u64 * c.slot_bytes <= limit, "{w:?}");
            assert_eq!((w.base * 4) as u64 % 256, 0, "{w:?}");
            for (i, piece) in w.pieces.iter().enumerate() {
                let n = w.first_seq + i;
                assert_eq!(piece.start, next[n], "sequence {n} in {w:?}");
                let origin = c
                    .part_tokens
                    .map_or(seqs[n].start, |part| piece.start / part * part)
                    .max(seqs[n].start);
                assert_eq!((piece.start - origin) % CHUNK, 0, "sequence {n} in {w:?}");
                assert!(piece.end <= w.base + w.tokens);
                next[n] = piece.end;
            }
        }
        for (n, s) in seqs.iter().enumerate() {
            assert_eq!(next[n], s.end, "sequence {n} not covered");
        }
    }

    #[test]
    fn whole_problem_when_it_fits() {
        let p = varlen(vec![0, 5, 5, 200]);
        let w = plan(&p, &costs(16, 64), 1 << 20, 256).unwrap();
        assert_eq!(w, vec![TokenWindow::whole(&p)]);
        assert_eq!(w[0].segment_table(), [0, 5, 0, 5, 0, 1, 5, 195, 2]);
    }

    #[test]
    fn windows_cover_every_token_within_the_limit() {
        let cases = [
            varlen(vec![0, 1, 1, 2, 300, 301, 700]),
            varlen(vec![0, 700]),
            varlen(vec![0, 63, 64, 65, 129, 192, 193, 330]),
        ];
        for p in &cases {
            for limit_tokens in [127usize, 128, 200, 333] {
                let c = costs(64, 256);
                let limit = limit_tokens as u64 * 64;
                let w = plan(p, &c, limit, 256).unwrap();
                assert_eq!(
                    w.len() > 1,
                    limit_tokens < p.total_tokens(),
                    "{p:?} at {limit_tokens}"
                );
                check_cover(p, &w, &c, limit);
            }
            // Few states per window: windows also split at sequence boundaries.
            let c = costs(4, 1024);
            let w = plan(p, &c, 2048, 256).unwrap();
            check_cover(p, &w, &c, 2048);
            assert!(w.iter().all(|w| w.seqs() <= 2));
        }
    }

    #[test]
    fn windows_hold_at_most_max_rows_chunks_and_sequences() {
        let p = varlen(vec![0, 1, 2, 3, 4, 5, 300, 700]);
        let c = WindowCosts {
            max_rows: 3,
            ..costs(4, 256)
        };
        let w = plan(&p, &c, 1 << 20, 256).unwrap();
        check_cover(&p, &w, &c, 1 << 20);
        for w in &w {
            assert!(w.seqs() <= 3 && w.chunk_table().len() / 2 <= 3, "{w:?}");
        }
    }

    /// Buffers of 128 tokens: windows end at every boundary, cutting the chunks of varlen
    /// sequences that cross one (a length-2 sequence into two length-1 pieces, long ones
    /// mid-chunk), and the pieces after a cut count their chunks from it (so the long
    /// sequence's later boundaries cut none of its chunks).
    #[test]
    fn chunks_across_buffer_boundaries_are_cut_there() {
        let p = varlen(vec![0, 100, 127, 129, 130, 255, 256, 257, 600, 700]);
        let pieces_of = |w: &[TokenWindow], n: usize| -> Vec<Range<usize>> {
            w.iter()
                .filter(|w| (w.first_seq..w.first_seq + w.seqs()).contains(&n))
                .map(|w| w.pieces[n - w.first_seq].clone())
                .filter(|r| !r.is_empty())
                .collect()
        };
        let long = costs(64, 256);
        let one_chunk = WindowCosts {
            max_rows: 1,
            ..costs(64, 256)
        };
        for (c, seq7) in [
            (long, vec![257..384, 384..512, 512..600]),
            (
                one_chunk,
                vec![257..321, 321..384, 384..448, 448..512, 512..576, 576..600],
            ),
        ] {
            let c = WindowCosts {
                part_tokens: Some(128),
                ..c
            };
            let w = plan(&p, &c, 1 << 20, 256).unwrap();
            check_cover(&p, &w, &c, 1 << 20);
            for boundary in [128, 256, 384, 512, 640] {
                assert!(w.iter().any(|w| w.base == boundary), "{boundary}: {w:?}");
            }
            // The length-2 sequence across 128 in two length-1 pieces; the length-1 ones at
            // 255 and 256 whole; the long ones cut mid-chunk at 384 and 640, and the chunks
            // after a cut counted from it.
            assert_eq!(pieces_of(&w, 2), [127..128, 128..129]);
            assert_eq!(pieces_of(&w, 5), vec![255..256]);
            assert_eq!(pieces_of(&w, 6), vec![256..257]);
            assert_eq!(pieces_of(&w, 7), seq7);
            assert_eq!(pieces_of(&w, 8), [600..640, 640..700]);
        }
    }

    #[test]
    fn a_limit_below_one_chunk_names_it() {
        let p = varlen(vec![0, 700]);
        let e = plan(&p, &costs(64, 256), 100 * 64, 256).unwrap_err();
        assert!(e.to_string().contains("one 64-token chunk"), "{e}");
        let e = plan(&p, &costs(4, 1 << 20), 1 << 16, 256).unwrap_err();
        assert!(e.to_string().contains("state of one sequence"), "{e}");
    }

    /// Decode windows compute every token once, in order, with every sequence (empty ones
    /// included) in at least one window; each binds at most `max_tokens` from a base that is
    /// a multiple of the granule, lies inside one part and holds at most `max_sequences`.
    #[test]
    fn decode_windows_cover_every_token_within_their_bounds() {
        // (cu_seqlens, max tokens, granule, tokens per part, max sequences)
        type Case = (Vec<usize>, usize, usize, Option<usize>, usize);
        let cases: [Case; 5] = [
            (vec![0, 1, 150, 151, 400, 400, 600], 16, 16, Some(16), 8190),
            (vec![0, 1, 150, 151, 400, 400, 600], 256, 4, Some(512), 8190),
            (vec![0, 0, 0, 5, 5, 9, 9, 9], 4, 2, None, 2),
            (vec![0, 1000], 7, 1, Some(64), 1),
            ((0..=50).collect(), 1 << 20, 64, None, 7),
        ];
        for (cu, max_tokens, granule, part, most) in cases {
            let seqs: Vec<Range<usize>> = cu.windows(2).map(|w| w[0]..w[1]).collect();
            let windows = plan_decode(&seqs, max_tokens, granule, part, most);
            let mut next = vec![None::<usize>; seqs.len()];
            let mut seen = vec![false; seqs.len()];
            for w in &windows {
                let what = format!("{cu:?}: {w:?}");
                assert!(
                    w.base.is_multiple_of(granule) && w.tokens <= max_tokens,
                    "{what}"
                );
                assert!(!w.pieces.is_empty() && w.seqs() <= most, "{what}");
                if let Some(p) = part {
                    assert_eq!(w.base / p, (w.base + w.tokens.max(1) - 1) / p, "{what}");
                }
                for (i, piece) in w.pieces.iter().enumerate() {
                    let n = w.first_seq + i;
                    seen[n] = true;
                    let start = next[n].unwrap_or(seqs[n].start);
                    assert_eq!(piece.start, start, "{what}: sequence {n}");
                    assert!(piece.end <= seqs[n].end && piece.start >= w.base, "{what}");
                    assert!(piece.end <= w.base + w.tokens.max(1), "{what}");
                    next[n] = Some(piece.end);
                }
            }
            for (n, s) in seqs.iter().enumerate() {
                assert!(seen[n], "{cu:?}: sequence {n} in no window");
                assert_eq!(next[n], Some(s.end), "{cu:?}: sequence {n} not covered");
            }
        }
    }
}
