//! DataLoader: batch counts, coverage, reproducible order, resume, prefetch, clean shutdown.

mod common;

use common::epoch;
use kiln_autograd::{DType, Device};
use kiln_data::{Augment, DataLoader, DataLoaderConfig, ImageDataset, LoaderState, Normalize};
use std::sync::Arc;

/// `n` samples of 2x3x3 whose every pixel is `i % 256` and whose label is `i % 4`.
fn counting(n: usize) -> Arc<ImageDataset> {
    let pixels = (0..n).flat_map(|i| [(i % 256) as u8; 18]).collect();
    let labels = (0..n).map(|i| (i % 4) as i64).collect();
    let classes = (0..4).map(|c| c.to_string()).collect();
    Arc::new(ImageDataset::new("counting", [2, 3, 3], pixels, labels, classes).unwrap())
}

fn config(batch_size: usize, shuffle: bool, drop_last: bool) -> DataLoaderConfig {
    DataLoaderConfig {
        batch_size,
        shuffle,
        drop_last,
        seed: 42,
        ..Default::default()
    }
}

#[test]
fn batch_counts_with_and_without_drop_last() {
    for (n, bs, drop_last, batches, last) in [
        (10, 3, false, 4, 1),
        (10, 3, true, 3, 3),
        (9, 3, false, 3, 3),
        (9, 3, true, 3, 3),
        (2, 5, false, 1, 2),
    ] {
        let mut loader =
            DataLoader::new(counting(n), config(bs, true, drop_last), Device::Cpu).unwrap();
        assert_eq!(loader.len(), batches);
        let got = epoch(&mut loader);
        assert_eq!(got.len(), batches, "n {n} bs {bs} drop_last {drop_last}");
        assert!(got[..batches - 1].iter().all(|b| b.0.len() == bs));
        assert_eq!(got.last().unwrap().0.len(), last);
    }
    let err = DataLoader::new(counting(2), config(5, true, true), Device::Cpu)
        .err()
        .unwrap();
    assert!(err.to_string().contains("gives no batches"), "{err}");
    let err = DataLoader::new(counting(2), config(0, true, true), Device::Cpu)
        .err()
        .unwrap();
    assert!(err.to_string().contains("batch_size is 0"), "{err}");
}

#[test]
fn each_index_once_per_epoch_with_matching_pixels_and_labels() {
    let mut loader = DataLoader::new(counting(23), config(4, true, false), Device::Cpu).unwrap();
    let mut orders = Vec::new();
    for e in 0..3u64 {
        assert_eq!(
            loader.state(),
            LoaderState {
                epoch: e,
                batches_done: 0
            }
        );
        let mut seen = vec![0; 23];
        let mut order = Vec::new();
        for b in loader.iter() {
            let b = b.unwrap();
            assert_eq!(b.epoch, e);
            assert_eq!(b.images.shape(), &[b.indices.len(), 2, 3, 3]);
            assert_eq!(b.images.dtype(), DType::F32);
            assert_eq!(b.labels.dtype(), DType::I64);
            let px = b.images.to_vec::<f32>().unwrap();
            let labels = b.labels.to_vec::<i64>().unwrap();
            for (k, &i) in b.indices.iter().enumerate() {
                seen[i] += 1;
                assert_eq!(px[k * 18], i as f32 / 255.0);
                assert_eq!(px[k * 18 + 17], i as f32 / 255.0);
                assert_eq!(labels[k], (i % 4) as i64);
            }
            order.extend(b.indices);
        }
        assert!(seen.iter().all(|&c| c == 1), "{seen:?}");
        orders.push(order);
    }
    // Shuffled: not the identity, and different each epoch.
    assert_ne!(orders[0], (0..23).collect::<Vec<_>>());
    assert_ne!(orders[0], orders[1]);
    assert_ne!(orders[1], orders[2]);
    // Unshuffled: dataset order.
    let mut plain = DataLoader::new(counting(7), config(3, false, false), Device::Cpu).unwrap();
    let order: Vec<usize> = epoch(&mut plain).into_iter().flat_map(|b| b.0).collect();
    assert_eq!(order, (0..7).collect::<Vec<_>>());
}

