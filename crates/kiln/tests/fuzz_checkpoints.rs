//! The fuzz suite for training checkpoints, the one file a user hands back to kiln
//! (`train --resume`, `predict --checkpoint`): a checkpoint written by the recipe at test size,
//! mutated case by case (its bytes; its safetensors header's dtypes, shapes, offsets and names;
//! the JSON of its metadata, leaf by leaf), then read the ways the examples read it:
//! `read_settings`, `take_checkpoint_settings`, `load_model` with `top_k` and `predict`,
//! `resume`, and for some cases the resumed run itself. Every case must end in `Ok` or a typed
//! error: no panic, no abort (the test caps its address space, as a `ulimit -v` would), no hang.
//!
//! Its own test binary, one test: the recipe seeds kiln's process-wide generator, so its runs
//! must not overlap another test's in one process.

mod common;
#[allow(dead_code)]
#[path = "fuzz_hostile/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "fuzz_hostile/json_mutation.rs"]
mod json_mutation;

use harness::{run, Outcome, Rng};
use kiln::autograd::{DType, Device, Tensor};
use kiln::data::{save_png, synthetic, ImageOptions, Split};
use kiln::recipe::{
    checkpoint, take_checkpoint_settings, train, GivenSettings, Quiet, TrainConfig,
};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A checkpoint file taken apart: its header's tensor entries (name, entry) in file order, its
/// metadata and the data bytes after the header.
#[derive(Clone)]
struct Parts {
    tensors: Vec<(String, Value)>,
    metadata: Map<String, Value>,
    data: Vec<u8>,
}

fn split(bytes: &[u8]) -> Parts {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut tensors = Vec::new();
    let mut metadata = Map::new();
    for (k, v) in header {
        match k.as_str() {
            "__metadata__" => metadata = v.as_object().unwrap().clone(),
            _ => tensors.push((k, v)),
        }
    }
    Parts {
        tensors,
        metadata,
        data: bytes[8 + n..].to_vec(),
    }
}

fn join(p: &Parts) -> Vec<u8> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), Value::Object(p.metadata.clone()));
    for (k, v) in &p.tensors {
        header.insert(k.clone(), v.clone());
    }
    let text = serde_json::to_vec(&Value::Object(header)).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&p.data);
    out
}

/// Hostile JSON values for a metadata leaf or a header field.
fn hostile_value(rng: &mut Rng) -> Value {
    let big = rng.size();
    rng.pick(&[
        Value::from(0),
        Value::from(-1),
        Value::from(1),
        Value::from(3),
        Value::from(1u64 << 40),
        Value::from(u64::MAX),
        Value::from(i64::MIN),
        Value::from(big as u64),
        Value::from(1e308),
        Value::from(-1e308),
        Value::from(0.5),
        Value::from(1e-300),
        Value::from("x"),
        Value::from(""),
        Value::Null,
        Value::Bool(true),
        Value::Array(vec![]),
        Value::Object(Map::new()),
        Value::Array(vec![Value::from(big as u64), Value::from(2)]),
    ])
}

/// One change to the checkpoint, drawn against the base file's structure.
#[derive(Debug, Clone)]
enum Mutation {
    /// A metadata value's JSON node at `path` (empty: the whole value) replaced.
    MetaNode {
        key: String,
        path: Vec<Value>,
        value: Value,
    },
    /// An array node of a metadata value cut to `len` items or grown by repeating its last.
    MetaArray {
        key: String,
        path: Vec<Value>,
        len: usize,
    },
    /// A metadata key removed, or its text replaced by something that is not JSON.
    MetaText {
        key: String,
        text: Option<String>,
    },
    /// A header field (`dtype`, `shape`, `data_offsets`) of tensor `index` replaced.
    TensorField {
        index: usize,
        field: &'static str,
        value: Value,
    },
    /// One dimension of tensor `index`'s shape set to `dim` (its offsets left as they are).
    TensorDim {
        index: usize,
        axis: usize,
        dim: u64,
    },
    /// Tensor `index` removed from the header (its bytes stay), or renamed.
    TensorName {
        index: usize,
        name: Option<String>,
    },
    /// Raw bytes: one bit flipped at `at` (mod the length), the file cut to `keep`, or the
    /// 8-byte header length set to `header_len`.
    Flip {
        at: usize,
        bit: u8,
    },
    Truncate {
        keep: usize,
    },
    HeaderLen {
        header_len: u64,
    },
}

