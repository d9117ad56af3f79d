//! Indexing kernels: PyTorch parity for embedding, index_select, gather, scatter and
//! scatter_add (forward and backward), finite-difference checks, and index/shape errors that
//! name the first bad index and its position.

mod common;

use common::*;
use kiln_device::ops::index::{cpu, DimIndex, EmbeddingBackwardOptions, EmbeddingShape};
use kiln_device::ops::KernelError;

const FIXTURE: &str = include_str!("fixtures/index.json");

fn dim(case: &serde_json::Value) -> usize {
    case["dim"].as_u64().unwrap() as usize
}

#[test]
fn embedding_matches_pytorch() {
    let fixture = parse(FIXTURE);
    for case in cases(&fixture, "embedding") {
        let name = case["name"].as_str().unwrap();
        let weight = tensor(case, "weight");
        let indices = tensor(case, "indices").i64();
        let shape = EmbeddingShape {
            num_embeddings: weight.shape[0],
            embedding_dim: weight.shape[1],
        };
        let mut out = vec![0.0f64; indices.len() * shape.embedding_dim];
        cpu::embedding_forward(&shape, &weight.data, &indices, &mut out).unwrap();
        assert_close(
            &format!("{name} output"),
            &out,
            &tensor(case, "output").data,
            F64_TOL,
        );
        let options = EmbeddingBackwardOptions {
            padding_idx: case["padding_idx"].as_i64(),
            scale_grad_by_freq: case["scale_grad_by_freq"].as_bool().unwrap(),
        };
        let mut gw = vec![5.0f32; weight.data.len()];
        let gy = tensor(case, "grad_output").f32();
        cpu::embedding_backward(&shape, &gy, &indices, options, &mut gw).unwrap();
        assert_close(
            &format!("{name} grad_weight"),
            &gw,
            &tensor(case, "grad_weight").data,
            F32_TOL,
        );
    }
}

#[test]
fn index_select_matches_pytorch() {
    let fixture = parse(FIXTURE);
    for case in cases(&fixture, "index_select") {
        let name = case["name"].as_str().unwrap();
        let input = tensor(case, "input");
        let index = tensor(case, "index").i64();
        let mut out = vec![0.0; tensor(case, "output").data.len()];
        cpu::index_select_forward(&input.data, &input.shape, dim(case), &index, &mut out).unwrap();
        assert_close(
            &format!("{name} output"),
            &out,
            &tensor(case, "output").data,
            F64_TOL,
        );
        let mut gin = vec![1.0; input.data.len()];
        let gy = tensor(case, "grad_output").data;
        cpu::index_select_backward(&gy, &input.shape, dim(case), &index, &mut gin).unwrap();
        assert_close(
            &format!("{name} grad_input"),
            &gin,
            &tensor(case, "grad_input").data,
            F64_TOL,
        );
    }
}

#[test]
fn gather_matches_pytorch() {
    let fixture = parse(FIXTURE);
    for case in cases(&fixture, "gather") {
        let name = case["name"].as_str().unwrap();
        let input = tensor(case, "input");
        let index = tensor(case, "index");
        let values = index.i64();
        let di = DimIndex {
            dim: dim(case),
            index: &values,
            shape: &index.shape,
        };
        let mut out = vec![0.0; values.len()];
        cpu::gather_forward(&input.data, &input.shape, di, &mut out).unwrap();
        assert_close(
            &format!("{name} output"),
            &out,
            &tensor(case, "output").data,
            F64_TOL,
        );
        let mut gin = vec![3.0; input.data.len()];
        let gy = tensor(case, "grad_output").data;
        cpu::gather_backward(&gy, di, &input.shape, &mut gin).unwrap();
        assert_close(
            &format!("{name} grad_input"),
            &gin,
            &tensor(case, "grad_input").data,
            F64_TOL,
        );
    }
}

