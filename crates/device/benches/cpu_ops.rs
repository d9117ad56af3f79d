//! Criterion micro-benchmarks of CPU kernels through the backend seam (`cargo bench -p
//! kiln-device`): elementwise (binary add, unary exp), reductions (sum of everything, sum of
//! the last dim), f32 matmul at a few sizes and top-5 of 1,000 rows of 1,000 (inference's
//! ranking), with short measurement times. `cargo xtask bench ops` stays the side-by-side
//! report against reference loops. Throughput is in elements, except for matmul, whose
//! "elements" are its 2·n³ floating-point operations (so Gelem/s reads as GFLOP/s).

// criterion_group! defines a public `fn benches` that cannot carry a doc comment.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln_device::prelude::*;
use kiln_device::{BinaryOp, CpuStorage, Layout, ReduceOp, UnaryOp};
use std::hint::black_box;
use std::time::Duration;

/// `n` deterministic values in [-1, 1].
fn values(n: usize) -> CpuStorage {
    CpuStorage::from_vec(
        (0..n)
            .map(|i| ((i as f32) * 0.37).sin())
            .collect::<Vec<f32>>(),
    )
}

fn elementwise(c: &mut Criterion) {
    let mut group = c.benchmark_group("elementwise_f32");
    for n in [1 << 12, 1 << 20] {
        let (a, b) = (values(n), values(n));
        let layout = Layout::contiguous(&[n]);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("add", n), &n, |bench, _| {
            bench.iter(|| black_box(a.binary(&layout, &b, &layout, BinaryOp::Add).expect("add")))
        });
        group.bench_with_input(BenchmarkId::new("exp", n), &n, |bench, _| {
            bench.iter(|| black_box(a.unary(&layout, UnaryOp::Exp).expect("exp")))
        });
    }
    group.finish();
}

fn reduce(c: &mut Criterion) {
    let mut group = c.benchmark_group("reduce_f32");
    let (rows, cols) = (1024usize, 1024usize);
    let a = values(rows * cols);
    let layout = Layout::contiguous(&[rows, cols]);
    group.throughput(Throughput::Elements((rows * cols) as u64));
    group.bench_function("sum_all_1024x1024", |bench| {
        bench.iter(|| black_box(a.reduce(&layout, &[0, 1], ReduceOp::Sum).expect("sum")))
    });
    group.bench_function("sum_last_dim_1024x1024", |bench| {
        bench.iter(|| black_box(a.reduce(&layout, &[1], ReduceOp::Sum).expect("sum")))
    });
    group.finish();
}

fn matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul_f32");
    group.sample_size(20);
    for n in [64usize, 256, 512] {
        let (a, b) = (values(n * n), values(n * n));
        let layout = Layout::contiguous(&[n, n]);
        group.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, _| {
            bench.iter(|| black_box(a.matmul(&layout, &b, &layout).expect("matmul")))
        });
    }
    group.finish();
}

fn topk(c: &mut Criterion) {
    let mut group = c.benchmark_group("topk_f32");
    let (rows, cols) = (1000usize, 1000usize);
    let a = values(rows * cols);
    let layout = Layout::contiguous(&[rows, cols]);
    group.throughput(Throughput::Elements((rows * cols) as u64));
    group.bench_function("top5_of_1000x1000", |bench| {
        bench.iter(|| black_box(a.topk_last_dim(&layout, 5, true).expect("topk")))
    });
    group.finish();
}

fn short() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = short();
    targets = elementwise, reduce, matmul, topk
}
criterion_main!(benches);
