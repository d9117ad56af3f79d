//! Finite-difference gradient checks, in f64 through `Tensor`, for the neural-network and
//! indexing ops: conv2d, the poolings, batch_norm, layer_norm, dropout, embedding,
//! index_select, gather, scatter and scatter_add.

#![allow(clippy::cloned_ref_to_slice_refs)] // `&[x.clone()]` reads better in a table of cases

mod common;

use common::{data, gradcheck};
use kiln_autograd::{
    AvgPool2dParams, BatchNormOptions, Conv2dParams, Device, Generator, MaxPool2dParams, Tensor,
};

fn indices(values: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(values, shape, Device::Cpu).unwrap()
}

#[test]
fn conv2d() {
    let grouped = Conv2dParams {
        stride: [2, 1],
        padding: [1, 0],
        dilation: [1, 2],
        groups: 2,
    };
    gradcheck(
        "conv2d_grouped_strided_dilated_bias",
        &[
            data(1, &[2, 4, 5, 6]),
            data(2, &[4, 2, 3, 2]),
            data(3, &[4]),
        ],
        |t| t[0].conv2d(&t[1], Some(&t[2]), grouped),
    );
    let padded = Conv2dParams {
        padding: [1, 1],
        ..Conv2dParams::default()
    };
    gradcheck(
        "conv2d_padded_no_bias",
        &[data(4, &[1, 2, 4, 4]), data(5, &[3, 2, 3, 3])],
        |t| t[0].conv2d(&t[1], None, padded),
    );
    gradcheck(
        "conv2d_pointwise",
        &[
            data(6, &[2, 3, 3, 3]),
            data(7, &[2, 3, 1, 1]),
            data(8, &[2]),
        ],
        |t| t[0].conv2d(&t[1], Some(&t[2]), Conv2dParams::default()),
    );
}

#[test]
fn pooling() {
    let x = data(10, &[2, 2, 6, 5]);
    let max = MaxPool2dParams {
        stride: [2, 1],
        padding: [1, 1],
        ..MaxPool2dParams::new([3, 3])
    };
    gradcheck("max_pool2d", &[x.clone()], |t| t[0].max_pool2d(max));
    let dilated = MaxPool2dParams {
        dilation: [2, 1],
        ceil_mode: true,
        ..MaxPool2dParams::new([2, 2])
    };
    gradcheck("max_pool2d_dilated_ceil", &[x.clone()], |t| {
        t[0].max_pool2d(dilated)
    });
    let avg = AvgPool2dParams {
        stride: [2, 2],
        padding: [1, 1],
        ceil_mode: true,
        count_include_pad: false,
        ..AvgPool2dParams::new([3, 3])
    };
    gradcheck("avg_pool2d", &[x.clone()], |t| t[0].avg_pool2d(avg));
    gradcheck("avg_pool2d_unbatched", &[data(11, &[2, 4, 4])], |t| {
        t[0].avg_pool2d(AvgPool2dParams::new([2, 2]))
    });
    gradcheck("adaptive_avg_pool2d", &[x], |t| {
        t[0].adaptive_avg_pool2d([4, 3])
    });
}

#[test]
fn batch_norm() {
    let x = data(20, &[4, 3, 2, 2]);
    let (w, b) = (data(21, &[3]), data(22, &[3]));
    let running = |seed| {
        (
            data(seed, &[3]).mul_scalar(0.1).unwrap(),
            data(seed + 1, &[3]).abs().unwrap().add_scalar(0.5).unwrap(),
        )
    };
    let (rm, rv) = running(23);
    gradcheck(
        "batch_norm_train_affine",
        &[x.clone(), w.clone(), b.clone()],
        |t| {
            t[0].batch_norm(
                Some(&rm),
                Some(&rv),
                Some(&t[1]),
                Some(&t[2]),
                BatchNormOptions::default(),
            )
        },
    );
    gradcheck("batch_norm_train_plain_2d", &[data(25, &[5, 3])], |t| {
        t[0].batch_norm(None, None, None, None, BatchNormOptions::default())
    });
    let eval = BatchNormOptions {
        training: false,
        ..BatchNormOptions::default()
    };
    gradcheck("batch_norm_eval_affine", &[x, w, b], |t| {
        t[0].batch_norm(Some(&rm), Some(&rv), Some(&t[1]), Some(&t[2]), eval)
    });
}

#[test]
fn layer_norm() {
    gradcheck(
        "layer_norm_affine",
        &[data(30, &[2, 3, 4]), data(31, &[3, 4]), data(32, &[3, 4])],
        |t| t[0].layer_norm(&[3, 4], Some(&t[1]), Some(&t[2]), 1e-5),
    );
    gradcheck("layer_norm_plain", &[data(33, &[4, 5])], |t| {
        t[0].layer_norm(&[5], None, None, 1e-5)
    });
    gradcheck(
        "layer_norm_weight_only",
        &[data(34, &[3, 6]), data(35, &[6])],
        |t| t[0].layer_norm(&[6], Some(&t[1]), None, 1e-5),
    );
}

#[test]
fn dropout() {
    // A fresh generator per call keeps the mask fixed across the finite-difference evaluations.
    gradcheck("dropout", &[data(40, &[4, 6])], |t| {
        t[0].dropout_with(0.4, true, &mut Generator::new(5))
    });
}

