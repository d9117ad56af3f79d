//! Which CUDA devices kiln may use, and how a logical `cuda:i` maps to a physical GPU.
//!
//! Two masks apply, one after the other, like nested containers:
//!
//! 1. **`CUDA_VISIBLE_DEVICES`** is applied by the CUDA driver itself when it initialises
//!    (`cuInit`). kiln never edits the process environment (`setenv` races with every `getenv`
//!    in other threads, and a driver initialised earlier by another library would silently ignore
//!    the change — PyTorch's trap). The driver's ordinals are therefore already masked; kiln parses
//!    the same variable only to *report* which physical GPU each driver ordinal is: entry `d` of
//!    the variable is driver ordinal `d`, because the driver enumerates the valid prefix of the
//!    list in order.
//! 2. **[`set_visible_devices`]** is kiln's programmatic mask. Its entries have the same syntax and
//!    semantics as the variable, but select among the devices the driver exposes (so a mask can
//!    narrow a scheduler's allocation, never widen it). kiln applies it through its own
//!    logical → driver-ordinal map when its CUDA state is first initialised (the first call to
//!    [`crate::cuda_status`], [`crate::Device::best`], a property query or a kernel launch).
//!    After that the map is frozen: `Device::Cuda(i)` values and contexts already handed out
//!    refer to it, so a late call returns [`Error::VisibilityFrozen`] instead of being ignored.
//!
//! The driver's parsing rules, which [`VisibleDevices::parse`] reproduces (they match the model
//! PyTorch's `_parse_visible_devices` keeps of the driver):
//! - unset: every device is visible; empty (or blank): none is;
//! - comma-separated entries, enumerated in the order given;
//! - if the list starts with `GPU-` (or `MIG-`), every entry is a UUID prefix of that kind that must
//!   match exactly one device; otherwise entries are ordinals read like `strtoul` (leading blanks
//!   and a sign allowed, trailing garbage ignored: `"1gpu"` is `1`);
//! - parsing stops at the first invalid entry (negative, malformed, out of range, unknown or
//!   ambiguous UUID, an entry of the other kind): the devices before it stay visible;
//! - a device named twice hides **every** device (the driver exposes an empty set).

use std::sync::Mutex;

use crate::error::{Error, Result};

/// One entry of a visibility list, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    /// A device ordinal (`"0"`, `"3"`).
    Ordinal(usize),
    /// A `GPU-…` or `MIG-…` UUID, or a prefix of one (`"GPU-8932f937"`).
    Uuid(String),
}

/// Why parsing a visibility list stopped before its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// Not an ordinal nor a UUID of the list's kind (also: empty entries, mixed kinds).
    Malformed,
    /// A negative ordinal (the conventional `-1` "no device").
    Negative,
    /// An ordinal at or past the number of devices.
    OutOfRange {
        /// How many devices there are to select from.
        count: usize,
    },
    /// A UUID prefix that matches no device.
    UnknownUuid,
    /// A UUID prefix that matches more than one device.
    AmbiguousUuid,
    /// The entry names a device an earlier entry already named: all devices are hidden.
    Duplicate {
        /// Index of the earlier entry naming the same device.
        first: usize,
    },
}

/// Where and why parsing stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseStop {
    /// Index of the offending entry in the comma-separated list.
    pub index: usize,
    /// The entry as written.
    pub entry: String,
    /// Why it is invalid.
    pub reason: StopReason,
}

impl std::fmt::Display for ParseStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (i, e) = (self.index, &self.entry);
        match &self.reason {
            StopReason::Malformed => write!(f, "entry {i} ({e:?}) is not a device ordinal or UUID"),
            StopReason::Negative => write!(f, "entry {i} ({e:?}) is negative"),
            StopReason::OutOfRange { count } => {
                write!(f, "entry {i} ({e:?}) is out of range: {count} device(s)")
            }
            StopReason::UnknownUuid => write!(f, "entry {i} ({e:?}) matches no device UUID"),
            StopReason::AmbiguousUuid => {
                write!(f, "entry {i} ({e:?}) matches several device UUIDs")
            }
            StopReason::Duplicate { first } => write!(
                f,
                "entry {i} ({e:?}) names the same device as entry {first}, which hides every device"
            ),
        }
    }
}

/// Entries read from a visibility list, before they are matched against devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selectors {
    /// The valid leading entries.
    pub entries: Vec<DeviceSelector>,
    /// The syntactic reason reading stopped, if it did.
    pub stop: Option<ParseStop>,
}

