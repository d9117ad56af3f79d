//! torchinfo parity of `summary` (figures printed by torchinfo 1.8 for torchvision's models).

mod common;

use kiln_autograd::{manual_seed, Module};
use kiln_models::models::{resnet18, resnet34, resnet50};
use kiln_models::summary;

#[test]
fn an_mlp_of_tanh_silu_and_sigmoid_matches_torchinfo() {
    manual_seed(0);
    let m = common::activations_mlp();
    let text = summary(&m, &[32, 128]).unwrap().to_string();
    // As torchinfo printed it for the same nn.Sequential (fixtures/gen_torchinfo.py).
    let want = include_str!("fixtures/activations_mlp_torchinfo.txt");
    assert_eq!(text.trim_end(), want.trim_end());
}

#[test]
fn resnet18_matches_torchinfo() {
    manual_seed(0);
    let m = resnet18(1000).unwrap();
    let s = summary(&m, &[1, 3, 224, 224]).unwrap();
    let text = s.to_string();
    println!("{text}");
    // The whole table, character for character, as torchinfo printed it (fixtures/gen_torchinfo.py).
    let want = include_str!("fixtures/resnet18_torchinfo.txt");
    assert_eq!(text.trim_end(), want.trim_end());
    assert_eq!(s.total_params, 11_689_512);
    assert_eq!(s.trainable_params, 11_689_512);
    assert_eq!(s.non_trainable_params, 0);
    for want in [
        "Total params: 11,689,512",
        "Trainable params: 11,689,512",
        "Non-trainable params: 0",
        "Total mult-adds (G): 1.81",
        "Input size (MB): 0.60",
        "Forward/backward pass size (MB): 39.75",
        "Params size (MB): 46.76",
        "Estimated Total Size (MB): 87.11",
        "├─Conv2d: 1-1                            [1, 64, 112, 112]         9,408                     True",
        "│    │    └─Sequential: 3-18             [1, 128, 28, 28]          8,448                     True",
        "│    │    └─ReLU: 3-51                   [1, 512, 7, 7]            --                        --",
        "├─Linear: 1-10                           [1, 1000]                 513,000                   True",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // Rows: the model, 10 children, 8 blocks, 51 rows at depth 3 (torchinfo's table).
    assert_eq!(
        s.layers.iter().filter(|r| r.depth <= 3).count(),
        1 + 10 + 8 + 51
    );
    assert_eq!(m.parameters().len(), 62);
}

#[test]
fn resnet34_and_50_parameter_counts_match_torchvision() {
    manual_seed(0);
    // torchinfo 1.8's totals for torchvision's resnet34 / resnet50 at 1x3x224x224.
    let cases = [
        (
            summary(&resnet34(1000).unwrap(), &[1, 3, 224, 224]).unwrap(),
            [
                "Total params: 21,797,672",
                "Total mult-adds (G): 3.66",
                "Forward/backward pass size (MB): 59.82",
                "Params size (MB): 87.19",
                "Estimated Total Size (MB): 147.61",
            ],
        ),
        (
            summary(&resnet50(1000).unwrap(), &[1, 3, 224, 224]).unwrap(),
            [
                "Total params: 25,557,032",
                "Total mult-adds (G): 4.09",
                "Forward/backward pass size (MB): 177.83",
                "Params size (MB): 102.23",
                "Estimated Total Size (MB): 280.66",
            ],
        ),
    ];
    for (s, lines) in cases {
        let text = s.to_string();
        for want in lines {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}

#[test]
fn cifar_stem_resnet18_has_the_known_count_and_shapes() {
    manual_seed(0);
    let m = kiln_models::models::ResNet::new(kiln_models::models::ResNetConfig {
        block: kiln_models::models::BlockKind::Basic,
        layers: [2, 2, 2, 2],
        num_classes: 10,
        small_input: true,
    })
    .unwrap();
    let s = summary(&m, &[8, 3, 32, 32]).unwrap();
    // 3x3 stem instead of 7x7 (-7,680) and a 10-way head: the usual CIFAR ResNet-18 count.
    assert_eq!(s.total_params, 11_173_962);
    let row = |path: &str| {
        s.layers
            .iter()
            .find(|r| r.path == path)
            .unwrap()
            .output_shape
            .clone()
    };
    assert_eq!(row("conv1"), vec![8, 64, 32, 32]);
    assert_eq!(row("layer4"), vec![8, 512, 4, 4]);
    assert!(s.layers.iter().all(|r| r.type_name != "MaxPool2d"));
    assert!(summary(&m, &[8, 1, 32, 32])
        .unwrap_err()
        .to_string()
        .contains("[N, 3, H, W]"));
}
