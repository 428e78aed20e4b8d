//! The shapes a sweep runs: head configurations, sequence sets and decode batch sizes.
//!
//! Defaults are FlashQLA's H200 set (`benchmark/bench_gated_delta_rule.py`, K = V = 128):
//! heads (h_qk, h_v) 16/64, 16/32, 8/32, 4/16, 2/8; sequences 1×32768, 1×8192, 1×2048,
//! 4096×8, 1024×8, 28672+4096, 16384+16384; decode B ∈ {1, 64, 256}.

use std::fmt;

use gdn_wgpu::problem::Problem;
use gdn_wgpu::{Options, Result};

/// q/k heads and v heads (GVA when `heads_v > heads_qk`), written `H/HV`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadConfig {
    /// H, the q/k heads.
    pub heads_qk: usize,
    /// HV, the v heads (a multiple of H).
    pub heads_v: usize,
}

impl fmt::Display for HeadConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.heads_qk, self.heads_v)
    }
}

impl HeadConfig {
    /// `"16/64"`.
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let (a, b) = s
            .split_once('/')
            .ok_or_else(|| format!("head config `{s}`: expected H/HV, e.g. 16/64"))?;
        let num = |x: &str| {
            x.trim()
                .parse::<usize>()
                .map_err(|_| format!("head config `{s}`: `{x}` is not a number"))
        };
        Ok(HeadConfig {
            heads_qk: num(a)?,
            heads_v: num(b)?,
        })
    }
}

/// The sequences of one forward/backward call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SeqSet {
    /// `count` sequences of `len` tokens as a dense batch `[B = count, T = len]` (`LEN` or
    /// `LENxCOUNT`; FlashQLA writes one sequence as `1×LEN` and a batch as `LEN×COUNT`).
    Uniform {
        /// T, tokens per sequence.
        len: usize,
        /// B, the number of sequences.
        count: usize,
    },
    /// Sequences of differing lengths packed with `cu_seqlens` (`L1+L2+…`, B = 1).
    Packed(Vec<usize>),
}

impl fmt::Display for SeqSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SeqSet::Uniform { len, count: 1 } => write!(f, "1x{len}"),
            SeqSet::Uniform { len, count } => write!(f, "{len}x{count}"),
            SeqSet::Packed(lens) => {
                let parts: Vec<String> = lens.iter().map(|l| l.to_string()).collect();
                f.write_str(&parts.join("+"))
            }
        }
    }
}

impl SeqSet {
    /// `"32768"` or `"1x32768"` (one sequence), `"4096x8"` (8 sequences of 4096, dense),
    /// `"28672+4096"` (packed with cu_seqlens). `AxB` is LENxCOUNT, except that `1xLEN` is
    /// FlashQLA's spelling of one sequence (so `1x32768` and `32768x1` are the same set).
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        let num = |x: &str| match x.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "sequence set `{s}`: `{x}` is not a positive number"
            )),
        };
        if s.contains('+') {
            let lens = s
                .split('+')
                .map(num)
                .collect::<std::result::Result<Vec<_>, _>>()?;
            return Ok(SeqSet::Packed(lens));
        }
        match s.split_once(['x', 'X', '×']) {
            None => Ok(SeqSet::Uniform {
                len: num(s)?,
                count: 1,
            }),
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                Ok(if a == 1 {
                    SeqSet::Uniform { len: b, count: 1 }
                } else {
                    SeqSet::Uniform { len: a, count: b }
                })
            }
        }
    }

    /// The sequence lengths.
    pub fn lengths(&self) -> Vec<usize> {
        match self {
            SeqSet::Uniform { len, count } => vec![*len; *count],
            SeqSet::Packed(lens) => lens.clone(),
        }
    }

    /// Total tokens.
    pub fn tokens(&self) -> usize {
        self.lengths().iter().sum()
    }

    /// The problem: a dense batch for uniform sets, `cu_seqlens` (B = 1) for packed ones.
    pub fn problem(&self, heads: HeadConfig, key_dim: usize, value_dim: usize) -> Result<Problem> {
        let (h, hv) = (heads.heads_qk, heads.heads_v);
        match self {
            SeqSet::Uniform { len, count } => Problem::new(
                *count,
                *len,
                h,
                hv,
                key_dim,
                value_dim,
                None,
                Options::default(),
            ),
            SeqSet::Packed(lens) => {
                let mut cu = vec![0];
                for l in lens {
                    cu.push(cu.last().unwrap() + l);
                }
                Problem::new(
                    1,
                    self.tokens(),
                    h,
                    hv,
                    key_dim,
                    value_dim,
                    Some(cu),
                    Options::default(),
                )
            }
        }
    }

    /// The same structure with every sequence cut to at most `max_len` tokens (the small
    /// shape of the correctness check).
    pub fn truncated(&self, max_len: usize) -> SeqSet {
        match self {
            SeqSet::Uniform { len, count } => SeqSet::Uniform {
                len: (*len).min(max_len),
                count: *count,
            },
            SeqSet::Packed(lens) => SeqSet::Packed(lens.iter().map(|&l| l.min(max_len)).collect()),
        }
    }
}