#[test]
fn indexing() {
    let table = data(50, &[5, 3]);
    let idx = indices(&[0, 2, 4, 2, 2, 1], &[2, 3]);
    gradcheck("embedding", &[table], |t| {
        Tensor::embedding(&idx, &t[0], None)
    });
    let x = data(51, &[3, 4, 2]);
    let pick = indices(&[3, 0, 3, 1], &[4]);
    gradcheck("index_select", &[x.clone()], |t| {
        t[0].index_select(1, &pick)
    });
    gradcheck("index_select_last", &[x.clone()], |t| {
        t[0].index_select(-1, &indices(&[1, 1, 0], &[3]))
    });
    let gidx = indices(&[0, 3, 3, 1, 2, 0], &[3, 2, 1]);
    gradcheck("gather", &[x], |t| t[0].gather(1, &gidx));
    // scatter: distinct targets per row (with duplicates the overwritten values have no
    // derivative); src larger than the index, so part of it gets zero gradient.
    let sidx = indices(&[4, 0, 2, 1, 3, 0], &[2, 3]);
    gradcheck("scatter", &[data(52, &[3, 5]), data(53, &[3, 4])], |t| {
        t[0].scatter(1, &sidx, &t[1])
    });
    let aidx = indices(&[1, 1, 0, 2, 2, 2, 0, 1], &[4, 2]);
    gradcheck(
        "scatter_add_dim0_duplicates",
        &[data(54, &[3, 2]), data(55, &[4, 3])],
        |t| t[0].scatter_add(0, &aidx, &t[1]),
    );
}

#[test]
fn embedding_padding_idx_gets_no_gradient() {
    let table = data(60, &[4, 2]);
    table.set_requires_grad(true).unwrap();
    let idx = indices(&[1, 3, 1, 0], &[4]);
    let out = Tensor::embedding(&idx, &table, Some(-3)).unwrap(); // row 1
    assert_eq!(out.shape(), [4, 2]);
    assert_eq!(
        out.select(0, 0).unwrap().to_vec::<f64>().unwrap(),
        table.select(0, 1).unwrap().to_vec::<f64>().unwrap()
    );
    out.sum_all().unwrap().backward().unwrap();
    let g = table.grad().unwrap().to_vec::<f64>().unwrap();
    assert_eq!(g, vec![1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
}

#[test]
fn strided_operands_give_the_contiguous_results() {
    // Inputs that are views (permuted, narrowed, transposed) are read through their layouts.
    let nhwc = data(70, &[2, 5, 6, 4]);
    let x = nhwc.permute(&[0, 3, 1, 2]).unwrap();
    assert!(!x.is_contiguous());
    let xc = x.contiguous().unwrap();
    let w = data(71, &[3, 4, 3, 3]).transpose(2, 3).unwrap();
    let p = Conv2dParams::default();
    let same = |a: Tensor, b: Tensor| {
        assert_eq!(a.shape(), b.shape());
        assert_eq!(a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap());
    };
    same(
        x.conv2d(&w, None, p).unwrap(),
        xc.conv2d(&w.contiguous().unwrap(), None, p).unwrap(),
    );
    let mp = MaxPool2dParams::new([2, 2]);
    same(x.max_pool2d(mp).unwrap(), xc.max_pool2d(mp).unwrap());
    let opts = BatchNormOptions::default();
    same(
        x.batch_norm(None, None, None, None, opts).unwrap(),
        xc.batch_norm(None, None, None, None, opts).unwrap(),
    );
    let rows = data(72, &[6, 8]).narrow(1, 2, 5).unwrap();
    same(
        rows.layer_norm(&[5], None, None, 1e-5).unwrap(),
        rows.contiguous()
            .unwrap()
            .layer_norm(&[5], None, None, 1e-5)
            .unwrap(),
    );
    let idx = indices(&[0, 4, 1, 3, 2, 0], &[2, 3]).t().unwrap();
    let m = data(73, &[3, 5]);
    same(
        m.gather(1, &idx).unwrap(),
        m.gather(1, &idx.contiguous().unwrap()).unwrap(),
    );
    gradcheck("conv2d_of_a_permuted_input", &[nhwc], |t| {
        t[0].permute(&[0, 3, 1, 2])?.conv2d(&w, None, p)
    });
}

#[test]
fn backward_computes_only_the_gradients_needed() {
    // Weight and bias gradients are the same whether or not the input wants one.
    let (x, w, b) = (
        data(80, &[2, 3, 5, 5]),
        data(81, &[4, 3, 3, 3]),
        data(82, &[4]),
    );
    let run = |input_grad: bool| {
        let (x, w, b) = (x.detach(), w.detach(), b.detach());
        x.set_requires_grad(input_grad).unwrap();
        w.set_requires_grad(true).unwrap();
        b.set_requires_grad(true).unwrap();
        let y = x.conv2d(&w, Some(&b), Conv2dParams::default()).unwrap();
        let n = y
            .batch_norm(None, None, None, None, BatchNormOptions::default())
            .unwrap();
        n.square().unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(x.grad().is_some(), input_grad);
        (
            w.grad().unwrap().to_vec::<f64>().unwrap(),
            b.grad().unwrap().to_vec::<f64>().unwrap(),
        )
    };
    assert_eq!(run(true), run(false));
}
