//! Writes a 10x10 grid of synthetic samples (row k: ten samples of class k) as a PNG:
//! `cargo run -p kiln-data --example synthetic_grid -- docs/synthetic_samples.png [seed]`.

use kiln_data::{image_grid, save_png, synthetic, Split};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = args
        .next()
        .unwrap_or_else(|| "docs/synthetic_samples.png".into());
    let seed: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0);
    let ds = synthetic::generate(seed, Split::Train, 100)?;
    // Sample k + 10 j has label k: put it in row k, column j, each upscaled 2x (nearest).
    let scaled: Vec<Vec<u8>> = (0..100)
        .map(|cell| {
            let (row, col) = (cell / 10, cell % 10);
            let img = ds.image(row + 10 * col)?;
            Ok((0..3 * 64 * 64)
                .map(|i| {
                    let (c, y, x) = (i / 4096, i / 64 % 64, i % 64);
                    img[c * 1024 + (y / 2) * 32 + x / 2]
                })
                .collect())
        })
        .collect::<kiln_data::Result<_>>()?;
    let refs: Vec<&[u8]> = scaled.iter().map(|v| v.as_slice()).collect();
    let (grid, shape) = image_grid(&refs, [3, 64, 64], 10, 4, 255)?;
    save_png(&out, &grid, shape)?;
    println!("wrote {out}: rows are {}", synthetic::CLASSES.join(", "));
    Ok(())
}