/// The result of applying a visibility list to a list of devices: logical index → device index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleDevices {
    /// `ordinals[logical]` is the index, in the list parsed against, of logical device `logical`.
    pub ordinals: Vec<usize>,
    /// Why parsing stopped early, if it did.
    pub stop: Option<ParseStop>,
}

/// Reads a `strtoul`-like ordinal: blanks, optional sign, digits; trailing text ignored.
fn read_ordinal(entry: &str) -> std::result::Result<usize, StopReason> {
    let s = entry.trim_start();
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(StopReason::Malformed);
    }
    let value: u128 = rest[..digits].parse().unwrap_or(u128::MAX);
    if negative && value != 0 {
        return Err(StopReason::Negative);
    }
    Ok(usize::try_from(value).unwrap_or(usize::MAX))
}

/// Splits and reads a visibility list without knowing the devices (syntax only). An entry
/// repeated verbatim (same ordinal, same UUID text) empties the list, as the driver does.
pub fn parse_selectors(spec: &str) -> Selectors {
    let uuid_kind = ["GPU-", "MIG-"].into_iter().find(|p| spec.starts_with(p));
    let mut entries = Vec::new();
    let mut stop = None;
    for (index, entry) in spec.split(',').enumerate() {
        let read = match uuid_kind {
            Some(prefix) if entry.starts_with(prefix) => {
                Ok(DeviceSelector::Uuid(entry.to_string()))
            }
            Some(_) => Err(StopReason::Malformed),
            None => read_ordinal(entry).map(DeviceSelector::Ordinal),
        };
        match read {
            Ok(sel) => {
                if let Some(first) = entries.iter().position(|e| *e == sel) {
                    // Named twice: the driver hides every device.
                    let reason = StopReason::Duplicate { first };
                    let stop = ParseStop {
                        index,
                        entry: entry.to_string(),
                        reason,
                    };
                    return Selectors {
                        entries: Vec::new(),
                        stop: Some(stop),
                    };
                }
                entries.push(sel)
            }
            Err(reason) => {
                stop = Some(ParseStop {
                    index,
                    entry: entry.to_string(),
                    reason,
                });
                break;
            }
        }
    }
    Selectors { entries, stop }
}

impl VisibleDevices {
    /// Every one of `count` devices, in order (the variable is unset).
    pub fn all(count: usize) -> Self {
        Self {
            ordinals: (0..count).collect(),
            stop: None,
        }
    }

    /// Applies a visibility list (`None`: unset) to the devices whose UUIDs are `uuids`
    /// (`"GPU-xxxxxxxx-xxxx-…"`, index = ordinal), with the driver's rules (module docs).
    pub fn parse(spec: Option<&str>, uuids: &[String]) -> Self {
        match spec {
            None => Self::all(uuids.len()),
            Some(spec) => {
                let selectors = parse_selectors(spec);
                Self::resolve(&selectors, spec, uuids)
            }
        }
    }

    fn resolve(selectors: &Selectors, spec: &str, uuids: &[String]) -> Self {
        let raw: Vec<&str> = spec.split(',').collect();
        let mut ordinals: Vec<usize> = Vec::new();
        for (index, sel) in selectors.entries.iter().enumerate() {
            let found = match sel {
                DeviceSelector::Ordinal(n) if *n < uuids.len() => Ok(*n),
                DeviceSelector::Ordinal(_) => Err(StopReason::OutOfRange { count: uuids.len() }),
                DeviceSelector::Uuid(prefix) => {
                    let mut matching = uuids
                        .iter()
                        .enumerate()
                        .filter(|(_, u)| u.starts_with(prefix.as_str()));
                    match (matching.next(), matching.next()) {
                        (Some((n, _)), None) => Ok(n),
                        (None, _) => Err(StopReason::UnknownUuid),
                        (Some(_), Some(_)) => Err(StopReason::AmbiguousUuid),
                    }
                }
            };
            let stop = |reason| ParseStop {
                index,
                entry: raw[index].to_string(),
                reason,
            };
            match found {
                Ok(n) => {
                    if let Some(first) = ordinals.iter().position(|&o| o == n) {
                        let reason = StopReason::Duplicate { first };
                        return Self {
                            ordinals: Vec::new(),
                            stop: Some(stop(reason)),
                        };
                    }
                    ordinals.push(n);
                }
                Err(reason) => {
                    return Self {
                        ordinals,
                        stop: Some(stop(reason)),
                    }
                }
            }
        }
        Self {
            ordinals,
            stop: selectors.stop.clone(),
        }
    }

    /// Number of visible devices.
    pub fn len(&self) -> usize {
        self.ordinals.len()
    }

