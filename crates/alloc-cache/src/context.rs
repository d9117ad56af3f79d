//! The thread-local [`AllocContext`]: scopes that declare what the current thread allocates
//! for, read by the allocator when it records an event (the rules are in `history.rs`'s header).
//!
//! Invariants:
//! - Every scope is a guard that undoes exactly what it pushed when dropped, so scopes nest
//!   like the code that opens them; guards are `!Send` (they belong to the thread's stacks).
//! - Category: the innermost *declared* category wins; without one, the innermost category an
//!   op scope implies; without either, none (the allocator records `Unknown`).
//! - Op: the outermost op wins (the op the caller asked for, or the backward node being run, not
//!   the helpers it calls). Module path: the innermost wins.
//! - Op and module scopes cost one relaxed atomic load while no allocator records history (they
//!   push nothing, and a module scope formats no path); category scopes always push.

use crate::history::{AllocContext, Attribution, MemoryCategory};
use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Allocators whose history is being recorded, over the whole process.
static RECORDING_ALLOCATORS: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn recording_started() {
    RECORDING_ALLOCATORS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn recording_stopped() {
    RECORDING_ALLOCATORS.fetch_sub(1, Ordering::Relaxed);
}

/// An op name: a literal (the usual case, no allocation per scope) or a shared string.
#[derive(Debug, Clone)]
enum OpName {
    Static(&'static str),
    Shared(Arc<str>),
}

#[derive(Debug, Default)]
struct Frames {
    declared: Vec<MemoryCategory>,
    implied: Vec<MemoryCategory>,
    ops: Vec<OpName>,
    modules: Vec<Arc<str>>,
    /// Literal op names already turned into shared strings (by address and length).
    interned: HashMap<(usize, usize), Arc<str>>,
}

thread_local! {
    static FRAMES: RefCell<Frames> = RefCell::new(Frames::default());
}

/// What a guard pushed, so that its drop pops exactly that.
#[derive(Debug, Clone, Copy, Default)]
struct Pushed {
    declared: bool,
    implied: bool,
    op: bool,
    module: bool,
}

/// Undoes one scope of the current thread's [`AllocContext`] when dropped.
#[must_use = "the scope ends when the guard is dropped; bind it to a variable (`let _scope = ...`)"]
#[derive(Debug)]
pub struct ContextGuard {
    pushed: Pushed,
    _not_send: PhantomData<*const ()>,
}

impl ContextGuard {
    fn new(pushed: Pushed) -> Self {
        ContextGuard {
            pushed,
            _not_send: PhantomData,
        }
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        let p = self.pushed;
        if !(p.declared || p.implied || p.op || p.module) {
            return;
        }
        // `try_with`: a guard dropped while the thread's locals are torn down has nothing left
        // to undo.
        let _ = FRAMES.try_with(|f| {
            let mut f = f.borrow_mut();
            if p.declared {
                f.declared.pop();
            }
            if p.implied {
                f.implied.pop();
            }
            if p.op {
                f.ops.pop();
            }
            if p.module {
                f.modules.pop();
            }
        });
    }
}

impl AllocContext {
    /// Whether any allocator in the process records history (op and module scopes do nothing
    /// otherwise).
    #[inline]
    pub fn is_recording_anywhere() -> bool {
        RECORDING_ALLOCATORS.load(Ordering::Relaxed) > 0
    }

    /// Declares that what this thread allocates until the guard drops is `category` (a
    /// category declared inside wins over this one; op scopes inside do not override it).
    pub fn category(category: MemoryCategory) -> ContextGuard {
        FRAMES.with(|f| f.borrow_mut().declared.push(category));
        ContextGuard::new(Pushed {
            declared: true,
            ..Pushed::default()
        })
    }

    /// Declares that an op named `op` runs until the guard drops, and the category its
    /// allocations have when no category is declared (`Activation` for a forward op under grad
    /// mode, `Temporary` otherwise). An op already running keeps its name (outermost wins).
    #[inline]
    pub fn op(op: &'static str, implied: MemoryCategory) -> ContextGuard {
        if !Self::is_recording_anywhere() {
            return ContextGuard::new(Pushed::default());
        }
        Self::push_op(OpName::Static(op), implied)
    }

    /// Sets the category implied for allocations that declare none until the guard drops,
    /// without naming an op (kiln-autograd's `no_grad` implies `Temporary`).
    #[inline]
    pub fn default_category(implied: MemoryCategory) -> ContextGuard {
        if !Self::is_recording_anywhere() {
            return ContextGuard::new(Pushed::default());
        }
        FRAMES.with(|f| f.borrow_mut().implied.push(implied));
        ContextGuard::new(Pushed {
            implied: true,
            ..Pushed::default()
        })
    }

    /// Like [`op`](Self::op) for a name built at run time.
    pub fn op_named(op: Arc<str>, implied: MemoryCategory) -> ContextGuard {
        if !Self::is_recording_anywhere() {
            return ContextGuard::new(Pushed::default());
        }
        Self::push_op(OpName::Shared(op), implied)
    }

    fn push_op(op: OpName, implied: MemoryCategory) -> ContextGuard {
        FRAMES.with(|f| {
            let mut f = f.borrow_mut();
            f.ops.push(op);
            f.implied.push(implied);
        });
        ContextGuard::new(Pushed {
            implied: true,
            op: true,
            ..Pushed::default()
        })
    }

    /// Enters the child module `name` of the current module path (`layer3` then `1` then
    /// `conv2` gives `layer3.1.conv2`); an empty name keeps the current path.
    #[inline]
    pub fn module(name: &str) -> ContextGuard {
        if !Self::is_recording_anywhere() {
            return ContextGuard::new(Pushed::default());
        }
        FRAMES.with(|f| {
            let mut f = f.borrow_mut();
            let path: Arc<str> = match (f.modules.last(), name.is_empty()) {
                (Some(outer), true) => Arc::clone(outer),
                (Some(outer), false) if !outer.is_empty() => format!("{outer}.{name}").into(),
                _ => name.into(),
            };
            f.modules.push(path);
        });
        ContextGuard::new(Pushed {
            module: true,
            ..Pushed::default()
        })
    }

    /// Sets the whole module path until the guard drops (not relative to the current one).
    pub fn module_path(path: Arc<str>) -> ContextGuard {
        if !Self::is_recording_anywhere() {
            return ContextGuard::new(Pushed::default());
        }
        FRAMES.with(|f| f.borrow_mut().modules.push(path));
        ContextGuard::new(Pushed {
            module: true,
            ..Pushed::default()
        })
    }

    /// This thread's context now (to carry it to another thread with [`enter`](Self::enter)).
    pub fn current() -> AllocContext {
        FRAMES.with(|f| {
            let mut f = f.borrow_mut();
            let category = f.declared.last().or(f.implied.last()).copied();
            let module = f.modules.last().cloned();
            let op = f.ops.first().cloned().map(|op| intern(&mut f.interned, op));
            AllocContext {
                category,
                op,
                module,
            }
        })
    }

    /// Makes this context the current thread's until the guard drops: its category as a
    /// declared one, its op and module path as the outermost op and the current path.
    pub fn enter(&self) -> ContextGuard {
        let mut pushed = Pushed::default();
        FRAMES.with(|f| {
            let mut f = f.borrow_mut();
            if let Some(c) = self.category {
                f.declared.push(c);
                pushed.declared = true;
            }
            if let Some(op) = &self.op {
                f.ops.push(OpName::Shared(Arc::clone(op)));
                pushed.op = true;
            }
            if let Some(m) = &self.module {
                f.modules.push(Arc::clone(m));
                pushed.module = true;
            }
        });
        ContextGuard::new(pushed)
    }

    /// This context as an attribution (what an event records).
    pub fn attribution(&self) -> Attribution {
        Attribution {
            category: self.category,
            op: self.op.clone(),
            module: self.module.clone(),
        }
    }
}

fn intern(interned: &mut HashMap<(usize, usize), Arc<str>>, op: OpName) -> Arc<str> {
    match op {
        OpName::Shared(s) => s,
        OpName::Static(s) => Arc::clone(
            interned
                .entry((s.as_ptr() as usize, s.len()))
                .or_insert_with(|| Arc::from(s)),
        ),
    }
}

/// The attribution of an allocation made now on this thread.
pub(crate) fn current_attribution() -> Attribution {
    AllocContext::current().attribution()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Recording;
    impl Recording {
        fn on() -> Self {
            recording_started();
            Recording
        }
    }
    impl Drop for Recording {
        fn drop(&mut self) {
            recording_stopped();
        }
    }

    #[test]
    fn scopes_nest_and_unwind() {
        let _on = Recording::on();
        assert_eq!(current_attribution(), Attribution::default());
        {
            let _m = AllocContext::module("layer3");
            let _m1 = AllocContext::module("1");
            let _op = AllocContext::op("Conv2d", MemoryCategory::Activation);
            let _inner = AllocContext::op("Mm", MemoryCategory::Temporary);
            let _m2 = AllocContext::module("conv2");
            let a = current_attribution();
            assert_eq!(a.module.as_deref(), Some("layer3.1.conv2"));
            assert_eq!(a.op.as_deref(), Some("Conv2d"), "outermost op names it");
            assert_eq!(
                a.category,
                Some(MemoryCategory::Temporary),
                "innermost implied"
            );
            {
                let _p = AllocContext::category(MemoryCategory::Parameter);
                let _op = AllocContext::op("Mul", MemoryCategory::Activation);
                assert_eq!(
                    current_attribution().category,
                    Some(MemoryCategory::Parameter),
                    "a declared category wins over implied ones"
                );
                let _g = AllocContext::category(MemoryCategory::Gradient);
                assert_eq!(
                    current_attribution().category,
                    Some(MemoryCategory::Gradient)
                );
            }
            assert_eq!(
                current_attribution().category,
                Some(MemoryCategory::Temporary)
            );
        }
        assert_eq!(current_attribution(), Attribution::default());
    }

    #[test]
    fn a_context_carried_to_another_thread_applies_there() {
        let _on = Recording::on();
        let _c = AllocContext::category(MemoryCategory::Data);
        let _m = AllocContext::module("loader");
        let ctx = AllocContext::current();
        let seen = std::thread::spawn(move || {
            let before = current_attribution();
            let _in = ctx.enter();
            (before, current_attribution())
        })
        .join()
        .unwrap();
        assert_eq!(seen.0, Attribution::default());
        assert_eq!(seen.1.category, Some(MemoryCategory::Data));
        assert_eq!(seen.1.module.as_deref(), Some("loader"));
    }
}
