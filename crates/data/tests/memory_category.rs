//! The loader's batches are counted as `Data` in the allocation history (what a memory report
//! shows as the batch, apart from activations and temporaries). Alone in its binary: the CPU
//! allocator's history is process-wide.

use kiln_autograd::{Device, Tensor};
use kiln_data::{DataLoader, DataLoaderConfig, ImageDataset};
use kiln_device::{memory_history, record_memory_history, MemoryCategory};
use std::sync::Arc;

fn block(t: &Tensor) -> usize {
    (t.numel() * t.dtype().size_in_bytes()).div_ceil(512) * 512
}

#[test]
fn a_batch_is_counted_as_data() {
    let n = 64;
    let pixels = (0..n * 3 * 8 * 8).map(|i| (i % 251) as u8).collect();
    let labels = (0..n).map(|i| (i % 2) as i64).collect();
    let classes = vec!["a".into(), "b".into()];
    let ds = ImageDataset::new("d", [3, 8, 8], pixels, labels, classes).unwrap();
    let config = DataLoaderConfig {
        batch_size: 16,
        ..Default::default()
    };
    let mut loader = DataLoader::new(Arc::new(ds), config, Device::Cpu).unwrap();
    record_memory_history(Device::Cpu, true, 100_000).unwrap();
    let batch = loader.iter().next().unwrap().unwrap();
    let h = memory_history(Device::Cpu).unwrap();
    record_memory_history(Device::Cpu, false, 1).unwrap();
    let now = *h.category_bytes().last().expect("the batch was recorded");
    let want = block(&batch.images) + block(&batch.labels);
    assert_eq!(now.get(MemoryCategory::Data), want);
    assert_eq!(now.total(), want, "nothing else is live: {now:?}");
}
