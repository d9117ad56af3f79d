//! Two papercuts: bare parameter lists (`module.parameters()`) go to the clip functions and the
//! optimizers without naming them first, and the infinity and negative norms of an empty
//! gradient are refused as PyTorch 2.15 refuses them, while an empty list (or no gradients)
//! totals 0 as there.

use kiln_autograd::{DType, Device, Parameter, Tensor};
use kiln_optim::{
    clip_coef_for, clip_grad_norm_, clip_grad_norm_on_device, clip_grad_value_,
    clip_grads_with_norm_, get_total_norm, AdamOptions, AdamW, Error, Optimizer, ParamGroup, Sgd,
    SgdOptions,
};

fn param_with_grad(values: &[f32], grad: &[f32]) -> Parameter {
    let t = |v: &[f32]| Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu).unwrap();
    let p = Parameter::new(t(values)).unwrap();
    p.set_grad(Some(t(grad))).unwrap();
    p
}

fn grads(ps: &[Parameter]) -> Vec<Vec<f32>> {
    ps.iter()
        .map(|p| p.grad().unwrap().to_vec::<f32>().unwrap())
        .collect()
}

#[test]
fn clip_functions_take_bare_parameters_and_name_them_by_place() {
    let ps = vec![
        param_with_grad(&[0.0, 0.0], &[3.0, 0.0]),
        param_with_grad(&[0.0], &[4.0]),
    ];
    // |(3, 0, 4)| = 5; clipping to 1 scales by 1 / (5 + 1e-6).
    let info = clip_coef_for(&ps, 1.0, 2.0, false).unwrap();
    assert_eq!(info.total_norm, 5.0);
    assert_eq!(clip_grad_norm_(&ps, 1.0, 2.0, false).unwrap(), 5.0);
    let coef = 1.0 / (5.0 + 1e-6);
    assert_eq!(
        grads(&ps),
        vec![vec![(3.0 * coef) as f32, 0.0], vec![(4.0 * coef) as f32]]
    );
    clip_grads_with_norm_(&ps, 0.5, 1.0).unwrap();
    clip_grad_value_(&ps, 0.25).unwrap();
    assert_eq!(grads(&ps)[0][0], 0.25);
    let total = clip_grad_norm_on_device(&ps, 10.0, 1.0, false).unwrap();
    assert_eq!(total.item().unwrap(), f64::from(0.25f32 + grads(&ps)[1][0]));

    let bad = vec![
        param_with_grad(&[0.0], &[1.0]),
        param_with_grad(&[0.0], &[f32::NAN]),
    ];
    let err = clip_grad_norm_(&bad, 1.0, 2.0, true).unwrap_err();
    assert!(
        matches!(&err, Error::NonFiniteNorm { name, .. } if name == "param[1]"),
        "{err}"
    );
    // Parameters without a gradient are skipped, and the name is still the place in the list.
    let without = Parameter::new(Tensor::zeros(&[1], DType::F32, Device::Cpu).unwrap()).unwrap();
    let bad = vec![without.clone(), without, bad[0].clone(), bad[1].clone()];
    let err = clip_grad_norm_(&bad, 1.0, 2.0, true).unwrap_err();
    assert!(
        matches!(&err, Error::NonFiniteNorm { name, .. } if name == "param[3]"),
        "{err}"
    );
}

