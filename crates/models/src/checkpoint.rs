//! Checkpoints in the safetensors format, with PyTorch's state-dict names, so weights move
//! between kiln and PyTorch both ways.
//!
//! A model's file holds its [`LayerExt::state_dict`]: parameters and buffers under dotted names
//! (`layer1.0.bn1.running_mean`), each in its own dtype. Writes are atomic: the bytes go to a
//! temporary file beside the target, which is synced and then renamed over it, so a crash leaves
//! either the old checkpoint or the new one, never half of one. Loading checks every key before
//! copying anything. A key in both whose shapes differ is always an error naming each such key
//! with both shapes, as PyTorch's `load_state_dict` raises on it even with `strict=False`. With
//! `strict`, a missing or unexpected key is an error too, naming them all; without it, the keys
//! that fit are loaded and the missing and unexpected ones reported (the fine-tuning path: a
//! backbone into a model with a new head, the file's head entries left out of the tensors
//! loaded, as in PyTorch). Values are copied into the
//! model's existing tensors (converted to their dtype), so optimizers holding the parameters see
//! the new values.
//!
//! [`save_tensors`] / [`load_tensors`] handle any named tensors plus string metadata, for
//! training checkpoints that add optimizer and scheduler state under their own prefixes.
//! [`remove_stale_temp_files`] deletes the temporary files of writes whose process was killed.

use crate::error::Error;
use crate::{Layer, LayerExt, Result};
use half::{bf16, f16};
use kiln_autograd::{DType, Device, Tensor};
use kiln_device::BoolByte;
use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// Named tensors. The order is the producer's: [`load_tensors`] returns them sorted by name
/// (safetensors keeps no order of its own), [`crate::pth::load_pth_tensors`] in the `.pth`
/// file's order, [`LayerExt::state_dict`] in registration order.
pub type NamedTensors = Vec<(String, Tensor)>;

fn io_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    }
}

fn st_dtype(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I64 => StDtype::I64,
        DType::U8 => StDtype::U8,
        DType::Bool => StDtype::BOOL,
    }
}

fn kiln_dtype(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::I64 => DType::I64,
        StDtype::U8 => DType::U8,
        StDtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// Little-endian bytes of a tensor's elements in row-major order.
fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    Ok(match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F64 => t
            .to_vec::<f64>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F16 => t
            .to_vec::<f16>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::BF16 => t
            .to_vec::<bf16>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::I64 => t
            .to_vec::<i64>()?
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::U8 => t.to_vec::<u8>()?,
        DType::Bool => t.to_vec::<BoolByte>()?.iter().map(|b| b.0).collect(),
    })
}

fn chunks<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    b.chunks_exact(N)
        .map(|c| c.try_into().expect("exact chunks"))
}

/// A CPU tensor from a safetensors view.
fn view_to_tensor(name: &str, v: &TensorView<'_>) -> Result<Tensor> {
    let dtype = kiln_dtype(v.dtype()).ok_or_else(|| {
        Error::StateDict(format!(
            "tensor {name:?} has dtype {:?}, which kiln does not store; convert it to float32 \
             before saving",
            v.dtype()
        ))
    })?;
    tensor_from_le_bytes(dtype, v.shape(), v.data())
}

/// A CPU tensor of `dtype` and `shape` from its elements' little-endian bytes in row-major
/// order (shared with the `.pth` reader).
pub(crate) fn tensor_from_le_bytes(dtype: DType, shape: &[usize], b: &[u8]) -> Result<Tensor> {
    let dev = Device::Cpu;
    Ok(match dtype {
        DType::F32 => Tensor::from_vec(chunks(b).map(f32::from_le_bytes).collect(), shape, dev)?,
        DType::F64 => Tensor::from_vec(chunks(b).map(f64::from_le_bytes).collect(), shape, dev)?,
        DType::F16 => Tensor::from_vec(chunks(b).map(f16::from_le_bytes).collect(), shape, dev)?,
        DType::BF16 => Tensor::from_vec(chunks(b).map(bf16::from_le_bytes).collect(), shape, dev)?,
        DType::I64 => Tensor::from_vec(chunks(b).map(i64::from_le_bytes).collect(), shape, dev)?,
        DType::U8 => Tensor::from_vec(b.to_vec(), shape, dev)?,
        DType::Bool => Tensor::from_vec(b.iter().map(|&x| BoolByte(x)).collect(), shape, dev)?,
    })
}

