//! Every WGSL pass, as assembled with each storage dtype and specialized with the override
//! constants the launchers really use (`variants::variants`, built from their tiling code), is
//! validated by naga and translated to SPIR-V, MSL and HLSL — so shader errors and Metal / DX12
//! portability problems fail on machines without a GPU — and its workgroup memory is checked
//! against the device limits the tiling was chosen for.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use gdn_wgpu::wgpu_backend::decode::RecurrentStepTiles;
use gdn_wgpu::wgpu_backend::shaders::{Pass, source};
use gdn_wgpu::wgpu_backend::variants::{Variant, variants};
use gdn_wgpu::{DType, Options, Problem};

/// The device-limit tables the tiling code is exercised with: WebGPU's defaults (16 KiB of
/// workgroup memory, what browsers and the `wgpu::Limits::default()` table guarantee), then
/// 32 KiB (Apple, most desktop Vulkan: the forward scan's V-block 64) and 48 KiB (NVIDIA:
/// the backward scans' V-block 64, `dh_scan`'s wide token slices, the coop scan).
fn limit_tables() -> Vec<wgpu::Limits> {
    [16384, 32768, 49152]
        .into_iter()
        .map(|bytes| wgpu::Limits {
            max_compute_workgroup_storage_size: bytes,
            ..wgpu::Limits::default()
        })
        .collect()
}

/// Head dims that reach each tiling branch: the smallest, odd multiples of 16, the coop
/// scan's K = 128 with V a multiple of 32, the largest; both state layouts (decode tiles).
fn problems() -> Vec<Problem> {
    let dims = [
        (16, 16),
        (32, 48),
        (48, 32),
        (64, 64),
        (128, 128),
        (128, 32),
        (256, 64),
        (256, 256),
    ];
    dims.into_iter()
        .flat_map(|(k, v)| {
            [false, true].map(|state_v_first| {
                let options = Options {
                    state_v_first,
                    ..Options::default()
                };
                Problem::new(1, 1, 1, 1, k, v, None, options).unwrap()
            })
        })
        .collect()
}

/// The capabilities a pass needs from the device (SHADER_F16, cooperative matrices): it is
/// validated with those only.
fn capabilities(pass: Pass, dtype: DType) -> naga::valid::Capabilities {
    use naga::valid::Capabilities as C;
    let mut caps = C::empty();
    if dtype == DType::F16 || pass.enables().contains(&"f16") {
        caps |= C::SHADER_FLOAT16;
    }
    if pass.needs_coop() {
        caps |= C::COOPERATIVE_MATRIX;
        // unpack2x16float (the staged K of the coop scans): wgpu grants it with
        // DownlevelFlags::SHADER_F16_IN_F32, which every backend with cooperative matrices has.
        caps |= C::SHADER_FLOAT16_IN_FLOAT32;
    }
    if pass.needs_subgroups() {
        caps |= C::SUBGROUP;
    }
    caps
}

/// Parsed and validated modules, one per (pass, dtype).
#[derive(Default)]
struct Modules(HashMap<(Pass, DType), (naga::Module, naga::valid::ModuleInfo)>);

impl Modules {
    fn get(&mut self, pass: Pass, dtype: DType) -> &(naga::Module, naga::valid::ModuleInfo) {
        self.0.entry((pass, dtype)).or_insert_with(|| {
            let text = &source(pass, dtype).unwrap().text;
            let name = pass.file();
            let module = naga::front::wgsl::parse_str(text)
                .unwrap_or_else(|e| panic!("{name} ({dtype}): {}", e.emit_to_string(text)));
            let info = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                capabilities(pass, dtype),
            )
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{name} ({dtype}): {}", e.emit_to_string(text)));
            (module, info)
        })
    }
}

/// Specialize `variant` for its entry point, translate it to SPIR-V, MSL and HLSL, and return
/// its workgroup memory: the sizes of the `var<workgroup>`s the entry point keeps.
fn translate(modules: &mut Modules, variant: &Variant, dtype: DType) -> u32 {
    let Variant {
        pass,
        entry,
        constants,
    } = variant;
    let what = format!("{} {entry} ({dtype}) with {constants:?}", pass.file());
    let (module, info) = modules.get(*pass, dtype);
    let map: naga::back::PipelineConstants =
        constants.iter().map(|&(k, v)| (k.to_string(), v)).collect();
    let stage = naga::ShaderStage::Compute;
    // Keeps only `entry`, so the module's workgroup variables are the entry point's.
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(module, info, Some((stage, entry)), &map)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(module.entry_points.len(), 1, "{what}: entry point missing");

    let spv = naga::back::spv::PipelineOptions {
        shader_stage: stage,
        entry_point: entry.to_string(),
    };
    naga::back::spv::write_vec(&module, &info, &Default::default(), Some(&spv))
        .unwrap_or_else(|e| panic!("{what} → SPIR-V: {e}"));

    // MSL 2.4 (macOS 12 / iOS 15): f16 and simdgroup matrices (the coop scan) need ≥ 2.3.
    let msl = naga::back::msl::Options {
        lang_version: (2, 4),
        ..Default::default()
    };
    let msl_pipeline = naga::back::msl::PipelineOptions {
        entry_point: Some((stage, entry.to_string())),
        ..Default::default()
    };
    naga::back::msl::write_string(&module, &info, &msl, &msl_pipeline)
        .unwrap_or_else(|e| panic!("{what} → MSL: {e}"));

    // DX12 has no cooperative matrices in wgpu (naga's HLSL writer does not implement them),
    // so the coop path never runs there; f16 needs shader model 6.2 (DXC).
    if !pass.needs_coop() {
        let hlsl = naga::back::hlsl::Options {
            shader_model: if capabilities(*pass, dtype).is_empty() {
                naga::back::hlsl::ShaderModel::V5_1
            } else {
                naga::back::hlsl::ShaderModel::V6_2
            },
            ..Default::default()
        };
        let hlsl_pipeline = naga::back::hlsl::PipelineOptions {
            entry_point: Some((stage, entry.to_string())),
        };
        let mut out = String::new();
        naga::back::hlsl::Writer::new(&mut out, &hlsl, &hlsl_pipeline)
            .write(&module, &info, None)
            .unwrap_or_else(|e| panic!("{what} → HLSL: {e}"));
    }

    module
        .global_variables
        .iter()
        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
        .map(|(_, g)| module.types[g.ty].inner.size(module.to_ctx()))
        .sum()
}

