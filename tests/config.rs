//! `Config`: every environment knob the wgpu backend reads, parsed from a lookup (never the
//! process environment: tests run in parallel), each bad value a typed error naming it.

use std::collections::HashMap;

use gdn_wgpu::Error;
use gdn_wgpu::wgpu_backend::{
    ComputePath, Config, Context, ForwardAlgorithm, SegmentChoice, ShaderChecks,
    list_adapters_matching,
};

fn parse(vars: &[(&str, &str)]) -> gdn_wgpu::Result<Config> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|&(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|name| map.get(name).cloned())
}

/// The error of `vars`, which must be an `Error::Value` naming `variable`.
fn expect_bad(vars: &[(&str, &str)], variable: &str) {
    let e = parse(vars).expect_err("a bad value");
    assert!(e.is_input_error(), "{e}");
    match &e {
        Error::Value { name, expected, .. } => {
            assert_eq!(name, variable, "{e}");
            assert!(!expected.is_empty(), "{e}");
        }
        other => panic!("{vars:?}: expected Error::Value naming {variable}, got {other:?}"),
    }
}

#[test]
fn empty_environment_is_the_default() {
    let c = parse(&[]).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.shader_checks, ShaderChecks::None);
    assert_eq!(c.compute_path, None);
    assert_eq!(c.forward_algorithm, None);
    assert_eq!(c.v_block, None);
    assert_eq!(c.segments, SegmentChoice::Auto);
    assert_eq!(c.adapter, None);
}

#[test]
fn every_variable_parses() {
    let c = parse(&[
        ("GDN_ADAPTER", "llvmpipe"),
        ("GDN_FORWARD_ALGORITHM", "recurrent"),
        ("GDN_COMPUTE_PATH", "coop"),
        ("GDN_V_BLOCK", "32"),
        ("GDN_SEGMENT_CHUNKS", " 4 "),
        ("GDN_SHADER_CHECKS", "no-loop-bounding"),
    ])
    .unwrap();
    assert_eq!(c.adapter.as_deref(), Some("llvmpipe"));
    assert_eq!(c.forward_algorithm, Some(ForwardAlgorithm::Recurrent));
    assert_eq!(c.compute_path, Some(ComputePath::CoopMatrix));
    assert_eq!(c.v_block, Some(32));
    assert_eq!(c.segments, SegmentChoice::Chunks(4));
    for (s, choice) in [
        ("auto", SegmentChoice::Auto),
        ("off", SegmentChoice::Off),
        ("0", SegmentChoice::Off),
        ("64", SegmentChoice::Chunks(64)),
    ] {
        assert_eq!(
            parse(&[("GDN_SEGMENT_CHUNKS", s)]).unwrap().segments,
            choice,
            "{s:?}"
        );
    }
    assert_eq!(c.shader_checks, ShaderChecks::NoLoopBounding);
    for (s, path) in [
        ("auto", None),
        ("", None),
        ("scalar", Some(ComputePath::Scalar)),
        ("F16", Some(ComputePath::F16Math)),
    ] {
        assert_eq!(
            parse(&[("GDN_COMPUTE_PATH", s)]).unwrap().compute_path,
            path,
            "{s:?}"
        );
    }
    for (s, path) in [
        ("auto", None),
        ("scalar", Some(ComputePath::Scalar)),
        ("COOP", Some(ComputePath::CoopMatrix)),
    ] {
        assert_eq!(
            parse(&[("GDN_BACKWARD_PATH", s)]).unwrap().backward_path,
            path,
            "{s:?}"
        );
    }
    for (s, algorithm) in [
        ("auto", None),
        ("", None),
        (" Chunked ", Some(ForwardAlgorithm::Chunked)),
        ("RECURRENT", Some(ForwardAlgorithm::Recurrent)),
    ] {
        assert_eq!(
            parse(&[("GDN_FORWARD_ALGORITHM", s)])
                .unwrap()
                .forward_algorithm,
            algorithm,
            "{s:?}"
        );
    }
    for bv in [16, 32, 64] {
        let c = parse(&[("GDN_V_BLOCK", &bv.to_string())]).unwrap();
        assert_eq!(c.v_block, Some(bv));
    }
    assert_eq!(
        parse(&[("GDN_SHADER_CHECKS", "all")])
            .unwrap()
            .shader_checks,
        ShaderChecks::All
    );
}

