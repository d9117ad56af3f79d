//! TensorBoard event files: writer and reader.
//!
//! An event file is a TFRecord stream. Each record is
//! `u64 length (LE) | u32 masked CRC-32C of those 8 bytes | data | u32 masked CRC-32C of data`,
//! and each `data` is a serialized `tensorflow.Event` protobuf. The first event carries
//! `file_version = "brain.Event:2"`; scalar events carry `wall_time`, `step` and a `Summary`
//! whose `Value`s hold `tag` and `simple_value` (a 32-bit float: TensorBoard's scalar format,
//! so logged f64s are rounded to f32 here; the CSV output keeps full precision).
//!
//! Only these protobuf fields are needed, so they are encoded by hand:
//! `Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//! SessionLog session_log = 7; }`, `Summary { repeated Value value = 1; }`,
//! `Value { string tag = 1; float simple_value = 2; }`, `SessionLog { SessionStatus status = 1; }`
//! (`START = 1`).
//!
//! A resumed run does what PyTorch's `SummaryWriter(purge_step = S)` does: its new file starts
//! with a `SessionLog` START event at step `S` ([`EventWriter::create_purging`]), and TensorBoard,
//! reading a folder's files in name order (time of creation), then drops every event of the
//! earlier files with a step of `S` or more: the steps the killed run logged after its last
//! checkpoint, which the resumed run logs again, show once. [`read_log_dir`] applies the same
//! rule, so tests see what TensorBoard shows.
//! The reader decodes the same fields, skips any others, and verifies both CRCs of every
//! record, so tests can check a file byte for byte without Python.
//!
//! The writer only appends, and flushes to the OS after every `flush_every` events (default 1:
//! every event), when asked, and when dropped; a process that dies keeps every event logged
//! before its last flush. A partially written last record (a crash mid-write) is reported by
//! the reader as truncated, never misread.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::crc32c::masked_crc32c;
use crate::error::{Result, SchedError};

/// The version string TensorBoard expects in the first event.
pub const FILE_VERSION: &str = "brain.Event:2";

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, ((field as u64) << 3) | wire as u64);
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(out, field, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Serialize one `Event` protobuf.
pub fn encode_event(wall_time: f64, step: i64, body: &EventBody) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    put_key(&mut out, 1, 1);
    out.extend_from_slice(&wall_time.to_le_bytes());
    if step != 0 {
        put_key(&mut out, 2, 0);
        put_varint(&mut out, step as u64);
    }
    match body {
        EventBody::FileVersion(v) => put_bytes(&mut out, 3, v.as_bytes()),
        EventBody::SessionStart => {
            // SessionLog { status: START }
            put_bytes(&mut out, 7, &[0x08, 0x01]);
        }
        EventBody::Scalars(values) => {
            let mut summary = Vec::new();
            for (tag, value) in values {
                let mut v = Vec::with_capacity(tag.len() + 8);
                put_bytes(&mut v, 1, tag.as_bytes());
                put_key(&mut v, 2, 5);
                v.extend_from_slice(&value.to_le_bytes());
                put_bytes(&mut summary, 1, &v);
            }
            put_bytes(&mut out, 5, &summary);
        }
    }
    out
}

/// Frame `data` as one TFRecord.
pub fn frame_record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// What an event carries (the subset kiln writes and reads).
#[derive(Debug, Clone, PartialEq)]
pub enum EventBody {
    /// The first event of a file.
    FileVersion(String),
    /// Scalar summaries: `(tag, simple_value)`.
    Scalars(Vec<(String, f32)>),
    /// `SessionLog { status: START }`: a (re)started run; TensorBoard drops the events of
    /// earlier files with this event's step or a later one. (Other session statuses are read as
    /// an empty `Scalars`: kiln never writes them.)
    SessionStart,
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// Global step.
    pub step: i64,
    /// Its content.
    pub body: EventBody,
}

fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() {
        "localhost".into()
    } else {
        clean
    }
}

