//! The synthetic dataset: determinism, independence of order and threads, balance, splits.

use kiln_data::{synthetic, Split};

#[test]
fn sample_i_is_a_function_of_seed_split_and_index() {
    let ds = synthetic::generate(3, Split::Train, 40).unwrap();
    for i in [0usize, 7, 39] {
        let (img, label) = synthetic::render(3, Split::Train, i as u64);
        assert_eq!(&*ds.image(i).unwrap(), img.as_slice());
        assert_eq!(ds.label(i), label);
    }
    // Generated on a one-thread pool: the same bytes.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let one = pool.install(|| synthetic::generate(3, Split::Train, 40).unwrap());
    assert_eq!(one, ds);
    // A longer set starts with the shorter one.
    let longer = synthetic::generate(3, Split::Train, 50).unwrap();
    assert_eq!(longer.image(39).unwrap(), ds.image(39).unwrap());
}

#[test]
fn seeds_and_splits_give_different_images() {
    let a = synthetic::render(3, Split::Train, 5).0;
    assert_ne!(a, synthetic::render(4, Split::Train, 5).0);
    assert_ne!(a, synthetic::render(3, Split::Test, 5).0);
    let (train, val) = synthetic::train_val(3, 20, 10).unwrap();
    assert_eq!((train.len(), val.len()), (20, 10));
    assert_eq!(train.name(), "synthetic/train");
    assert_eq!(val.name(), "synthetic/val");
    for i in 0..10 {
        assert_ne!(train.image(i).unwrap(), val.image(i).unwrap());
    }
}

#[test]
fn classes_are_balanced_and_images_are_varied() {
    let ds = synthetic::generate(0, Split::Train, 200).unwrap();
    assert_eq!(ds.sample_shape(), [3, 32, 32]);
    assert_eq!(ds.classes()[9], "dot grid");
    let mut counts = [0; 10];
    for &l in ds.labels() {
        counts[l as usize] += 1;
    }
    assert_eq!(counts, [20; 10]);
    // Images use the range and carry real contrast (a figure on a background).
    let (mean, std) = ds.channel_stats().unwrap();
    for c in 0..3 {
        assert!((0.3..0.7).contains(&mean[c]), "mean {mean:?}");
        assert!(std[c] > 0.15, "std {std:?}");
    }
    for i in 0..200 {
        let img = ds.image(i).unwrap();
        let (lo, hi) = img
            .iter()
            .fold((255u8, 0u8), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(hi - lo > 60, "sample {i} is nearly flat: {lo}..{hi}");
    }
    // No two samples of a class alike.
    assert_ne!(ds.image(0).unwrap(), ds.image(10).unwrap());
}

/// Nearest-class-mean on raw pixels (a linear-ish baseline) stays far below what a CNN reaches:
/// the classes are not separable by where their pixels are.
#[test]
fn nearest_class_mean_on_pixels_is_weak() {
    let (train, val) = synthetic::train_val(1, 500, 200).unwrap();
    let per = 3 * 32 * 32;
    let mut means = vec![vec![0f64; per]; 10];
    for i in 0..train.len() {
        let l = train.label(i) as usize;
        for (m, &v) in means[l].iter_mut().zip(train.image(i).unwrap().iter()) {
            *m += v as f64 / 50.0;
        }
    }
    let mut correct = 0;
    for i in 0..val.len() {
        let img = val.image(i).unwrap();
        let best = (0..10)
            .min_by(|&a, &b| {
                let d = |m: &Vec<f64>| {
                    m.iter()
                        .zip(img.iter())
                        .map(|(m, &v)| (m - v as f64).powi(2))
                        .sum::<f64>()
                };
                d(&means[a]).total_cmp(&d(&means[b]))
            })
            .unwrap();
        correct += (best as i64 == val.label(i)) as usize;
    }
    let acc = correct as f64 / val.len() as f64;
    assert!(acc < 0.5, "nearest-class-mean accuracy {acc}");
}
