//! PyTorch `.pth` files written by `torch.save` (tests/fixtures/gen_pth.py) load into kiln with
//! the same tensors, bit for bit, as the safetensors copies of the same state, and give
//! PyTorch's logits; hostile or foreign files give typed errors.

use half::{bf16, f16};
use kiln_autograd::{DType, Device, Tensor};
use kiln_device::BoolByte;
use kiln_models::checkpoint::{load_tensors, NamedTensors};
use kiln_models::layers::Sequential;
use kiln_models::layers::{BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, ReLU};
use kiln_models::pth::{load_pth_tensors, read_pth};
use kiln_models::{load_pth, Error, Layer, LayerExt, PthError};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Writes an embedded fixture to a temporary file: the fixtures travel inside the test binary,
/// so it also runs where the source tree is absent.
fn embedded(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    // A folder per call: tests run in parallel, and two writing the same file name into one
    // folder could truncate it under the other's reader.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir()
        .join(format!("kiln-models-pth-{}", std::process::id()))
        .join(call.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

const SMALL_PTH: &[u8] = include_bytes!("fixtures/small_convnet.pth");
const SMALL_LEGACY_PTH: &[u8] = include_bytes!("fixtures/small_convnet_legacy.pth");
const SMALL_ST: &[u8] = include_bytes!("fixtures/small_convnet.safetensors");
const VIEWS_PTH: &[u8] = include_bytes!("fixtures/views.pth");
const VIEWS_LEGACY_PTH: &[u8] = include_bytes!("fixtures/views_legacy.pth");
const VIEWS_DEFLATED_PTH: &[u8] = include_bytes!("fixtures/views_deflated.pth");
/// views.pth in the zip64 form of archives over 4 GiB (gen_pth.py's `zip64`).
const VIEWS_ZIP64_PTH: &[u8] = include_bytes!("fixtures/views_zip64.pth");
const VIEWS_ST: &[u8] = include_bytes!("fixtures/views.safetensors");

/// gen_fixtures.py's `small_convnet`.
fn small_convnet() -> Sequential {
    Sequential::new()
        .push(Conv2d::new(3, 4, 3, Conv2dConfig::default().padding(1)).unwrap())
        .push(BatchNorm2d::new(4).unwrap())
        .push(ReLU::new())
        .push(MaxPool2d::new(2, 2, 0).unwrap())
        .push(Flatten::new())
        .push(Linear::new(16 * 4, 3, true).unwrap())
}

/// A tensor's dtype, shape and element bits (little-endian), for exact comparison.
fn bits(t: &Tensor) -> (DType, Vec<usize>, Vec<u8>) {
    let b: Vec<u8> = match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F64 => t
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F16 => t
            .to_vec::<f16>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::I64 => t
            .to_vec::<i64>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::U8 => t.to_vec::<u8>().unwrap(),
        DType::Bool => t
            .to_vec::<BoolByte>()
            .unwrap()
            .iter()
            .map(|b| b.0)
            .collect(),
    };
    (t.dtype(), t.shape().to_vec(), b)
}

fn assert_same_tensors(pth: &NamedTensors, st: &NamedTensors) {
    let mut a: Vec<_> = pth.iter().map(|(n, t)| (n.clone(), bits(t))).collect();
    let b: Vec<_> = st.iter().map(|(n, t)| (n.clone(), bits(t))).collect();
    a.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y, "{}", x.0);
    }
}

fn safetensors(name: &str, bytes: &[u8]) -> NamedTensors {
    load_tensors(embedded(name, bytes)).unwrap().0
}

#[test]
fn small_convnet_pth_holds_the_safetensors_bits() {
    let st = safetensors("small_convnet.safetensors", SMALL_ST);
    for (name, bytes) in [
        ("small_convnet.pth", SMALL_PTH),
        ("small_convnet_legacy.pth", SMALL_LEGACY_PTH),
    ] {
        let pth = load_pth_tensors(embedded(name, bytes)).unwrap();
        // The file's order is the state dict's.
        let names: Vec<&str> = pth.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[..3], ["0.weight", "0.bias", "1.weight"], "{name}");
        assert_same_tensors(&pth, &st);
    }
}