    /// True when no device is visible.
    pub fn is_empty(&self) -> bool {
        self.ordinals.is_empty()
    }
}

/// The programmatic mask, and whether kiln's CUDA state already froze it.
struct VisibilityControl {
    requested: Option<Vec<String>>,
    frozen: bool,
}

static CONTROL: Mutex<VisibilityControl> = Mutex::new(VisibilityControl {
    requested: None,
    frozen: false,
});

/// Checks one programmatic entry strictly: a plain ordinal or a `GPU-`/`MIG-` UUID (prefix).
fn check_entry(index: usize, entry: &str) -> Result<DeviceSelector> {
    let invalid = |why: &str| Error::InvalidVisibleDevice {
        index,
        entry: entry.to_string(),
        why: why.to_string(),
    };
    if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
        return entry
            .parse()
            .map(DeviceSelector::Ordinal)
            .map_err(|_| invalid("ordinal too large"));
    }
    if let Some(rest) = entry.strip_prefix("GPU-") {
        if rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Ok(DeviceSelector::Uuid(entry.to_string()));
        }
        return Err(invalid("a GPU UUID holds only hex digits and dashes"));
    }
    if let Some(rest) = entry.strip_prefix("MIG-") {
        // `MIG-<uuid>`, or the older `MIG-GPU-<uuid>/<gpu instance>/<compute instance>`.
        let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'/';
        if !rest.is_empty() && rest.bytes().all(allowed) {
            return Ok(DeviceSelector::Uuid(entry.to_string()));
        }
        return Err(invalid(
            "a MIG id holds only letters, digits, dashes and slashes",
        ));
    }
    Err(invalid(
        "write an ordinal such as \"0\" or a UUID such as \"GPU-8932f937\"",
    ))
}

/// Restricts the CUDA devices kiln uses to `ids` (ordinals or `GPU-`/`MIG-` UUID prefixes, among
/// the devices `CUDA_VISIBLE_DEVICES` leaves visible), in that order: `cuda:0` becomes `ids[0]`.
/// An empty list hides every device.
///
/// Must be called before kiln first initialises CUDA (see the module docs); afterwards it returns
/// [`Error::VisibilityFrozen`]. Entries are checked here for syntax, kind and duplicates; an entry
/// naming no existing device stops the list there when CUDA initialises, as the driver does, and
/// [`crate::cuda_status`] reports it.
pub fn set_visible_devices<S: AsRef<str>>(ids: &[S]) -> Result<()> {
    let mut entries = Vec::with_capacity(ids.len());
    for (index, id) in ids.iter().enumerate() {
        let id = id.as_ref();
        let sel = check_entry(index, id)?;
        if let Some(first) = entries.iter().position(|(s, _)| *s == sel) {
            return Err(Error::InvalidVisibleDevice {
                index,
                entry: id.to_string(),
                why: format!("it repeats entry {first}; name each device once"),
            });
        }
        entries.push((sel, id.to_string()));
    }
    let kinds = entries
        .iter()
        .filter(|(s, _)| matches!(s, DeviceSelector::Ordinal(_)))
        .count();
    if kinds != 0 && kinds != entries.len() {
        return Err(Error::InvalidVisibleDevice {
            index: 0,
            entry: ids.iter().map(|s| s.as_ref()).collect::<Vec<_>>().join(","),
            why: "ordinals and UUIDs are mixed; use one kind".to_string(),
        });
    }
    let mut control = CONTROL.lock().unwrap_or_else(|e| e.into_inner());
    if control.frozen {
        return Err(Error::VisibilityFrozen);
    }
    control.requested = Some(entries.into_iter().map(|(_, s)| s).collect());
    Ok(())
}