#[test]
fn optimizers_take_bare_parameter_lists_and_groups_convert_from_them() {
    let (a, b) = (
        param_with_grad(&[1.0, 2.0], &[0.5, -1.0]),
        param_with_grad(&[3.0], &[2.0]),
    );
    // PyTorch's SGD(model.parameters(), lr=0.1): p - 0.1 g.
    let mut sgd = Sgd::new(vec![a.clone(), b.clone()], SgdOptions::default().lr(0.1)).unwrap();
    sgd.step().unwrap();
    assert_eq!(
        a.tensor().to_vec::<f32>().unwrap(),
        vec![1.0 - 0.1 * 0.5, 2.0 + 0.1]
    );
    assert_eq!(b.tensor().to_vec::<f32>().unwrap(), vec![3.0 - 0.1 * 2.0]);
    assert_eq!(sgd.num_groups(), 1);

    let group: ParamGroup = vec![a.clone(), b.clone()].into();
    let names: Vec<&str> = group.params().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["param[0]", "param[1]"]);
    let head = param_with_grad(&[0.0], &[1.0]);
    let opt = AdamW::new(
        vec![
            ParamGroup::from(vec![a, b]).lr(1e-4),
            ParamGroup::from(vec![("fc.weight".to_string(), head)]).lr(1e-2),
        ],
        AdamOptions::adamw(),
    )
    .unwrap();
    assert_eq!((opt.lr(0).unwrap(), opt.lr(1).unwrap()), (1e-4, 1e-2));
}

#[test]
fn the_infinity_and_negative_norms_of_an_empty_gradient_are_refused_as_in_pytorch() {
    // PyTorch 2.15: clip_grad_norm_([p(2), p(0)], 1.0, norm_type=inf) raises "cannot compute
    // the infinity norm on an empty tensor because the operation does not have an identity"
    // (-inf and any negative p: the same from linalg.vector_norm, whose sum of |x|^p over
    // nothing would be raised to 1/p < 0), foreach or not.
    for (norm_type, which) in [
        (f64::INFINITY, "infinity"),
        (f64::NEG_INFINITY, "-infinity"),
        (-0.5, "-0.5"),
        (-2.0, "-2"),
    ] {
        let ps = vec![
            param_with_grad(&[0.0, 0.0], &[3.0, 3.0]),
            param_with_grad(&[], &[]),
        ];
        let errs = [
            clip_grad_norm_(&ps, 1.0, norm_type, false).map(|_| ()),
            clip_grad_norm_on_device(&ps, 1.0, norm_type, false).map(|_| ()),
            clip_coef_for(&ps, 1.0, norm_type, false).map(|_| ()),
        ];
        for err in errs {
            let err = err.unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
            let msg = err.to_string();
            assert!(msg.contains("param[1] has no elements"), "{msg}");
            assert!(
                msg.contains(&format!("the {which} norm of an empty tensor")),
                "{msg}"
            );
        }
        // Refused before anything was scaled.
        assert_eq!(grads(&ps), vec![vec![3.0, 3.0], vec![]]);
        let empty = Tensor::zeros(&[0], DType::F32, Device::Cpu).unwrap();
        let msg = get_total_norm(&[empty], norm_type, false)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("tensor[0] has no elements"), "{msg}");
    }
    // Finite norms of an empty gradient are 0, as in PyTorch: |(3, 3)| = sqrt(18).
    let ps = vec![
        param_with_grad(&[0.0, 0.0], &[3.0, 3.0]),
        param_with_grad(&[], &[]),
    ];
    assert_eq!(
        clip_grad_norm_(&ps, 100.0, 2.0, false).unwrap(),
        18f64.sqrt()
    );

    // An empty list, or parameters without gradients: 0 for every norm, inf included, as
    // PyTorch returns tensor(0.).
    let none: Vec<Parameter> = Vec::new();
    let no_grad =
        vec![Parameter::new(Tensor::zeros(&[3], DType::F32, Device::Cpu).unwrap()).unwrap()];
    for norm_type in [2.0, 1.0, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(clip_grad_norm_(&none, 1.0, norm_type, false).unwrap(), 0.0);
        assert_eq!(
            clip_grad_norm_(&no_grad, 1.0, norm_type, true).unwrap(),
            0.0
        );
        assert_eq!(get_total_norm(&[], norm_type, false).unwrap(), 0.0);
        let on_device = clip_grad_norm_on_device(&none, 1.0, norm_type, false).unwrap();
        assert_eq!(on_device.item().unwrap(), 0.0);
    }
}