struct Bytes {
    dtype: StDtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl safetensors::View for &Bytes {
    fn dtype(&self) -> StDtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        (&self.data[..]).into()
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes `tensors` (and string `metadata`) to `path` atomically (temporary file, fsync,
/// rename). Names must be unique.
pub fn save_tensors(
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
    path: impl AsRef<Path>,
) -> Result<()> {
    let path = path.as_ref();
    let mut seen = std::collections::HashSet::new();
    let mut owned = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        if !seen.insert(name.as_str()) {
            return Err(Error::StateDict(format!(
                "save: the name {name:?} appears twice; tensor names must be unique"
            )));
        }
        owned.push((
            name.clone(),
            Bytes {
                dtype: st_dtype(t.dtype()),
                shape: t.shape().to_vec(),
                data: tensor_bytes(t)?,
            },
        ));
    }
    let bytes = safetensors::serialize(owned.iter().map(|(n, b)| (n.as_str(), b)), metadata)
        .map_err(|e| io_err(path, e))?;
    let file_name = path
        .file_name()
        .ok_or_else(|| io_err(path, "the path names no file"))?;
    let tmp = path.with_file_name(format!(
        "{}{}",
        temp_prefix(&file_name.to_string_lossy()),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(path, e)
    })
}

/// The start of the temporary-file names [`save_tensors`] writes `file_name` through; the
/// writing process's id completes it.
fn temp_prefix(file_name: &str) -> String {
    format!(".{file_name}.tmp-")
}

/// Whether process `pid` is gone, so a temporary file it left can only be stale. On Unix the
/// kernel answers a null signal (`ESRCH`: no such process; `EPERM`: it runs, as another
/// user); elsewhere no process is taken for gone, so no file is removed.
fn process_gone(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return true; // beyond pid_t: no process can have it
        };
        if pid <= 0 {
            return false; // 0 would address this process group, not one process
        }
        // SAFETY: signal 0 is never delivered; `kill` only checks that `pid` exists.
        let status = unsafe { libc::kill(pid, 0) };
        status != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        false
    }
}

/// Removes the temporary files that killed [`save_tensors`] calls left beside `path`
/// (`.NAME.tmp-PID` of processes no longer running) and returns them; the current process's
/// and live processes' files are left alone. A missing folder has none.
pub fn remove_stale_temp_files(path: impl AsRef<Path>) -> Result<Vec<std::path::PathBuf>> {
    let path = path.as_ref();
    let file_name = path
        .file_name()
        .ok_or_else(|| io_err(path, "the path names no file"))?
        .to_string_lossy()
        .into_owned();
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir, e)),
    };
    let prefix = temp_prefix(&file_name);
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && process_gone(pid) {
            std::fs::remove_file(entry.path()).map_err(|e| io_err(&entry.path(), e))?;
            removed.push(entry.path());
        }
    }
    removed.sort();
    Ok(removed)
}

/// Says in words what the safetensors parser reports as "header too large" or "file not fully
/// covered": a file too short for its 8-byte header length, a header length past the end of
/// the file, or tensor data that ends past it (a truncated copy or not a safetensors file).
fn check_file_length(bytes: &[u8], path: &Path) -> Result<()> {
    let not_safetensors = |why: String| {
        io_err(
            path,
            format!("{why}; the file is truncated or not a safetensors file, copy it again"),
        )
    };
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(not_safetensors(format!(
            "{} bytes, fewer than the 8 that hold a safetensors header length",
            bytes.len()
        )));
    };
    let header_len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    let after_len = (bytes.len() - 8) as u64;
    if header_len > after_len {
        return Err(not_safetensors(format!(
            "the header declares {header_len} bytes but only {after_len} follow"
        )));
    }
    let header = &bytes[8..8 + header_len as usize];
    let Ok(serde_json::Value::Object(entries)) = serde_json::from_slice(header) else {
        return Ok(()); // a malformed header is the parser's error to report
    };
    let data_end = entries
        .values()
        .filter_map(|e| e.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    let data_len = after_len - header_len;
    if data_end > data_len {
        return Err(not_safetensors(format!(
            "the tensors declare {data_end} bytes of data but only {data_len} follow the header"
        )));
    }
    Ok(())
}