#[derive(serde::Deserialize)]
struct Logits {
    input_shape: Vec<usize>,
    logits_shape: Vec<usize>,
    logits: Vec<f32>,
}

fn logits_of(model: &mut dyn Layer, input_shape: &[usize]) -> Tensor {
    let n: usize = input_shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (0.37 * i as f64).cos() as f32).collect();
    model.eval();
    let x = Tensor::from_vec(v, input_shape, Device::Cpu).unwrap();
    model.forward(&x).unwrap()
}

#[test]
fn small_convnet_pth_gives_torchs_logits_and_the_safetensors_ones() {
    let want: Logits =
        serde_json::from_str(include_str!("fixtures/small_convnet_logits.json")).unwrap();
    let mut from_st = small_convnet();
    kiln_models::load_safetensors(
        &from_st,
        embedded("small_convnet.safetensors", SMALL_ST),
        true,
    )
    .unwrap();
    let st_logits = logits_of(&mut from_st, &want.input_shape)
        .to_vec::<f32>()
        .unwrap();
    for (name, bytes) in [
        ("small_convnet.pth", SMALL_PTH),
        ("small_convnet_legacy.pth", SMALL_LEGACY_PTH),
    ] {
        let mut m = small_convnet();
        let report = load_pth(&m, embedded(name, bytes), true).unwrap();
        assert!(report.is_exact(), "{report:?}");
        assert_eq!(report.loaded.len(), 9);
        let y = logits_of(&mut m, &want.input_shape);
        assert_eq!(y.shape(), &want.logits_shape[..]);
        let got = y.to_vec::<f32>().unwrap();
        assert_eq!(
            got, st_logits,
            "{name}: the .pth and safetensors paths differ"
        );
        for (g, w) in got.iter().zip(&want.logits) {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{name}: {g} vs torch {w}"
            );
        }
    }
}

#[test]
fn views_dtypes_and_shared_storages_match_safetensors_bit_for_bit() {
    let st = safetensors("views.safetensors", VIEWS_ST);
    for (name, bytes) in [
        ("views.pth", VIEWS_PTH),
        ("views_legacy.pth", VIEWS_LEGACY_PTH),
        ("views_deflated.pth", VIEWS_DEFLATED_PTH),
        ("views_zip64.pth", VIEWS_ZIP64_PTH),
    ] {
        let pth = read_pth(bytes).unwrap();
        assert_same_tensors(&pth, &st);
        let get = |k: &str| pth.iter().find(|(n, _)| n == k).unwrap().1.clone();
        assert_eq!(get("transposed.weight").shape(), &[5, 6], "{name}");
        assert_eq!(get("offset.weight").shape(), &[2, 3], "{name}");
        assert_eq!(get("shared.b").shape(), &[3, 2], "{name}");
        assert_eq!(get("scalar").shape(), &[] as &[usize], "{name}");
        assert_eq!(get("empty").shape(), &[0, 3], "{name}");
        assert_eq!(
            get("features.1.indices").to_vec::<i64>().unwrap(),
            [-3, 0, 1 << 40, -(1 << 62)]
        );
        for (k, d) in [
            ("features.0.bias", DType::F64),
            ("features.1.weight", DType::F16),
            ("features.1.bias", DType::BF16),
            ("features.1.num_batches_tracked", DType::I64),
            ("features.2.mask", DType::Bool),
            ("features.2.codes", DType::U8),
            ("param", DType::F32),
        ] {
            assert_eq!(get(k).dtype(), d, "{name}: {k}");
        }
    }
}

#[test]
fn strict_load_of_a_foreign_state_dict_names_the_keys() {
    let m = small_convnet();
    let err = load_pth(&m, embedded("views.pth", VIEWS_PTH), true).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::StateDict(_)), "{msg}");
    assert!(
        msg.contains("missing keys: 0.weight") && msg.contains("transposed.weight"),
        "{msg}"
    );
    let report = load_pth(&m, embedded("views.pth", VIEWS_PTH), false).unwrap();
    assert!(report.loaded.is_empty() && !report.unexpected.is_empty());
}

