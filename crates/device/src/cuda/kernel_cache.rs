//! The on-disk PTX cache: NVRTC's output kept between processes.
//!
//! Every process compiles each `.cu` file it launches once ([`super::kernels`]' in-memory cache),
//! which costs seconds per process: a GPU run of the packed test binaries (one process each)
//! would spend minutes of its few in NVRTC, compiling the same files again and again. So the
//! PTX is also written to a folder ([`dir`]) under a name that hashes everything that
//! determines it ([`file_name`]: the file's path and text, the NVRTC options including the
//! header folder, the NVRTC version and the arch), and read back by later processes. (The
//! driver keeps its own cache of the PTX-to-SASS step, `~/.nv/ComputeCache`.)
//!
//! The cache is best effort: any failure to read or write it just means compiling. A file is
//! written under a temporary name and renamed into place, and ends with a marker line checked on
//! reading, so a reader never takes a half-written file. The hash is std's `DefaultHasher`,
//! stable for one toolchain, which is all a cache shared by binaries of one build needs (another
//! toolchain at worst misses and writes a second file).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// Last line of every cache file (a PTX comment, so the text stays valid PTX).
const COMPLETE: &str = "\n// kiln kernel cache: complete\n";

/// The cache folder: `$KILN_KERNEL_CACHE` (an empty value turns the cache off), else
/// `$XDG_CACHE_HOME/kiln/kernels`, else `$HOME/.cache/kiln/kernels`; `None` when there is none.
pub fn dir(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    match var("KILN_KERNEL_CACHE") {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => var("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| Path::new(&h).join(".cache")))
            .map(|cache| cache.join("kiln").join("kernels")),
    }
}

/// The cache file name of `file` (its `text`) compiled with `options` by NVRTC `version` for
/// `arch` (e.g. 90): `<stem>-sm<arch>-<hash>.ptx`.
pub fn file_name(
    file: &str,
    text: &str,
    options: &[String],
    version: (i32, i32),
    arch: u32,
) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (file, text, options, version, arch).hash(&mut hasher);
    let stem = Path::new(file)
        .file_stem()
        .map_or_else(|| "kernels".into(), |s| s.to_string_lossy());
    format!("{stem}-sm{arch}-{:016x}.ptx", hasher.finish())
}

/// The PTX cached at `path`, when the file is complete: exactly the text [`write()`] was given
/// (less trailing NULs), without the completion marker, so a loader stricter than the driver's
/// PTX parser (the CUDA emulator checks its module text) gets the compiler's own output.
pub fn read(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let ptx = text.strip_suffix(COMPLETE)?;
    ptx.contains(".entry").then(|| ptx.to_string())
}

/// Writes `ptx` to `path` (temporary file, then rename); errors are ignored.
pub fn write(path: &Path, ptx: &str) {
    let Some(folder) = path.parent() else {
        return;
    };
    if std::fs::create_dir_all(folder).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let mut text = String::with_capacity(ptx.len() + COMPLETE.len());
    text.push_str(ptx.trim_end_matches('\0'));
    text.push_str(COMPLETE);
    if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            dir(env(&[("KILN_KERNEL_CACHE", "/c"), ("HOME", "/h")])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(dir(env(&[("KILN_KERNEL_CACHE", ""), ("HOME", "/h")])), None);
        assert_eq!(
            dir(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            Some(PathBuf::from("/x/kiln/kernels"))
        );
        assert_eq!(
            dir(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/kiln/kernels"))
        );
        assert_eq!(dir(env(&[])), None);
    }

    #[test]
    fn names_change_with_everything_that_changes_the_ptx() {
        let opts = vec!["--gpu-architecture=compute_90".to_string()];
        let base = file_name("ops/fill/fill.cu", "src", &opts, (13, 0), 90);
        assert!(
            base.starts_with("fill-sm90-") && base.ends_with(".ptx"),
            "{base}"
        );
        assert_eq!(
            base,
            file_name("ops/fill/fill.cu", "src", &opts, (13, 0), 90)
        );
        let other_opts = vec!["--gpu-architecture=compute_80".to_string()];
        for changed in [
            file_name("ops/fill/fill.cu", "src2", &opts, (13, 0), 90),
            file_name("ops/fill/fill.cu", "src", &other_opts, (13, 0), 90),
            file_name("ops/fill/fill.cu", "src", &opts, (13, 1), 90),
            file_name("ops/fill/fill.cu", "src", &opts, (13, 0), 80),
            file_name("ops/copy/fill.cu", "src", &opts, (13, 0), 90),
        ] {
            assert_ne!(changed, base);
        }
    }

    #[test]
    fn only_complete_files_are_read_back() {
        let root = std::env::temp_dir().join(format!("kiln-kernel-cache-{}", std::process::id()));
        let path = root.join("nested").join("k-sm90-0.ptx");
        assert_eq!(read(&path), None);
        let ptx = ".version 9.0\n.visible .entry kiln_k(\n)\n{\n}\n";
        write(&path, ptx);
        let back = read(&path).unwrap();
        assert_eq!(back, ptx, "the text written, without the marker");
        let file = std::fs::read_to_string(&path).unwrap();
        assert!(file.starts_with(ptx) && file.ends_with(COMPLETE));
        // A truncated file (a writer killed before the rename would never leave one, but a
        // full disk might) is not taken.
        std::fs::write(&path, &file[..file.len() - 3]).unwrap();
        assert_eq!(read(&path), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