#[test]
fn same_seed_same_order_other_seed_other_order() {
    let make = |seed| {
        let mut c = config(5, true, false);
        c.seed = seed;
        DataLoader::new(counting(40), c, Device::Cpu).unwrap()
    };
    let (mut a, mut b, mut c) = (make(1), make(1), make(2));
    for _ in 0..2 {
        let ea = epoch(&mut a);
        assert_eq!(ea, epoch(&mut b));
        assert_ne!(ea, epoch(&mut c));
    }
}

fn augmented(prefetch: usize) -> DataLoader {
    let mut c = config(6, true, false);
    c.prefetch_batches = prefetch;
    c.augment = Augment {
        crop_padding: 1,
        flip_prob: 0.5,
    };
    c.normalize = Some(Normalize::new(&[0.25, 0.5], &[0.5, 0.25]).unwrap());
    // Pixels that differ within an image, so crops and flips show.
    let n = 20;
    let pixels = (0..n * 18).map(|i| (i * 13 % 251) as u8).collect();
    let ds = ImageDataset::new(
        "varied",
        [2, 3, 3],
        pixels,
        (0..n).map(|i| (i % 3) as i64).collect(),
        vec!["a".into(), "b".into(), "c".into()],
    )
    .unwrap();
    DataLoader::new(Arc::new(ds), c, Device::Cpu).unwrap()
}

#[test]
fn prefetch_gives_the_same_batches_as_no_prefetch() {
    let mut inline = augmented(0);
    let mut one = augmented(1);
    let mut three = augmented(3);
    for _ in 0..3 {
        let want = epoch(&mut inline);
        assert_eq!(want, epoch(&mut one));
        assert_eq!(want, epoch(&mut three));
    }
}

#[test]
fn augmentation_changes_between_epochs_but_not_between_runs() {
    let mut a = augmented(0);
    let e0 = epoch(&mut a);
    let e1 = epoch(&mut a);
    let by_index = |e: &Vec<(Vec<usize>, Vec<f32>, Vec<i64>)>| {
        let mut m = vec![Vec::new(); 20];
        for (idx, px, _) in e {
            for (k, &i) in idx.iter().enumerate() {
                m[i] = px[k * 18..(k + 1) * 18].to_vec();
            }
        }
        m
    };
    let (m0, m1) = (by_index(&e0), by_index(&e1));
    assert!(m0.iter().zip(&m1).filter(|(x, y)| x != y).count() >= 10);
    assert_eq!(e0, epoch(&mut augmented(2)));
}

/// Augmentation is drawn per sample: identical images in one epoch get their own crops and
/// flips, each the one `Augment::apply` gives for that sample's index and epoch.
#[test]
fn samples_of_one_epoch_get_their_own_crop_and_flip() {
    let n = 32;
    let image: Vec<u8> = (0..18).map(|i| (i * 13 % 251) as u8).collect();
    let pixels = image.iter().copied().cycle().take(n * 18).collect();
    let ds = ImageDataset::new("same", [2, 3, 3], pixels, vec![0; n], vec!["a".into()]).unwrap();
    let mut c = config(n, false, false);
    c.augment = Augment {
        crop_padding: 1,
        flip_prob: 0.5,
    };
    let mut loader = DataLoader::new(Arc::new(ds), c.clone(), Device::Cpu).unwrap();
    for epoch_index in 0..2 {
        let batches = epoch(&mut loader);
        let (indices, px, _) = &batches[0];
        let mut distinct = std::collections::BTreeSet::new();
        for (k, &i) in indices.iter().enumerate() {
            let mut want = vec![0u8; 18];
            c.augment
                .apply(&image, [2, 3, 3], c.seed, epoch_index, i, &mut want)
                .unwrap();
            let got: Vec<u8> = px[k * 18..(k + 1) * 18]
                .iter()
                .map(|v| (v * 255.0).round() as u8)
                .collect();
            assert_eq!(got, want, "epoch {epoch_index}, sample {i}");
            distinct.insert(got);
        }
        // 9 crops x 2 flips over 32 samples: far more than one.
        assert!(
            distinct.len() >= 6,
            "{} distinct augmentations",
            distinct.len()
        );
    }
    // Flipping alone (no crop) is still augmentation: every image comes mirrored.
    c.augment = Augment {
        crop_padding: 0,
        flip_prob: 1.0,
    };
    let mut loader = DataLoader::new(
        Arc::new(
            ImageDataset::new(
                "same",
                [2, 3, 3],
                image.repeat(n),
                vec![0; n],
                vec!["a".into()],
            )
            .unwrap(),
        ),
        c,
        Device::Cpu,
    )
    .unwrap();
    let mirrored: Vec<u8> = image
        .chunks(3)
        .flat_map(|row| row.iter().rev().copied())
        .collect();
    for (_, px, _) in epoch(&mut loader) {
        for got in px.chunks(18) {
            let got: Vec<u8> = got.iter().map(|v| (v * 255.0).round() as u8).collect();
            assert_eq!(got, mirrored);
        }
    }
}