#[test]
fn adapter_filter_is_a_case_insensitive_substring() {
    let c = parse(&[("GDN_ADAPTER", "LLVM")]).unwrap();
    assert!(c.adapter_matches("llvmpipe (LLVM 15.0.7, 256 bits)"));
    assert!(!c.adapter_matches("NVIDIA H200"));
    assert!(Config::default().adapter_matches("anything"));
}

#[test]
fn bad_v_block_is_an_error() {
    // Was silently ignored before the config was read in one place.
    for bad in ["", "abc", "0", "8", "48", "128", "-16", "32.0"] {
        expect_bad(&[("GDN_V_BLOCK", bad)], "GDN_V_BLOCK");
    }
}

/// `GDN_SEGMENT_WINDOW` (exact by default) and `GDN_SEGMENT_WARMUP`.
#[test]
fn segment_window_settings() {
    use gdn_wgpu::wgpu_backend::SegmentWindow;
    assert_eq!(parse(&[]).unwrap().segment_window, None, "exact by default");
    let window = |t, m| Some(SegmentWindow::new(t, m).unwrap());
    for (w, warmup, want) in [
        ("exact", None, None),
        ("OFF", Some("4"), None),
        ("on", None, Some(SegmentWindow::DEFAULT)),
        ("on", Some("segment"), window(-10.0, None)),
        (" -15 ", Some(" 8 "), window(-15.0, Some(8))),
        ("-5.5", None, window(-5.5, None)),
    ] {
        let mut vars = vec![("GDN_SEGMENT_WINDOW", w)];
        vars.extend(warmup.map(|m| ("GDN_SEGMENT_WARMUP", m)));
        assert_eq!(
            parse(&vars).unwrap().segment_window,
            want,
            "{w:?} {warmup:?}"
        );
    }
    for bad in ["", "0", "10", "yes", "-inf", "nan"] {
        expect_bad(&[("GDN_SEGMENT_WINDOW", bad)], "GDN_SEGMENT_WINDOW");
    }
    for bad in ["", "0", "-1", "all"] {
        expect_bad(
            &[("GDN_SEGMENT_WINDOW", "on"), ("GDN_SEGMENT_WARMUP", bad)],
            "GDN_SEGMENT_WARMUP",
        );
        // Checked while the window is off too: a typo is never ignored.
        expect_bad(&[("GDN_SEGMENT_WARMUP", bad)], "GDN_SEGMENT_WARMUP");
    }
}

#[test]
fn bad_segment_chunks_is_an_error() {
    for bad in ["", "-1", "two", "1.5", "on"] {
        expect_bad(&[("GDN_SEGMENT_CHUNKS", bad)], "GDN_SEGMENT_CHUNKS");
    }
}

#[test]
fn bad_compute_path_is_an_error() {
    for bad in ["gpu", "coop2", "scalar,f16"] {
        expect_bad(&[("GDN_COMPUTE_PATH", bad)], "GDN_COMPUTE_PATH");
    }
}

#[test]
fn bad_backward_path_is_an_error() {
    // The backward has no f16-math passes.
    for bad in ["f16", "gpu", "scalar,coop"] {
        expect_bad(&[("GDN_BACKWARD_PATH", bad)], "GDN_BACKWARD_PATH");
    }
}

#[test]
fn bad_forward_algorithm_is_an_error() {
    for bad in ["decode", "scan", "chunked,recurrent", "recurrent2"] {
        expect_bad(&[("GDN_FORWARD_ALGORITHM", bad)], "GDN_FORWARD_ALGORITHM");
    }
}

#[test]
fn bad_shader_checks_is_an_error() {
    for bad in ["", "ALL", "some", "off"] {
        expect_bad(&[("GDN_SHADER_CHECKS", bad)], "GDN_SHADER_CHECKS");
    }
}

#[test]
fn one_bad_value_fails_the_whole_config() {
    expect_bad(
        &[
            ("GDN_COMPUTE_PATH", "scalar"),
            ("GDN_V_BLOCK", "24"),
            ("GDN_SEGMENT_CHUNKS", "2"),
        ],
        "GDN_V_BLOCK",
    );
}

