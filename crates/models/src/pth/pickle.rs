//! A pickle virtual machine for the subset `torch.save` writes for a `state_dict`, which builds
//! values and never runs code.
//!
//! Invariants: the only callables are the [`Global`]s of a fixed allow-list (an ordered dict, the
//! tensor and parameter rebuild functions, the storage types); any other `GLOBAL`, and any opcode
//! outside the subset, stops the load with an error naming it. A call to an allowed global builds
//! a plain record ([`Object::Tensor`], a dict), nothing more. Every length read from the stream
//! is checked against the bytes left before anything is allocated, and each opcode adds at most
//! one value or object, so memory stays proportional to the input. Containers live in an arena
//! (`objects`) and values refer to them by index, which gives pickle's shared references (memo,
//! `DUP`) without reference cycles; readers of the result limit their recursion depth.

use super::error::PthError;
use super::tensor::MAX_DIMS;
use super::value::{opcode_name, resolve_global, Global, Object, TensorRecord, Value};
use std::collections::HashMap;
use std::rc::Rc;

/// The result of one pickle: the top value and the arena it refers into.
pub(crate) struct Unpickled {
    pub top: Value,
    pub objects: Vec<Object>,
    /// Bytes the pickle took, so a caller reading several in a row knows where the next starts.
    pub consumed: usize,
}

fn bad(msg: impl Into<String>) -> PthError {
    PthError::Pickle(msg.into())
}

struct Machine<'a, F> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
    objects: Vec<Object>,
    persistent_load: F,
}

/// Runs the pickle at the start of `data`, up to its `STOP`. `persistent_load` is called for
/// each `BINPERSID` with the fields of the persistent id (and the arena they refer into) and
/// returns the object the id stands for.
pub(crate) fn unpickle<F>(data: &[u8], persistent_load: F) -> Result<Unpickled, PthError>
where
    F: FnMut(&[Value], &[Object]) -> Result<Object, PthError>,
{
    let mut m = Machine {
        data,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        objects: Vec::new(),
        persistent_load,
    };
    loop {
        let at = m.pos;
        let op = m.byte()?;
        if op == b'.' {
            let top = m.pop()?;
            return Ok(Unpickled {
                top,
                objects: m.objects,
                consumed: m.pos,
            });
        }
        m.step(op, at)?;
    }
}

