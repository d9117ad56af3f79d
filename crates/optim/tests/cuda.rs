//! CUDA paths against the CPU: fused SGD steps, GradScaler's fused unscale-and-check (with and
//! without an injected inf, and with a gradient the unscale overflows) and `clip_grad_norm_on_device`. Each test skips (printing why) when
//! no CUDA device is usable, and fails instead under `KILN_REQUIRE_CUDA=1`.

use kiln_autograd::{Device, Parameter, Tensor};
use kiln_optim::{GradScaler, GradScalerOptions, Optimizer, ParamGroup, Sgd, SgdOptions};

const LENS: [usize; 3] = [5, 70_001, 1];

fn params(device: Device) -> Vec<Parameter> {
    LENS.iter()
        .map(|&n| {
            let h: Vec<f32> = (0..n).map(|i| ((i % 11) as f32 - 5.0) * 0.1).collect();
            let t = Tensor::from_vec(h, &[n], Device::Cpu).unwrap();
            Parameter::new(t.to_device(device).unwrap()).unwrap()
        })
        .collect()
}

fn sgd(ps: &[Parameter], o: SgdOptions) -> Sgd {
    let named = ps
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("p.{i}"), p.clone()))
        .collect();
    Sgd::new(vec![ParamGroup::new(named)], o).unwrap()
}

/// Sets the same gradient (a function of `step`, times `mult`) on the CPU and CUDA parameters.
fn set_grads(cpu: &[Parameter], gpu: &[Parameter], dev: Device, step: usize, mult: f32) {
    for (c, g) in cpu.iter().zip(gpu) {
        let v: Vec<f32> = (0..c.numel())
            .map(|i| (((i + step) % 7) as f32 * 0.3 - 0.9) * mult)
            .collect();
        let t = Tensor::from_vec(v, &[c.numel()], Device::Cpu).unwrap();
        c.set_grad(Some(t.clone())).unwrap();
        g.set_grad(Some(t.to_device(dev).unwrap())).unwrap();
    }
}

fn values(p: &Parameter) -> Vec<f32> {
    p.to_vec::<f32>().unwrap()
}

fn grad_values(p: &Parameter) -> Vec<f32> {
    p.grad().unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn sgd_on_a_cuda_device_matches_the_cpu_bitwise() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    let configs = [
        SgdOptions::default().lr(0.1),
        SgdOptions::default()
            .lr(0.05)
            .momentum(0.9)
            .dampening(0.1)
            .weight_decay(0.01),
        SgdOptions::default()
            .lr(0.05)
            .momentum(0.9)
            .nesterov(true)
            .weight_decay(0.02)
            .maximize(true),
    ];
    for o in configs {
        let (cpu, gpu) = (params(Device::Cpu), params(dev));
        let (mut oc, mut og) = (sgd(&cpu, o), sgd(&gpu, o));
        for step in 0..3 {
            set_grads(&cpu, &gpu, dev, step, 1.0);
            oc.step().unwrap();
            og.step().unwrap();
        }
        for (c, g) in cpu.iter().zip(&gpu) {
            // The kernel rounds each multiply and add as the CPU does (no FMA contraction).
            assert_eq!(values(c), values(g), "{o:?}");
        }
        // The momentum buffers in the state dicts agree as well.
        let (sc, sg) = (oc.state_dict().unwrap(), og.state_dict().unwrap());
        assert_eq!(
            serde_json::to_string(&sc).unwrap(),
            serde_json::to_string(&sg).unwrap()
        );
    }
}