/// An adapter for the device tests, or `None` (loudly) without one unless GDN_REQUIRE_GPU=1.
fn adapter() -> Option<wgpu::Adapter> {
    let found = pollster::block_on(list_adapters_matching(&Config::default()))
        .into_iter()
        .next();
    if found.is_none() {
        assert!(
            std::env::var("GDN_REQUIRE_GPU").as_deref() != Ok("1"),
            "GDN_REQUIRE_GPU=1 but no GPU adapter"
        );
        eprintln!("SKIPPED (no GPU adapter; set GDN_REQUIRE_GPU=1 to fail instead)");
    }
    found
}

#[test]
fn config_reaches_the_context() {
    let Some(adapter) = adapter() else { return };
    let limits = adapter.limits();
    let config = parse(&[
        ("GDN_V_BLOCK", "16"),
        ("GDN_SEGMENT_CHUNKS", "3"),
        ("GDN_FORWARD_ALGORITHM", "chunked"),
    ])
    .unwrap();
    let ctx = pollster::block_on(Context::from_adapter_with_config(
        adapter,
        limits,
        config.clone(),
    ))
    .unwrap();
    assert_eq!(ctx.config(), &config);
    assert_eq!(ctx.tuning().forced_v_block, Some(16));
    assert_eq!(ctx.forced_compute_path(), None);
    assert_eq!(
        ctx.forced_forward_algorithm(),
        Some(ForwardAlgorithm::Chunked)
    );
}

/// `GDN_FORWARD_ALGORITHM=recurrent` reaches every automatic entry point (the forward keeps
/// no intermediates, the choice says "forced"), while `forward_saved` keeps the chunked scan
/// the backward needs; `set_forward_algorithm(None)` returns to the automatic choice.
#[test]
fn forced_algorithm_reaches_the_forward_but_not_forward_saved() {
    use gdn_wgpu::wgpu_backend::{forward, forward_algorithm, forward_saved, upload_inputs};
    let Some(adapter) = adapter() else { return };
    let limits = adapter.limits();
    let config = parse(&[("GDN_FORWARD_ALGORITHM", "recurrent")]).unwrap();
    let mut ctx =
        pollster::block_on(Context::from_adapter_with_config(adapter, limits, config)).unwrap();
    // Two chunks and a partial one: a GPU's automatic choice would be the chunked scan.
    let problem = gdn_wgpu::Problem::new(1, 140, 1, 2, 32, 32, None, Default::default()).unwrap();
    let choice = forward_algorithm(&ctx, &problem, gdn_wgpu::DType::F32).unwrap();
    assert_eq!(choice.algorithm, ForwardAlgorithm::Recurrent);
    assert!(choice.reason.contains("forced"), "{}", choice.reason);
    let host = gdn_wgpu::RandomSpec::default().generate(&problem);
    let inputs = upload_inputs(&ctx, &host.as_ref()).unwrap();
    let mut encoder = ctx.create_encoder("forced recurrent");
    let fwd = forward(&ctx, &mut encoder, &problem, &inputs.as_ref()).unwrap();
    assert!(
        fwd.saved.is_none(),
        "the recurrent kernel keeps no intermediates"
    );
    let (saved_fwd, saved) = forward_saved(&ctx, &mut encoder, &problem, &inputs.as_ref()).unwrap();
    assert!(
        saved_fwd.saved.is_some(),
        "forward_saved runs the chunked scan"
    );
    ctx.submit_and_wait(encoder).unwrap();
    // Both forwards agree with the oracle (f32: 1e-5).
    let want = gdn_wgpu::reference::forward(&problem, &host.as_ref()).unwrap();
    for (what, o) in [("forward", &fwd.o), ("forward_saved", &saved_fwd.o)] {
        let got = o.download_blocking(&ctx).unwrap();
        let err = gdn_wgpu::relative_l2(&got.data, &want.o);
        assert!(err <= 1e-5, "{what}: rel-L2 {err:e}");
    }
    assert_eq!(saved.problem, problem);
    ctx.set_forward_algorithm(None);
    let auto = forward_algorithm(&ctx, &problem, gdn_wgpu::DType::F32).unwrap();
    assert!(!auto.reason.contains("forced"), "{}", auto.reason);
}