fn draw(rng: &mut Rng, base: &Parts, size: usize) -> Mutation {
    let keys: Vec<&String> = base.metadata.keys().collect();
    let key = keys[rng.below(keys.len())].clone();
    let index = rng.below(base.tensors.len());
    match rng.below(12) {
        0..=4 => {
            let text = base.metadata[&key].as_str().unwrap();
            let parsed: Value = serde_json::from_str(text).unwrap();
            let mut all = Vec::new();
            json_mutation::paths(&parsed, &mut Vec::new(), &mut all);
            let path = all[rng.below(all.len())].clone();
            match rng.chance(0.8) {
                true => Mutation::MetaNode {
                    key,
                    path,
                    value: hostile_value(rng),
                },
                false => Mutation::MetaArray {
                    key,
                    path,
                    len: rng.pick(&[0, 1, 2, 7, 100]),
                },
            }
        }
        5 => Mutation::MetaText {
            key,
            text: rng.pick(&[
                None,
                Some("{".into()),
                Some("null".into()),
                Some("[]".into()),
            ]),
        },
        6 => {
            let field = rng.pick(&["dtype", "shape", "data_offsets"]);
            let value = match (field, rng.below(3)) {
                ("dtype", 0) => Value::from(rng.pick(&["F16", "BF16", "F64", "I64", "I32"])),
                ("dtype", 1) => Value::from(rng.pick(&["U8", "BOOL", "F8_E4M3", "I8", "U64"])),
                ("shape", 0) => Value::Array(vec![]),
                ("shape", 1) => Value::Array(vec![Value::from(0); 1 + rng.below(4)]),
                ("data_offsets", 0) => Value::Array(vec![
                    Value::from(rng.below(size + 2) as u64),
                    Value::from(rng.below(size + 2) as u64),
                ]),
                _ => hostile_value(rng),
            };
            Mutation::TensorField {
                index,
                field,
                value,
            }
        }
        7 => {
            let any = rng.size() as u64;
            Mutation::TensorDim {
                index,
                axis: rng.below(4),
                dim: rng.pick(&[0, 1, 2, 1 << 20, 1 << 32, u64::MAX, any]),
            }
        }
        8 => Mutation::TensorName {
            index,
            name: rng.pick(&[
                None,
                Some("model.conv1.weight".into()),
                Some("optimizer.0.exp_avg".into()),
                Some("optimizer.999.exp_avg".into()),
                Some("model.fc.bias".into()),
                Some("elsewhere".into()),
                Some(String::new()),
            ]),
        },
        9 | 10 => Mutation::Flip {
            at: rng.next_u64() as usize,
            bit: rng.below(8) as u8,
        },
        _ => match rng.chance(0.5) {
            true => Mutation::Truncate {
                keep: rng.below(size + 1),
            },
            false => {
                let any = rng.size() as u64;
                Mutation::HeaderLen {
                    header_len: rng.pick(&[0, 1, 7, 100_000_000, u64::MAX, any]),
                }
            }
        },
    }
}

/// Applies `ms` to the base file. Raw-byte changes come after the structural ones. (A case
/// removes at most three tensors of the base's many, so some are always left to index.)
fn apply(base: &Parts, ms: &[Mutation]) -> Vec<u8> {
    let mut p = base.clone();
    for m in ms {
        match m {
            Mutation::MetaNode { key, path, value } => edit_meta(&mut p, key, |v| {
                if let Some(node) = json_mutation::at(v, path) {
                    *node = value.clone();
                }
            }),
            Mutation::MetaArray { key, path, len } => edit_meta(&mut p, key, |v| {
                if let Some(Value::Array(a)) = json_mutation::at(v, path) {
                    match a.last().cloned() {
                        Some(last) if *len > a.len() => a.resize(*len, last),
                        _ => a.truncate(*len),
                    }
                }
            }),
            Mutation::MetaText { key, text } => match text {
                Some(t) => {
                    p.metadata.insert(key.clone(), Value::from(t.as_str()));
                }
                None => {
                    p.metadata.remove(key);
                }
            },
            Mutation::TensorField {
                index,
                field,
                value,
            } => {
                let i = *index % p.tensors.len();
                p.tensors[i].1[*field] = value.clone();
            }
            Mutation::TensorDim { index, axis, dim } => {
                let i = *index % p.tensors.len();
                let entry = &mut p.tensors[i].1;
                if let Some(Value::Array(shape)) = entry.get_mut("shape") {
                    let axis = (*axis).min(shape.len());
                    match shape.get_mut(axis) {
                        Some(d) => *d = Value::from(*dim),
                        None => shape.push(Value::from(*dim)),
                    }
                }
            }
            Mutation::TensorName { index, name } => {
                let i = *index % p.tensors.len();
                match name {
                    Some(n) => p.tensors[i].0 = n.clone(),
                    None => drop(p.tensors.remove(i)),
                }
            }
            _ => {}
        }
    }
    let mut bytes = join(&p);
    for m in ms {
        match *m {
            Mutation::Flip { at, bit } if !bytes.is_empty() => {
                let i = at % bytes.len();
                bytes[i] ^= 1 << bit;
            }
            Mutation::Truncate { keep } => bytes.truncate(keep),
            Mutation::HeaderLen { header_len } if bytes.len() >= 8 => {
                bytes[..8].copy_from_slice(&header_len.to_le_bytes())
            }
            _ => {}
        }
    }
    bytes
}

fn edit_meta(p: &mut Parts, key: &str, f: impl FnOnce(&mut Value)) {
    let Some(Ok(mut v)) = p
        .metadata
        .get(key)
        .and_then(Value::as_str)
        .map(serde_json::from_str)
    else {
        return;
    };
    f(&mut v);
    p.metadata.insert(key.into(), Value::from(v.to_string()));
}

