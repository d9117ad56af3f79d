//! Bad shapes, parameters and indices for the neural-network and indexing ops: each error names
//! the op, the problem and the fix. Also the dropout statistics (fraction zeroed, exact scaling,
//! identity in evaluation).

mod common;

use common::data;
use kiln_autograd::{
    manual_seed, AvgPool2dParams, BatchNormOptions, Conv2dParams, DType, Device, Generator,
    MaxPool2dParams, Result, Tensor,
};

/// The error message of `r`, which must be an error.
#[track_caller]
fn message(r: Result<Tensor>) -> String {
    match r {
        Ok(t) => panic!("expected an error, got {t:?}"),
        Err(e) => e.to_string(),
    }
}

#[track_caller]
fn assert_mentions(r: Result<Tensor>, parts: &[&str]) {
    let m = message(r);
    for p in parts {
        assert!(m.contains(p), "message {m:?} lacks {p:?}");
    }
}

fn indices(values: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(values, shape, Device::Cpu).unwrap()
}

#[test]
fn conv2d_errors() {
    let x = data(1, &[2, 4, 6, 6]);
    let w = data(2, &[6, 4, 3, 3]);
    let p = Conv2dParams::default();
    assert_mentions(
        data(3, &[4, 6, 6]).conv2d(&w, None, p),
        &["conv2d", "[4, 6, 6]", "4-D", "unsqueeze(0)"],
    );
    let grouped = Conv2dParams { groups: 3, ..p };
    assert_mentions(
        x.conv2d(&w, None, grouped),
        &["conv2d", "in_channels = 4", "not divisible by groups = 3"],
    );
    assert_mentions(
        x.conv2d(&data(4, &[6, 3, 3, 3]), None, p),
        &[
            "conv2d",
            "weight shape [6, 3, 3, 3]",
            "in_channels / groups = 4 / 1 = 4",
        ],
    );
    assert_mentions(
        x.conv2d(&w, Some(&data(5, &[4])), p),
        &["conv2d", "bias [4] must be [6]"],
    );
    let zero_stride = Conv2dParams {
        stride: [0, 1],
        ..p
    };
    assert_mentions(
        x.conv2d(&w, None, zero_stride),
        &["conv2d", "`stride` is 0"],
    );
    assert_mentions(
        x.conv2d(&data(6, &[6, 4, 7, 3]), None, p),
        &[
            "conv2d",
            "height of the dilated kernel (7)",
            "padded input height (6)",
        ],
    );
    assert_mentions(
        x.conv2d(&w.to_dtype(DType::F32).unwrap(), None, p),
        &["conv2d", "dtypes differ"],
    );
}

#[test]
fn pooling_errors() {
    let x = data(10, &[1, 2, 5, 5]);
    let padded = MaxPool2dParams {
        padding: [2, 0],
        ..MaxPool2dParams::new([3, 3])
    };
    assert_mentions(
        x.max_pool2d(padded),
        &["max_pool2d", "padding 2 along height", "kernel_size / 2"],
    );
    assert_mentions(
        x.avg_pool2d(AvgPool2dParams::new([6, 2])),
        &["avg_pool2d", "exceeds the padded input height (5)"],
    );
    assert_mentions(
        x.adaptive_avg_pool2d([0, 2]),
        &["adaptive_avg_pool2d", "`output_size` is 0"],
    );
    assert_mentions(
        data(11, &[5, 5]).max_pool2d(MaxPool2dParams::new([2, 2])),
        &["max_pool2d", "[5, 5]", "[N, C, H, W]"],
    );
}

#[test]
fn norm_errors() {
    let x = data(20, &[4, 3, 2]);
    let train = BatchNormOptions::default();
    let eval = BatchNormOptions {
        training: false,
        ..train
    };
    assert_mentions(
        x.batch_norm(None, None, None, None, eval),
        &[
            "batch_norm",
            "running_mean and running_var",
            "training = true",
        ],
    );
    assert_mentions(
        x.batch_norm(None, None, Some(&data(21, &[4])), None, train),
        &["batch_norm", "weight has shape [4]", "needs [3]"],
    );
    let rm = data(22, &[3]);
    assert_mentions(
        x.batch_norm(Some(&rm), None, None, None, train),
        &["batch_norm", "pass both or neither"],
    );
    assert_mentions(
        data(23, &[1, 3]).batch_norm(None, None, None, None, train),
        &["batch_norm", "more than 1 value per channel", "got 1"],
    );
    assert_mentions(
        data(24, &[3]).batch_norm(None, None, None, None, train),
        &["batch_norm", "at least 2 dims"],
    );
    assert_mentions(
        x.batch_norm(Some(&rm), Some(&rm), None, None, train),
        &["batch_norm", "shares its storage"],
    );
    assert_mentions(
        x.layer_norm(&[3], None, None, 1e-5),
        &[
            "layer_norm",
            "normalized_shape [3]",
            "suffix of the input shape [4, 3, 2]",
        ],
    );
    assert_mentions(
        x.layer_norm(&[3, 2], Some(&data(25, &[6])), None, 1e-5),
        &["layer_norm", "weight has shape [6]", "needs [3, 2]"],
    );
}

