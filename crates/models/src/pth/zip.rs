//! A read-only zip reader for the container `torch.save` writes.
//!
//! Invariants: the whole archive is one borrowed byte slice and nothing is read outside it;
//! every offset and length taken from the file is combined with checked arithmetic and checked
//! against the slice before it is used, so a hostile archive gives a [`PthError`], never a panic
//! or an allocation larger than the archive itself (or, for a deflated entry, larger than its
//! declared size, which is capped by the compressed length times deflate's largest ratio).
//! Entries are located through the central directory (zip64 records included, as PyTorch writes
//! them for large files), their data through each local header, and every entry's CRC-32 is
//! checked when it is read. Stored entries (what PyTorch writes) are borrowed, not copied.

use super::error::PthError;
use std::borrow::Cow;

const EOCD_SIG: u32 = 0x0605_4b50;
const ZIP64_LOCATOR_SIG: u32 = 0x0706_4b50;
const ZIP64_EOCD_SIG: u32 = 0x0606_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
const EOCD_LEN: usize = 22;
const CENTRAL_LEN: usize = 46;
const LOCAL_LEN: usize = 30;
/// The most a zip comment can add after the end-of-central-directory record.
const MAX_COMMENT: usize = 0xFFFF;
/// Deflate cannot expand data by more than about 1032:1.
const MAX_DEFLATE_RATIO: u64 = 1100;

const METHOD_STORED: u16 = 0;
const METHOD_DEFLATED: u16 = 8;

fn bad(msg: impl Into<String>) -> PthError {
    PthError::Zip(msg.into())
}

/// `len` bytes at `at`, or an error naming `what`.
fn slice<'a>(b: &'a [u8], at: u64, len: u64, what: &str) -> Result<&'a [u8], PthError> {
    let start = usize::try_from(at).map_err(|_| bad(format!("{what} lies past the file")))?;
    let len = usize::try_from(len).map_err(|_| bad(format!("{what} lies past the file")))?;
    start
        .checked_add(len)
        .and_then(|end| b.get(start..end))
        .ok_or_else(|| {
            bad(format!(
                "{what} ({len} bytes at offset {start}) lies past the end of the {}-byte file",
                b.len()
            ))
        })
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// One file of the archive, as its central directory describes it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The entry's path inside the archive.
    pub name: String,
    method: u16,
    crc32: u32,
    compressed_size: u64,
    uncompressed_size: u64,
    local_header_offset: u64,
}

/// An opened archive: its entries, borrowing the bytes.
pub(crate) struct ZipArchive<'a> {
    bytes: &'a [u8],
    /// Entries in central-directory order.
    pub entries: Vec<Entry>,
}

impl<'a> ZipArchive<'a> {
    /// Reads the central directory of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Result<Self, PthError> {
        let eocd = find_eocd(bytes)?;
        let rec = &bytes[eocd..eocd + EOCD_LEN];
        let mut count = u64::from(u16_at(rec, 10));
        let mut cd_size = u64::from(u32_at(rec, 12));
        let mut cd_offset = u64::from(u32_at(rec, 16));
        if count == 0xFFFF || cd_size == 0xFFFF_FFFF || cd_offset == 0xFFFF_FFFF {
            (count, cd_size, cd_offset) = read_zip64_eocd(bytes, eocd)?;
        }
        let cd = slice(bytes, cd_offset, cd_size, "the central directory")?;
        // Each record takes at least CENTRAL_LEN bytes, which bounds the allocation below.
        if count > (cd.len() / CENTRAL_LEN) as u64 {
            return Err(bad(format!(
                "the archive claims {count} entries but its central directory has room for {}",
                cd.len() / CENTRAL_LEN
            )));
        }
        let mut entries = Vec::with_capacity(count as usize);
        let mut at = 0usize;
        for i in 0..count {
            let head = cd
                .get(at..at + CENTRAL_LEN)
                .ok_or_else(|| bad(format!("central directory record {i} is cut short")))?;
            if u32_at(head, 0) != CENTRAL_SIG {
                return Err(bad(format!(
                    "central directory record {i} has a bad signature"
                )));
            }
            let name_len = usize::from(u16_at(head, 28));
            let extra_len = usize::from(u16_at(head, 30));
            let comment_len = usize::from(u16_at(head, 32));
            let var = cd
                .get(at + CENTRAL_LEN..at + CENTRAL_LEN + name_len + extra_len + comment_len)
                .ok_or_else(|| bad(format!("central directory record {i} is cut short")))?;
            let name = std::str::from_utf8(&var[..name_len])
                .map_err(|_| bad(format!("the name of entry {i} is not UTF-8")))?
                .to_string();
            let mut entry = Entry {
                name,
                method: u16_at(head, 10),
                crc32: u32_at(head, 16),
                compressed_size: u64::from(u32_at(head, 20)),
                uncompressed_size: u64::from(u32_at(head, 24)),
                local_header_offset: u64::from(u32_at(head, 42)),
            };
            apply_zip64_extra(&mut entry, &var[name_len..name_len + extra_len])?;
            entries.push(entry);
            at += CENTRAL_LEN + name_len + extra_len + comment_len;
        }
        Ok(ZipArchive { bytes, entries })
    }

    /// The entry called `name`, if there is one.
    pub fn find(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The uncompressed bytes of `entry`, checked against its CRC-32.
    pub fn read(&self, entry: &Entry) -> Result<Cow<'a, [u8]>, PthError> {
        let what = format!("entry {:?}", entry.name);
        let local = slice(
            self.bytes,
            entry.local_header_offset,
            LOCAL_LEN as u64,
            &what,
        )?;
        if u32_at(local, 0) != LOCAL_SIG {
            return Err(bad(format!("{what} has a bad local header signature")));
        }
        let skip = LOCAL_LEN as u64 + u64::from(u16_at(local, 26)) + u64::from(u16_at(local, 28));
        let start = entry
            .local_header_offset
            .checked_add(skip)
            .ok_or_else(|| bad(format!("{what} lies past the file")))?;
        let raw = slice(self.bytes, start, entry.compressed_size, &what)?;
        let data: Cow<'a, [u8]> = match entry.method {
            METHOD_STORED => {
                if entry.compressed_size != entry.uncompressed_size {
                    return Err(bad(format!(
                        "{what} is stored but its sizes differ ({} and {})",
                        entry.compressed_size, entry.uncompressed_size
                    )));
                }
                Cow::Borrowed(raw)
            }
            METHOD_DEFLATED => Cow::Owned(inflate(raw, entry, &what)?),
            m => {
                return Err(PthError::Zip(format!(
                    "{what} uses compression method {m}; only stored (0) and deflate (8) are \
                     read: re-save the file with torch.save"
                )))
            }
        };
        let crc = crc32fast::hash(&data);
        if crc != entry.crc32 {
            return Err(bad(format!(
                "{what} is corrupt: its CRC-32 is {crc:#010x}, the archive says {:#010x}",
                entry.crc32
            )));
        }
        Ok(data)
    }
}

