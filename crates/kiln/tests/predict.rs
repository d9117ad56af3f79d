//! `predict` end to end: a tiny checkpoint written by the recipe, a synthetic sample saved as a
//! PNG, and the top-5 classes read back through `kiln::recipe::predict`; wrong sizes and
//! channel counts are kiln-data's errors.

use kiln::data::{save_png, synthetic, DataSource, ImageOptions, Split};
use kiln::recipe::{checkpoint, train, Quiet, TrainConfig};

#[test]
fn predict_prints_five_classes_that_sum_to_at_most_one() {
    let root = std::env::temp_dir().join(format!("kiln-predict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let config = TrainConfig {
        epochs: 2,
        batch_size: Some(20),
        run_dir: root.join("run"),
        data: DataSource::Synthetic {
            train_len: 60,
            val_len: 20,
        },
        width: 4,
        prefetch_batches: 0,
        ..TrainConfig::default()
    };
    let outcome = train(&config, &mut Quiet).unwrap();
    let ckpt = outcome.checkpoint;

    let info = checkpoint::read_info(&ckpt).unwrap();
    assert_eq!(info.classes.len(), 10);
    assert_eq!(info.config.input_shape(), [3, 32, 32]);

    let (pixels, label) = synthetic::render(0, Split::Test, 3);
    let png = root.join("sample.png");
    save_png(&png, &pixels, [3, 32, 32]).unwrap();
    let top = kiln::recipe::predict(&ckpt, &png, ImageOptions::default(), 5).unwrap();
    assert_eq!(top.len(), 5);
    let total: f64 = top.iter().map(|(_, p)| p).sum();
    assert!(total > 0.0 && total <= 1.0 + 1e-6, "{total}");
    assert!(top.windows(2).all(|w| w[0].1 >= w[1].1), "{top:?}");
    for (class, _) in &top {
        assert!(synthetic::CLASSES.contains(&class.as_str()), "{class}");
    }
    // All ten classes sum to one.
    let all = kiln::recipe::predict(&ckpt, &png, ImageOptions::default(), 10).unwrap();
    let sum: f64 = all.iter().map(|(_, p)| p).sum();
    assert!((sum - 1.0).abs() < 1e-5, "{sum}");
    assert!(all
        .iter()
        .any(|(c, _)| c == synthetic::CLASSES[label as usize]));

    // A 16x16 gray image is refused with both fixes named, and accepted with them.
    let gray = root.join("gray.png");
    save_png(&gray, &vec![128u8; 16 * 16], [1, 16, 16]).unwrap();
    let msg = kiln::recipe::predict(&ckpt, &gray, ImageOptions::default(), 5)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("16x16") && msg.contains("resize") && msg.contains("convert"),
        "{msg}"
    );
    let fixed = ImageOptions {
        resize: true,
        convert_channels: true,
    };
    assert_eq!(
        kiln::recipe::predict(&ckpt, &gray, fixed, 5).unwrap().len(),
        5
    );
    let _ = std::fs::remove_dir_all(&root);
}