/// FlashQLA's H200 head configurations.
pub fn default_heads() -> Vec<HeadConfig> {
    [(16, 64), (16, 32), (8, 32), (4, 16), (2, 8)]
        .map(|(heads_qk, heads_v)| HeadConfig { heads_qk, heads_v })
        .to_vec()
}

/// FlashQLA's H200 sequence sets.
pub fn default_seqs() -> Vec<SeqSet> {
    [
        "1x32768",
        "1x8192",
        "1x2048",
        "4096x8",
        "1024x8",
        "28672+4096",
        "16384+16384",
    ]
    .iter()
    .map(|s| SeqSet::parse(s).expect("built-in set"))
    .collect()
}

/// Decode batch sizes (sequences per step, one token each).
pub const DEFAULT_DECODE_BATCHES: [usize; 3] = [1, 64, 256];

/// The `--quick` head configs: tiny shapes of every op that run in seconds on lavapipe.
pub(crate) fn quick_heads() -> Vec<HeadConfig> {
    vec![
        HeadConfig {
            heads_qk: 1,
            heads_v: 2,
        },
        HeadConfig {
            heads_qk: 2,
            heads_v: 4,
        },
    ]
}

/// The `--quick` sequence sets: one sequence, a dense batch, two packed.
pub(crate) fn quick_seqs() -> Vec<SeqSet> {
    ["1x256", "64x2", "100+92"]
        .iter()
        .map(|s| SeqSet::parse(s).expect("built-in set"))
        .collect()
}

/// The `--quick` decode batch sizes.
pub(crate) const QUICK_DECODE_BATCHES: [usize; 2] = [1, 4];
/// K = V of the `--quick` sweep.
pub(crate) const QUICK_HEAD_DIM: usize = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display() {
        assert_eq!(
            SeqSet::parse("32768").unwrap(),
            SeqSet::Uniform {
                len: 32768,
                count: 1
            }
        );
        assert_eq!(
            SeqSet::parse("1x32768").unwrap(),
            SeqSet::Uniform {
                len: 32768,
                count: 1
            }
        );
        assert_eq!(
            SeqSet::parse("4096x8").unwrap(),
            SeqSet::Uniform {
                len: 4096,
                count: 8
            }
        );
        assert_eq!(
            SeqSet::parse("28672+4096").unwrap(),
            SeqSet::Packed(vec![28672, 4096])
        );
        assert!(SeqSet::parse("0").is_err());
        assert!(SeqSet::parse("4096xq").is_err());
        for s in ["1x32768", "4096x8", "28672+4096"] {
            assert_eq!(SeqSet::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(
            HeadConfig::parse("16/64").unwrap(),
            HeadConfig {
                heads_qk: 16,
                heads_v: 64
            }
        );
        assert!(HeadConfig::parse("16").is_err());
    }

    #[test]
    fn problems() {
        let heads = HeadConfig {
            heads_qk: 2,
            heads_v: 8,
        };
        let p = SeqSet::parse("28672+4096")
            .unwrap()
            .problem(heads, 128, 128)
            .unwrap();
        assert_eq!((p.batch, p.tokens, p.num_sequences()), (1, 32768, 2));
        let p = SeqSet::parse("4096x8")
            .unwrap()
            .problem(heads, 128, 128)
            .unwrap();
        assert_eq!((p.batch, p.tokens, p.cu_seqlens.is_none()), (8, 4096, true));
        assert_eq!(
            SeqSet::parse("28672+4096")
                .unwrap()
                .truncated(131)
                .lengths(),
            vec![131, 131]
        );
    }
}
