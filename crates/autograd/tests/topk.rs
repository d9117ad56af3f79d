//! `Tensor::topk` along any dim against `torch.topk`'s values and indices, its gradient (to the
//! selected elements only, as PyTorch's), a 0-d tensor, and the error for `k` past the dim.

use kiln_autograd::{Device, Tensor};

fn t(values: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(values, shape, Device::Cpu).unwrap()
}

#[test]
fn topk_along_each_dim_matches_torch() {
    // x = [[0.3, -1.2, 2.5], [0.9, -0.4, 4.0]]
    let x = t(vec![0.3, -1.2, 2.5, 0.9, -0.4, 4.0], &[2, 3]);
    // torch.topk(x, 2, dim=1): values [[2.5, 0.3], [4.0, 0.9]], indices [[2, 0], [2, 0]]
    let (v, i) = x.topk(2, 1, true, true).unwrap();
    assert_eq!(v.shape(), &[2, 2]);
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![2.5, 0.3, 4.0, 0.9]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![2, 0, 2, 0]);
    // torch.topk(x, 1, dim=0, largest=False): values [[0.3, -1.2, 2.5]], indices [[0, 0, 0]]
    let (v, i) = x.topk(1, 0, false, true).unwrap();
    assert_eq!(v.shape(), &[1, 3]);
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![0.3, -1.2, 2.5]);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, 0, 0]);
    // dim -2 is dim 0: torch.topk(x, 2, dim=-2): values [[0.9, -0.4, 4.0], [0.3, -1.2, 2.5]],
    // indices [[1, 1, 1], [0, 0, 0]]
    let (v, i) = x.topk(2, -2, true, false).unwrap();
    assert_eq!(
        v.to_vec::<f32>().unwrap(),
        vec![0.9, -0.4, 4.0, 0.3, -1.2, 2.5]
    );
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![1, 1, 1, 0, 0, 0]);
    // A 0-d tensor: torch.topk(torch.tensor(5.), 1) is (tensor(5.), tensor(0)).
    let (v, i) = t(vec![5.0], &[]).topk(1, 0, true, true).unwrap();
    assert_eq!((v.shape(), i.shape()), (&[] as &[usize], &[] as &[usize]));
    assert_eq!(
        (v.item().unwrap(), i.to_vec::<i64>().unwrap()),
        (5.0, vec![0])
    );
}

#[test]
fn topk_gradient_reaches_the_selected_elements_only() {
    let x = t(vec![0.3, -1.2, 2.5, 0.9, -0.4, 4.0], &[2, 3])
        .set_requires_grad(true)
        .unwrap();
    let (v, _) = x.topk(2, 1, true, true).unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![2.5, 0.3, 4.0, 0.9]);
    // d/dx sum(v * [1, 2, 3, 4]): 2.5 <- 1, 0.3 <- 2, 4.0 <- 3, 0.9 <- 4; as in PyTorch.
    let w = t(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]);
    v.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![2.0, 0.0, 1.0, 4.0, 0.0, 3.0]
    );
}

#[test]
fn k_past_the_dim_is_an_error_naming_both() {
    let x = t(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let msg = x.topk(3, 0, true, true).unwrap_err().to_string();
    assert!(
        msg.contains("k = 3 is larger than dim 0's 2 elements (shape [2, 3])"),
        "{msg}"
    );
    assert!(x.topk(1, 2, true, true).is_err());
}
