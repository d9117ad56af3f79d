//! The "PTX" the emulator's NVRTC returns: self-describing text that names the compiled module
//! by its content hash and carries everything needed to compile it again (kiln keeps PTX on disk
//! between processes, so the module cache may have been cleared since).
//!
//! Invariants: the text starts with [`MAGIC`], then a `// .target sm_XX` line (the architecture
//! compiled for, as PTX names it) and one `// .entry NAME(` comment line per kernel (as PTX lists
//! `.visible .entry NAME(`, so tools that look for a kernel's entry find it), holds
//! no NUL byte, and [`decode`] of [`encode`]'s output gives back the same [`Image`]; anything else
//! (real PTX, garbage) is an error saying what it is.

/// The first line of every image.
pub const MAGIC: &str = "// kiln-cuda-emu module v1 (not PTX: compiled for the CUDA emulator)\n";

/// A compiled program's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Content hash naming the compiled module in the cache.
    pub hash: String,
    /// The `extern "C"` kernels of the module.
    pub kernels: Vec<String>,
    /// The architecture compiled for (90 for `compute_90`).
    pub target: u32,
    /// The program's name (`nvrtcCreateProgram`'s `name`).
    pub name: String,
    /// The compile options, as given.
    pub options: Vec<String>,
    /// Headers given to `nvrtcCreateProgram`: include name and text.
    pub headers: Vec<(String, String)>,
    /// The program's source.
    pub source: String,
}

/// How the target line starts.
const TARGET: &str = "// .target sm_";
/// How an entry line starts.
const ENTRY: &str = "// .entry ";

fn field(out: &mut String, key: &str, value: &str) {
    out.push_str(&format!("{key} {}\n{value}\n", value.len()));
}

/// The image's text (without the terminating NUL).
pub fn encode(image: &Image) -> String {
    let mut out = String::from(MAGIC);
    out.push_str(&format!("{TARGET}{}\n", image.target));
    for k in &image.kernels {
        out.push_str(&format!("{ENTRY}{k}(\n"));
    }
    field(&mut out, "hash", &image.hash);
    field(&mut out, "name", &image.name);
    for o in &image.options {
        field(&mut out, "option", o);
    }
    for (name, text) in &image.headers {
        field(&mut out, "header-name", name);
        field(&mut out, "header-text", text);
    }
    field(&mut out, "source", &image.source);
    out
}

/// What an image that is not the emulator's looks like, for the error message.
fn describe_foreign(text: &str) -> String {
    let head: String = text.chars().take(60).collect();
    if text.contains(".version") && text.contains(".target") {
        format!(
            "real PTX (from NVIDIA's NVRTC or nvcc) cannot run on the CUDA emulator; compile the \
             kernel with the emulator's NVRTC (clear kiln's on-disk PTX cache if it came from \
             there); it starts {head:?}"
        )
    } else {
        format!("not a module compiled by the CUDA emulator's NVRTC; it starts {head:?}")
    }
}

/// Reads an image's text.
pub fn decode(text: &str) -> Result<Image, String> {
    let Some(mut rest) = text.strip_prefix(MAGIC) else {
        return Err(describe_foreign(text));
    };
    let mut target = 0;
    if let Some(after) = rest.strip_prefix(TARGET) {
        let (line, next) = after.split_once('\n').unwrap_or((after, ""));
        target = line.parse().unwrap_or(0);
        rest = next;
    }
    let mut kernels = Vec::new();
    while let Some(after) = rest.strip_prefix(ENTRY) {
        let (line, next) = after.split_once('\n').unwrap_or((after, ""));
        kernels.push(line.trim_end_matches('(').to_string());
        rest = next;
    }
    let mut image = Image {
        hash: String::new(),
        kernels,
        target,
        name: String::new(),
        options: Vec::new(),
        headers: Vec::new(),
        source: String::new(),
    };
    let mut header_name: Option<String> = None;
    let mut seen_source = false;
    while !rest.is_empty() {
        // After the last field only comment lines may follow (kiln's disk cache appends one).
        if seen_source
            && rest
                .lines()
                .all(|l| l.trim().is_empty() || l.trim_start().starts_with("//"))
        {
            break;
        }
        let bad = || "a CUDA emulator module whose text is damaged".to_string();
        let (line, after) = rest.split_once('\n').ok_or_else(bad)?;
        let (key, len) = line.split_once(' ').ok_or_else(bad)?;
        let len: usize = len.parse().map_err(|_| bad())?;
        let value = after.get(..len).ok_or_else(bad)?.to_string();
        rest = after
            .get(len..)
            .and_then(|r| r.strip_prefix('\n'))
            .ok_or_else(bad)?;
        match key {
            "hash" => image.hash = value,
            "name" => image.name = value,
            "option" => image.options.push(value),
            "header-name" => header_name = Some(value),
            "header-text" => image
                .headers
                .push((header_name.take().ok_or_else(bad)?, value)),
            "source" => {
                image.source = value;
                seen_source = true;
            }
            _ => return Err(bad()),
        }
    }
    if image.hash.is_empty() {
        return Err("a CUDA emulator module without its hash".into());
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_round_trip_and_foreign_text_is_named() {
        let image = Image {
            hash: "abc".into(),
            kernels: vec!["k".into(), "other".into()],
            target: 90,
            name: "k.cu".into(),
            options: vec!["--std=c++17".into(), "-DX=a\nb".into()],
            headers: vec![("h.cuh".into(), "int x;\n".into())],
            source: "extern \"C\" __global__ void k() {}\n".into(),
        };
        assert_eq!(decode(&encode(&image)).unwrap(), image);
        assert!(encode(&image).contains(".entry other("));
        assert!(encode(&image).contains("\n// .target sm_90\n"));
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n.version 8.5\n.target sm_90\n";
        assert!(decode(ptx).unwrap_err().contains("real PTX"));
        assert!(decode("garbage").unwrap_err().contains("not a module"));
        let cut = encode(&image);
        assert!(decode(&cut[..cut.len() - 5]).is_err());
        let cached = format!("{cut}\n// kiln kernel cache: complete\n");
        assert_eq!(decode(&cached).unwrap(), image);
        assert!(decode(&format!("{cut}junk")).is_err());
    }
}
