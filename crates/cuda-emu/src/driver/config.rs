//! The emulator's configuration (environment variables, read once at `cuInit`) and
//! `CUDA_VISIBLE_DEVICES` applied the way NVIDIA's driver applies it.
//!
//! Invariants: every variable is parsed strictly (a bad value is an error naming the variable,
//! never a silent default); `visible[driver_ordinal]` is the physical device behind each driver
//! ordinal, with no physical device listed twice.
//!
//! `CUDA_VISIBLE_DEVICES` rules (NVIDIA's documented behaviour, plus the driver's observed
//! handling of duplicates that PyTorch also models):
//! - unset: every device, in order; set but empty: none;
//! - comma-separated entries, enumerated in the order given;
//! - when the first entry starts with `GPU-` or `MIG-`, entries are UUID prefixes that must match
//!   exactly one device's UUID (`GPU-…`); otherwise they are ordinals read like `strtoul`
//!   (leading blanks and a sign allowed, trailing text ignored);
//! - the list stops at the first invalid entry (malformed, negative, out of range, unknown or
//!   ambiguous prefix, an entry of the other kind); the devices before it stay visible;
//! - a device named twice hides every device, and so does an entry written twice, even after an
//!   out-of-range or unknown entry (the driver reads the entries before matching them);
//! - the emulated devices are not MIG-partitioned, so a `MIG-` entry matches nothing.

use crate::space::SPAN_BYTES;

/// Default device memory per device (`KILN_EMU_MEMORY`).
const DEFAULT_MEMORY: u64 = 16 << 30;
/// Most emulated devices (`KILN_EMU_DEVICES`).
const MAX_DEVICES: usize = 64;

/// The emulator's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// Physical devices emulated (`KILN_EMU_DEVICES`, default 1).
    pub physical: usize,
    /// Bytes of memory per device (`KILN_EMU_MEMORY`).
    pub memory: u64,
    /// Compute capability (`KILN_EMU_CC`, default 9.0).
    pub cc: (i32, i32),
    /// Random delays before stream work (`KILN_EMU_DELAY=1`).
    pub delay: bool,
    /// Log every call (`KILN_EMU_LOG=1`).
    pub log_calls: bool,
    /// Physical device of each driver ordinal, after `CUDA_VISIBLE_DEVICES`.
    pub visible: Vec<usize>,
}

/// The marketing name every emulated device reports.
pub(crate) const DEVICE_NAME: &str = "NVIDIA H200 (kiln-cuda-emu)";

