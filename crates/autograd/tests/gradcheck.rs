//! Finite-difference gradient checks, in f64, for every op that has a backward.

#![allow(clippy::cloned_ref_to_slice_refs)] // `&[x.clone()]` reads better in a table of cases

mod common;

use common::{data, gradcheck};
use kiln_autograd::Tensor;

fn positive(seed: u64, shape: &[usize]) -> Tensor {
    data(seed, shape).abs().unwrap().add_scalar(0.5).unwrap()
}

#[test]
fn unary_ops() {
    let x = data(1, &[3, 4]);
    let p = positive(2, &[3, 4]);
    type Op = fn(&Tensor) -> kiln_autograd::Result<Tensor>;
    let cases: Vec<(&str, Op, &Tensor)> = vec![
        ("neg", Tensor::neg, &x),
        ("exp", Tensor::exp, &x),
        ("log", Tensor::log, &p),
        ("sqrt", Tensor::sqrt, &p),
        ("rsqrt", Tensor::rsqrt, &p),
        ("abs", Tensor::abs, &x),
        ("relu", Tensor::relu, &x),
        ("gelu", Tensor::gelu, &x),
        ("gelu_tanh", Tensor::gelu_tanh, &x),
        ("sigmoid", Tensor::sigmoid, &x),
        ("tanh", Tensor::tanh, &x),
        ("silu", Tensor::silu, &x),
        ("erf", Tensor::erf, &x),
        ("recip", Tensor::recip, &p),
        ("square", Tensor::square, &x),
    ];
    for (name, op, input) in cases {
        gradcheck(name, &[input.clone()], |t| op(&t[0]));
    }
}

#[test]
fn broadcasting_binary_ops() {
    let a = data(3, &[2, 3, 4]);
    let b = data(4, &[3, 1]);
    let pa = positive(5, &[2, 3, 4]);
    gradcheck("add", &[a.clone(), b.clone()], |t| t[0].add(&t[1]));
    gradcheck("sub", &[a.clone(), b.clone()], |t| t[0].sub(&t[1]));
    gradcheck("mul", &[a.clone(), b.clone()], |t| t[0].mul(&t[1]));
    gradcheck("div", &[a.clone(), positive(6, &[3, 1])], |t| {
        t[0].div(&t[1])
    });
    gradcheck("pow", &[pa.clone(), b.clone()], |t| t[0].pow(&t[1]));
    gradcheck("maximum", &[a.clone(), b.clone()], |t| t[0].maximum(&t[1]));
    gradcheck("minimum", &[a.clone(), b.clone()], |t| t[0].minimum(&t[1]));
    gradcheck("scalars", &[a.clone()], |t| {
        t[0].add_scalar(1.5)?
            .mul_scalar(-2.0)?
            .sub_scalar(0.25)?
            .div_scalar(3.0)?
            .rsub_scalar(1.0)
    });
    gradcheck("pow_scalar", &[pa], |t| t[0].pow_scalar(2.5));
    gradcheck("clamp", &[a], |t| t[0].clamp(-0.5, 0.5));
}

#[test]
fn selection_ops() {
    let a = data(7, &[3, 4]);
    let b = data(8, &[4]);
    let cond = data(9, &[3, 4]).gt_scalar(0.0).unwrap();
    gradcheck("where", &[a.clone(), b], |t| {
        Tensor::where_(&cond, &t[0], &t[1])
    });
    gradcheck("masked_fill", &[a.clone()], |t| {
        t[0].masked_fill(&cond, 7.0)
    });
    let m = data(10, &[2, 4, 5]);
    gradcheck("triu", &[m.clone()], |t| t[0].triu(1));
    gradcheck("tril", &[m], |t| t[0].tril(-1));
}

#[test]
fn reductions() {
    let x = data(11, &[3, 4, 5]);
    gradcheck("sum", &[x.clone()], |t| t[0].sum(&[0, 2], false));
    gradcheck("sum_keepdim", &[x.clone()], |t| t[0].sum(&[-1], true));
    gradcheck("sum_all", &[x.clone()], |t| t[0].sum_all());
    gradcheck("mean", &[x.clone()], |t| t[0].mean(&[1], true));
    gradcheck("amax", &[x.clone()], |t| t[0].amax(&[2], false));
    gradcheck("amin", &[x.clone()], |t| t[0].amin(&[0, 1], true));
    gradcheck("max_dim", &[x.clone()], |t| Ok(t[0].max_dim(1, false)?.0));
    gradcheck("min_dim", &[x.clone()], |t| Ok(t[0].min_dim(-1, true)?.0));
    gradcheck("max_all", &[x.clone()], |t| t[0].max_all());
    gradcheck("var", &[x.clone()], |t| t[0].var(&[1], 1, false));
    gradcheck("var_population", &[x.clone()], |t| {
        t[0].var(&[0, 2], 0, true)
    });
    gradcheck("std", &[x.clone()], |t| t[0].std(&[2], 1, false));
    gradcheck("logsumexp", &[x.clone()], |t| t[0].logsumexp(&[1], false));
    gradcheck("norm2", &[x.clone()], |t| t[0].norm(2.0, &[2], false));
    gradcheck("norm1", &[x.clone()], |t| t[0].norm(1.0, &[], false));
    gradcheck("norm3", &[x.clone()], |t| t[0].norm(3.0, &[0], true));
    gradcheck("norm_inf", &[x], |t| t[0].norm(f64::INFINITY, &[1], false));
}