#[test]
fn resume_mid_epoch_continues_bit_identically() {
    for prefetch in [0, 2] {
        let mut full = augmented(prefetch);
        let mut all = epoch(&mut full);
        all.extend(epoch(&mut full));

        // Stop after 2 batches of epoch 0 (dropping the iterator with its worker), then resume
        // in a fresh loader from the saved state.
        let mut first = augmented(prefetch);
        let mut saved = LoaderState::default();
        let mut got = Vec::new();
        for b in first.iter().take(2) {
            let b = b.unwrap();
            saved = b.state_after;
            got.push((
                b.indices,
                b.images.to_vec::<f32>().unwrap(),
                b.labels.to_vec::<i64>().unwrap(),
            ));
        }
        assert_eq!(
            saved,
            LoaderState {
                epoch: 0,
                batches_done: 2
            }
        );
        assert_eq!(first.state(), saved);
        // Through a checkpoint's JSON and back.
        let json = serde_json::to_string(&saved).unwrap();
        assert_eq!(json, r#"{"epoch":0,"batches_done":2}"#);
        let saved: LoaderState = serde_json::from_str(&json).unwrap();
        let mut resumed = augmented(prefetch);
        resumed.set_state(saved).unwrap();
        got.extend(epoch(&mut resumed));
        assert_eq!(
            resumed.state(),
            LoaderState {
                epoch: 1,
                batches_done: 0
            }
        );
        got.extend(epoch(&mut resumed));
        assert_eq!(got, all);
    }
    // A state at the end of an epoch means the start of the next one.
    let mut l = augmented(0);
    l.set_state(LoaderState {
        epoch: 4,
        batches_done: 4,
    })
    .unwrap();
    assert_eq!(
        l.state(),
        LoaderState {
            epoch: 5,
            batches_done: 0
        }
    );
    let err = l
        .set_state(LoaderState {
            epoch: 0,
            batches_done: 5,
        })
        .unwrap_err();
    assert!(err.to_string().contains("past the 4 batches"), "{err}");
}

#[test]
fn dropping_a_prefetching_iterator_stops_its_worker() {
    let mut c = config(1, true, false);
    c.prefetch_batches = 2;
    let mut loader = DataLoader::new(counting(1000), c, Device::Cpu).unwrap();
    for _ in 0..5 {
        let mut it = loader.iter();
        it.next().unwrap().unwrap();
        drop(it); // joins the worker, which is blocked on a full channel
    }
    // The loader is still usable and resumes after the 5 batches handed out.
    assert_eq!(
        loader.state(),
        LoaderState {
            epoch: 0,
            batches_done: 5
        }
    );
    assert_eq!(loader.iter().count(), 995);
    drop(loader);
}

#[test]
fn normalize_channel_mismatch_is_refused() {
    let mut c = config(2, false, false);
    c.normalize = Some(Normalize::mnist());
    let err = DataLoader::new(counting(4), c, Device::Cpu).err().unwrap();
    assert!(
        err.to_string()
            .contains("normalize has 1 channel(s) but counting images have 2"),
        "{err}"
    );
}