/// Reads every tensor of a safetensors file (on the CPU), sorted by name, and its metadata.
pub fn load_tensors(path: impl AsRef<Path>) -> Result<(NamedTensors, HashMap<String, String>)> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    check_file_length(&bytes, path)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| io_err(path, e))?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| io_err(path, e))?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let mut out = Vec::new();
    for (name, view) in st.iter() {
        out.push((name.to_string(), view_to_tensor(name, &view)?));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((out, metadata))
}

/// Saves `model`'s parameters and buffers with their PyTorch names.
pub fn save_safetensors(model: &dyn Layer, path: impl AsRef<Path>) -> Result<()> {
    save_tensors(&model.state_dict(), None, path)
}

/// What a load matched and what it did not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Keys copied into the model.
    pub loaded: Vec<String>,
    /// Keys the model has and the file lacks.
    pub missing: Vec<String>,
    /// Keys the file has and the model lacks.
    pub unexpected: Vec<String>,
    /// Keys in both with different shapes: `(name, model shape, file shape)`. A load refuses
    /// them (strict or not), so a report a load returns has none; the error lists them.
    pub mismatched: Vec<(String, Vec<usize>, Vec<usize>)>,
}

impl LoadReport {
    /// True when every key matched.
    pub fn is_exact(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty()
    }

    /// The missing and unexpected keys, in words.
    fn describe_names(&self) -> String {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!("missing keys: {}", self.missing.join(", ")));
        }
        if !self.unexpected.is_empty() {
            parts.push(format!("unexpected keys: {}", self.unexpected.join(", ")));
        }
        parts.join("; ")
    }

    /// The mis-shaped keys with both shapes, in words.
    fn describe_shapes(&self) -> String {
        let parts: Vec<String> = self
            .mismatched
            .iter()
            .map(|(n, m, f)| format!("{n}: model has shape {m:?}, file has {f:?}"))
            .collect();
        parts.join("; ")
    }

    /// The error a load with `strict` gives for this report, or `None` when it loads.
    fn refusal(&self, strict: bool) -> Option<Error> {
        let names_differ = !self.missing.is_empty() || !self.unexpected.is_empty();
        let fix_names = "load with strict = false to take only the keys that fit";
        if !self.mismatched.is_empty() {
            let mut msg = format!(
                "the checkpoint's shapes do not fit the model ({}); a key whose shape differs is \
                 never loaded, strict or not (PyTorch raises on it with strict=False too): build \
                 the model with the file's sizes, or leave those keys out of the tensors you load \
                 (for a new head, drop the file's head entries and load with strict = false)",
                self.describe_shapes()
            );
            if strict && names_differ {
                msg.push_str(&format!(
                    "; the names differ too ({}): fix them, or {fix_names}",
                    self.describe_names()
                ));
            }
            return Some(Error::StateDict(msg));
        }
        (strict && names_differ).then(|| {
            Error::StateDict(format!(
                "the checkpoint's names do not fit the model ({}); fix the names, or {fix_names}",
                self.describe_names()
            ))
        })
    }
}

/// Loads a safetensors state dict into `model` (see the module notes for `strict`).
pub fn load_safetensors(
    model: &dyn Layer,
    path: impl AsRef<Path>,
    strict: bool,
) -> Result<LoadReport> {
    let (file, _) = load_tensors(path)?;
    load_state_dict(model, &file, strict)
}