#[test]
fn matmul_and_softmax() {
    gradcheck("matmul_2d", &[data(12, &[3, 4]), data(13, &[4, 2])], |t| {
        t[0].matmul(&t[1])
    });
    gradcheck(
        "matmul_batch_broadcast",
        &[data(14, &[2, 1, 3, 4]), data(15, &[3, 4, 2])],
        |t| t[0].matmul(&t[1]),
    );
    // A batch of matrices times one matrix folds the batch into rows: a dense batch, a
    // transposed one (folded through a copy, since the matrix needs a gradient) and a vector.
    gradcheck(
        "matmul_batch_fold",
        &[data(30, &[2, 3, 4]), data(31, &[4, 2])],
        |t| t[0].matmul(&t[1]),
    );
    gradcheck(
        "matmul_batch_fold_transposed",
        &[data(32, &[3, 4, 2]), data(33, &[4, 5])],
        |t| t[0].transpose(1, 2)?.matmul(&t[1]),
    );
    gradcheck(
        "matmul_batch_fold_vector",
        &[data(34, &[2, 3, 4]), data(35, &[4])],
        |t| t[0].matmul(&t[1]),
    );
    gradcheck(
        "matmul_vec_mat",
        &[data(16, &[4]), data(17, &[2, 4, 3])],
        |t| t[0].matmul(&t[1]),
    );
    gradcheck(
        "matmul_mat_vec",
        &[data(18, &[3, 4]), data(19, &[4])],
        |t| t[0].matmul(&t[1]),
    );
    gradcheck(
        "matmul_transposed",
        &[data(20, &[4, 3]), data(21, &[2, 4])],
        |t| t[0].t()?.matmul(&t[1].t()?),
    );
    let x = data(22, &[2, 3, 4]);
    gradcheck("softmax_last", &[x.clone()], |t| t[0].softmax(-1));
    gradcheck("softmax_mid", &[x.clone()], |t| t[0].softmax(1));
    gradcheck("log_softmax_first", &[x.clone()], |t| t[0].log_softmax(0));
    gradcheck("log_softmax_last", &[x], |t| t[0].log_softmax(2));
}

#[test]
fn views_and_joins() {
    let x = data(23, &[2, 3, 4]);
    gradcheck("view", &[x.clone()], |t| t[0].view(&[6, -1]));
    gradcheck("reshape_after_permute", &[x.clone()], |t| {
        t[0].permute(&[2, 0, 1])?.reshape(&[4, 6])
    });
    gradcheck("transpose", &[x.clone()], |t| t[0].transpose(0, 2));
    gradcheck("unsqueeze_squeeze", &[x.clone()], |t| {
        t[0].unsqueeze(1)?.squeeze_dim(1)?.unsqueeze(-1)
    });
    gradcheck("narrow", &[x.clone()], |t| t[0].narrow(2, 1, 2));
    gradcheck("select", &[x.clone()], |t| t[0].select(1, -1));
    gradcheck("expand", &[data(24, &[3, 1])], |t| t[0].expand(&[2, 3, 5]));
    gradcheck("flatten", &[x.clone()], |t| t[0].flatten(1, 2));
    gradcheck("contiguous", &[x.clone()], |t| {
        t[0].transpose(0, 1)?.contiguous()
    });
    gradcheck("chunk", &[x.clone()], |t| {
        let parts = t[0].chunk(4, 2)?;
        assert_eq!(parts.len(), 4);
        parts[0]
            .mul(&parts[1])?
            .sum(&[], false)?
            .add(&parts[2].sum_all()?)
    });
    gradcheck("cat", &[x.clone(), data(25, &[2, 1, 4])], |t| {
        Tensor::cat(&[t[0].clone(), t[1].clone()], 1)
    });
    gradcheck("stack", &[data(26, &[3, 2]), data(27, &[3, 2])], |t| {
        Tensor::stack(&[t[0].clone(), t[1].clone()], 1)
    });
    gradcheck("split_sizes", &[x], |t| {
        let parts = t[0].split_sizes(&[1, 2], 1)?;
        parts[1].sum(&[1], false)?.mul(&parts[0].squeeze_dim(1)?)
    });
}

#[test]
fn reused_inputs_accumulate_through_the_graph() {
    // x is used three times; the engine must sum all paths.
    gradcheck("diamond", &[data(28, &[4])], |t| {
        let a = t[0].exp()?;
        let b = t[0].mul(&a)?;
        b.add(&t[0].sigmoid()?)?.mul(&t[0])
    });
}