#[test]
fn scatter_and_scatter_add_match_pytorch() {
    let fixture = parse(FIXTURE);
    for (op, adds) in [("scatter_add", true), ("scatter", false)] {
        for case in cases(&fixture, op) {
            let name = format!("{op} {}", case["name"].as_str().unwrap());
            let input = tensor(case, "input");
            let src = tensor(case, "src");
            let index = tensor(case, "index");
            let values = index.i64();
            let di = DimIndex {
                dim: dim(case),
                index: &values,
                shape: &index.shape,
            };
            let mut out = input.data.clone();
            if adds {
                cpu::scatter_add_(&mut out, &input.shape, di, &src.data, &src.shape).unwrap();
            } else {
                cpu::scatter_(&mut out, &input.shape, di, &src.data, &src.shape).unwrap();
            }
            assert_close(
                &format!("{name} output"),
                &out,
                &tensor(case, "output").data,
                F64_TOL,
            );
            // Backward: self gets grad (scatter: with the written positions zeroed), src gets
            // gather(grad, dim, index).
            let gy = tensor(case, "grad_output").data;
            let mut gin = gy.clone();
            if !adds {
                cpu::scatter_value_(&mut gin, &input.shape, di, 0.0).unwrap();
            }
            assert_close(
                &format!("{name} grad_input"),
                &gin,
                &tensor(case, "grad_input").data,
                F64_TOL,
            );
            if has(case, "grad_src") {
                let mut gsrc = vec![0.0; values.len()];
                cpu::gather_forward(&gy, &input.shape, di, &mut gsrc).unwrap();
                assert_close(
                    &format!("{name} grad_src"),
                    &gsrc,
                    &tensor(case, "grad_src").data,
                    F64_TOL,
                );
            }
        }
    }
}

#[test]
fn index_gradients_match_finite_differences() {
    let mut rng = Rng::new(23);
    // gather along dim 1 of [3, 4, 2] with a [3, 5, 2] index (repeats included).
    let input_shape = [3, 4, 2];
    let index_shape = [3, 5, 2];
    let values: Vec<i64> = (0..30).map(|_| rng.below(4) as i64).collect();
    let di = DimIndex {
        dim: 1,
        index: &values,
        shape: &index_shape,
    };
    let x = rng.vec(24);
    let upstream = rng.vec(30);
    let gather_loss = |x: &[f64]| {
        let mut out = vec![0.0; 30];
        cpu::gather_forward(x, &input_shape, di, &mut out).unwrap();
        dot(&out, &upstream)
    };
    let mut gin = vec![0.0; 24];
    cpu::gather_backward(&upstream, di, &input_shape, &mut gin).unwrap();
    check_gradient("gather", gather_loss, &x, &gin, 1e-6);

    // index_select along dim 0 and embedding with padding.
    let index = [2i64, 0, 2, 1];
    let sel_upstream = rng.vec(4 * 4 * 2);
    let select_loss = |x: &[f64]| {
        let mut out = vec![0.0; 32];
        cpu::index_select_forward(x, &input_shape, 0, &index, &mut out).unwrap();
        dot(&out, &sel_upstream)
    };
    let mut gin = vec![0.0; 24];
    cpu::index_select_backward(&sel_upstream, &input_shape, 0, &index, &mut gin).unwrap();
    check_gradient("index_select", select_loss, &x, &gin, 1e-6);

    let shape = EmbeddingShape {
        num_embeddings: 6,
        embedding_dim: 4,
    };
    let ids = [3i64, 0, 3, 5, 1];
    let emb_upstream = rng.vec(20);
    let emb_loss = |w: &[f64]| {
        let mut out = vec![0.0; 20];
        cpu::embedding_forward(&shape, w, &ids, &mut out).unwrap();
        dot(&out, &emb_upstream)
    };
    let mut gw = vec![0.0; 24];
    cpu::embedding_backward(&shape, &emb_upstream, &ids, Default::default(), &mut gw).unwrap();
    check_gradient("embedding", emb_loss, &x, &gw, 1e-6);

    // scatter_add: linear in both self and src.
    let src_shape = [3, 5, 2];
    let dest = rng.vec(24);
    let src = rng.vec(30);
    let out_upstream = rng.vec(24);
    let scatter_loss = |d: &[f64], s: &[f64]| {
        let mut out = d.to_vec();
        cpu::scatter_add_(&mut out, &input_shape, di, s, &src_shape).unwrap();
        dot(&out, &out_upstream)
    };
    let mut gsrc = vec![0.0; 30];
    cpu::gather_forward(&out_upstream, &input_shape, di, &mut gsrc).unwrap();
    check_gradient(
        "scatter_add src",
        |s| scatter_loss(&dest, s),
        &src,
        &gsrc,
        1e-6,
    );
    check_gradient(
        "scatter_add self",
        |d| scatter_loss(d, &src),
        &dest,
        &out_upstream,
        1e-6,
    );
}