#[test]
fn index_errors() {
    let x = data(30, &[2, 3]);
    assert_mentions(
        x.gather(1, &indices(&[0, 1, 5, 0], &[2, 2])),
        &[
            "gather",
            "index 5 at position [1, 0]",
            "dimension 1 of size 3",
        ],
    );
    assert_mentions(
        x.index_select(0, &indices(&[1, -1], &[2])),
        &["index_select", "index -1 at position [1]", "[0, 2)"],
    );
    let table = data(31, &[4, 2]);
    assert_mentions(
        Tensor::embedding(&indices(&[0, 1, 2, 3, 3, 9], &[2, 3]), &table, None),
        &["embedding", "index 9 at position [1, 2]", "size 4"],
    );
    assert_mentions(
        Tensor::embedding(&indices(&[0], &[1]), &table, Some(4)),
        &["embedding", "padding_idx 4", "-4 <= padding_idx < 4"],
    );
    assert_mentions(
        x.scatter_add(1, &indices(&[0, 3], &[1, 2]), &data(32, &[1, 2])),
        &["scatter_add", "index 3 at position [0, 1]"],
    );
    assert_mentions(
        x.scatter(1, &indices(&[0, 1, 1], &[3, 1]), &data(33, &[3, 1])),
        &[
            "scatter",
            "index",
            "[3, 1]",
            "no larger than self [2, 3] in every dim but 1",
        ],
    );
    assert_mentions(
        x.gather(1, &x.to_dtype(DType::F32).unwrap()),
        &["gather", "int64", "to_dtype(DType::I64)"],
    );
    assert_mentions(
        x.index_select(2, &indices(&[0], &[1])),
        &["index_select", "dim 2 is out of range"],
    );
    assert_mentions(
        x.index_select(0, &indices(&[0, 1], &[1, 2])),
        &["index_select", "must be 1-D"],
    );
}

#[test]
fn dropout_errors() {
    let x = data(40, &[3]);
    for p in [1.0, -0.1, 1.5, f64::NAN] {
        assert_mentions(x.dropout(p, true), &["dropout", "must lie in [0, 1)"]);
    }
}

#[test]
fn dropout_zeroes_a_fraction_p_and_scales_the_rest_exactly() {
    let n = 40_000;
    let x = Tensor::ones(&[n], DType::F32, Device::Cpu).unwrap();
    let p = 0.3;
    let y = x.dropout_with(p, true, &mut Generator::new(7)).unwrap();
    let v = y.to_vec::<f32>().unwrap();
    let zeros = v.iter().filter(|&&e| e == 0.0).count();
    let kept = (1.0 / (1.0 - p)) as f32;
    assert!(
        v.iter().all(|&e| e == 0.0 || e == kept),
        "values other than 0 and 1/(1-p)"
    );
    // 3 standard deviations of the zeroed fraction: sqrt(p (1 - p) / n) = 0.0023.
    let fraction = zeros as f64 / n as f64;
    assert!((fraction - p).abs() < 0.007, "zeroed fraction {fraction}");
    // The same seed gives the same mask; another seed a different one.
    let again = x.dropout_with(p, true, &mut Generator::new(7)).unwrap();
    assert_eq!(again.to_vec::<f32>().unwrap(), v);
    let other = x.dropout_with(p, true, &mut Generator::new(8)).unwrap();
    assert_ne!(other.to_vec::<f32>().unwrap(), v);
    // The default generator is reproducible after manual_seed.
    manual_seed(11);
    let a = x.dropout(0.5, true).unwrap().to_vec::<f32>().unwrap();
    manual_seed(11);
    let b = x.dropout(0.5, true).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, b);
}

#[test]
fn dropout_is_the_identity_in_eval_and_at_p_zero_and_its_gradient_is_the_mask() {
    let x = data(41, &[5, 4]);
    for y in [
        x.dropout(0.5, false).unwrap(),
        x.dropout(0.0, true).unwrap(),
    ] {
        assert!(y.shares_storage_with(&x));
        assert_eq!(y.to_vec::<f64>().unwrap(), x.to_vec::<f64>().unwrap());
    }
    let leaf = Tensor::ones(&[1000], DType::F64, Device::Cpu).unwrap();
    leaf.set_requires_grad(true).unwrap();
    let y = leaf
        .dropout_with(0.25, true, &mut Generator::new(3))
        .unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(
        leaf.grad().unwrap().to_vec::<f64>().unwrap(),
        y.to_vec::<f64>().unwrap(),
        "d(sum(dropout(x)))/dx is the scaled mask, which for x = 1 is the output"
    );
}
