//! Helpers shared by kiln-data's integration tests.

use kiln_data::DataLoader;

/// Every batch of one epoch as (indices, images, labels).
pub type Batches = Vec<(Vec<usize>, Vec<f32>, Vec<i64>)>;

/// The loader's next epoch, every batch unwrapped.
pub fn epoch(loader: &mut DataLoader) -> Batches {
    loader
        .iter()
        .map(|b| {
            let b = b.unwrap();
            (
                b.indices,
                b.images.to_vec::<f32>().unwrap(),
                b.labels.to_vec::<i64>().unwrap(),
            )
        })
        .collect()
}
