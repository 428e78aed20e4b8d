//! naga parses and validates every WGSL file in `shaders/` (as assembled with each storage
//! dtype), specializes the override constants the launchers use, and emits SPIR-V — so shader
//! errors fail on machines without a GPU.

use std::collections::BTreeSet;
use std::path::Path;

use gdn_wgpu::wgpu_backend::shaders::{Pass, source};
use gdn_wgpu::wgpu_backend::tuning::{
    state_scan_arena_words, state_scan_f16_arena_slots, state_scan_token_slice,
};

fn constants(pass: Pass) -> Vec<Vec<(&'static str, f64)>> {
    match pass {
        Pass::SegmentCombine => vec![vec![("HAS_H0", 1.0)], vec![("HAS_H0", 0.0)]],
        Pass::PrepareQk | Pass::PrepareGate | Pass::ToHalf | Pass::GateQ | Pass::StateScanCoop => {
            vec![vec![]]
        }
        Pass::WyInverse | Pass::WyInverseCoop => [16.0, 128.0, 256.0]
            .iter()
            .map(|&k| vec![("K_DIM", k)])
            .collect(),
        Pass::StateScan | Pass::StateScanF16 => {
            [(16u32, 16.0), (32, 128.0), (64, 256.0), (16, 256.0)]
                .iter()
                .map(|&(bv, k)| {
                    let arena = if pass == Pass::StateScanF16 {
                        state_scan_f16_arena_slots(bv)
                    } else {
                        state_scan_arena_words(bv)
                    };
                    vec![
                        ("K_DIM", k),
                        ("V_BLOCK", bv as f64),
                        ("ARENA", arena as f64),
                        ("T_SLICE", state_scan_token_slice(k as u32) as f64),
                    ]
                })
                .collect()
        }
        Pass::StateRecompute | Pass::DhScan => {
            [(16u32, 16.0), (32, 128.0), (64, 256.0), (16, 256.0)]
                .iter()
                .map(|&(bv, k)| {
                    vec![
                        ("K_DIM", k),
                        ("V_BLOCK", bv as f64),
                        (
                            "ARENA",
                            gdn_wgpu::wgpu_backend::backward::scan_arena_words(bv) as f64,
                        ),
                    ]
                })
                .collect()
        }
        Pass::WyGrad | Pass::StateGrad | Pass::QkGrad => [16.0, 128.0, 256.0]
            .iter()
            .map(|&k| vec![("K_DIM", k)])
            .collect(),
        Pass::ValueGrams | Pass::QkFinish | Pass::GateFinish => vec![vec![]],
        Pass::RecurrentStep => [
            (16, 16, false),
            (128, 128, false),
            (128, 128, true),
            (256, 64, true),
            (48, 32, true),
        ]
        .into_iter()
        .flat_map(|(k, v, v_first)| {
            let options = gdn_wgpu::Options {
                state_v_first: v_first,
                ..Default::default()
            };
            let problem = gdn_wgpu::Problem::new(1, 1, 1, 1, k, v, None, options).unwrap();
            gdn_wgpu::wgpu_backend::decode::RecurrentStepTiles::candidates(
                &wgpu::Limits::default(),
                &problem,
            )
        })
        .flat_map(|t| {
            [
                t.pipeline_constants(false).to_vec(),
                t.pipeline_constants(true).to_vec(),
            ]
        })
        .collect(),
    }
}

fn validate(name: &str, text: &str, constants: &[(&'static str, f64)]) {
    let module = naga::front::wgsl::parse_str(text)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(text)));
    let mut validator = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    );
    let info = validator
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(text)));
    let map: naga::back::PipelineConstants =
        constants.iter().map(|&(k, v)| (k.to_string(), v)).collect();
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, None, &map)
            .unwrap_or_else(|e| panic!("{name} with {constants:?}: {e}"));
    let options = naga::back::spv::Options::default();
    naga::back::spv::write_vec(&module, &info, &options, None)
        .unwrap_or_else(|e| panic!("{name} → SPIR-V: {e}"));
}

#[test]
fn every_pass_validates_with_every_storage_dtype() {
    for pass in Pass::ALL {
        for &dtype in pass.storage_dtypes() {
            let src = source(pass, dtype).unwrap();
            for c in constants(pass) {
                validate(pass.file(), &src.text, &c);
            }
        }
    }
}

#[test]
fn every_wgsl_file_is_a_pass_or_a_common_snippet() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    let mut files = BTreeSet::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "wgsl") {
                files.insert(
                    path.strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/"),
                );
            }
        }
    }
    let passes: BTreeSet<String> = Pass::ALL.iter().map(|p| p.file().to_string()).collect();
    // Family snippets are validated as part of the passes that include them (above).
    let family: BTreeSet<String> = Pass::ALL
        .iter()
        .flat_map(|p| p.family_snippets())
        .map(|(file, _)| file.to_string())
        .collect();
    for f in &files {
        assert!(
            passes.contains(f) || family.contains(f) || f.starts_with("common/"),
            "{f} is neither a pass, a family snippet, nor under common/"
        );
        if f.starts_with("common/") {
            // Snippets must parse on their own (they are prepended to every pass).
            let text = std::fs::read_to_string(root.join(f)).unwrap();
            let module = naga::front::wgsl::parse_str(&text)
                .unwrap_or_else(|e| panic!("{f}: {}", e.emit_to_string(&text)));
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{f}: {}", e.emit_to_string(&text)));
        }
    }
    for p in &passes {
        assert!(files.contains(p), "pass file {p} missing");
    }
}