fn inflate(raw: &[u8], entry: &Entry, what: &str) -> Result<Vec<u8>, PthError> {
    let cap = (raw.len() as u64).saturating_mul(MAX_DEFLATE_RATIO);
    if entry.uncompressed_size > cap {
        return Err(bad(format!(
            "{what} claims {} bytes from {} compressed ones, more than deflate can produce",
            entry.uncompressed_size,
            raw.len()
        )));
    }
    let limit = usize::try_from(entry.uncompressed_size)
        .map_err(|_| bad(format!("{what} is too large for this machine")))?;
    let out = miniz_oxide::inflate::decompress_to_vec_with_limit(raw, limit)
        .map_err(|e| bad(format!("{what} does not inflate: {:?}", e.status)))?;
    if out.len() as u64 != entry.uncompressed_size {
        return Err(bad(format!(
            "{what} inflates to {} bytes, the archive says {}",
            out.len(),
            entry.uncompressed_size
        )));
    }
    Ok(out)
}

/// The offset of the end-of-central-directory record, searched backwards over a possible
/// comment.
fn find_eocd(b: &[u8]) -> Result<usize, PthError> {
    if b.len() < EOCD_LEN {
        return Err(bad("the file is too short to be a zip archive"));
    }
    let last = b.len() - EOCD_LEN;
    let first = last.saturating_sub(MAX_COMMENT);
    (first..=last)
        .rev()
        .find(|&at| u32_at(b, at) == EOCD_SIG)
        .ok_or_else(|| bad("no end-of-central-directory record: the zip archive is cut short"))
}

/// `(entries, central directory size, central directory offset)` from the zip64 records.
fn read_zip64_eocd(b: &[u8], eocd: usize) -> Result<(u64, u64, u64), PthError> {
    let loc_at = eocd
        .checked_sub(20)
        .ok_or_else(|| bad("the zip64 locator is missing"))?;
    let loc = &b[loc_at..eocd];
    if u32_at(loc, 0) != ZIP64_LOCATOR_SIG {
        return Err(bad("the zip64 locator is missing or has a bad signature"));
    }
    let rec = slice(b, u64_at(loc, 8), 56, "the zip64 end record")?;
    if u32_at(rec, 0) != ZIP64_EOCD_SIG {
        return Err(bad("the zip64 end record has a bad signature"));
    }
    Ok((u64_at(rec, 32), u64_at(rec, 40), u64_at(rec, 48)))
}

/// Replaces the 32-bit fields saturated at `0xFFFF_FFFF` by their zip64 extra-field values.
fn apply_zip64_extra(entry: &mut Entry, mut extra: &[u8]) -> Result<(), PthError> {
    while extra.len() >= 4 {
        let id = u16_at(extra, 0);
        let len = usize::from(u16_at(extra, 2));
        let body = extra.get(4..4 + len).ok_or_else(|| {
            bad(format!(
                "entry {:?} has a cut-short extra field",
                entry.name
            ))
        })?;
        if id == 0x0001 {
            let mut fields = body.chunks_exact(8).map(|c| u64_at(c, 0));
            let mut take = |field: &mut u64| -> Result<(), PthError> {
                if *field == 0xFFFF_FFFF {
                    *field = fields
                        .next()
                        .ok_or_else(|| bad(format!("entry {:?} lacks a zip64 size", entry.name)))?;
                }
                Ok(())
            };
            take(&mut entry.uncompressed_size)?;
            take(&mut entry.compressed_size)?;
            take(&mut entry.local_header_offset)?;
        }
        extra = &extra[4 + len..];
    }
    Ok(())
}
