//! Hostile sizes: huge batches, huge or malformed memory budgets. Each used to hang, panic or
//! print wrapped numbers; each is now a result or an error that names the problem.

use kiln_autograd::DType;
use kiln_models::models::{mlp, resnet18};
use kiln_models::{parse_memory_size, plan, summary, OptimizerKind};

/// `max_batch_size` with a budget of `usize::MAX` used to double `hi` until it wrapped to 0 and
/// loop forever; it now terminates with the largest batch whose peak fits in `usize`.
#[test]
fn max_batch_size_terminates_for_every_budget() {
    let model = mlp(&[8, 16, 4], 0.0).unwrap();
    let p = plan(&model, &[8], DType::F32, OptimizerKind::Adam).unwrap();
    for budget in [usize::MAX, usize::MAX / 2, 1 << 62, 1 << 40] {
        let b = p.max_batch_size(budget).unwrap();
        assert!(p.peak_bytes(b) <= budget, "budget {budget}: batch {b}");
        let next = p.peak_bytes(b + 1);
        assert!(
            next > budget || next == usize::MAX,
            "budget {budget}: batch {b} is not the largest"
        );
    }
    // Too small a budget is still the named error.
    let msg = p.max_batch_size(10).unwrap_err().to_string();
    assert!(msg.contains("cannot hold even one sample"), "{msg}");
    // A peak beyond usize reads as usize::MAX rather than a wrapped small number.
    assert_eq!(p.peak_bytes(usize::MAX), usize::MAX);
}

/// A sample with no elements costs nothing per sample: no largest batch, said so.
#[test]
fn max_batch_size_of_empty_samples_is_an_error_not_a_hang() {
    let model = mlp(&[8, 4], 0.0).unwrap();
    let p = plan(&model, &[0, 8], DType::F32, OptimizerKind::Sgd).unwrap();
    if let Err(e) = p.max_batch_size(usize::MAX) {
        assert!(e.to_string().contains("every batch size fits"), "{e}");
    }
}

/// The summary of a 2^62 batch printed 0 mult-adds (wrapped); it is now an error.
#[test]
fn summary_of_a_huge_batch_is_an_error_not_wrapped_counts() {
    let model = resnet18(10).unwrap();
    let msg = summary(&model, &[1 << 62, 3, 32, 32])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("usize::MAX") && msg.contains("smaller batch"),
        "{msg}"
    );
    let model = mlp(&[8, 4], 0.0).unwrap();
    assert!(summary(&model, &[usize::MAX, 8]).is_err());
    assert!(plan(&model, &[usize::MAX / 2], DType::F32, OptimizerKind::Sgd).is_err());
    // A normal batch still works.
    assert!(summary(&model, &[2, 8]).unwrap().total_mult_adds > 0);
}

/// Memory budgets: `-5GB` read as 0 and `1e30GB` as usize::MAX; NaN as 0.
#[test]
fn memory_sizes_parse_or_say_what_is_wrong() {
    assert_eq!(parse_memory_size("24GiB").unwrap(), 24 << 30);
    assert_eq!(parse_memory_size("1.5 GB").unwrap(), 1_500_000_000);
    assert_eq!(parse_memory_size("4096").unwrap(), 4096);
    assert_eq!(parse_memory_size("512B").unwrap(), 512);
    assert_eq!(parse_memory_size("2KiB").unwrap(), 2048);
    for (bad, says) in [
        ("-5GB", "negative"),
        ("NaNGB", "no number"),
        ("NaN", "no number"),
        ("inf GB", "no number"),
        ("1.2.3GB", "not a number"),
        ("1e30GB", "more than"),
        ("18446744073709551616", "more than"),
        ("12 parsecs", "unknown unit"),
        ("", "no number"),
    ] {
        let msg = parse_memory_size(bad).unwrap_err().to_string();
        assert!(msg.contains(says) && msg.contains("24GiB"), "{bad}: {msg}");
    }
    // The size is shown with its unit, and without a stray space when it has none.
    let msg = parse_memory_size("1e30").unwrap_err().to_string();
    assert!(msg.contains(": 1e30 is more than the "), "{msg}");
    let msg = parse_memory_size("1e30GB").unwrap_err().to_string();
    assert!(msg.contains(": 1e30 GB is more than the "), "{msg}");
}

/// A ResNet, GPT or ViT whose blocks' weights no memory holds is refused before its first
/// block is made (a depth of 2^40 was built block by block for hours), naming the depth, the
/// width and the fix; a width whose sizes overflow `usize` too (a debug-build panic in the GPT
/// and the ViT before); normal ones still build.
#[test]
fn a_model_no_memory_holds_is_refused_before_it_is_built() {
    use kiln_models::models::{
        BlockKind, Gpt, GptConfig, ResNet, ResNetConfig, ResNetDims, VisionTransformer, VitConfig,
    };
    let config = |layers| ResNetConfig {
        block: BlockKind::Basic,
        layers,
        num_classes: 10,
        small_input: true,
    };
    let dims = |width| ResNetDims {
        width,
        in_channels: 3,
    };
    let started = std::time::Instant::now();
    let msg = ResNet::with_dims(config([1 << 40, 1, 1, 1]), dims(4))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("blocks per stage [1099511627776, 1, 1, 1]")
            && msg.contains("more than this machine's memory")
            && msg.contains("fewer blocks or a smaller width"),
        "{msg}"
    );
    let msg = ResNet::with_dims(config([1, 1, 1, 1]), dims(1 << 40))
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("more than 2^64 bytes"), "{msg}");
    let gpt = |n_layer, n_embd| {
        Gpt::new(GptConfig {
            n_layer,
            n_embd,
            ..GptConfig::tiny()
        })
    };
    let msg = gpt(1 << 40, 16).err().unwrap().to_string();
    assert!(
        msg.contains("n_layer 1099511627776, n_embd 16") && msg.contains("fewer layers"),
        "{msg}"
    );
    let msg = gpt(2, usize::MAX / 2).err().unwrap().to_string();
    assert!(msg.contains("more than 2^64 bytes"), "{msg}");
    let vit = |num_layers, hidden_dim| {
        VisionTransformer::new(VitConfig {
            num_layers,
            hidden_dim,
            ..VitConfig::tiny(10)
        })
    };
    let msg = vit(1 << 40, 16).err().unwrap().to_string();
    assert!(
        msg.contains("num_layers 1099511627776, hidden_dim 16") && msg.contains("fewer layers"),
        "{msg}"
    );
    let msg = vit(2, usize::MAX / 2).err().unwrap().to_string();
    assert!(msg.contains("more than 2^64 bytes"), "{msg}");
    assert!(
        started.elapsed().as_secs() < 5,
        "refusing took {:?}",
        started.elapsed()
    );
    assert!(ResNet::with_dims(config([2, 2, 2, 2]), dims(64)).is_ok());
    assert!(gpt(2, 16).is_ok() && vit(2, 16).is_ok());
}
