//! A test hook: `KILN_KERNEL_SOURCE_DIR=<dir>` makes the kernel loader compile `<dir>/<file>`
//! (e.g. `<dir>/ops/reduce/reduce.cu`, the file's path relative to kiln-device's `src/`) instead
//! of the source built into the binary, for every kernel file present there. It exists so a test
//! harness can plant a bug in a copy of a kernel (`cargo xtask emu-mutants`) and check that the
//! GPU tests catch it, without rebuilding kiln. Never set it outside such a harness.
//!
//! Invariants: the variable is read once per process; a dir that is not a readable folder, or an
//! override file that cannot be read as UTF-8, is a typed error ([`Error::KernelSourceOverride`])
//! at the first kernel compile, never a panic and never a silent fall-back to the built-in source;
//! a file absent from the dir keeps its built-in source; the text read here is what the loader
//! hashes into the on-disk cache key, so an override never hits PTX compiled from other text;
//! each overridden file is announced once on stderr.

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// The variable naming the override folder.
pub const SOURCE_DIR_VAR: &str = "KILN_KERNEL_SOURCE_DIR";

/// The source the loader compiles for the kernel file `file` whose built-in text is `source`
/// (before kiln's headers are spliced in): the override file when [`SOURCE_DIR_VAR`] names a
/// folder holding one, else `source`.
pub fn kernel_text(file: &'static str, source: &'static str) -> Result<Cow<'static, str>> {
    let dir = override_dir().map_err(|why| Error::KernelSourceOverride { file, why })?;
    match read_override(dir, file) {
        Ok(None) => Ok(Cow::Borrowed(source)),
        Ok(Some((path, text))) => {
            announce(file, &path);
            Ok(Cow::Owned(text))
        }
        Err(why) => Err(Error::KernelSourceOverride { file, why }),
    }
}

/// The override folder, checked once: `Ok(None)` when the variable is unset or empty.
fn override_dir() -> std::result::Result<Option<&'static Path>, String> {
    static DIR: OnceLock<std::result::Result<Option<PathBuf>, String>> = OnceLock::new();
    DIR.get_or_init(|| check_dir(std::env::var_os(SOURCE_DIR_VAR).map(PathBuf::from)))
        .as_ref()
        .map(|dir| dir.as_deref())
        .map_err(Clone::clone)
}

/// `Ok(Some(dir))` when `value` names a folder, `Ok(None)` when unset or empty, an error naming
/// the variable otherwise.
pub fn check_dir(value: Option<PathBuf>) -> std::result::Result<Option<PathBuf>, String> {
    let Some(dir) = value.filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(None);
    };
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => Ok(Some(dir)),
        Ok(_) => Err(format!(
            "{SOURCE_DIR_VAR}={} is not a folder (it is a test hook: point it at a folder of \
             kernel files laid out as kiln-device's src/, or unset it)",
            dir.display()
        )),
        Err(e) => Err(format!(
            "{SOURCE_DIR_VAR}={} cannot be read: {e} (it is a test hook: point it at a folder \
             of kernel files laid out as kiln-device's src/, or unset it)",
            dir.display()
        )),
    }
}

/// The override of `file` under `dir`: `Ok(None)` without a dir or without that file there.
pub fn read_override(
    dir: Option<&Path>,
    file: &str,
) -> std::result::Result<Option<(PathBuf, String)>, String> {
    let Some(dir) = dir else {
        return Ok(None);
    };
    let path = dir.join(file);
    match std::fs::read(&path) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(|text| Some((path.clone(), text)))
            .map_err(|_| format!("{} is not UTF-8 text", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Says once per file on stderr that its source comes from the override folder.
fn announce(file: &'static str, path: &Path) {
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(file) {
        eprintln!(
            "kiln-device: {SOURCE_DIR_VAR}: compiling {file} from {} (test hook)",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_checks_say_what_is_wrong() {
        assert_eq!(check_dir(None), Ok(None));
        assert_eq!(check_dir(Some(PathBuf::new())), Ok(None));
        let root = std::env::temp_dir().join(format!("kiln-src-override-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        assert_eq!(check_dir(Some(root.clone())), Ok(Some(root.clone())));
        let missing = check_dir(Some(root.join("missing"))).unwrap_err();
        assert!(
            missing.contains(SOURCE_DIR_VAR) && missing.contains("cannot be read"),
            "{missing}"
        );
        let file = root.join("plain-file");
        std::fs::write(&file, "x").unwrap();
        let not_dir = check_dir(Some(file)).unwrap_err();
        assert!(not_dir.contains("is not a folder"), "{not_dir}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn files_present_are_read_and_others_keep_their_source() {
        let root = std::env::temp_dir().join(format!("kiln-src-read-{}", std::process::id()));
        std::fs::create_dir_all(root.join("ops/fill")).unwrap();
        std::fs::write(root.join("ops/fill/fill.cu"), "// planted\n").unwrap();
        std::fs::write(root.join("ops/fill/bad.cu"), [0xff, 0xfe]).unwrap();
        let (path, text) = read_override(Some(&root), "ops/fill/fill.cu")
            .unwrap()
            .unwrap();
        assert_eq!(
            (path, text.as_str()),
            (root.join("ops/fill/fill.cu"), "// planted\n")
        );
        assert_eq!(read_override(Some(&root), "ops/copy/copy.cu"), Ok(None));
        assert_eq!(read_override(None, "ops/fill/fill.cu"), Ok(None));
        let err = read_override(Some(&root), "ops/fill/bad.cu").unwrap_err();
        assert!(err.contains("not UTF-8"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn without_the_variable_the_built_in_source_is_used() {
        if std::env::var_os(SOURCE_DIR_VAR).is_some() {
            return; // a harness run: the override is the point
        }
        let source = "extern \"C\" __global__ void kiln_k() {}\n";
        let text = kernel_text("ops/test/k.cu", source).unwrap();
        assert!(matches!(text, Cow::Borrowed(_)));
        assert_eq!(text, source);
    }
}
