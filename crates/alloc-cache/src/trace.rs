//! Allocation traces: the text format, a recorder and a parser.
//!
//! One event a line: `a ID BYTES` (allocate BYTES, the caller's request before rounding, under
//! the name ID), `f ID` (free it), `# comment`. Blank lines are ignored. An ID may be reused after
//! its free. Traces recorded from any run can be replayed through any backend (see
//! [`crate::replay`]).

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fmt::Write as _;

/// One trace event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEvent {
    /// `a ID BYTES`.
    Alloc {
        /// Name of the allocation.
        id: u64,
        /// Bytes requested.
        bytes: usize,
    },
    /// `f ID`.
    Free {
        /// Name of the allocation freed.
        id: u64,
    },
}

/// A parsed, validated trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Events in order.
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// Parses the text format; rejects unknown lines, frees of ids that are not live, and
    /// allocations under an id that is still live, naming the line.
    pub fn parse(text: &str) -> Result<Trace> {
        let mut events = Vec::new();
        let mut live: HashMap<u64, usize> = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let err = |message: String| Error::TraceParse { line, message };
            let text = raw.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            let mut parts = text.split_whitespace();
            let number = |p: Option<&str>, what: &str| -> Result<u64> {
                let p = p.ok_or_else(|| {
                    err(format!(
                        "`{text}` lacks the {what}; write `a ID BYTES` or `f ID`"
                    ))
                })?;
                p.parse()
                    .map_err(|_| err(format!("{what} `{p}` is not a non-negative integer")))
            };
            let event = match parts.next() {
                Some("a") => {
                    let id = number(parts.next(), "id")?;
                    let bytes = number(parts.next(), "byte count")? as usize;
                    if let Some(&at) = live.get(&id) {
                        return Err(err(format!(
                            "id {id} is allocated again while live (allocated on line {at}); free it first or use a new id"
                        )));
                    }
                    live.insert(id, line);
                    TraceEvent::Alloc { id, bytes }
                }
                Some("f") => {
                    let id = number(parts.next(), "id")?;
                    if live.remove(&id).is_none() {
                        return Err(err(format!("id {id} is freed but not live; every `f ID` needs an earlier `a ID BYTES`")));
                    }
                    TraceEvent::Free { id }
                }
                _ => {
                    return Err(err(format!(
                        "`{text}` is not an event; lines are `a ID BYTES`, `f ID` or `# comment`"
                    )))
                }
            };
            if let Some(extra) = parts.next() {
                return Err(err(format!("unexpected `{extra}` after the event")));
            }
            events.push(event);
        }
        Ok(Trace { events })
    }

    /// Reads and parses a trace file.
    pub fn read(path: impl AsRef<std::path::Path>) -> Result<Trace> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        Trace::parse(&text)
    }

    /// The text format (no comments).
    pub fn to_text(&self) -> String {
        let mut r = TraceRecorder::new();
        for e in &self.events {
            match *e {
                TraceEvent::Alloc { id, bytes } => r.record_alloc(id, bytes),
                TraceEvent::Free { id } => r.record_free(id),
            }
        }
        r.into_string()
    }

    /// Largest sum of live requested bytes over the trace.
    pub fn peak_live_bytes(&self) -> usize {
        let mut sizes = HashMap::new();
        let (mut live, mut peak) = (0usize, 0usize);
        for e in &self.events {
            match *e {
                TraceEvent::Alloc { id, bytes } => {
                    sizes.insert(id, bytes);
                    live += bytes;
                    peak = peak.max(live);
                }
                TraceEvent::Free { id } => live -= sizes.remove(&id).unwrap_or(0),
            }
        }
        peak
    }
}