pub(crate) fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SchedError + '_ {
    move |source| SchedError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Appends events to a new `events.out.tfevents.<time>.<host>` file in a log directory.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
    flush_every: usize,
    unflushed: usize,
}

impl EventWriter {
    /// Create `dir` if needed and a new event file in it (never overwriting one: a name taken
    /// in the same second gets a `.1`, `.2`, ... suffix), and write the file-version event.
    pub fn create(dir: impl AsRef<Path>) -> Result<Self> {
        Self::create_file(dir.as_ref())
    }

    /// [`create`](Self::create) for a resumed run, like PyTorch's
    /// `SummaryWriter(purge_step = purge_step)`: after the file-version event the new file holds a
    /// `SessionLog` START event at `purge_step`, so TensorBoard drops every event of the folder's
    /// earlier files whose step is `purge_step` or later (those the resumed run logs again).
    /// Errors when `purge_step` is negative.
    pub fn create_purging(dir: impl AsRef<Path>, purge_step: i64) -> Result<Self> {
        if purge_step < 0 {
            return Err(SchedError::InvalidLog {
                reason: format!(
                    "purge step {purge_step} is negative: pass the first step the resumed run logs"
                ),
            });
        }
        let mut w = Self::create_file(dir.as_ref())?;
        w.write_event(now(), purge_step, &EventBody::SessionStart)?;
        w.flush()?;
        Ok(w)
    }

    fn create_file(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let wall = now();
        let base = format!("events.out.tfevents.{}.{}", wall as u64, host_name());
        let mut n = 0;
        let (path, file) = loop {
            let name = if n == 0 {
                base.clone()
            } else {
                format!("{base}.{n}")
            };
            let path = dir.join(name);
            match OpenOptions::new().append(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(SchedError::Io { path, source: e }),
            }
        };
        let mut w = Self {
            path,
            out: BufWriter::new(file),
            flush_every: 1,
            unflushed: 0,
        };
        w.write_event(wall, 0, &EventBody::FileVersion(FILE_VERSION.into()))?;
        w.flush()?;
        Ok(w)
    }

