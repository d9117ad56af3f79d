//! The `ops` group's cross-entropy rows: `cross_entropy` forward and backward (class-index
//! targets, mean reduction, f32) on an image classifier's head (`[256, 1000]` logits) and a
//! language model's (`[512, 32000]`), as time per call against the memory-bandwidth limit
//! measured in the same run, and with `--vs-torch` against PyTorch's `F.cross_entropy` then
//! `backward()` on the same shapes (`torch.rs`, case `cross_entropy_<C>_classes/<N>`).
//!
//! The limit counts the least traffic a fused loss with its gradient can make: the logits read
//! once for each row's statistics, then read again and the gradient written (one read pass and
//! one copy pass over the logits' bytes). The classifier head's logits fit in the caches, so
//! only the language model's limit is one memory can hold kiln to; both rows state it.

use super::clip::bandwidth;
use super::harness::{err, median_secs, Options, Row};
use super::torch::{Figure, Pairs};
use kiln_autograd::{DType, Device, Generator, Tensor};
use kiln_losses::{cross_entropy, CrossEntropyOptions};
use std::hint::black_box;

const GROUP: &str = "ops";
/// Logits smaller than this are marked cache-resident in their row: they fit in the last-level
/// cache of the machines kiln is measured on (16 MiB per core complex on Zen 2), so the
/// bandwidth limit does not bind them.
const CACHE_BYTES: f64 = 16.0 * 1024.0 * 1024.0;

/// The rows: per shape, kiln's ms against the bandwidth limit, and the pair with PyTorch.
pub(super) fn rows(
    options: &Options,
    rows: &mut Vec<Row>,
    pairs: &mut Pairs,
) -> Result<(), String> {
    let (read_bw, copy_bw) = bandwidth(options)?;
    let shapes: [(usize, usize); 2] = if options.quick {
        [(32, 1000), (64, 32000)]
    } else {
        [(256, 1000), (512, 32000)]
    };
    let reps = if options.quick { 2 } else { 10 };
    for (n, classes) in shapes {
        let logits = Generator::new(5)
            .normal(&[n, classes], 0.0, 2.0, DType::F32, Device::Cpu)
            .map_err(err)?;
        logits.set_requires_grad(true).map_err(err)?;
        let labels: Vec<i64> = (0..n).map(|i| ((i * 7 + 3) % classes) as i64).collect();
        let target = Tensor::from_vec(labels, &[n], Device::Cpu).map_err(err)?;
        let ce = CrossEntropyOptions::default();
        let mut call = || {
            logits.set_grad(None).map_err(err)?;
            let loss = cross_entropy(&logits, &target, &ce).map_err(err)?;
            loss.backward().map_err(err)?;
            black_box(logits.grad());
            Ok(())
        };
        let ms = median_secs(reps, &mut call)? * 1e3;
        let bytes = (n * classes * 4) as f64;
        let limit_ms = (bytes / read_bw + 2.0 * bytes / copy_bw) * 1e3;
        let case = format!("cross_entropy_fwd_bwd_f32_{n}x{classes}");
        eprintln!("bench ops: {case}: kiln {ms:.3} ms, bandwidth limit {limit_ms:.3} ms");
        rows.push(Row::new(
            GROUP,
            case.clone(),
            "ms",
            ms,
            format!(
                "bandwidth limit, same run (logits read twice, gradient written once; \
                 {:.1} MB of logits{}): {limit_ms:.3} ms",
                bytes / 1e6,
                if bytes < CACHE_BYTES {
                    ", cache-resident"
                } else {
                    ""
                }
            ),
            limit_ms / ms,
        ));
        let id = format!("cross_entropy_{classes}_classes/{n}");
        pairs.add(&case, &id, Figure::Millis, ms, || {
            Ok(median_secs(reps, &mut call)? * 1e3)
        })?;
    }
    Ok(())
}