#[test]
fn v_block_the_device_cannot_fit_is_an_error() {
    let Some(adapter) = adapter() else { return };
    // WebGPU's default 16 KiB of workgroup memory fits the forward scan at V-block 16 only.
    let config = parse(&[("GDN_V_BLOCK", "64")]).unwrap();
    let e = pollster::block_on(Context::from_adapter_with_config(
        adapter,
        wgpu::Limits::default(),
        config,
    ))
    .err()
    .expect("V-block 64 does not fit 16 KiB of workgroup memory");
    match &e {
        Error::Value { name, .. } => assert_eq!(name, "GDN_V_BLOCK", "{e}"),
        other => panic!("expected Error::Value naming GDN_V_BLOCK, got {other:?}"),
    }
}

#[test]
fn adapter_filter_that_matches_nothing_is_no_adapter() {
    if adapter().is_none() {
        return;
    }
    let config = parse(&[("GDN_ADAPTER", "no adapter is called this 0x5f3759df")]).unwrap();
    let e = pollster::block_on(Context::with_config(config))
        .err()
        .expect("no adapter matches");
    assert!(matches!(e, Error::NoAdapter(_)), "{e}");
    assert!(e.to_string().contains("GDN_ADAPTER"), "{e}");
}

#[test]
fn grid_past_the_device_limit_names_the_pass_and_dimension() {
    let Some(adapter) = adapter() else { return };
    // A device granting 4 workgroups per dimension: a forward over 5 v-heads cannot dispatch
    // the scan's one workgroup row per v-head (5 chunks would run in windows of 4; wy_inverse
    // runs a row per q/k head, of which there is one).
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 4,
        ..adapter.limits()
    };
    // The chunked scan forced: the automatic choice would run the recurrent kernel on a CPU
    // adapter.
    let config = parse(&[("GDN_FORWARD_ALGORITHM", "chunked")]).unwrap();
    let ctx =
        pollster::block_on(Context::from_adapter_with_config(adapter, limits, config)).unwrap();
    let problem = gdn_wgpu::Problem::new(1, 64, 1, 5, 16, 16, None, Default::default()).unwrap();
    let inputs = gdn_wgpu::RandomSpec::default().generate(&problem);
    let inputs = gdn_wgpu::wgpu_backend::upload_inputs(&ctx, &inputs.as_ref()).unwrap();
    let mut encoder = ctx.create_encoder("too many chunks");
    let e = gdn_wgpu::wgpu_backend::forward(&ctx, &mut encoder, &problem, &inputs.as_ref())
        .expect_err("5 v-heads on a 4-workgroup grid");
    match &e {
        Error::TooLarge {
            name,
            bytes,
            limit_name,
            limit,
        } => {
            assert_eq!(name, "state_scan grid y (v-heads)", "{e}");
            assert_eq!((*bytes, *limit), (5, 4), "{e}");
            assert_eq!(*limit_name, "max_compute_workgroups_per_dimension", "{e}");
        }
        other => panic!("expected Error::TooLarge, got {other:?}"),
    }
    assert!(e.to_string().contains("5 workgroups exceed"), "{e}");
    assert!(e.is_input_error(), "{e}");
    ctx.check().unwrap();
}

#[test]
fn coop_grads_parse_and_bad_values_are_errors() {
    use gdn_wgpu::wgpu_backend::tuning::CoopGrads;
    assert_eq!(parse(&[]).unwrap().coop_grads, None);
    for (text, want) in [
        ("all", CoopGrads::ALL),
        ("none", CoopGrads::NONE),
        ("default", CoopGrads::DEFAULT),
        (
            " qk_grad, value_grams ",
            CoopGrads {
                qk_grad: true,
                value_grams: true,
                ..CoopGrads::NONE
            },
        ),
        (
            "state_grad",
            CoopGrads {
                state_grad: true,
                ..CoopGrads::NONE
            },
        ),
        (
            "wy_grad",
            CoopGrads {
                wy_grad: true,
                ..CoopGrads::NONE
            },
        ),
    ] {
        let c = parse(&[("GDN_COOP_GRADS", text)]).unwrap();
        assert_eq!(c.coop_grads, Some(want), "{text:?}");
    }
    expect_bad(
        &[("GDN_COOP_GRADS", "value_grams,dh_scan")],
        "GDN_COOP_GRADS",
    );
    expect_bad(&[("GDN_COOP_GRADS", "on")], "GDN_COOP_GRADS");
}