/// The runs whose checkpoints are mutated: the recipe at test size (a frozen first epoch, two
/// lr groups, accumulation, clipping, warm-up + cosine), plain and with f16 autocast (whose
/// checkpoint also holds the loss scaler's state).
fn run_config(run_dir: PathBuf, f16: bool) -> TrainConfig {
    let mut config = common::tiny_config(run_dir, 7, (32, 16));
    config.accum_steps = 2;
    config.freeze_epochs = 1;
    if f16 {
        config.freeze_epochs = 0;
        config.amp = true;
        config.amp_dtype = DType::F16;
    }
    config
}

/// Reads the checkpoint in `dir` every way the examples do, then resumes its run from it
/// (with `f16` as the run was) when every read succeeded.
fn read_every_way(dir: &Path, png: &Path, f16: bool) -> Outcome {
    let path = checkpoint::checkpoint_path(dir);
    let settings = checkpoint::read_settings(&path);
    let predicted = kiln::recipe::predict(&path, png, ImageOptions::default(), 3);
    let loaded = checkpoint::load_model(&path);
    let Ok((model, info)) = loaded else {
        return Outcome::Refused;
    };
    // The model on an input of the configured shape, where that is small (`predict` above
    // takes only the PNG's 32x32).
    let shape = info.config.input_shape();
    let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if numel.is_some_and(|n| n <= 3 * 64 * 64) {
        if let Ok(x) = Tensor::zeros(&shape, DType::F32, Device::Cpu) {
            let _ = kiln::recipe::top_k(&model, &x, 3);
        }
    }
    let resumed = checkpoint::resume(&model, &path);
    if !(settings.is_ok() && predicted.is_ok() && resumed.is_ok()) {
        return Outcome::from(resumed);
    }
    // The resumed run, as `train --resume` starts it: settings not given are the checkpoint's.
    let mut config = run_config(dir.to_path_buf(), f16);
    config.batch_size = None;
    config.resume = true;
    if let Err(e) = take_checkpoint_settings(&mut config, GivenSettings::default()) {
        return Outcome::from(Err::<(), _>(e));
    }
    Outcome::from(train(&config, &mut Quiet))
}

#[test]
fn fuzz_training_checkpoints() {
    kiln_testkit::limit_address_space(kiln_testkit::FUZZ_ADDRESS_SPACE_BYTES);
    let root = std::env::temp_dir().join(format!("kiln-fuzz-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // One epoch of two, so that a resumed run has one to train.
    let bases: Vec<(Parts, usize)> = [false, true]
        .into_iter()
        .map(|f16| {
            let mut config = run_config(root.join(format!("base-{f16}")), f16);
            config.stop_after = Some(1);
            let outcome = train(&config, &mut Quiet).unwrap();
            let bytes = std::fs::read(&outcome.checkpoint).unwrap();
            (split(&bytes), bytes.len())
        })
        .collect();
    let (pixels, _) = synthetic::render(0, Split::Test, 3);
    let png = root.join("sample.png");
    save_png(&png, &pixels, [3, 32, 32]).unwrap();
    let case_dir: PathBuf = root.join("case");
    std::fs::create_dir_all(&case_dir).unwrap();
    // A find of a longer hunt, checked on every run: a width whose head size overflows, in a
    // file whose stem weight, which would contradict it, was renamed (a debug-build panic
    // before).
    let base = &bases[0].0;
    let conv1 = base
        .tensors
        .iter()
        .position(|(n, _)| n == "model.conv1.weight");
    let huge_width = [
        Mutation::TensorName {
            index: conv1.unwrap(),
            name: Some("optimizer.0.exp_avg".into()),
        },
        Mutation::MetaNode {
            key: "kiln.model_config".into(),
            path: vec![Value::from("width")],
            value: Value::from(u64::MAX),
        },
    ];
    let path = checkpoint::checkpoint_path(&case_dir);
    std::fs::write(&path, apply(base, &huge_width)).unwrap();
    let err = checkpoint::read_info(&path).unwrap_err().to_string();
    assert!(err.contains("is past any network's size"), "{err}");
    run(
        "training checkpoints",
        0x5eed_0101,
        300,
        |rng| {
            let f16 = rng.chance(0.5);
            let (base, size) = &bases[f16 as usize];
            let n = 1 + rng.below(3);
            let mutations: Vec<Mutation> = (0..n).map(|_| draw(rng, base, *size)).collect();
            (f16, mutations)
        },
        |(f16, mutations)| {
            let _ = std::fs::remove_dir_all(&case_dir);
            std::fs::create_dir_all(&case_dir).unwrap();
            let bytes = apply(&bases[*f16 as usize].0, mutations);
            std::fs::write(checkpoint::checkpoint_path(&case_dir), bytes).unwrap();
            read_every_way(&case_dir, &png, *f16)
        },
    );
    let _ = std::fs::remove_dir_all(&root);
}
