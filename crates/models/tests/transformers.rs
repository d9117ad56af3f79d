//! ViT and GPT: torchvision names, torchinfo parity of the tiny ViT, parameter counts.

use kiln_autograd::{manual_seed, DType, Module};
use kiln_models::models::{Gpt, GptConfig, VisionTransformer, VitConfig};
use kiln_models::{summary, summary_with_dtype, LayerExt};

#[test]
fn tiny_vit_has_torchvisions_state_dict_and_torchinfo_table() {
    manual_seed(0);
    let m = VisionTransformer::new(VitConfig::tiny(10)).unwrap();
    let want: Vec<(String, Vec<usize>, String)> =
        serde_json::from_str(include_str!("fixtures/vit_tiny_state_dict.json")).unwrap();
    let got: Vec<(String, Vec<usize>, String)> = m
        .state_dict()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec(), "float32".to_string()))
        .collect();
    assert_eq!(got, want);
    let s = summary(&m, &[1, 3, 32, 32]).unwrap();
    assert_eq!(s.total_params, 24_234);
    let text = s.to_string();
    assert_eq!(
        text.trim_end(),
        include_str!("fixtures/vit_tiny_torchinfo.txt").trim_end(),
        "\n{text}"
    );
}

#[test]
fn vit_b16_and_gpt_parameter_counts() {
    manual_seed(0);
    // torchvision's vit_b_16 has 86,567,656 parameters. Building it takes 86M random draws,
    // slow in a debug build, so count ViT-B/16 with 1 and 2 blocks and extrapolate to 12.
    let count = |layers: usize| -> usize {
        let m = VisionTransformer::new(VitConfig {
            num_layers: layers,
            ..VitConfig::b16(1000)
        })
        .unwrap();
        m.parameters().iter().map(|p| p.numel()).sum()
    };
    let (one, two) = (count(1), count(2));
    assert_eq!(one + 11 * (two - one), 86_567_656);

    let c = GptConfig::tiny();
    let g = Gpt::new(c).unwrap();
    let (v, t, d, l) = (c.vocab_size, c.block_size, c.n_embd, c.n_layer);
    // Per block: attention 4d^2 + 4d, MLP 8d^2 + 5d, two LayerNorms 4d.
    let want = v * d + t * d + l * (12 * d * d + 13 * d) + 2 * d + d * v;
    let s = summary_with_dtype(&g, &[3, t], DType::I64).unwrap();
    assert_eq!(s.total_params, want);
    let out = &s.layers.last().unwrap().output_shape;
    assert_eq!(out, &vec![3, t, v]);
    let names: Vec<String> = g.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"h.1.self_attn.in_proj_weight".to_string()));
    assert!(names.contains(&"h.0.norm1.weight".to_string()));
    assert_eq!(names.last().unwrap(), "lm_head.weight");
    assert!(summary_with_dtype(&g, &[3, t + 1], DType::I64).is_err());
}
