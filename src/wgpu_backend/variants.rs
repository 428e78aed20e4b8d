//! Every pipeline the launchers may build for a problem on a device, listed with the
//! launchers' own tiling code so the tests compile and size exactly what runs. It sits above
//! the launchers (it imports them; nothing in the library imports it), so `shaders` stays a
//! leaf that the launchers import.

use crate::error::Result;
use crate::wgpu_backend::shaders::Pass;

/// One pipeline the launchers build: a pass, its entry point and its override constants.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// The pass (the WGSL file) the pipeline is built from.
    pub pass: Pass,
    /// The entry point's function name.
    pub entry: &'static str,
    /// Override constants (name, value) the pipeline is built with.
    pub constants: Vec<(&'static str, f64)>,
}

/// Every (pass, entry point, override constants) the launchers may instantiate for `problem`
/// on a device with `limits`, whatever the dtype, compute path or `GDN_V_BLOCK`; built with
/// the launchers' own tiling code, so tests compile and size exactly what runs.
pub fn variants(limits: &wgpu::Limits, problem: &crate::problem::Problem) -> Result<Vec<Variant>> {
    use crate::tensor::DType;
    use crate::wgpu_backend::backward::{
        dh_scan_tiling, recompute_token_slice, scan_arena_words, scan_bytes,
    };
    use crate::wgpu_backend::decode::{RecurrentStepTiles, StepKernel};
    use crate::wgpu_backend::path::{COOP_KEY_DIM, COOP_V_BLOCK};
    use crate::wgpu_backend::tuning::COOP_PATH_BYTES;
    use crate::wgpu_backend::tuning::{
        Tuning, state_scan_arena_words, state_scan_f16_arena_slots, state_scan_token_slice,
    };
    use crate::wgpu_backend::validate::find_nonfinite_constants;

    let tuning = Tuning::for_device(limits)?;
    let bytes = tuning.workgroup_bytes;
    let (k, v) = (problem.key_dim as u32, problem.value_dim as u32);
    let kf = k as f64;
    let variant = |pass, entry, constants: &[(&'static str, f64)]| Variant {
        pass,
        entry,
        constants: constants.to_vec(),
    };
    let mut out = vec![
        variant(Pass::PrepareQk, "prepare_qk", &[]),
        variant(Pass::PrepareGate, "prepare_gate", &[]),
        variant(Pass::WyInverse, "wy_inverse", &[("K_DIM", kf)]),
        variant(Pass::SegmentCombine, "combine", &[("HAS_H0", 0.0)]),
        variant(Pass::SegmentCombine, "combine", &[("HAS_H0", 1.0)]),
        variant(
            Pass::SegmentCombine,
            "combine",
            &[("HAS_H0", 0.0), ("WINDOWED", 1.0)],
        ),
        variant(
            Pass::SegmentCombine,
            "combine",
            &[("HAS_H0", 1.0), ("WINDOWED", 1.0)],
        ),
        variant(Pass::SegmentCombine, "final_copy", &[]),
        variant(
            Pass::SegmentWindow,
            "segment_window",
            &[("THRESHOLD", -10.0), ("MAX_WARMUP", u32::MAX as f64)],
        ),
        variant(Pass::ValueGrams, "value_grams", &[]),
        variant(Pass::WyGrad, "wy_grad", &[("K_DIM", kf)]),
        variant(Pass::StateGrad, "state_grad", &[("K_DIM", kf)]),
        variant(Pass::QkGrad, "qk_grad", &[("K_DIM", kf)]),
        variant(Pass::QkFinish, "qk_finish", &[]),
        variant(Pass::QkFinish, "dv_finish", &[]),
        variant(Pass::GateFinish, "gate_finish", &[]),
    ];
    // A forced GDN_V_BLOCK may pick any width that fits, dividing V or not.
    for &bv in &tuning.v_blocks {
        for (pass, arena) in [
            (Pass::StateScan, state_scan_arena_words(bv)),
            (Pass::StateScanF16, state_scan_f16_arena_slots(bv)),
        ] {
            let constants = [
                ("K_DIM", kf),
                ("V_BLOCK", bv as f64),
                ("ARENA", arena as f64),
                ("T_SLICE", state_scan_token_slice(k) as f64),
            ];
            out.push(variant(pass, "state_scan", &constants));
            // The gate-driven window's scans read a row per (segment, v-head).
            let per_head: Vec<_> = constants
                .into_iter()
                .chain([("SEGMENTS_PER_HEAD", 1.0)])
                .collect();
            out.push(variant(pass, "state_scan", &per_head));
        }
    }
    if k as usize == COOP_KEY_DIM
        && (v as usize).is_multiple_of(COOP_V_BLOCK)
        && COOP_PATH_BYTES <= bytes
    {
        out.push(variant(Pass::WyInverseCoop, "wy_inverse_coop", &[]));
        // The scans' head counts are pipeline constants (coop_scan::head_constants).
        let heads = [
            ("HEADS_QK_CONST", problem.heads_qk as f64),
            ("HEADS_V_CONST", problem.heads_v as f64),
        ];
        out.push(variant(Pass::StateScanCoop, "state_scan_coop", &heads));
        out.push(variant(
            Pass::StateScanCoop,
            "state_scan_coop",
            &[heads.as_slice(), &[("SEGMENTS_PER_HEAD", 1.0)]].concat(),
        ));
        out.push(variant(
            Pass::StateRecomputeCoop,
            "state_recompute_coop",
            &heads,
        ));
        out.push(variant(Pass::DhScanCoop, "dh_scan_coop", &heads));
        if crate::wgpu_backend::tuning::STATE_SCAN_COOP_STAGED_BYTES <= bytes {
            out.push(variant(
                Pass::StateScanCoopStaged,
                "state_scan_coop",
                &heads,
            ));
            out.push(variant(
                Pass::StateScanCoopStaged,
                "state_scan_coop",
                &[heads.as_slice(), &[("SEGMENTS_PER_HEAD", 1.0)]].concat(),
            ));
            out.push(variant(
                Pass::StateRecomputeCoopStaged,
                "state_recompute_coop",
                &heads,
            ));
            out.push(variant(Pass::DhScanCoopStaged, "dh_scan_coop", &heads));
        }
        if crate::wgpu_backend::tuning::STATE_GRAD_COOP_BYTES <= bytes {
            out.push(variant(Pass::StateGradCoop, "state_grad_coop", &[]));
        }
        out.push(variant(Pass::ValueGramsCoop, "value_grams_coop", &[]));
        out.push(variant(Pass::QkGradCoop, "qk_grad_coop", &[]));
        out.push(variant(Pass::WyGradCoop, "wy_grad_coop", &[]));
        let chain_fits = crate::wgpu_backend::forward::STATE_CHAIN_COOP_BYTES <= bytes;
        for per_head in [0.0, 1.0].into_iter().filter(|_| chain_fits) {
            for store in [0.0, 1.0] {
                out.push(variant(
                    Pass::StateChainCoop,
                    "state_chain_coop",
                    &[
                        heads.as_slice(),
                        &[("SEGMENTS_PER_HEAD", per_head), ("STORE_CHUNKS", store)],
                    ]
                    .concat(),
                ));
            }
        }
        if chain_fits {
            out.push(variant(Pass::ChunkOutputCoop, "chunk_output_coop", &[]));
        }
    }
    // The backward scans' widths: those `backward::scan_v_block` picks from.
    for bv in [64, 32, 16] {
        if scan_bytes(bv) > bytes || !v.is_multiple_of(bv) {
            continue;
        }
        let recompute = [
            ("K_DIM", kf),
            ("V_BLOCK", bv as f64),
            ("ARENA", scan_arena_words(bv) as f64),
            ("T_SLICE", recompute_token_slice(k) as f64),
        ];
        out.push(variant(Pass::StateRecompute, "state_recompute", &recompute));
        let (t_slice, arena) = dh_scan_tiling(bv, k, bytes);
        let dh = [
            ("K_DIM", kf),
            ("V_BLOCK", bv as f64),
            ("ARENA", arena as f64),
            ("T_SLICE", t_slice as f64),
        ];
        out.push(variant(Pass::DhScan, "dh_scan", &dh));
    }
    // The finite check reads words whatever the dtype: one pipeline per (dtype, sign check).
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for reject_positive in [false, true] {
            let constants = find_nonfinite_constants(dtype, reject_positive);
            out.push(variant(Pass::FindNonfinite, "find_nonfinite", &constants));
        }
    }
    // The decode kernels (the subgroup one where the device has subgroups), both pool
    // dtypes (the column kernel takes f32 pools only).
    let decode_tiles = RecurrentStepTiles::candidates(limits, problem)
        .into_iter()
        .chain(RecurrentStepTiles::column_candidates(limits, problem))
        .chain(RecurrentStepTiles::subgroup_candidates(limits, problem));
    for tiles in decode_tiles {
        // The workgroup kernel has a T = 1 form too (no token loop).
        let one_token: &[bool] = match tiles.kernel {
            StepKernel::Workgroup => &[false, true],
            _ => &[false],
        };
        for (per_token_states, &one) in [false, true]
            .into_iter()
            .flat_map(|p| one_token.iter().map(move |o| (p, o)))
        {
            let constants = tiles.step_constants(per_token_states, one);
            for state in [DType::F32, DType::BF16] {
                if tiles.kernel == StepKernel::Column && state != DType::F32 {
                    continue;
                }
                out.push(variant(tiles.pass(state), tiles.entry(), &constants));
            }
        }
    }
    Ok(out)
}