/// Freezes the programmatic mask (kiln's CUDA state is being initialised) and returns it as a
/// comma-separated list, `None` when [`set_visible_devices`] was never called.
pub(crate) fn freeze() -> Option<String> {
    let mut control = CONTROL.lock().unwrap_or_else(|e| e.into_inner());
    control.frozen = true;
    control.requested.as_ref().map(|ids| ids.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuids() -> Vec<String> {
        [
            "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
            "GPU-8932aaaa-0000-4106-c12f-20bd9faed9f6",
            "GPU-11111111-2222-3333-4444-555555555555",
            "GPU-ffff0000-2222-3333-4444-555555555555",
        ]
        .map(String::from)
        .to_vec()
    }

    /// (spec, expected logical -> device map, expected stop (entry index, reason))
    type Case = (
        Option<&'static str>,
        &'static [usize],
        Option<(usize, StopReason)>,
    );

    #[test]
    fn visibility_table() {
        use StopReason::*;
        let table: &[Case] = &[
            (None, &[0, 1, 2, 3], None),
            (Some(""), &[], Some((0, Malformed))),
            (Some("  "), &[], Some((0, Malformed))),
            (Some("0"), &[0], None),
            (Some("2,1"), &[2, 1], None),
            (Some("0,2,-1,1"), &[0, 2], Some((2, Negative))),
            (Some("-1"), &[], Some((0, Negative))),
            (Some("1, 3"), &[1, 3], None),
            (Some("1gpu,2ampere"), &[1, 2], None),
            (Some("+3"), &[3], None),
            (Some("0,4,1"), &[0], Some((1, OutOfRange { count: 4 }))),
            (
                Some("99999999999999999999999"),
                &[],
                Some((0, OutOfRange { count: 4 })),
            ),
            (Some("0,,1"), &[0], Some((1, Malformed))),
            (Some("1,x"), &[1], Some((1, Malformed))),
            (Some("0,GPU-1111"), &[0], Some((1, Malformed))),
            (Some("0,1,0"), &[], Some((2, Duplicate { first: 0 }))),
            (Some("3,3"), &[], Some((1, Duplicate { first: 0 }))),
            (Some("GPU-1111"), &[2], None),
            (Some("GPU-ffff0000,GPU-8932f"), &[3, 0], None),
            (Some("GPU-8932"), &[], Some((0, AmbiguousUuid))),
            (Some("GPU-1111,GPU-dead"), &[2], Some((1, UnknownUuid))),
            (Some("GPU-1111,0"), &[2], Some((1, Malformed))),
            (
                Some("GPU-1111,GPU-11111111-2222"),
                &[],
                Some((1, Duplicate { first: 0 })),
            ),
            (Some("MIG-1111"), &[], Some((0, UnknownUuid))),
        ];
        for (spec, ordinals, stop) in table {
            let got = VisibleDevices::parse(*spec, &uuids());
            assert_eq!(got.ordinals, *ordinals, "ordinals for {spec:?}");
            let got_stop = got.stop.as_ref().map(|s| (s.index, s.reason.clone()));
            assert_eq!(got_stop, *stop, "stop for {spec:?}");
        }
    }

    #[test]
    fn mig_ids_match_mig_devices() {
        let devices = vec![
            "MIG-aaaa1111-0000".to_string(),
            "MIG-bbbb2222-0000".to_string(),
        ];
        let got = VisibleDevices::parse(Some("MIG-bbbb,MIG-aaaa"), &devices);
        assert_eq!(got.ordinals, vec![1, 0]);
        assert_eq!(got.stop, None);
    }

    #[test]
    fn selectors_keep_entries_for_reporting() {
        let s = parse_selectors("3,1,-1,0");
        assert_eq!(
            s.entries,
            vec![DeviceSelector::Ordinal(3), DeviceSelector::Ordinal(1)]
        );
        let stop = s.stop.unwrap();
        assert_eq!((stop.index, stop.entry.as_str()), (2, "-1"));
        assert_eq!(
            parse_selectors("GPU-ab").entries,
            vec![DeviceSelector::Uuid("GPU-ab".into())]
        );
    }

    #[test]
    fn stop_messages_name_the_entry() {
        let got = VisibleDevices::parse(Some("0,7"), &uuids());
        let msg = got.stop.unwrap().to_string();
        assert_eq!(msg, "entry 1 (\"7\") is out of range: 4 device(s)");
    }

    #[test]
    fn programmatic_entries_are_checked_strictly() {
        assert!(check_entry(0, "0").is_ok());
        assert_eq!(
            check_entry(0, "GPU-89ab").unwrap(),
            DeviceSelector::Uuid("GPU-89ab".into())
        );
        assert!(check_entry(0, "MIG-GPU-89ab/1/0").is_ok());
        assert!(check_entry(0, "MIG-4f0b7a4c-13e2-5d6b-8b4a-0c6a0fe1f9f4").is_ok());
        for bad in [
            "", "-1", "1gpu", " 1", "GPU-xyz", "MIG-", "MIG-a b", "cuda:0",
        ] {
            let err = check_entry(3, bad).unwrap_err();
            assert!(
                matches!(err, Error::InvalidVisibleDevice { index: 3, .. }),
                "{bad:?}"
            );
        }
        let dup = set_visible_devices(&["1", "0", "1"]).unwrap_err();
        assert!(dup.to_string().contains("repeats entry 0"), "{dup}");
        let mixed = set_visible_devices(&["0", "GPU-ab"]).unwrap_err();
        assert!(mixed.to_string().contains("mixed"), "{mixed}");
    }
}
