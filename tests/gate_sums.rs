//! Diagnostic (scratch): dA_log / ddt_bias of long varlen cases with every option.

mod common;

use common::cases::{HardCase, backward_case, spec};
use gdn_wgpu::wgpu_backend;
use gdn_wgpu::{DType, Options, RandomSpec, relative_l2};

fn all() -> Options {
    Options {
        scale: Some(0.3),
        l2norm_qk: true,
        beta_sigmoid: true,
        allow_neg_eigval: true,
        gate_in_kernel: true,
        state_v_first: true,
    }
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
}
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn diagnose(case: &HardCase, dtype: DType) {
    let ctx = common::gpu().unwrap();
    let p = &case.problem;
    let (inputs, d_o, dht, expected) = backward_case(case, dtype, true);
    let (_, got) =
        wgpu_backend::backward_host(ctx, p, &inputs.as_ref(), &d_o, dht.as_ref()).unwrap();
    let hv_n = p.heads_v;
    let a_log = &inputs.a_log.as_ref().unwrap().data;
    let dt_bias = &inputs.dt_bias.as_ref().unwrap().data;
    let g_raw = &inputs.g.data;
    let gd = got.da_log.as_ref().unwrap();
    let gb = got.ddt_bias.as_ref().unwrap();
    let ed = expected.da_log.as_ref().unwrap();
    let eb = expected.ddt_bias.as_ref().unwrap();
    eprintln!(
        "== {} {dtype}: dA_log {:.2e} ddt_bias {:.2e} dg {:.2e}",
        case.name,
        relative_l2(&gd.data, ed),
        relative_l2(&gb.data, eb),
        relative_l2(&got.dg.data, &expected.dg)
    );
    let bt = p.total_tokens();
    for hv in 0..hv_n {
        let a = (a_log[hv] as f64).exp();
        // Terms of dA_log (dg_act·g) and ddt_bias (dg_raw), GPU (from its dg_raw) and oracle.
        let (mut sa_g, mut sa_e, mut abs_a, mut sb_g, mut sb_e, mut abs_b) =
            (0.0f64, 0.0, 0.0, 0.0, 0.0, 0.0);
        let (mut err_a2, mut err_a, mut term_a2) = (0.0f64, 0.0, 0.0);
        for t in 0..bt {
            let at = t * hv_n + hv;
            let x = g_raw[at] as f64 + dt_bias[hv] as f64;
            let slope = if x > 20.0 { 1.0 } else { sigmoid(x) };
            let deriv = -a * slope;
            let g = -a * softplus(x);
            let raw_g = got.dg.data[at] as f64;
            let raw_e = expected.dg[at];
            let ta_g = raw_g / deriv * g;
            let ta_e = raw_e / deriv * g;
            sa_g += ta_g;
            sa_e += ta_e;
            abs_a += ta_e.abs();
            err_a += ta_g - ta_e;
            err_a2 += (ta_g - ta_e).powi(2);
            term_a2 += ta_e * ta_e;
            sb_g += raw_g;
            sb_e += raw_e;
            abs_b += raw_e.abs();
        }
        eprintln!(
            "hv {hv} A_log {:.2}: dA_log oracle {:.4e} gpu {:.4e} | gpu terms f64-summed {:.4e} \
             (kernel sum err {:.1e}, upstream err {:.1e}) cond Σ|t|/|Σt| {:.1} | Σerr {:.1e} \
             √Σerr² {:.1e} rel-L2 terms {:.1e}",
            a_log[hv],
            ed[hv],
            gd.data[hv],
            sa_g,
            (gd.data[hv] as f64 - sa_g).abs() / ed[hv].abs(),
            (sa_g - sa_e).abs() / ed[hv].abs(),
            abs_a / sa_e.abs(),
            err_a,
            err_a2.sqrt(),
            (err_a2 / term_a2).sqrt(),
        );
        eprintln!(
            "      ddt_bias oracle {:.4e} gpu {:.4e} | gpu terms f64 {:.4e} (kernel {:.1e}, upstream {:.1e}) cond {:.1} | oracle sum check {:.1e}",
            eb[hv],
            gb.data[hv],
            sb_g,
            (gb.data[hv] as f64 - sb_g).abs() / eb[hv].abs(),
            (sb_g - sb_e).abs() / eb[hv].abs(),
            abs_b / sb_e.abs(),
            (sb_e - eb[hv]).abs() / eb[hv].abs(),
        );
    }
}

#[test]
fn diagnose_1041() {
    let cases = [
        (vec![0, 1, 520, 1041], 1, 2, 32, 32, 0),
        (vec![0, 1, 520, 1041], 1, 2, 32, 32, 1),
        (vec![0, 300, 301, 1041], 2, 4, 32, 32, 0),
        (vec![0, 1041], 1, 2, 32, 32, 0),
    ];
    for (seed, (cu, h, hv, k, v, zero)) in cases.into_iter().enumerate() {
        let case = HardCase {
            name: format!("T1041 {cu:?} H{h}/{hv} zero-gate {zero}"),
            problem: common::problem(1, 1041, h, hv, k, v, Some(cu), all()),
            spec: RandomSpec {
                zero_gate_heads: zero,
                ..spec(500 + seed as u64, true)
            },
        };
        for dtype in [DType::F32, DType::BF16] {
            diagnose(&case, dtype);
        }
    }
}
