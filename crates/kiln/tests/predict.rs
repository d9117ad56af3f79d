//! `predict` end to end: a tiny checkpoint written by the recipe, a synthetic sample saved as a
//! PNG, and the top-5 classes read back through `kiln::recipe::predict`; wrong sizes and
//! channel counts are kiln-data's errors; a class list that does not fit the model, and NaN
//! weights, are errors naming the problem. A run on a folder of PNGs (`--data folder:DIR`)
//! predicts with its folders' names.

use kiln::data::{save_png, synthetic, DataSource, ImageOptions, Normalize, Split};
use kiln::recipe::{checkpoint, train, Arch, Quiet, TrainConfig};
use std::path::Path;

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
    // A run folder that is a file is refused naming the flag (not "File exists").
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("file"), b"").unwrap();
    let on_file = TrainConfig {
        run_dir: root.join("file"),
        ..config.clone()
    };
    let msg = train(&on_file, &mut Quiet).err().unwrap().to_string();
    assert!(msg.contains("is a file, not a folder"), "{msg}");
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

    // Three class names for a ten-output model: refused when read, never an index panic.
    let short = root.join("short.safetensors");
    rewrite_safetensors(&ckpt, &short, |header, _| {
        header["__metadata__"]["kiln.classes"] = r#"["a","b","c"]"#.into();
    });
    let msg = kiln::recipe::predict(&short, &png, ImageOptions::default(), 5)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("names 3 classes but the model has 10"),
        "{msg}"
    );
    // A config describing a huge network the weights do not fit: refused before it is built.
    let huge = root.join("huge.safetensors");
    rewrite_safetensors(&ckpt, &huge, |header, _| {
        let meta = &mut header["__metadata__"];
        let mut config: serde_json::Value =
            serde_json::from_str(meta["kiln.model_config"].as_str().unwrap()).unwrap();
        config["width"] = 4096.into();
        config["blocks"] = serde_json::json!([64, 64, 64, 64]);
        meta["kiln.model_config"] = config.to_string().into();
    });
    let msg = kiln::recipe::predict(&huge, &png, ImageOptions::default(), 5)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("does not describe the weights")
            && msg.contains("layer1 has 1 blocks, the config 64"),
        "{msg}"
    );
    // NaN weights in the head: an error, never `NaN%` probabilities.
    let nan = root.join("nan.safetensors");
    rewrite_safetensors(&ckpt, &nan, |header, data| {
        let range = &header["model.fc.bias"]["data_offsets"];
        let (begin, end) = (range[0].as_u64().unwrap(), range[1].as_u64().unwrap());
        for chunk in data[begin as usize..end as usize].chunks_mut(4) {
            chunk.copy_from_slice(&f32::NAN.to_le_bytes());
        }
    });
    let msg = kiln::recipe::predict(&nan, &png, ImageOptions::default(), 5)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("probabilities are NaN"), "{msg}");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_folder_of_images_trains_and_predicts_with_its_class_names() {
    let root = std::env::temp_dir().join(format!("kiln-predict-folder-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let data = root.join("data");
    // train/<class>/ and val/<class>/ from the synthetic set: 4 and 1 images of each class
    for index in 0..50 {
        let (pixels, label) = synthetic::render(7, Split::Train, index);
        // each class's fifth image (labels cycle through the ten classes) is a validation one
        let split = if index >= 40 { "val" } else { "train" };
        let dir = data.join(split).join(synthetic::CLASSES[label as usize]);
        std::fs::create_dir_all(&dir).unwrap();
        save_png(dir.join(format!("{index}.png")), &pixels, [3, 32, 32]).unwrap();
    }
    let mut sorted: Vec<String> = synthetic::CLASSES.iter().map(|c| c.to_string()).collect();
    sorted.sort();
    let config = TrainConfig {
        epochs: 2,
        batch_size: Some(10),
        run_dir: root.join("run"),
        data: format!("folder:{}", data.display()).parse().unwrap(),
        width: 4,
        prefetch_batches: 0,
        ..TrainConfig::default()
    };
    let ckpt = train(&config, &mut Quiet).unwrap().checkpoint;
    let info = checkpoint::read_info(&ckpt).unwrap();
    assert_eq!(info.classes, sorted);
    assert_eq!(info.config.input_shape(), [3, 32, 32]);
    let image = std::fs::read_dir(data.join("val").join(&sorted[0]))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let top = kiln::recipe::predict(&ckpt, &image, ImageOptions::default(), 10).unwrap();
    let mut names: Vec<String> = top.into_iter().map(|(c, _)| c).collect();
    names.sort();
    assert_eq!(names, sorted);
    // a folder normalises with its training split's statistics, or with ImageNet's when the
    // run starts from torchvision weights (which expect them), unless --normalize says otherwise
    let (train_set, _) = config.data.load(0).unwrap();
    let own = Normalize::from_dataset(&train_set).unwrap();
    assert_eq!(info.normalize, own);
    let pth = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/resnet18_w4.pth");
    for (choice, want) in [("source", Normalize::imagenet()), ("dataset", own)] {
        let finetune = TrainConfig {
            model: Arch::ResNet18,
            pretrained: Some(pth.clone()),
            normalize: choice.parse().unwrap(),
            stop_after: Some(1),
            run_dir: root.join(format!("finetune-{choice}")),
            ..config.clone()
        };
        let ckpt = train(&finetune, &mut Quiet).unwrap().checkpoint;
        assert_eq!(
            checkpoint::read_info(&ckpt).unwrap().normalize,
            want,
            "{choice}"
        );
    }
    // `folder:HxW:DIR` resizes every image
    let resized: DataSource = format!("folder:16x16:{}", data.display()).parse().unwrap();
    let (train_set, val_set) = resized.load(0).unwrap();
    assert_eq!((train_set.len(), val_set.len()), (40, 10));
    assert_eq!(val_set.sample_shape(), [3, 16, 16]);
    // without a size, an image of another size is refused naming the flag that resizes
    let odd = data.join("train").join(&sorted[3]).join("odd.png");
    save_png(&odd, &vec![7u8; 3 * 20 * 24], [3, 20, 24]).unwrap();
    let msg = config.data.load(0).unwrap_err().to_string();
    assert!(
        msg.contains("odd.png") && msg.contains(&format!("pass folder:32x32:{}", data.display())),
        "{msg}"
    );
    let (train_set, _) = resized.load(0).unwrap();
    assert_eq!(train_set.len(), 41);
    // splits with different classes would give one label two meanings: refused
    std::fs::remove_dir_all(data.join("val").join(&sorted[9])).unwrap();
    let msg = config.data.load(0).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("but {} has", data.join("val").display()))
            && msg.contains("give both splits the same class folders"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// Copies a safetensors file from `src` to `dst`, letting `edit` change its JSON header and
/// its data bytes (the header is re-padded with spaces to a multiple of 8 bytes).
fn rewrite_safetensors(
    src: &std::path::Path,
    dst: &std::path::Path,
    edit: impl FnOnce(&mut serde_json::Value, &mut [u8]),
) {
    let bytes = std::fs::read(src).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let mut data = bytes[8 + len..].to_vec();
    edit(&mut header, &mut data);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&data);
    std::fs::write(dst, out).unwrap();
}
