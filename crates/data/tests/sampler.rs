//! DistributedSampler: PyTorch's indices exactly without shuffle (fixture from
//! `fixtures/distributed_sampler.py`), the shard invariants with shuffle, and its use by the
//! DataLoader.

use kiln_data::{DataLoader, DataLoaderConfig, DistributedSampler, ImageDataset};
use std::collections::BTreeSet;
use std::sync::Arc;

#[test]
fn unshuffled_indices_equal_pytorchs_for_every_rank() {
    let text = include_str!("fixtures/distributed_sampler.json");
    let cases: Vec<serde_json::Value> = serde_json::from_str(text).unwrap();
    assert!(cases.len() >= 50);
    for case in cases {
        let len = case["len"].as_u64().unwrap() as usize;
        let replicas = case["num_replicas"].as_u64().unwrap() as usize;
        let drop_last = case["drop_last"].as_bool().unwrap();
        for (rank, want) in case["ranks"].as_array().unwrap().iter().enumerate() {
            let want: Vec<usize> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            let s = DistributedSampler::new(len, replicas, rank)
                .unwrap()
                .shuffle(false)
                .drop_last(drop_last);
            assert_eq!(
                s.indices(),
                want,
                "len {len} replicas {replicas} rank {rank} drop_last {drop_last}"
            );
            assert_eq!(s.num_samples(), want.len());
        }
    }
}

fn shards(len: usize, replicas: usize, epoch: u64, drop_last: bool) -> Vec<Vec<usize>> {
    (0..replicas)
        .map(|rank| {
            let mut s = DistributedSampler::new(len, replicas, rank)
                .unwrap()
                .seed(7)
                .drop_last(drop_last);
            s.set_epoch(epoch);
            s.indices()
        })
        .collect()
}

#[test]
fn shuffled_shards_are_disjoint_equal_covering_and_reshuffled_per_epoch() {
    for (len, replicas) in [(12, 3), (10, 4), (101, 8), (3, 5)] {
        for epoch in 0..3 {
            let ranks = shards(len, replicas, epoch, false);
            let per = len.div_ceil(replicas);
            assert!(ranks.iter().all(|r| r.len() == per), "equal length {per}");
            let all: Vec<usize> = ranks.iter().flatten().copied().collect();
            let distinct: BTreeSet<usize> = all.iter().copied().collect();
            assert_eq!(distinct, (0..len).collect(), "every index is covered");
            // Only the padding repeats: exactly total - len duplicates.
            assert_eq!(all.len() - distinct.len(), per * replicas - len);
            // Every rank computes the same permutation for the same epoch: rank r's shard is
            // positions r, r + n, ... of one order, so rebuilding it from the shards and reading
            // it back with another sampler instance gives the same shards.
            assert_eq!(ranks, shards(len, replicas, epoch, false));
            if len == 101 {
                assert_ne!(ranks, shards(len, replicas, epoch + 1, false), "reshuffled");
            }
        }
        let dropped = shards(len, replicas, 0, true);
        let per = len / replicas;
        assert!(dropped.iter().all(|r| r.len() == per));
        let all: Vec<usize> = dropped.iter().flatten().copied().collect();
        let distinct: BTreeSet<usize> = all.iter().copied().collect();
        assert_eq!(distinct.len(), all.len(), "drop_last repeats nothing");
    }
    // The first epoch's order is not the identity, and the seed matters.
    let one = DistributedSampler::new(100, 1, 0).unwrap();
    assert_ne!(one.indices(), (0..100).collect::<Vec<_>>());
    assert_ne!(one.indices(), one.clone().seed(1).indices());
}

#[test]
fn bad_ranks_are_refused() {
    let msg = DistributedSampler::new(10, 2, 2).unwrap_err().to_string();
    assert!(msg.contains("rank 2 with num_replicas 2"), "{msg}");
    assert!(DistributedSampler::new(10, 0, 0).is_err());
}

fn counting(n: usize) -> Arc<ImageDataset> {
    let pixels = (0..n).flat_map(|i| [(i % 256) as u8; 4]).collect();
    let labels = (0..n).map(|i| (i % 2) as i64).collect();
    let classes = vec!["a".into(), "b".into()];
    Arc::new(ImageDataset::new("counting", [1, 2, 2], pixels, labels, classes).unwrap())
}

#[test]
fn a_loader_with_a_sampler_reads_its_shard_of_the_loaders_epoch() {
    let data = counting(10);
    let config = DataLoaderConfig {
        batch_size: 2,
        ..Default::default()
    };
    let mut seen = Vec::new();
    for rank in 0..3 {
        let sampler = DistributedSampler::new(10, 3, rank).unwrap().seed(3);
        let mut loader = DataLoader::new(data.clone(), config.clone(), kiln_autograd::Device::Cpu)
            .unwrap()
            .with_sampler(sampler.clone())
            .unwrap();
        assert_eq!(loader.len(), 2, "4 samples per rank in batches of 2");
        for epoch in 0..2 {
            let got: Vec<usize> = loader.iter().flat_map(|b| b.unwrap().indices).collect();
            assert_eq!(got, sampler.indices_for_epoch(epoch));
            seen.push((rank, epoch, got));
        }
    }
    let epoch0: BTreeSet<usize> = seen
        .iter()
        .filter(|s| s.1 == 0)
        .flat_map(|s| s.2.clone())
        .collect();
    assert_eq!(epoch0, (0..10).collect());

    let shuffled = DataLoaderConfig {
        shuffle: true,
        ..config.clone()
    };
    let loader = DataLoader::new(data.clone(), shuffled, kiln_autograd::Device::Cpu).unwrap();
    let msg = loader
        .with_sampler(DistributedSampler::new(10, 2, 0).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("set shuffle: false"), "{msg}");
    let loader = DataLoader::new(data, config, kiln_autograd::Device::Cpu).unwrap();
    let msg = loader
        .with_sampler(DistributedSampler::new(9, 2, 0).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("made for 9 samples"), "{msg}");
}

/// A shard that gives no batch is refused when the loader is built, not met as an empty epoch:
/// with `drop_last` a shard smaller than a batch, and a shard of nothing (more ranks than
/// samples with `drop_last`); without `drop_last` a short shard is one short batch.
#[test]
fn shards_that_give_no_batch_are_refused() {
    let data = counting(10);
    let config = |drop_last| DataLoaderConfig {
        batch_size: 4,
        drop_last,
        ..Default::default()
    };
    let cpu = kiln_autograd::Device::Cpu;
    // 10 samples over 4 ranks: shards of 3.
    let sampler = DistributedSampler::new(10, 4, 1).unwrap().shuffle(false);
    let msg = DataLoader::new(data.clone(), config(true), cpu)
        .unwrap()
        .with_sampler(sampler.clone())
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("rank 1's shard has 3 samples, so batch_size 4"),
        "{msg}"
    );
    let mut short = DataLoader::new(data.clone(), config(false), cpu)
        .unwrap()
        .with_sampler(sampler.clone())
        .unwrap();
    assert_eq!(short.len(), 1);
    let got: Vec<Vec<usize>> = short.iter().map(|b| b.unwrap().indices).collect();
    assert_eq!(got, vec![sampler.indices_for_epoch(0)]);
    // 3 samples over 4 ranks with drop_last: nothing for anyone.
    let few = counting(3);
    let empty = DistributedSampler::new(3, 4, 0).unwrap().drop_last(true);
    assert_eq!(empty.num_samples(), 0);
    let msg = DataLoader::new(few, config(false), cpu)
        .unwrap()
        .with_sampler(empty)
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("shard has 0 samples"), "{msg}");
}