/// The UUID of physical device `physical`: stable, distinct in its first bytes.
pub(crate) fn uuid_bytes(physical: usize) -> [u8; 16] {
    let head = (physical as u32 + 1).wrapping_mul(0x9e37_79b1);
    let mut bytes = *b"\0\0\0\0kiln-cudaemu";
    bytes[..4].copy_from_slice(&head.to_be_bytes());
    bytes
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` prints it.
pub(crate) fn uuid_string(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// `strtoul`'s reading of an ordinal: optional blanks and sign, then digits (trailing text
/// ignored); `None` when there are no digits.
fn read_ordinal(entry: &str) -> Option<i128> {
    let s = entry.trim_start();
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let value = digits.parse::<u64>().ok().map(i128::from)?;
    Some(if negative { -value } else { value })
}

/// Applies a `CUDA_VISIBLE_DEVICES` value to devices with these UUIDs (see the module docs);
/// returns the visible devices' indices in enumeration order. Like the driver, the list is read
/// in two passes: its entries (a repeated entry hides every device), then the devices they name
/// (the first that names none stops the list; two naming one device hide every device).
pub(crate) fn apply_visibility(value: &str, uuids: &[String]) -> Vec<usize> {
    let entries: Vec<&str> = value.split(',').map(str::trim).collect();
    let kind = ["GPU-", "MIG-"]
        .into_iter()
        .find(|p| value.trim_start().starts_with(p));
    let mut visible = Vec::new();
    if let Some(prefix) = kind {
        let mut listed: Vec<&str> = Vec::new();
        for entry in entries {
            if listed.contains(&entry) {
                return Vec::new();
            }
            if !entry.starts_with(prefix) {
                break;
            }
            listed.push(entry);
        }
        for entry in listed {
            // Emulated devices are not MIG-partitioned: only `GPU-` UUIDs exist.
            let mut matches = uuids
                .iter()
                .enumerate()
                .filter(|(_, u)| u.starts_with(entry));
            let index = match (matches.next(), matches.next()) {
                (Some((i, _)), None) => i,
                _ => break,
            };
            if visible.contains(&index) {
                return Vec::new();
            }
            visible.push(index);
        }
    } else {
        let mut listed: Vec<i128> = Vec::new();
        for entry in entries {
            let ordinal = read_ordinal(entry).unwrap_or(-1);
            if listed.contains(&ordinal) {
                return Vec::new();
            }
            if ordinal < 0 {
                break;
            }
            listed.push(ordinal);
        }
        for ordinal in listed {
            match usize::try_from(ordinal) {
                Ok(i) if i < uuids.len() => visible.push(i),
                _ => break,
            }
        }
    }
    visible
}

fn parse_bool(name: &str, value: Option<String>) -> Result<bool, String> {
    match value.as_deref() {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(format!("{name}={other:?} is not 0 or 1")),
    }
}

/// Reads a byte count: digits, optionally followed by `K`, `M`, `G` or `KiB`, `MiB`, `GiB`.
pub(crate) fn parse_bytes(text: &str) -> Option<u64> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let shift = match suffix {
        "" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// Builds the configuration from the variables `get` returns.
pub(crate) fn parse_config(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
    let physical = match get("KILN_EMU_DEVICES") {
        None => 1,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n <= MAX_DEVICES => n,
            _ => {
                return Err(format!(
                    "KILN_EMU_DEVICES={v:?} is not a device count 0..={MAX_DEVICES}"
                ))
            }
        },
    };
    let memory = match get("KILN_EMU_MEMORY") {
        None => DEFAULT_MEMORY,
        Some(v) => match parse_bytes(&v) {
            Some(n) if n > 0 && n <= SPAN_BYTES / 2 => n,
            _ => {
                return Err(format!(
                    "KILN_EMU_MEMORY={v:?} is not a byte count between 1 and {} (digits, \
                     optionally K/M/G)",
                    SPAN_BYTES / 2
                ))
            }
        },
    };
    let cc = match get("KILN_EMU_CC") {
        None => (9, 0),
        Some(v) => {
            let parsed = v
                .split_once('.')
                .and_then(|(a, b)| Some((a.parse::<u8>().ok()?, b.parse::<u8>().ok()?)))
                .filter(|&(a, b)| a >= 1 && b <= 9);
            match parsed {
                Some((a, b)) => (a as i32, b as i32),
                None => {
                    return Err(format!(
                        "KILN_EMU_CC={v:?} is not a compute capability like 9.0"
                    ))
                }
            }
        }
    };
    let delay = parse_bool("KILN_EMU_DELAY", get("KILN_EMU_DELAY"))?;
    let log_calls = parse_bool("KILN_EMU_LOG", get("KILN_EMU_LOG"))?;
    let uuids: Vec<String> = (0..physical).map(|p| uuid_string(&uuid_bytes(p))).collect();
    let visible = match get("CUDA_VISIBLE_DEVICES") {
        None => (0..physical).collect(),
        Some(v) => apply_visibility(&v, &uuids),
    };
    Ok(Config {
        physical,
        memory,
        cc,
        delay,
        log_calls,
        visible,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids(n: usize) -> Vec<String> {
        (0..n).map(|p| uuid_string(&uuid_bytes(p))).collect()
    }

    #[test]
    fn ordinals_follow_the_driver() {
        let u = uuids(4);
        assert_eq!(apply_visibility("2,1", &u), vec![2, 1]);
        assert_eq!(apply_visibility("0,2,-1,1", &u), vec![0, 2]);
        assert_eq!(apply_visibility(" 3, 1gpu,0", &u), vec![3, 1, 0]);
        assert_eq!(apply_visibility("1,7,0", &u), vec![1]);
        assert_eq!(apply_visibility("", &u), Vec::<usize>::new());
        assert_eq!(apply_visibility("-1", &u), Vec::<usize>::new());
        assert_eq!(apply_visibility("x,0", &u), Vec::<usize>::new());
        assert_eq!(apply_visibility("0,,1", &u), vec![0]);
        assert_eq!(
            apply_visibility("1,0,1", &u),
            Vec::<usize>::new(),
            "duplicate hides all"
        );
    }

    #[test]
    fn uuid_prefixes_must_be_unique() {
        let u = uuids(3);
        let full = u[1].clone();
        assert_eq!(apply_visibility(&full, &u), vec![1]);
        assert_eq!(apply_visibility(&full[..8], &u), vec![1]);
        let two = format!("{},{}", &u[2][..9], &u[0][..9]);
        assert_eq!(apply_visibility(&two, &u), vec![2, 0]);
        assert_eq!(
            apply_visibility("GPU-", &u),
            Vec::<usize>::new(),
            "ambiguous"
        );
        assert_eq!(
            apply_visibility(&format!("{full},1"), &u),
            vec![1],
            "mixed kinds stop"
        );
        assert_eq!(apply_visibility("GPU-ffff", &u), Vec::<usize>::new());
        assert_eq!(
            apply_visibility(&format!("MIG-{full}"), &u),
            Vec::<usize>::new()
        );
        assert_eq!(
            apply_visibility(&format!("{full},{full}"), &u),
            Vec::<usize>::new()
        );
        assert_eq!(
            apply_visibility("GPU-", &uuids(1)),
            vec![0],
            "unique when alone"
        );
    }

    #[test]
    fn uuids_are_stable_and_distinct() {
        let u = uuids(8);
        assert_eq!(u[0].len(), 40);
        for (i, a) in u.iter().enumerate() {
            for b in &u[i + 1..] {
                assert_ne!(a[..8], b[..8]);
            }
        }
        assert_eq!(u, uuids(8));
    }

    #[test]
    fn variables_parse_strictly() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = parse_config(env(&[])).unwrap();
        assert_eq!(
            (c.physical, c.memory, c.cc, c.visible.clone()),
            (1, 16 << 30, (9, 0), vec![0])
        );
        let c = parse_config(env(&[
            ("KILN_EMU_DEVICES", "3"),
            ("KILN_EMU_MEMORY", "64M"),
            ("KILN_EMU_CC", "8.6"),
            ("CUDA_VISIBLE_DEVICES", "2,0"),
        ]))
        .unwrap();
        assert_eq!(
            (c.physical, c.memory, c.cc, c.visible),
            (3, 64 << 20, (8, 6), vec![2, 0])
        );
        for bad in [
            ("KILN_EMU_MEMORY", "lots"),
            ("KILN_EMU_MEMORY", "0"),
            ("KILN_EMU_MEMORY", "12 G"),
            ("KILN_EMU_DEVICES", "-1"),
            ("KILN_EMU_CC", "9"),
            ("KILN_EMU_DELAY", "yes"),
        ] {
            let err = parse_config(|k| (k == bad.0).then(|| bad.1.to_string())).unwrap_err();
            assert!(err.starts_with(bad.0), "{err}");
        }
    }
}