#[test]
fn foreign_and_hostile_files_give_typed_errors() {
    assert_eq!(read_pth(b"hello").unwrap_err(), PthError::NotPth);
    // A pickle that would call os.system: the global is refused by name, nothing runs.
    let evil = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
    match read_pth(evil).unwrap_err() {
        PthError::UnknownGlobal { module, name } => {
            assert_eq!((&*module, &*name), ("os", "system"))
        }
        e => panic!("{e}"),
    }
    // A protocol-0 INT opcode is outside the subset.
    match read_pth(b"\x80\x02I1\n.").unwrap_err() {
        PthError::UnknownOpcode {
            opcode,
            name,
            offset,
        } => {
            assert_eq!((opcode, name, offset), (b'I', "INT", 2))
        }
        e => panic!("{e}"),
    }
    // Cut-short archives and flipped storage bytes are errors, never panics.
    for n in [10, VIEWS_PTH.len() / 2, VIEWS_PTH.len() - 1] {
        assert!(read_pth(&VIEWS_PTH[..n]).is_err(), "{n}");
    }
    let mut flipped = VIEWS_PTH.to_vec();
    let at = flipped
        .windows(12)
        .position(|w| w == b"views/data/0")
        .unwrap();
    // The first storage's bytes follow its local header (name, then alignment padding).
    flipped[at + 100] ^= 0x40;
    let err = read_pth(&flipped).unwrap_err().to_string();
    assert!(err.contains("CRC") || err.contains("zip"), "{err}");
    let path_err = load_pth_tensors(embedded("bad.pth", b"hello")).unwrap_err();
    assert!(path_err.to_string().contains("bad.pth"), "{path_err}");
}

#[test]
fn one_storage_named_over_and_over_is_refused_not_copied_out() {
    let aliased = include_bytes!("fixtures/aliased.pth");
    match read_pth(aliased).unwrap_err() {
        PthError::Bounds { msg, .. } => assert!(msg.contains("add up to"), "{msg}"),
        e => panic!("{e}"),
    }
}

/// torchvision's resnet18 saved by torch.save (gen_pth.py --full; not committed): the logits
/// of the safetensors copy.
#[test]
fn resnet18_pth_matches_its_safetensors_when_generated() {
    let pth = std::path::Path::new(FIXTURES).join("resnet18.pth");
    let st = std::path::Path::new(FIXTURES).join("resnet18.safetensors");
    if !pth.exists() || !st.exists() {
        eprintln!(
            "skipped: run gen_fixtures.py --full and gen_pth.py --full to create resnet18.pth"
        );
        return;
    }
    let a = load_pth_tensors(&pth).unwrap();
    let (b, _) = load_tensors(&st).unwrap();
    assert_same_tensors(&a, &b);
    let mut m = kiln_models::models::resnet18(1000).unwrap();
    load_pth(&m, &pth, true).unwrap();
    let mut m2 = kiln_models::models::resnet18(1000).unwrap();
    kiln_models::load_safetensors(&m2, &st, true).unwrap();
    let shape = [1, 3, 64, 64];
    assert_eq!(
        logits_of(&mut m, &shape).to_vec::<f32>().unwrap(),
        logits_of(&mut m2, &shape).to_vec::<f32>().unwrap()
    );
    assert_eq!(m.state_dict().len(), a.len());
}

#[test]
fn convert_writes_the_same_tensors_as_safetensors() {
    for (name, bytes) in [
        ("views.pth", VIEWS_PTH),
        ("views_legacy.pth", VIEWS_LEGACY_PTH),
    ] {
        let input = embedded(name, bytes);
        let output = input.with_extension("converted.safetensors");
        let written = kiln_models::pth::convert_to_safetensors(&input, &output).unwrap();
        let (back, meta) = load_tensors(&output).unwrap();
        assert_eq!(meta.get("format").map(String::as_str), Some("pt"));
        assert_same_tensors(&written, &back);
        assert_same_tensors(
            &read_pth(bytes).unwrap(),
            &safetensors("views.safetensors", VIEWS_ST),
        );
        assert!(kiln_models::pth::convert_to_safetensors(&input, &input).is_err());
    }
}
