//! What the launchers of the cooperative-matrix scans share (`state_scan_coop`,
//! `state_chain_coop`, `state_recompute_coop`, `dh_scan_coop`; their tiles are in
//! `shaders/forward/coop_scan_tiles.wgsl`): the shape and dtype checks, and the grid of one
//! workgroup per (segment, v-head, V-block).

use crate::error::{Error, Result};
use crate::tensor::DType;
use crate::wgpu_backend::launch::Grid;
use crate::wgpu_backend::shaders::Pass;
use crate::wgpu_backend::tuning::STATE_SCAN_COOP_STAGED_BYTES;
use crate::wgpu_backend::tuning::{COOP_KEY_DIM, COOP_V_BLOCK};
use crate::wgpu_backend::{Context, GpuTensor};

/// The coop kernels' K = 128 (the last dimension of `keyed`); `what` names the caller in the
/// error ("the coop wy_grad").
pub(crate) fn check_coop_key_dim(what: &str, keyed: &GpuTensor) -> Result<()> {
    let key_dim = keyed.shape[keyed.shape.len() - 1];
    if key_dim != COOP_KEY_DIM {
        return Err(Error::unsupported(
            "compute path",
            format!("{what} at K = {key_dim} (needs K = {COOP_KEY_DIM})"),
        ));
    }
    Ok(())
}

/// The coop passes' shapes: K = 128 (the last dimension of `keyed`), V a multiple of the
/// V-block, and the f16 operands in f16. `what` names the caller in the error ("the coop
/// scan", "the coop backward").
pub(crate) fn check_coop_shapes(
    what: &str,
    keyed: &GpuTensor,
    value_dim: usize,
    halves: &[(&str, &GpuTensor)],
) -> Result<()> {
    let key_dim = keyed.shape[keyed.shape.len() - 1];
    if key_dim != COOP_KEY_DIM || !value_dim.is_multiple_of(COOP_V_BLOCK) {
        return Err(Error::unsupported(
            "compute path",
            format!(
                "{what} at K = {key_dim}, V = {value_dim} (needs K = {COOP_KEY_DIM}, V a multiple of {COOP_V_BLOCK})"
            ),
        ));
    }
    for &(name, t) in halves {
        if t.dtype != DType::F16 {
            return Err(Error::DType {
                name: name.into(),
                expected: "F16".into(),
                got: t.dtype.to_string(),
            });
        }
    }
    Ok(())
}

/// The scans' grid: a workgroup per (segment, v-head, V-block of 32 columns).
pub(crate) fn coop_scan_grid(num_segments: usize, heads_v: usize, value_dim: usize) -> Grid {
    Grid([
        (num_segments, "segments"),
        (heads_v, "v-heads"),
        (value_dim / COOP_V_BLOCK, "V-blocks"),
    ])
}

/// The scans' head counts as pipeline constants (`HEADS_QK_CONST`, `HEADS_V_CONST`, declared
/// in coop_scan_tiles.wgsl): H from `k16` (`[rows + 64, H, K]`), HV as given; 0 (the counts
/// from the uniform parameters) with `GDN_COOP_UNIFORM_STRIDES=on`. Constant strides halved
/// the cost of a cooperative load from storage on the H200 (examples/coop_probe.rs); a
/// pipeline per head configuration is the price.
pub(crate) fn head_constants(
    ctx: &Context,
    k16: &GpuTensor,
    heads_v: usize,
) -> [(&'static str, f64); 2] {
    let (heads_qk, heads_v) = match ctx.config().coop_uniform_strides {
        true => (0, 0),
        false => (k16.shape[k16.shape.len() - 2], heads_v),
    };
    [
        ("HEADS_QK_CONST", heads_qk as f64),
        ("HEADS_V_CONST", heads_v as f64),
    ]
}

/// `direct`, or its variant with each chunk's K staged through workgroup memory where
/// `GDN_COOP_STAGE=on` and the device has the workgroup memory for it.
pub(crate) fn k_variant(ctx: &Context, direct: Pass) -> Pass {
    let staged =
        ctx.config().coop_stage && STATE_SCAN_COOP_STAGED_BYTES <= ctx.tuning().workgroup_bytes;
    match direct {
        Pass::StateScanCoop if staged => Pass::StateScanCoopStaged,
        Pass::StateRecomputeCoop if staged => Pass::StateRecomputeCoopStaged,
        Pass::DhScanCoop if staged => Pass::DhScanCoopStaged,
        pass => pass,
    }
}