#[test]
fn grad_scaler_on_a_cuda_device_matches_the_cpu_and_skips_on_inf() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    let o = SgdOptions::default().lr(0.1).momentum(0.5);
    let (cpu, gpu) = (params(Device::Cpu), params(dev));
    let (mut oc, mut og) = (sgd(&cpu, o), sgd(&gpu, o));
    let opts = GradScalerOptions {
        init_scale: 1024.0,
        growth_interval: 1,
        ..GradScalerOptions::default()
    };
    let (mut sc, mut sg) = (
        GradScaler::new(opts).unwrap(),
        GradScaler::new(opts).unwrap(),
    );

    // Clean step: unscale_ divides by 1024 exactly as on the CPU; the step is taken.
    set_grads(&cpu, &gpu, dev, 0, 1024.0);
    sc.unscale_(&mut oc).unwrap();
    sg.unscale_(&mut og).unwrap();
    for (c, g) in cpu.iter().zip(&gpu) {
        assert_eq!(grad_values(c), grad_values(g));
        assert_eq!(grad_values(c)[0], -0.9);
    }
    assert!(sc.step(&mut oc).unwrap());
    assert!(sg.step(&mut og).unwrap());
    sc.update().unwrap();
    sg.update().unwrap();
    assert_eq!(sg.get_scale(), 2048.0);
    assert_eq!(sc.get_scale(), sg.get_scale());

    // An inf in one element of the large gradient: the step is skipped, the scale backs off.
    let before: Vec<Vec<f32>> = gpu.iter().map(values).collect();
    set_grads(&cpu, &gpu, dev, 1, 2048.0);
    for p in [&cpu[1], &gpu[1]] {
        let mut v = grad_values(p);
        v[65_537] = f32::INFINITY;
        let t = Tensor::from_vec(v, &[p.numel()], Device::Cpu).unwrap();
        p.set_grad(Some(t.to_device(p.device()).unwrap())).unwrap();
    }
    assert!(!sc.step(&mut oc).unwrap());
    assert!(!sg.step(&mut og).unwrap());
    sc.update().unwrap();
    sg.update().unwrap();
    assert_eq!(sg.get_scale(), 1024.0);
    assert_eq!(sc.get_scale(), sg.get_scale());
    for (b, g) in before.iter().zip(&gpu) {
        assert_eq!(
            b,
            &values(g),
            "a skipped step must leave the parameters alone"
        );
    }
    // The gradients were still unscaled, finite ones exactly as on the CPU.
    for (c, g) in cpu.iter().zip(&gpu) {
        assert_eq!(grad_values(c), grad_values(g));
    }

    // A NaN in the single-element gradient is caught too.
    set_grads(&cpu, &gpu, dev, 2, 1024.0);
    let t = Tensor::from_vec(vec![f32::NAN], &[1], Device::Cpu).unwrap();
    gpu[2].set_grad(Some(t.to_device(dev).unwrap())).unwrap();
    sg.unscale_(&mut og).unwrap();
    assert!(!sg.step(&mut og).unwrap());
    sg.update().unwrap();

    // A finite gradient the unscale overflows (a scale below 1) is caught as well, on both.
    let opts = GradScalerOptions {
        init_scale: 0.25,
        ..GradScalerOptions::default()
    };
    let (mut sc, mut sg) = (
        GradScaler::new(opts).unwrap(),
        GradScaler::new(opts).unwrap(),
    );
    set_grads(&cpu, &gpu, dev, 3, 1.0);
    for p in [&cpu[1], &gpu[1]] {
        let mut v = grad_values(p);
        v[70_000] = f32::MAX / 2.0;
        let t = Tensor::from_vec(v, &[p.numel()], Device::Cpu).unwrap();
        p.set_grad(Some(t.to_device(p.device()).unwrap())).unwrap();
    }
    assert!(!sc.step(&mut oc).unwrap());
    assert!(!sg.step(&mut og).unwrap());
    assert_eq!(grad_values(&gpu[1])[70_000], f32::INFINITY);
    for (c, g) in cpu.iter().zip(&gpu) {
        assert_eq!(grad_values(c), grad_values(g));
    }
}

#[test]
fn clip_grad_norm_on_device_matches_the_cpu_and_stays_on_the_device() {
    let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
        return;
    };
    let named = kiln_optim::unnamed;
    for max_norm in [1e9, 1.0] {
        let (cpu, gpu) = (params(Device::Cpu), params(dev));
        set_grads(&cpu, &gpu, dev, 0, 1.0);
        let want = kiln_optim::clip_grad_norm_(&named(&cpu), max_norm, 2.0, false).unwrap();
        let got = kiln_optim::clip_grad_norm_on_device(&named(&gpu), max_norm, 2.0, false).unwrap();
        assert_eq!(got.device(), dev);
        assert_eq!(got.shape(), &[] as &[usize]);
        let got = got.item().unwrap();
        assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
        for (c, g) in cpu.iter().zip(&gpu) {
            for (x, y) in grad_values(c).iter().zip(grad_values(g)) {
                assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{x} vs {y}");
            }
        }
        // The f64 API on the same (already clipped) gradients agrees with the tensor.
        let again = kiln_optim::clip_grad_norm_(&named(&gpu), 1e9, 2.0, false).unwrap();
        let dev_again = kiln_optim::clip_grad_norm_on_device(&named(&gpu), 1e9, 2.0, false)
            .unwrap()
            .item()
            .unwrap();
        assert!(
            (again - dev_again).abs() <= 1e-6 * again,
            "{again} vs {dev_again}"
        );
    }
}