    /// Flush after every `n` events (1 = every event, the default). 0 is treated as 1.
    pub fn set_flush_every(&mut self, n: usize) {
        self.flush_every = n.max(1);
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Append one event.
    pub fn write_event(&mut self, wall_time: f64, step: i64, body: &EventBody) -> Result<()> {
        let record = frame_record(&encode_event(wall_time, step, body));
        self.out.write_all(&record).map_err(io_err(&self.path))?;
        self.unflushed += 1;
        if self.unflushed >= self.flush_every {
            self.flush()?;
        }
        Ok(())
    }

    /// Hand everything written so far to the OS.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(io_err(&self.path))?;
        self.unflushed = 0;
        Ok(())
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.data.get(self.pos)?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.data.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    /// Skip a field of wire type `wire`.
    fn skip(&mut self, wire: u64) -> Option<()> {
        match wire {
            0 => self.varint().map(|_| ()),
            1 => self.take(8).map(|_| ()),
            2 => {
                let n = self.varint()? as usize;
                self.take(n).map(|_| ())
            }
            5 => self.take(4).map(|_| ()),
            _ => None,
        }
    }
}

fn decode_value(data: &[u8]) -> Option<Option<(String, f32)>> {
    let mut c = Cursor { data, pos: 0 };
    let (mut tag, mut value) = (None, None);
    while !c.done() {
        let key = c.varint()?;
        match (key >> 3, key & 7) {
            (1, 2) => {
                let n = c.varint()? as usize;
                tag = Some(String::from_utf8(c.take(n)?.to_vec()).ok()?);
            }
            (2, 5) => value = Some(f32::from_le_bytes(c.take(4)?.try_into().ok()?)),
            (_, wire) => c.skip(wire)?,
        }
    }
    Some(tag.zip(value))
}

/// Decode one `Event` protobuf (the fields kiln uses; others are skipped).
pub fn decode_event(data: &[u8]) -> Option<Event> {
    let mut c = Cursor { data, pos: 0 };
    let mut event = Event {
        wall_time: 0.0,
        step: 0,
        body: EventBody::Scalars(Vec::new()),
    };
    while !c.done() {
        let key = c.varint()?;
        match (key >> 3, key & 7) {
            (1, 1) => event.wall_time = f64::from_le_bytes(c.take(8)?.try_into().ok()?),
            (2, 0) => event.step = c.varint()? as i64,
            (3, 2) => {
                let n = c.varint()? as usize;
                event.body = EventBody::FileVersion(String::from_utf8(c.take(n)?.to_vec()).ok()?);
            }
            (7, 2) => {
                let n = c.varint()? as usize;
                let mut s = Cursor {
                    data: c.take(n)?,
                    pos: 0,
                };
                let mut status = 0;
                while !s.done() {
                    let key = s.varint()?;
                    if key == 1 << 3 {
                        status = s.varint()?;
                    } else {
                        s.skip(key & 7)?;
                    }
                }
                if status == 1 {
                    event.body = EventBody::SessionStart;
                }
            }
            (5, 2) => {
                let n = c.varint()? as usize;
                let mut s = Cursor {
                    data: c.take(n)?,
                    pos: 0,
                };
                let mut values = Vec::new();
                while !s.done() {
                    let key = s.varint()?;
                    if key == (1 << 3) | 2 {
                        let n = s.varint()? as usize;
                        if let Some(v) = decode_value(s.take(n)?)? {
                            values.push(v);
                        }
                    } else {
                        s.skip(key & 7)?;
                    }
                }
                event.body = EventBody::Scalars(values);
            }
            (_, wire) => c.skip(wire)?,
        }
    }
    Some(event)
}

/// Read every event of an event file, verifying both CRCs of every record. Errors name the
/// byte offset of the first bad or truncated record.
pub fn read_events(path: impl AsRef<Path>) -> Result<Vec<Event>> {
    let path = path.as_ref();
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io_err(path))?;
    let corrupt = |offset: usize, what: &str| SchedError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("record at byte {offset}: {what}"),
    };
    let mut events = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let header = bytes
            .get(pos..pos + 12)
            .ok_or_else(|| corrupt(pos, "truncated header"))?;
        let len_bytes = &header[..8];
        let crc = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
        if crc != masked_crc32c(len_bytes) {
            return Err(corrupt(pos, "length CRC mismatch"));
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let start = pos + 12;
        let data = start
            .checked_add(len)
            .and_then(|end| bytes.get(start..end))
            .ok_or_else(|| corrupt(pos, "truncated data"))?;
        let footer = bytes
            .get(start + len..start + len + 4)
            .ok_or_else(|| corrupt(pos, "truncated data CRC"))?;
        if u32::from_le_bytes(footer.try_into().expect("4 bytes")) != masked_crc32c(data) {
            return Err(corrupt(pos, "data CRC mismatch"));
        }
        events.push(decode_event(data).ok_or_else(|| corrupt(pos, "not an Event protobuf"))?);
        pos = start + len + 4;
    }
    Ok(events)
}

/// Every event of a log folder as TensorBoard shows it: the `events.out.tfevents.*` files (not
/// those of subfolders) read in name order, which is their order of creation, and each
/// [`EventBody::SessionStart`] at step `S` dropping the scalar events read before it whose step
/// is `S` or more (TensorBoard's purge of orphaned data, `purge_orphaned_data = True`, its
/// default). File-version and session events are kept. Errors name the file that is corrupt.
pub fn read_log_dir(dir: impl AsRef<Path>) -> Result<Vec<Event>> {
    let dir = dir.as_ref();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("events.out.tfevents.") && entry.path().is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    let mut events: Vec<Event> = Vec::new();
    for file in files {
        for event in read_events(&file)? {
            if event.body == EventBody::SessionStart {
                events.retain(|e| !matches!(e.body, EventBody::Scalars(_)) || e.step < event.step);
            }
            events.push(event);
        }
    }
    Ok(events)
}
