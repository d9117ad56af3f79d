//! PyTorch checkpoint files (`torch.save` of a `state_dict`, `.pth` / `.pt`), read without
//! running any of their code.
//!
//! Both formats of `torch.save` are read: the zip archive of PyTorch 1.6 and later
//! (`<name>/data.pkl`, one record `<name>/data/<key>` per storage, `<name>/byteorder`), which
//! torchvision's published weights use, and the legacy stream of earlier versions (header
//! pickles, the state-dict pickle, then the raw storages). The pickle is read by a small virtual
//! machine that knows only the opcodes a `state_dict` needs and builds values from an allow-list
//! of globals (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`,
//! `torch._utils._rebuild_parameter`, the `torch.*Storage` types); anything else is a
//! [`PthError`] naming the opcode or global. Storages of f32, f64, f16, bf16, i64, u8 and bool
//! elements become kiln tensors of that dtype, bit for bit.
//!
//! Invariants: every tensor's offset, sizes and strides are checked with checked arithmetic
//! against the byte length of its storage before any element is read, and a view may not hold
//! more elements than its storage, nor all the tensors of a file together more than a few times
//! its size, so the memory a load takes is bounded by the file's size (a PyTorch tensor
//! expanded with stride 0 is therefore refused: save `t.contiguous()`). Strided
//! and offset views are copied out contiguously; views sharing a storage become separate
//! tensors. Loading into a model goes through [`crate::checkpoint::load_state_dict`], so names,
//! shapes and `strict` behave exactly as for safetensors.

pub(crate) mod error;
mod legacy;
mod pickle;
mod tensor;
mod value;
mod zip;

pub use error::PthError;

use crate::checkpoint::{load_state_dict, LoadReport, NamedTensors};
use crate::error::Error;
use crate::{Layer, Result};
use std::collections::HashMap;
use std::path::Path;
use tensor::{materialise, state_dict_records, Located, OutputBudget};
use value::{storage_ref, Object, Value};

/// Reads every tensor of a `torch.save` file of a `state_dict` (on the CPU), in the file's
/// order.
pub fn load_pth_tensors(path: impl AsRef<Path>) -> Result<NamedTensors> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    })?;
    read_pth(&bytes).map_err(|e| pth_err(path, e))
}

/// Loads a `torch.save` file of a `state_dict` into `model`'s parameters and buffers by name,
/// with the same `strict` semantics as [`crate::load_safetensors`].
pub fn load_pth(model: &dyn Layer, path: impl AsRef<Path>, strict: bool) -> Result<LoadReport> {
    let _parameters = crate::scope::parameters();
    let tensors = load_pth_tensors(path)?;
    load_state_dict(model, &tensors, strict)
}

/// Converts a `torch.save` file of a `state_dict` to safetensors: the same names, dtypes, shapes
/// and element bits, each tensor contiguous, written atomically; returns the tensors written
/// (in the `.pth` file's order). The file's metadata says `format: pt`, as Hugging Face's
/// converter writes.
pub fn convert_to_safetensors(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
) -> Result<NamedTensors> {
    let (input, output) = (input.as_ref(), output.as_ref());
    if input == output {
        return Err(Error::Io {
            path: output.display().to_string(),
            msg: "the output would overwrite the input; name another output file".into(),
        });
    }
    let tensors = load_pth_tensors(input)?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    crate::checkpoint::save_tensors(&tensors, Some(metadata), output)?;
    Ok(tensors)
}

fn pth_err(path: &Path, e: PthError) -> Error {
    Error::Pth {
        path: path.display().to_string(),
        source: e,
    }
}

/// Reads the tensors of a `torch.save` file held in memory: a `state_dict`, in the file's order
/// (a key given twice keeps its first place and its last value, as a Python dict does).
pub fn read_pth(bytes: &[u8]) -> std::result::Result<NamedTensors, PthError> {
    if bytes.starts_with(b"PK\x03\x04") {
        read_zip(bytes)
    } else if bytes.first() == Some(&0x80) {
        legacy::read(bytes)
    } else {
        Err(PthError::NotPth)
    }
}

fn read_zip(bytes: &[u8]) -> std::result::Result<NamedTensors, PthError> {
    let archive = zip::ZipArchive::new(bytes)?;
    let pkl = archive
        .entries
        .iter()
        .find(|e| {
            e.name
                .strip_suffix("/data.pkl")
                .is_some_and(|prefix| !prefix.contains('/'))
        })
        .ok_or_else(|| {
            PthError::Zip(
                "the archive has no <name>/data.pkl: it is a zip file but not one torch.save \
                 wrote"
                    .into(),
            )
        })?;
    let prefix = &pkl.name[..pkl.name.len() - "data.pkl".len()];
    let big_endian = match archive.find(&format!("{prefix}byteorder")) {
        None => false,
        Some(e) => match &archive.read(e)?[..] {
            b"little" => false,
            b"big" => true,
            other => {
                return Err(PthError::Zip(format!(
                    "byteorder is {:?}, neither \"little\" nor \"big\"",
                    String::from_utf8_lossy(other)
                )))
            }
        },
    };
    let pickled = archive.read(pkl)?;
    let unpickled = pickle::unpickle(&pickled, storage_from_pid)?;
    let mut budget = OutputBudget::for_input(bytes.len());
    let records = state_dict_records(&unpickled.top, &unpickled.objects)?;
    let mut storages: HashMap<String, std::borrow::Cow<'_, [u8]>> = HashMap::new();
    let mut out = Vec::with_capacity(records.len());
    for (name, record) in records {
        let key = &record.storage.key;
        if !storages.contains_key(key) {
            let entry = archive
                .find(&format!("{prefix}data/{key}"))
                .ok_or_else(|| PthError::Bounds {
                    name: name.clone(),
                    msg: format!("its storage record {prefix}data/{key} is missing"),
                })?;
            storages.insert(key.clone(), archive.read(entry)?);
        }
        let storage = &storages[key];
        let located = Located {
            record,
            storage,
            big_endian,
        };
        out.push((name.clone(), materialise(&name, &located, &mut budget)?));
    }
    Ok(out)
}

/// The storage of a zip-format persistent id `('storage', type, key, location, numel)`.
fn storage_from_pid(fields: &[Value], objects: &[Object]) -> std::result::Result<Object, PthError> {
    storage_ref(fields, objects, 5).map(Object::Storage)
}
