//! The recipe's network: kiln-models' [`ResNet`], sized by [`ModelConfig`], of one of the
//! [`Arch`]s: by default `BasicBlock`s with the CIFAR stem (3x3 stride-1 `conv1`, no max-pool),
//! whose base width, depth and input channels are parameters because the recipe needs a network
//! small enough to reach 90% on the synthetic set in minutes on two CPU cores, and MNIST's
//! single channel; or one of torchvision's ImageNet-stem ResNets (`resnet18`, `resnet34`,
//! `resnet50`), the ones whose published weights fine-tuning starts from.
//!
//! [`ModelConfig`] is everything needed to rebuild the network, so a checkpoint stores it as
//! JSON metadata (`kiln.model_config`; its fields are that file format, and a file written
//! before `arch` existed reads as the default [`Arch::CifarResNet`]) and `predict` builds the
//! same model before loading the weights.
//!
//! Pretrained weights ([`read_pretrained`], [`load_pretrained`]) come from a `torch.save` file
//! of a `state_dict` or a safetensors file with torchvision's names. Everything but the head
//! (`fc.*`, sized for the pretraining classes) must match the model key for key and shape for
//! shape; a file of another kind of ResNet is refused with the keys that did not match.

use super::error::{Error, Result};
use kiln_autograd::Tensor;
use kiln_models::checkpoint::{load_state_dict, load_tensors, NamedTensors};
use kiln_models::models::{BlockKind, ResNet, ResNetConfig, ResNetDims};
use kiln_models::LayerExt;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Which ResNet the recipe builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// `BasicBlock`s with the CIFAR stem; `width` and `blocks` come from the configuration
    /// (`--model cifar-resnet`, the default).
    #[default]
    CifarResNet,
    /// torchvision's ResNet-18: `BasicBlock`s `[2, 2, 2, 2]`, 7x7 stride-2 stem and max-pool.
    ResNet18,
    /// torchvision's ResNet-34: `BasicBlock`s `[3, 4, 6, 3]`, ImageNet stem.
    ResNet34,
    /// torchvision's ResNet-50: `Bottleneck`s `[3, 4, 6, 3]`, ImageNet stem.
    ResNet50,
}

impl Arch {
    /// Every arch, in the order `--help` lists them.
    pub const ALL: [Arch; 4] = [
        Arch::CifarResNet,
        Arch::ResNet18,
        Arch::ResNet34,
        Arch::ResNet50,
    ];

    /// The `--model` name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::CifarResNet => "cifar-resnet",
            Arch::ResNet18 => "resnet18",
            Arch::ResNet34 => "resnet34",
            Arch::ResNet50 => "resnet50",
        }
    }

    /// torchvision's blocks per stage, or `None` for the CIFAR ResNet (whose depth is a knob).
    pub fn torchvision_blocks(self) -> Option<[usize; 4]> {
        match self {
            Arch::CifarResNet => None,
            Arch::ResNet18 => Some([2, 2, 2, 2]),
            Arch::ResNet34 | Arch::ResNet50 => Some([3, 4, 6, 3]),
        }
    }

    /// The residual block.
    pub fn block(self) -> BlockKind {
        match self {
            Arch::ResNet50 => BlockKind::Bottleneck,
            _ => BlockKind::Basic,
        }
    }

    /// Output channels of a block per planes (1 for `BasicBlock`, 4 for `Bottleneck`).
    pub fn expansion(self) -> usize {
        match self.block() {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }

    /// Side of the stem convolution's kernel: 3 (CIFAR stem) or 7 (ImageNet stem).
    pub fn stem_kernel(self) -> usize {
        match self {
            Arch::CifarResNet => 3,
            _ => 7,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Arch::ALL.iter().map(|a| a.name()).collect();
                format!("unknown --model {s:?}; use one of {}", names.join(", "))
            })
    }
}

/// What [`ModelConfig::build`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Input channels (3 for RGB, 1 for MNIST).
    pub in_channels: usize,
    /// Input height and width.
    pub image_size: [usize; 2],
    /// Outputs of `fc`.
    pub num_classes: usize,
    /// Planes of `layer1`; each later stage doubles them (torchvision: 64).
    pub width: usize,
    /// Blocks per stage (ResNet-18: `[2, 2, 2, 2]`).
    pub blocks: [usize; 4],
    /// The kind of ResNet (block and stem); absent in files written before it existed.
    #[serde(default)]
    pub arch: Arch,
}

impl ModelConfig {
    /// The input shape `[C, H, W]`.
    pub fn input_shape(&self) -> [usize; 3] {
        [self.in_channels, self.image_size[0], self.image_size[1]]
    }

    /// Input features of `fc`: the last stage's output channels (`None` when that overflows
    /// `usize`, which only a hostile width can make).
    pub fn features(&self) -> Option<usize> {
        self.width.checked_mul(8 * self.arch.expansion())
    }

    /// Builds the network, weights drawn from kiln's default generator (seed it with
    /// `kiln_autograd::manual_seed` for a reproducible init).
    pub fn build(&self) -> kiln_models::Result<ResNet> {
        let config = ResNetConfig {
            block: self.arch.block(),
            layers: self.blocks,
            num_classes: self.num_classes,
            small_input: self.arch == Arch::CifarResNet,
        };
        let dims = ResNetDims {
            width: self.width,
            in_channels: self.in_channels,
        };
        ResNet::with_dims(config, dims)
    }
}