#[test]
fn bad_indices_name_the_first_offender_and_its_position() {
    let input_shape = [2, 3];
    let input = [0.0f32; 6];
    let values = [0i64, 2, 1, 3, -1, 0];
    let di = DimIndex {
        dim: 1,
        index: &values,
        shape: &[2, 3],
    };
    let mut out = [9.0f32; 6];
    let err = cpu::gather_forward(&input, &input_shape, di, &mut out).unwrap_err();
    assert_eq!(
        err,
        KernelError::IndexOutOfRange {
            op: "gather",
            index: 3,
            position: vec![1, 0],
            dim: 1,
            size: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "gather: index 3 at position [1, 0] of the index tensor is out of range for dimension 1 of \
         size 3; every index must lie in [0, 3)"
    );
    assert_eq!(out, [9.0; 6], "nothing is written before validation");

    let mut dest = [0.0f64; 6];
    let values = [0i64, -2];
    let di = DimIndex {
        dim: 0,
        index: &values,
        shape: &[1, 2],
    };
    let err = cpu::scatter_add_(&mut dest, &input_shape, di, &[1.0, 1.0], &[1, 2]).unwrap_err();
    assert!(
        matches!(err, KernelError::IndexOutOfRange { index: -2, ref position, dim: 0, size: 2, .. } if *position == vec![0, 1])
    );

    let shape = EmbeddingShape {
        num_embeddings: 4,
        embedding_dim: 2,
    };
    let err = cpu::embedding_forward(&shape, &[0.0f32; 8], &[1, 4], &mut [0.0; 4]).unwrap_err();
    assert!(matches!(
        err,
        KernelError::IndexOutOfRange {
            op: "embedding",
            index: 4,
            size: 4,
            ..
        }
    ));
    let options = EmbeddingBackwardOptions {
        padding_idx: Some(-5),
        scale_grad_by_freq: false,
    };
    let err =
        cpu::embedding_backward(&shape, &[0.0f32; 4], &[1, 2], options, &mut [0.0; 8]).unwrap_err();
    assert_eq!(
        err,
        KernelError::PaddingIdxOutOfRange {
            op: "embedding_backward",
            padding_idx: -5,
            num_embeddings: 4
        }
    );

    let err = cpu::index_select_forward(&input, &input_shape, 2, &[0], &mut [0.0; 2]).unwrap_err();
    assert_eq!(
        err,
        KernelError::DimOutOfRange {
            op: "index_select",
            dim: 2,
            ndim: 2
        }
    );
}

#[test]
fn index_shapes_follow_pytorch_rules() {
    let input = [0.0f64; 6];
    // gather: index larger than the input in a dim other than `dim`.
    let values = [0i64; 3];
    let di = DimIndex {
        dim: 1,
        index: &values,
        shape: &[3, 1],
    };
    let err = cpu::gather_forward(&input, &[2, 3], di, &mut [0.0; 3]).unwrap_err();
    assert!(err.to_string().contains("dim 0 has size 3 > 2"), "{err}");
    // gather: index larger along `dim` itself is fine.
    let values = [0i64, 1, 2, 2, 1, 0, 0, 0];
    let di = DimIndex {
        dim: 1,
        index: &values,
        shape: &[2, 4],
    };
    let mut out = [0.0; 8];
    cpu::gather_forward(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], di, &mut out).unwrap();
    assert_eq!(out, [1.0, 2.0, 3.0, 3.0, 5.0, 4.0, 4.0, 4.0]);
    // gather: rank mismatch.
    let di = DimIndex {
        dim: 0,
        index: &values,
        shape: &[8],
    };
    let err = cpu::gather_forward(&input, &[2, 3], di, &mut [0.0; 8]).unwrap_err();
    assert!(
        err.to_string()
            .contains("the index needs as many dims as the input [2, 3]"),
        "{err}"
    );
    // scatter: index larger than src.
    let values = [0i64; 4];
    let di = DimIndex {
        dim: 0,
        index: &values,
        shape: &[2, 2],
    };
    let err = cpu::scatter_(&mut [0.0; 6], &[2, 3], di, &[1.0; 2], &[2, 1]).unwrap_err();
    assert!(
        err.to_string()
            .contains("no larger than src [2, 1] in every dim"),
        "{err}"
    );
    // scatter: repeated indices, last write wins (row-major order).
    let values = [1i64, 1, 1];
    let di = DimIndex {
        dim: 1,
        index: &values,
        shape: &[1, 3],
    };
    let mut dest = [0i32; 3];
    cpu::scatter_(&mut dest, &[1, 3], di, &[7, 8, 9], &[1, 3]).unwrap();
    assert_eq!(dest, [0, 9, 0]);
}
