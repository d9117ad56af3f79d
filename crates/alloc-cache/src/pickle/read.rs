//! The reader of the plain-data pickle subset (invariants in the parent module's docs).

use super::*;

/// Values on the reader's stack: atoms inline, containers by arena index.
#[derive(Clone)]
enum Slot {
    Atom(PickleValue),
    Container(usize),
}

enum Container {
    List(Vec<Slot>),
    Tuple(Vec<Slot>),
    Dict(Vec<(Slot, Slot)>),
}

/// Deepest nesting [`from_pickle`] builds (a snapshot nests 7 deep).
pub const MAX_DEPTH: usize = 64;

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Slot>,
    marks: Vec<usize>,
    memo: std::collections::HashMap<u64, Slot>,
    arena: Vec<Container>,
}

/// Reads the plain-data pickle `data` (kiln's writer, or Python's `pickle.dump` of plain data
/// at any protocol from 2 to 5).
pub fn from_pickle(data: &[u8]) -> Result<PickleValue, PickleError> {
    let mut r = Reader {
        data,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: std::collections::HashMap::new(),
        arena: Vec::new(),
    };
    loop {
        let at = r.pos;
        let op = r.take(1)?[0];
        if op == STOP {
            let top = r.pop(at)?;
            // Every node built is at most one input byte's worth of work, plus sharing: allow
            // shared references, but not an explosion of them.
            let mut budget = data.len().saturating_mul(64).max(1 << 16);
            return r.build(&top, 0, &mut budget, at);
        }
        r.step(op, at)?;
    }
}