#[test]
fn every_pass_translates_at_the_launchers_constants_within_the_device_limits() {
    let mut modules = Modules::default();
    // Workgroup bytes per translated (pass, dtype, entry, constants): each is translated once.
    let mut bytes: HashMap<String, u32> = HashMap::new();
    let mut covered = BTreeSet::new();
    for limits in limit_tables() {
        let limit = limits.max_compute_workgroup_storage_size;
        // The widest V-block of each scan at this limit, and whether the coop scan fits.
        let mut widest: HashMap<Pass, u32> = HashMap::new();
        for problem in problems() {
            for variant in variants(&limits, &problem).unwrap() {
                for &dtype in variant.pass.storage_dtypes() {
                    let key = format!("{variant:?} {dtype}");
                    let declared = *bytes
                        .entry(key)
                        .or_insert_with(|| translate(&mut modules, &variant, dtype));
                    assert!(
                        declared <= limit,
                        "{} {} ({dtype}) with {:?} declares {declared} B of workgroup memory, \
                         more than the {limit} B its tiling was chosen for",
                        variant.pass.file(),
                        variant.entry,
                        variant.constants,
                    );
                }
                covered.insert(format!("{:?}", variant.pass));
                if let Some(&(_, bv)) = variant.constants.iter().find(|(n, _)| *n == "V_BLOCK") {
                    let w = widest.entry(variant.pass).or_default();
                    *w = (*w).max(bv as u32);
                }
                if variant.pass == Pass::StateScanCoop {
                    widest.insert(Pass::StateScanCoop, 32);
                }
            }
        }
        // The larger tables must reach the bigger tiles they exist for.
        let expected: &[(Pass, u32)] = match limit {
            16384 => &[(Pass::StateScan, 16), (Pass::DhScan, 16)],
            32768 => &[(Pass::StateScan, 64), (Pass::DhScan, 32)],
            _ => &[
                (Pass::StateScan, 64),
                (Pass::DhScan, 64),
                (Pass::StateScanCoop, 32),
            ],
        };
        for &(pass, bv) in expected {
            assert_eq!(widest.get(&pass), Some(&bv), "{pass:?} at {limit} B");
        }
        if limit == 16384 {
            assert!(!widest.contains_key(&Pass::StateScanCoop), "coop at 16 KiB");
        }
    }
    for pass in Pass::ALL {
        assert!(
            covered.contains(&format!("{pass:?}")),
            "{pass:?} is never instantiated"
        );
    }
    eprintln!("{} pipelines translated", bytes.len());
}

/// The host's workgroup-memory figure (which filters tilings against the device limit) is
/// what the specialized shader declares, for every tiling WebGPU's default limits admit.
#[test]
fn recurrent_step_workgroup_bytes_match_the_host_figure() {
    let text = &source(Pass::RecurrentStep, DType::F32).unwrap().text;
    let module = naga::front::wgsl::parse_str(text).unwrap();
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::empty(),
    )
    .validate(&module)
    .unwrap();
    let mut checked = 0;
    for (k, v, v_first) in [
        (128, 128, false),
        (128, 128, true),
        (48, 32, false),
        (256, 64, true),
    ] {
        let o = Options {
            state_v_first: v_first,
            ..Options::default()
        };
        let p = Problem::new(1, 1, 1, 1, k, v, None, o).unwrap();
        for t in RecurrentStepTiles::candidates(&wgpu::Limits::default(), &p) {
            let constants: naga::back::PipelineConstants = t
                .pipeline_constants(false)
                .iter()
                .map(|&(n, x)| (n.to_string(), x))
                .collect();
            let (specialized, _) =
                naga::back::pipeline_constants::process_overrides(&module, &info, None, &constants)
                    .unwrap();
            let declared: u32 = specialized
                .global_variables
                .iter()
                .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
                .map(|(_, g)| specialized.types[g.ty].inner.size(specialized.to_ctx()))
                .sum();
            assert_eq!(
                declared,
                t.workgroup_bytes(),
                "{t:?}: shader declares {declared} B"
            );
            checked += 1;
        }
    }
    assert!(
        checked > 20,
        "only {checked} tilings fit WebGPU's default limits"
    );
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