impl<F> Machine<'_, F>
where
    F: FnMut(&[Value], &[Object]) -> Result<Object, PthError>,
{
    fn take(&mut self, n: usize) -> Result<&[u8], PthError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| {
                bad(format!(
                    "the pickle is cut short: {n} bytes wanted at offset {} of {}",
                    self.pos,
                    self.data.len()
                ))
            })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, PthError> {
        Ok(self.take(1)?[0])
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], PthError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn len_u64(&mut self, n: u64) -> Result<&[u8], PthError> {
        let n = usize::try_from(n).map_err(|_| bad(format!("a length of {n} bytes")))?;
        self.take(n)
    }

    fn line(&mut self) -> Result<String, PthError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad("a GLOBAL name has no end of line"))?;
        let s = std::str::from_utf8(&rest[..n])
            .map_err(|_| bad("a GLOBAL name is not UTF-8"))?
            .to_string();
        self.pos += n + 1;
        Ok(s)
    }

    fn pop(&mut self) -> Result<Value, PthError> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            return Err(bad("an opcode pops across a MARK"));
        }
        self.stack
            .pop()
            .ok_or_else(|| bad("an opcode pops an empty stack"))
    }

    fn top(&self) -> Result<&Value, PthError> {
        self.stack
            .last()
            .ok_or_else(|| bad("an opcode reads an empty stack"))
    }

    /// The values pushed since the last `MARK`, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PthError> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| bad("an opcode needs a MARK and there is none"))?;
        Ok(self.stack.split_off(m))
    }

    fn push_obj(&mut self, o: Object) {
        self.objects.push(o);
        self.stack.push(Value::Obj(self.objects.len() - 1));
    }

    fn obj_mut(&mut self, v: &Value, what: &str) -> Result<&mut Object, PthError> {
        match v {
            Value::Obj(i) => Ok(&mut self.objects[*i]),
            _ => Err(bad(format!(
                "{what} applied to {v:?}, which is not a container"
            ))),
        }
    }

    fn append(&mut self, list: Value, items: Vec<Value>) -> Result<(), PthError> {
        match self.obj_mut(&list, "APPEND")? {
            Object::List(l) => {
                l.extend(items);
                Ok(())
            }
            _ => Err(bad("APPEND applied to something that is not a list")),
        }
    }

    fn set_items(&mut self, dict: Value, kv: Vec<Value>) -> Result<(), PthError> {
        if !kv.len().is_multiple_of(2) {
            return Err(bad("SETITEMS with an odd number of values"));
        }
        match self.obj_mut(&dict, "SETITEM")? {
            Object::Dict { items, .. } => {
                let mut it = kv.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    items.push((k, v));
                }
                Ok(())
            }
            _ => Err(bad("SETITEM applied to something that is not a dict")),
        }
    }

    fn memo_get(&mut self, idx: u32) -> Result<(), PthError> {
        let v = self
            .memo
            .get(&idx)
            .cloned()
            .ok_or_else(|| bad(format!("GET of memo slot {idx}, which was never PUT")))?;
        self.stack.push(v);
        Ok(())
    }

    fn memo_put(&mut self, idx: u32) -> Result<(), PthError> {
        let v = self.top()?.clone();
        self.memo.insert(idx, v);
        Ok(())
    }

    fn int(&mut self, bytes_le: &[u8]) -> Result<(), PthError> {
        if bytes_le.len() > 16 {
            return Err(bad(format!(
                "an integer of {} bytes, larger than this reader handles",
                bytes_le.len()
            )));
        }
        let mut a = [0u8; 16];
        a[..bytes_le.len()].copy_from_slice(bytes_le);
        if bytes_le.last().is_some_and(|b| b & 0x80 != 0) {
            a[bytes_le.len()..].fill(0xFF);
        }
        self.stack.push(Value::Int(i128::from_le_bytes(a)));
        Ok(())
    }

    fn str(&mut self, b: &[u8]) -> Result<(), PthError> {
        let s = std::str::from_utf8(b).map_err(|_| bad("a string is not UTF-8"))?;
        self.stack.push(Value::Str(s.into()));
        Ok(())
    }

    fn step(&mut self, op: u8, at: usize) -> Result<(), PthError> {
        match op {
            0x80 => {
                let proto = self.byte()?;
                if proto > 5 {
                    return Err(bad(format!("pickle protocol {proto} is newer than 5")));
                }
            }
            0x95 => {
                // FRAME: a length hint only.
                self.take(8)?;
            }
            b'(' => self.marks.push(self.stack.len()),
            b'}' => self.push_obj(Object::Dict {
                items: Vec::new(),
                state: None,
            }),
            b']' => self.push_obj(Object::List(Vec::new())),
            b')' => self.push_obj(Object::Tuple(Vec::new())),
            b't' => {
                let items = self.pop_mark()?;
                self.push_obj(Object::Tuple(items));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.push_obj(Object::Tuple(items));
            }
            b'a' => {
                let v = self.pop()?;
                let list = self.top()?.clone();
                self.append(list, vec![v])?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                let list = self.top()?.clone();
                self.append(list, items)?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                let dict = self.top()?.clone();
                self.set_items(dict, vec![k, v])?;
            }
            b'u' => {
                let kv = self.pop_mark()?;
                let dict = self.top()?.clone();
                self.set_items(dict, kv)?;
            }
            b'N' => self.stack.push(Value::None),
            0x88 => self.stack.push(Value::Bool(true)),
            0x89 => self.stack.push(Value::Bool(false)),
            b'J' => {
                let v = i32::from_le_bytes(self.fixed()?);
                self.stack.push(Value::Int(v.into()));
            }
            b'K' => {
                let v = self.byte()?;
                self.stack.push(Value::Int(v.into()));
            }
            b'M' => {
                let v = u16::from_le_bytes(self.fixed()?);
                self.stack.push(Value::Int(v.into()));
            }
            0x8a => {
                let n = usize::from(self.byte()?);
                let b = self.take(n)?.to_vec();
                self.int(&b)?;
            }
            0x8b => {
                let n = i32::from_le_bytes(self.fixed()?);
                let n = usize::try_from(n).map_err(|_| bad("LONG4 with a negative length"))?;
                let b = self.take(n)?.to_vec();
                self.int(&b)?;
            }
            b'G' => {
                let v = f64::from_be_bytes(self.fixed()?);
                self.stack.push(Value::Float(v));
            }
            b'X' => {
                let n = u32::from_le_bytes(self.fixed()?);
                let b = self.len_u64(n.into())?.to_vec();
                self.str(&b)?;
            }
            0x8c => {
                let n = self.byte()?;
                let b = self.take(n.into())?.to_vec();
                self.str(&b)?;
            }
            0x8d => {
                let n = u64::from_le_bytes(self.fixed()?);
                let b = self.len_u64(n)?.to_vec();
                self.str(&b)?;
            }
            b'T' | b'U' => {
                // Python 2 byte strings: read as Latin-1 text, which is what Python 3 does.
                let n = if op == b'T' {
                    let n = i32::from_le_bytes(self.fixed()?);
                    usize::try_from(n).map_err(|_| bad("BINSTRING with a negative length"))?
                } else {
                    usize::from(self.byte()?)
                };
                let s: String = self.take(n)?.iter().map(|&b| char::from(b)).collect();
                self.stack.push(Value::Str(s.into()));
            }
            b'B' | b'C' | 0x8e => {
                let n = match op {
                    b'B' => u64::from(u32::from_le_bytes(self.fixed()?)),
                    b'C' => u64::from(self.byte()?),
                    _ => u64::from_le_bytes(self.fixed()?),
                };
                let b: Rc<[u8]> = self.len_u64(n)?.into();
                self.stack.push(Value::Bytes(b));
            }
            b'q' => {
                let i = self.byte()?;
                self.memo_put(i.into())?;
            }
            b'r' => {
                let i = u32::from_le_bytes(self.fixed()?);
                self.memo_put(i)?;
            }
            0x94 => {
                let i = u32::try_from(self.memo.len()).map_err(|_| bad("memo overflow"))?;
                self.memo_put(i)?;
            }
            b'h' => {
                let i = self.byte()?;
                self.memo_get(i.into())?;
            }
            b'j' => {
                let i = u32::from_le_bytes(self.fixed()?);
                self.memo_get(i)?;
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self.top()?.clone();
                self.stack.push(v);
            }
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                let g = resolve_global(&module, &name)?;
                self.push_obj(Object::Global(g));
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                match (module, name) {
                    (Value::Str(m), Value::Str(n)) => {
                        let g = resolve_global(&m, &n)?;
                        self.push_obj(Object::Global(g));
                    }
                    _ => return Err(bad("STACK_GLOBAL of values that are not strings")),
                }
            }
            b'Q' => {
                let pid = self.pop()?;
                let fields = match &pid {
                    Value::Obj(i) => match &self.objects[*i] {
                        Object::Tuple(t) => t,
                        _ => return Err(bad("a persistent id that is not a tuple")),
                    },
                    _ => return Err(bad("a persistent id that is not a tuple")),
                };
                let o = (self.persistent_load)(fields, &self.objects)?;
                self.push_obj(o);
            }
            b'R' => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let o = self.reduce(&callable, &args)?;
                self.push_obj(o);
            }
            b'b' => {
                let state = self.pop()?;
                let target = self.top()?.clone();
                match self.obj_mut(&target, "BUILD")? {
                    Object::Dict { state: s, .. } => *s = Some(state),
                    // A tensor's state (set by `_rebuild_parameter_with_state`) carries nothing
                    // that a state dict needs.
                    Object::Tensor(_) => {}
                    other => return Err(bad(format!("BUILD applied to {other:?}"))),
                }
            }
            _ => {
                return Err(PthError::UnknownOpcode {
                    opcode: op,
                    name: opcode_name(op),
                    offset: at,
                })
            }
        }
        Ok(())
    }

    /// The items of the tuple `v` refers to, borrowed (a tuple reused through the memo is never
    /// copied, so reuse costs no more than the opcode that names it).
    fn tuple_of(&self, v: &Value, what: &str) -> Result<&[Value], PthError> {
        match v {
            Value::Obj(i) => match &self.objects[*i] {
                Object::Tuple(t) => Ok(t),
                _ => Err(bad(format!("{what} is not a tuple"))),
            },
            _ => Err(bad(format!("{what} is not a tuple"))),
        }
    }

    fn global_of(&self, v: &Value) -> Option<Global> {
        match v {
            Value::Obj(i) => match &self.objects[*i] {
                Object::Global(g) => Some(*g),
                _ => None,
            },
            _ => None,
        }
    }

    fn reduce(&self, callable: &Value, args: &Value) -> Result<Object, PthError> {
        let g = self
            .global_of(callable)
            .ok_or_else(|| bad("REDUCE calls something that is not an allowed global"))?;
        let args = self.tuple_of(args, "the arguments of REDUCE")?;
        match g {
            Global::OrderedDict if args.is_empty() => Ok(Object::Dict {
                items: Vec::new(),
                state: None,
            }),
            Global::RebuildTensorV2 => self.rebuild_tensor(args),
            Global::RebuildParameter | Global::RebuildParameterWithState => {
                let data = args
                    .first()
                    .ok_or_else(|| bad("_rebuild_parameter without arguments"))?;
                self.tensor_of(data).map(Object::Tensor)
            }
            Global::RebuildFromTypeV2 => {
                // (func, new_type, args, state): a plain tensor or parameter only.
                let [func, new_type, inner, _state] = args else {
                    return Err(bad("_rebuild_from_type_v2 needs 4 arguments"));
                };
                match self.global_of(new_type) {
                    Some(Global::TensorType | Global::ParameterType) => {}
                    _ => return Err(bad("_rebuild_from_type_v2 of a tensor subclass")),
                }
                if self.global_of(func) != Some(Global::RebuildTensorV2) {
                    return Err(bad("_rebuild_from_type_v2 of something not a tensor"));
                }
                self.rebuild_tensor(self.tuple_of(inner, "the rebuild arguments")?)
            }
            other => Err(bad(format!(
                "REDUCE calls {other:?} with {} arguments",
                args.len()
            ))),
        }
    }

    fn tensor_of(&self, v: &Value) -> Result<TensorRecord, PthError> {
        match v {
            Value::Obj(i) => match &self.objects[*i] {
                Object::Tensor(t) => Ok(t.clone()),
                _ => Err(bad("a parameter whose data is not a tensor")),
            },
            _ => Err(bad("a parameter whose data is not a tensor")),
        }
    }

    fn ints(&self, v: &Value, what: &str) -> Result<Vec<u64>, PthError> {
        let items = self.tuple_of(v, what)?;
        if items.len() > MAX_DIMS {
            return Err(bad(format!(
                "{what} has {} dimensions, more than {MAX_DIMS}",
                items.len()
            )));
        }
        items
            .iter()
            .map(|x| match x {
                Value::Int(n) => u64::try_from(*n)
                    .map_err(|_| bad(format!("{what} holds {n}, not a size or stride"))),
                _ => Err(bad(format!("{what} holds a value that is not an integer"))),
            })
            .collect()
    }

    /// `_rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, hooks, ...)`.
    fn rebuild_tensor(&self, args: &[Value]) -> Result<Object, PthError> {
        if args.len() < 4 {
            return Err(bad("_rebuild_tensor_v2 needs at least 4 arguments"));
        }
        let storage = match &args[0] {
            Value::Obj(i) => match &self.objects[*i] {
                Object::Storage(s) => s.clone(),
                _ => return Err(bad("_rebuild_tensor_v2 of something that is not a storage")),
            },
            _ => return Err(bad("_rebuild_tensor_v2 of something that is not a storage")),
        };
        let offset = match args[1] {
            Value::Int(n) => {
                u64::try_from(n).map_err(|_| bad(format!("a negative storage offset {n}")))?
            }
            _ => return Err(bad("a storage offset that is not an integer")),
        };
        let size = self.ints(&args[2], "a tensor's size")?;
        let stride = self.ints(&args[3], "a tensor's stride")?;
        if size.len() != stride.len() {
            return Err(bad(format!(
                "a tensor with {} sizes and {} strides",
                size.len(),
                stride.len()
            )));
        }
        Ok(Object::Tensor(TensorRecord {
            storage,
            offset,
            size,
            stride,
        }))
    }
}