fn bad(offset: usize, message: impl Into<String>) -> PickleError {
    PickleError::Malformed {
        offset,
        message: message.into(),
    }
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| {
                bad(
                    self.pos,
                    format!(
                        "needs {n} more bytes but {} are left (truncated file?)",
                        self.data.len() - self.pos
                    ),
                )
            })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64, PickleError> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
    }

    fn pop(&mut self, at: usize) -> Result<Slot, PickleError> {
        self.stack.pop().ok_or_else(|| bad(at, "stack underflow"))
    }

    fn pop_mark(&mut self, at: usize) -> Result<Vec<Slot>, PickleError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| bad(at, "an opcode needs a MARK but none is open"))?;
        Ok(self.stack.split_off(mark))
    }

    fn push_container(&mut self, c: Container) {
        self.arena.push(c);
        self.stack.push(Slot::Container(self.arena.len() - 1));
    }

    fn string(&mut self, n: u64, at: usize) -> Result<(), PickleError> {
        let n = usize::try_from(n).map_err(|_| bad(at, "str length overflows"))?;
        let bytes = self.take(n)?;
        let s = std::str::from_utf8(bytes)
            .map_err(|e| bad(at, format!("str is not UTF-8: {e}")))?
            .to_owned();
        self.stack.push(Slot::Atom(PickleValue::Str(s)));
        Ok(())
    }

    fn top_container(&mut self, depth_below: usize, at: usize) -> Result<usize, PickleError> {
        let idx = self
            .stack
            .len()
            .checked_sub(depth_below + 1)
            .ok_or_else(|| bad(at, "stack underflow"))?;
        match self.stack[idx] {
            Slot::Container(c) => Ok(c),
            Slot::Atom(ref v) => Err(bad(
                at,
                format!(
                    "expected a list or dict to add to, found a {}",
                    v.type_name()
                ),
            )),
        }
    }

    fn extend(&mut self, target: usize, items: Vec<Slot>, at: usize) -> Result<(), PickleError> {
        match &mut self.arena[target] {
            Container::List(v) => {
                v.extend(items);
                Ok(())
            }
            Container::Dict(d) => {
                if !items.len().is_multiple_of(2) {
                    return Err(bad(at, "SETITEMS with an odd number of items"));
                }
                let mut it = items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    d.push((k, v));
                }
                Ok(())
            }
            Container::Tuple(_) => Err(bad(at, "cannot add items to a tuple")),
        }
    }

    fn step(&mut self, op: u8, at: usize) -> Result<(), PickleError> {
        match op {
            PROTO => {
                let v = self.take(1)?[0];
                if !(2..=5).contains(&v) {
                    return Err(bad(at, format!("protocol {v}; expected 2 to 5")));
                }
            }
            FRAME => {
                self.take(8)?;
            }
            MARK => self.marks.push(self.stack.len()),
            POP => {
                self.pop(at)?;
            }
            POP_MARK => {
                self.pop_mark(at)?;
            }
            EMPTY_DICT => self.push_container(Container::Dict(Vec::new())),
            EMPTY_LIST => self.push_container(Container::List(Vec::new())),
            EMPTY_TUPLE => self.push_container(Container::Tuple(Vec::new())),
            LIST => {
                let items = self.pop_mark(at)?;
                self.push_container(Container::List(items));
            }
            TUPLE => {
                let items = self.pop_mark(at)?;
                self.push_container(Container::Tuple(items));
            }
            DICT => {
                let items = self.pop_mark(at)?;
                self.push_container(Container::Dict(Vec::new()));
                let target = self.top_container(0, at)?;
                self.extend(target, items, at)?;
            }
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let n = (op - TUPLE1 + 1) as usize;
                let start = self
                    .stack
                    .len()
                    .checked_sub(n)
                    .ok_or_else(|| bad(at, "stack underflow"))?;
                let items = self.stack.split_off(start);
                self.push_container(Container::Tuple(items));
            }
            APPEND => {
                let v = self.pop(at)?;
                let target = self.top_container(0, at)?;
                self.extend(target, vec![v], at)?;
            }
            SETITEM => {
                let v = self.pop(at)?;
                let k = self.pop(at)?;
                let target = self.top_container(0, at)?;
                self.extend(target, vec![k, v], at)?;
            }
            APPENDS | SETITEMS => {
                let items = self.pop_mark(at)?;
                let target = self.top_container(0, at)?;
                self.extend(target, items, at)?;
            }
            BININT => {
                let v = self.uint(4)? as u32 as i32;
                self.stack.push(Slot::Atom(PickleValue::Int(v as i128)));
            }
            BININT1 => {
                let v = self.uint(1)?;
                self.stack.push(Slot::Atom(PickleValue::Int(v as i128)));
            }
            BININT2 => {
                let v = self.uint(2)?;
                self.stack.push(Slot::Atom(PickleValue::Int(v as i128)));
            }
            LONG1 => {
                let n = self.take(1)?[0] as usize;
                if n > 16 {
                    return Err(bad(at, format!("a {n}-byte int is over 128 bits")));
                }
                let b = self.take(n)?;
                let fill = if b.last().is_some_and(|&x| x >= 0x80) {
                    0xff
                } else {
                    0
                };
                let mut full = [fill; 16];
                full[..n].copy_from_slice(b);
                self.stack
                    .push(Slot::Atom(PickleValue::Int(i128::from_le_bytes(full))));
            }
            BINFLOAT => {
                let b: [u8; 8] = self.take(8)?.try_into().expect("8 bytes");
                self.stack
                    .push(Slot::Atom(PickleValue::Float(f64::from_be_bytes(b))));
            }
            SHORT_BINUNICODE => {
                let n = self.uint(1)?;
                self.string(n, at)?;
            }
            BINUNICODE => {
                let n = self.uint(4)?;
                self.string(n, at)?;
            }
            BINUNICODE8 => {
                let n = self.uint(8)?;
                self.string(n, at)?;
            }
            NONE => self.stack.push(Slot::Atom(PickleValue::None)),
            NEWTRUE => self.stack.push(Slot::Atom(PickleValue::Bool(true))),
            NEWFALSE => self.stack.push(Slot::Atom(PickleValue::Bool(false))),
            MEMOIZE | BINPUT | LONG_BINPUT => {
                let key = match op {
                    MEMOIZE => self.memo.len() as u64,
                    BINPUT => self.uint(1)?,
                    _ => self.uint(4)?,
                };
                let top = self
                    .stack
                    .last()
                    .cloned()
                    .ok_or_else(|| bad(at, "memoize with an empty stack"))?;
                self.memo.insert(key, top);
            }
            BINGET | LONG_BINGET => {
                let key = if op == BINGET {
                    self.uint(1)?
                } else {
                    self.uint(4)?
                };
                let v = self
                    .memo
                    .get(&key)
                    .cloned()
                    .ok_or_else(|| bad(at, format!("memo key {key} was never set")))?;
                self.stack.push(v);
            }
            other => {
                return Err(bad(
                    at,
                    format!(
                        "opcode {other:#04x} ({:?}) is outside the plain-data subset \
                         (dict, list, tuple, str, int, float, bool, None); a pickle of objects \
                         cannot be read here",
                        other as char
                    ),
                ))
            }
        }
        Ok(())
    }

    fn build(
        &self,
        slot: &Slot,
        depth: usize,
        budget: &mut usize,
        at: usize,
    ) -> Result<PickleValue, PickleError> {
        *budget = budget
            .checked_sub(1)
            .ok_or_else(|| bad(at, "shared references expand past the node budget"))?;
        let c = match slot {
            Slot::Atom(v) => return Ok(v.clone()),
            Slot::Container(c) => &self.arena[*c],
        };
        if depth >= MAX_DEPTH {
            return Err(bad(
                at,
                format!("nested deeper than {MAX_DEPTH} (a self-referencing container?)"),
            ));
        }
        let list = |items: &[Slot], budget: &mut usize| {
            items
                .iter()
                .map(|s| self.build(s, depth + 1, budget, at))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(match c {
            Container::List(items) => PickleValue::List(list(items, budget)?),
            Container::Tuple(items) => PickleValue::Tuple(list(items, budget)?),
            Container::Dict(items) => PickleValue::Dict(
                items
                    .iter()
                    .map(|(k, v)| {
                        Ok((
                            self.build(k, depth + 1, budget, at)?,
                            self.build(v, depth + 1, budget, at)?,
                        ))
                    })
                    .collect::<Result<Vec<_>, PickleError>>()?,
            ),
        })
    }
}
