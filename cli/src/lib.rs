//! The `gdn` command-line tool's library: `gdn bench` (sweeps, the correctness gate, records)
//! as a module its integration tests can reach. The binary is `src/main.rs`.

#![warn(missing_docs)]

pub mod backend;
pub mod bench;