/// Loads named tensors into `model`'s parameters and buffers (see the module notes for
/// `strict`; a shape mismatch is refused either way, copying nothing).
pub fn load_state_dict(
    model: &dyn Layer,
    tensors: &[(String, Tensor)],
    strict: bool,
) -> Result<LoadReport> {
    let _parameters = crate::scope::parameters();
    let file: HashMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let own = model.state_dict();
    let own_names: std::collections::HashSet<&str> = own.iter().map(|(n, _)| n.as_str()).collect();
    let mut report = LoadReport::default();
    let mut to_copy = Vec::new();
    for (name, dst) in &own {
        match file.get(name.as_str()) {
            None => report.missing.push(name.clone()),
            Some(src) if src.shape() != dst.shape() => {
                report
                    .mismatched
                    .push((name.clone(), dst.shape().to_vec(), src.shape().to_vec()))
            }
            Some(src) => to_copy.push((name, dst, *src)),
        }
    }
    report.unexpected = tensors
        .iter()
        .filter(|(n, _)| !own_names.contains(n.as_str()))
        .map(|(n, _)| n.clone())
        .collect();
    if let Some(e) = report.refusal(strict) {
        return Err(e);
    }
    let _g = kiln_autograd::NoGradGuard::new();
    for (name, dst, src) in to_copy {
        let src = src.to_dtype(dst.dtype())?.to_device(dst.device())?;
        dst.copy_(&src)?;
        report.loaded.push(name.clone());
    }
    Ok(report)
}

/// Prefix of model tensors in a training checkpoint.
const MODEL_PREFIX: &str = "model.";
/// Prefix of optimizer tensors in a training checkpoint.
const OPTIMIZER_PREFIX: &str = "optimizer.";

/// What a training checkpoint carries besides the model: the optimizer's tensors (momentum,
/// `exp_avg`, ... under names of the optimizer's choosing) and string metadata (optimizer
/// hyper-parameters and step counts, the scheduler's serialised state, the epoch, ...).
#[derive(Debug, Clone, Default)]
pub struct TrainingState {
    /// Optimizer tensors by name.
    pub optimizer_tensors: NamedTensors,
    /// Everything else, as strings (JSON for structured state).
    pub metadata: HashMap<String, String>,
}

/// Saves a training checkpoint in one safetensors file (atomically): the model's state dict
/// under `model.`, the optimizer's tensors under `optimizer.`, and `state.metadata` as the
/// file's metadata.
pub fn save_training_checkpoint(
    model: &dyn Layer,
    state: &TrainingState,
    path: impl AsRef<Path>,
) -> Result<()> {
    let mut tensors: NamedTensors = model
        .state_dict()
        .into_iter()
        .map(|(n, t)| (format!("{MODEL_PREFIX}{n}"), t))
        .collect();
    tensors.extend(
        state
            .optimizer_tensors
            .iter()
            .map(|(n, t)| (format!("{OPTIMIZER_PREFIX}{n}"), t.clone())),
    );
    save_tensors(&tensors, Some(state.metadata.clone()), path)
}

/// Loads a training checkpoint written by [`save_training_checkpoint`]: the model's tensors go
/// into `model` (strictly or not, as [`load_safetensors`]), the rest is returned.
pub fn load_training_checkpoint(
    model: &dyn Layer,
    path: impl AsRef<Path>,
    strict: bool,
) -> Result<(LoadReport, TrainingState)> {
    let (tensors, metadata) = load_tensors(path)?;
    let mut model_tensors = Vec::new();
    let mut optimizer_tensors = Vec::new();
    for (name, t) in tensors {
        if let Some(rest) = name.strip_prefix(MODEL_PREFIX) {
            model_tensors.push((rest.to_string(), t));
        } else if let Some(rest) = name.strip_prefix(OPTIMIZER_PREFIX) {
            optimizer_tensors.push((rest.to_string(), t));
        } else {
            return Err(Error::StateDict(format!(
                "{name:?} is neither a model. nor an optimizer. tensor; this is not a kiln \
                 training checkpoint (load it with load_safetensors)"
            )));
        }
    }
    let report = load_state_dict(model, &model_tensors, strict)?;
    Ok((
        report,
        TrainingState {
            optimizer_tensors,
            metadata,
        },
    ))
}