/// Turns what a [`TraceRecorder`] attached to a running allocator wrote into a self-contained
/// trace file: frees of blocks allocated before recording began are dropped, ids are renumbered
/// densely (the lowest id free at the time is reused, so they stay small and the file short),
/// comment lines are kept in place, and blocks still live at the end are freed there (after a
/// comment saying how many), so the trace can be replayed back to back. Errors name the line of
/// an event that is not `a ID BYTES` or `f ID`, or an id allocated while live.
pub fn compact_recording(text: &str) -> Result<String> {
    let mut out = String::with_capacity(text.len() / 2);
    let mut names: HashMap<u64, u64> = HashMap::new();
    let mut spare: std::collections::BinaryHeap<std::cmp::Reverse<u64>> = Default::default();
    let mut next = 1u64;
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let event = raw.trim();
        if event.is_empty() {
            continue;
        }
        if event.starts_with('#') {
            let _ = writeln!(out, "{event}");
            continue;
        }
        let one = Trace::parse(event).map_err(|e| match e {
            Error::TraceParse { message, .. } => Error::TraceParse { line, message },
            other => other,
        });
        let one = match (one, event.starts_with("f ")) {
            (Ok(t), _) => t,
            // A lone free does not parse (nothing is live): read its id directly.
            (Err(_), true) => {
                let id: u64 = event[2..].trim().parse().map_err(|_| Error::TraceParse {
                    line,
                    message: format!("`{event}`: the id is not a non-negative integer"),
                })?;
                if let Some(name) = names.remove(&id) {
                    spare.push(std::cmp::Reverse(name));
                    let _ = writeln!(out, "f {name}");
                }
                continue;
            }
            (Err(e), false) => return Err(e),
        };
        if let Some(TraceEvent::Alloc { id, bytes }) = one.events.first().copied() {
            let name = match spare.pop() {
                Some(std::cmp::Reverse(n)) => n,
                None => {
                    next += 1;
                    next - 1
                }
            };
            if names.insert(id, name).is_some() {
                return Err(Error::TraceParse {
                    line,
                    message: format!("id {id} is allocated again while live; free it first"),
                });
            }
            let _ = writeln!(out, "a {name} {bytes}");
        }
    }
    if !names.is_empty() {
        let mut left: Vec<u64> = names.into_values().collect();
        left.sort_unstable();
        let _ = writeln!(
            out,
            "# {} blocks still live at the end, freed here",
            left.len()
        );
        for name in left {
            let _ = writeln!(out, "f {name}");
        }
    }
    Ok(out)
}

impl std::str::FromStr for Trace {
    type Err = Error;
    fn from_str(s: &str) -> Result<Trace> {
        Trace::parse(s)
    }
}

/// Writes events in the trace format as they happen. Attach one to an allocator with
/// [`CachingAllocator::set_trace_recorder`](crate::CachingAllocator::set_trace_recorder) (ids are
/// then the allocations' unique ids), or feed it by hand.
#[derive(Debug, Clone, Default)]
pub struct TraceRecorder {
    text: String,
    events: usize,
}

impl TraceRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `a ID BYTES`.
    pub fn record_alloc(&mut self, id: u64, bytes: usize) {
        let _ = writeln!(self.text, "a {id} {bytes}");
        self.events += 1;
    }

    /// Records `f ID`.
    pub fn record_free(&mut self, id: u64) {
        let _ = writeln!(self.text, "f {id}");
        self.events += 1;
    }

    /// Records `# TEXT` (one comment line per line of `text`).
    pub fn comment(&mut self, text: &str) {
        for line in text.lines() {
            let _ = writeln!(self.text, "# {line}");
        }
    }

    /// Number of alloc/free events recorded.
    pub fn events(&self) -> usize {
        self.events
    }

    /// The trace text so far.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The trace text.
    pub fn into_string(self) -> String {
        self.text
    }

    /// Writes the trace text to `path`.
    pub fn write_to(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, &self.text).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

/// Splits a trace file at its `# step ...` comment lines (as `cargo xtask record-traces` writes
/// them): the events before the first such line, then one [`Trace`] per step (the last one
/// runs to the end of the file). The whole text is validated first, so a step's events may
/// free blocks of earlier steps.
pub fn steps_of(text: &str) -> Result<Vec<Trace>> {
    let all = Trace::parse(text)?;
    let mut cuts = Vec::new();
    let mut events = 0;
    for line in text.lines().map(str::trim) {
        if line.starts_with("# step ") {
            cuts.push(events);
        } else if !line.is_empty() && !line.starts_with('#') {
            events += 1;
        }
    }
    let mut steps = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for to in cuts.into_iter().chain(std::iter::once(all.events.len())) {
        steps.push(Trace {
            events: all.events[from..to].to_vec(),
        });
        from = to;
    }
    Ok(steps)
}