/// True for the parameters of the classifier head (`fc.*`): what trains while the backbone is
/// frozen, and the optimizer's second parameter group.
pub(super) fn is_head(name: &str) -> bool {
    name.starts_with("fc.")
}

/// What [`load_pretrained`] did, for the run's setup report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PretrainedReport {
    /// The file.
    pub path: PathBuf,
    /// Backbone tensors copied into the model (every state-dict entry but the head's).
    pub loaded: usize,
    /// The file's head entries, left out for the new head: `(name, shape)`.
    pub dropped_head: Vec<(String, Vec<usize>)>,
}

/// Reads a pretrained state dict: a `torch.save` file (`.pth`, `.pt`, `.bin`, or any file
/// starting as a zip or pickle does) or a `.safetensors` file. A `module.` prefix on every key
/// (a model saved from inside `DataParallel`) is removed.
pub fn read_pretrained(path: &Path) -> Result<NamedTensors> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let tensors = if ext == "safetensors" {
        load_tensors(path)?.0
    } else {
        kiln_models::pth::load_pth_tensors(path)?
    };
    if !tensors.is_empty() && tensors.iter().all(|(n, _)| n.starts_with("module.")) {
        return Ok(tensors
            .into_iter()
            .map(|(n, t)| (n["module.".len()..].to_string(), t))
            .collect());
    }
    Ok(tensors)
}

fn not_this_arch(path: &Path, arch: Arch, why: String) -> Error {
    Error::Pretrained(format!(
        "{} is not a torchvision {arch} state dict: {why}; pass the --model it was saved from \
         (resnet18 / resnet34 have BasicBlocks, resnet50 Bottlenecks with conv3), or a file \
         written by torch.save(model.state_dict())",
        path.display()
    ))
}

/// The base width and input channels of a torchvision ResNet state dict, from its stem
/// convolution (`conv1.weight`, `[width, channels, 7, 7]`).
pub fn pretrained_dims(tensors: &NamedTensors, arch: Arch, path: &Path) -> Result<ResNetDims> {
    let conv1 = tensors
        .iter()
        .find(|(n, _)| n == "conv1.weight")
        .map(|(_, t)| t.shape().to_vec())
        .ok_or_else(|| not_this_arch(path, arch, "it has no conv1.weight".into()))?;
    let k = arch.stem_kernel();
    match conv1[..] {
        [width, in_channels, kh, kw] if kh == k && kw == k => Ok(ResNetDims { width, in_channels }),
        _ => Err(not_this_arch(
            path,
            arch,
            format!("conv1.weight has shape {conv1:?}, the stem of {arch} is [width, channels, {k}, {k}]"),
        )),
    }
}

/// At most eight names of `names`, then how many more.
fn some_of(names: &[String]) -> String {
    let mut s = names.iter().take(8).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 8 {
        s.push_str(&format!(" and {} more", names.len() - 8));
    }
    s
}

/// Loads the backbone of `tensors` (read from `path`) into `model`, leaving `model`'s freshly
/// initialised head alone: the file's `fc.*` entries are dropped, and every other entry must
/// match the model's state dict exactly (no key missing, none unexpected, equal shapes), else
/// nothing is copied and the error names the keys that did not match.
pub fn load_pretrained(
    model: &ResNet,
    tensors: &NamedTensors,
    arch: Arch,
    path: &Path,
) -> Result<PretrainedReport> {
    let (head, backbone): (Vec<_>, Vec<_>) = tensors.iter().cloned().partition(|(n, _)| is_head(n));
    let own: Vec<String> = model
        .state_dict()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !is_head(n))
        .collect();
    let own_set: HashSet<&str> = own.iter().map(String::as_str).collect();
    let file_set: HashSet<&str> = backbone.iter().map(|(n, _)| n.as_str()).collect();
    let missing: Vec<String> = own
        .iter()
        .filter(|n| !file_set.contains(n.as_str()))
        .cloned()
        .collect();
    let unexpected: Vec<String> = backbone
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| !own_set.contains(n.as_str()))
        .collect();
    if !missing.is_empty() || !unexpected.is_empty() {
        let mut why = Vec::new();
        if !missing.is_empty() {
            why.push(format!(
                "{} backbone keys of the model are not in the file ({})",
                missing.len(),
                some_of(&missing)
            ));
        }
        if !unexpected.is_empty() {
            why.push(format!(
                "{} keys of the file are not in the model ({})",
                unexpected.len(),
                some_of(&unexpected)
            ));
        }
        return Err(not_this_arch(path, arch, why.join("; ")));
    }
    // Shapes are checked by the load itself, which refuses (copying nothing) and names each
    // key with both shapes; only the head is missing, by construction.
    let report = load_state_dict(model, &backbone, false).map_err(|e| {
        Error::Pretrained(format!(
            "{}: {e}; the file's widths differ from a torchvision {arch}'s",
            path.display()
        ))
    })?;
    Ok(PretrainedReport {
        path: path.to_path_buf(),
        loaded: report.loaded.len(),
        dropped_head: head
            .iter()
            .map(|(n, t): &(String, Tensor)| (n.clone(), t.shape().to_vec()))
            .collect(),
    })
}

/// Puts everything but the head in eval mode, so a frozen pretrained backbone is a fixed
/// feature extractor: its BatchNorm layers normalise with, and keep, the pretrained running
/// statistics instead of drifting towards the new data's (the head stays in training mode).
pub(super) fn hold_backbone_statistics(model: &mut ResNet) {
    use kiln_autograd::Module;
    for (name, child) in model.children_mut() {
        if name != "fc" {
            child.train(false);
        }
    }
}
