//! Graph nodes. Each op output that needs gradients points at a [`Node`]: the op's name, one
//! optional [`Edge`] per input (to the input's node, or to the input itself when it is a leaf),
//! and the backward closure, which owns the tensors the op saved. The closure sits in a
//! `Mutex<Option<..>>`: running the node without `retain_graph` takes it out and drops it, which
//! frees the saved tensors right away, and a second run finds `None` and reports the freed graph
//! instead of computing garbage.

use crate::tensor::{StorageCell, Tensor};
use crate::{Error, Result};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, Weak};

/// A saved tensor's buffer and the version it had when saved.
pub(crate) type SavedVersion = (Weak<StorageCell>, u64);

thread_local! {
    /// Buffers saved while a backward closure is being built (see `collect_saved`).
    static SAVING: RefCell<Option<Vec<SavedVersion>>> = const { RefCell::new(None) };
}

/// Notes that the closure being built saves `cell` (called by `Tensor::saved`).
pub(crate) fn register_saved(cell: &Arc<StorageCell>) {
    SAVING.with(|s| {
        if let Some(list) = s.borrow_mut().as_mut() {
            list.push((Arc::downgrade(cell), cell.version()));
        }
    });
}

/// Runs `make` and returns what it built along with the versions of the tensors it saved.
pub(crate) fn collect_saved<T>(make: impl FnOnce() -> T) -> (T, Vec<SavedVersion>) {
    let outer = SAVING.with(|s| s.borrow_mut().replace(Vec::new()));
    let built = make();
    let saved = SAVING
        .with(|s| std::mem::replace(&mut *s.borrow_mut(), outer))
        .unwrap_or_default();
    (built, saved)
}

/// Computes the input gradients from the output gradient; `None` for inputs needing none.
pub(crate) type BackwardFn = Box<dyn Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// Where an input's gradient goes.
pub(crate) enum Edge {
    /// Into another node's gradient buffer.
    Node(Arc<Node>),
    /// Into a leaf tensor's `.grad()`.
    Leaf(Tensor),
}

/// One recorded op.
pub(crate) struct Node {
    pub(crate) name: &'static str,
    pub(crate) edges: Vec<Option<Edge>>,
    backward: Mutex<Option<BackwardFn>>,
    saved: Vec<SavedVersion>,
}

impl Drop for Node {
    /// Drops long chains iteratively: a node whose edges hold the last handle to the next node
    /// would otherwise recurse once per node and overflow the stack on graphs of ~10k ops.
    fn drop(&mut self) {
        let mut pending: Vec<Arc<Node>> = Vec::new();
        let take_edges = |edges: &mut Vec<Option<Edge>>, pending: &mut Vec<Arc<Node>>| {
            for edge in edges.drain(..).flatten() {
                if let Edge::Node(n) = edge {
                    pending.push(n);
                }
            }
        };
        take_edges(&mut self.edges, &mut pending);
        while let Some(node) = pending.pop() {
            if let Ok(mut owned) = Arc::try_unwrap(node) {
                take_edges(&mut owned.edges, &mut pending);
                // `owned` drops here with no edges left, so it does not recurse.
            }
        }
    }
}

impl Node {
    pub(crate) fn new(
        name: &'static str,
        edges: Vec<Option<Edge>>,
        backward: BackwardFn,
        saved: Vec<SavedVersion>,
    ) -> Self {
        Node {
            name,
            edges,
            backward: Mutex::new(Some(backward)),
            saved,
        }
    }

    /// Refuses a node a backward cannot run: one a backward without `retain_graph` already
    /// ran (its saved tensors are gone), or one that saved a tensor modified in place since.
    /// The engine checks every node it will reach before running any, so a refused backward
    /// leaves every `.grad()` as it was.
    pub(crate) fn check_runnable(&self) -> Result<()> {
        let slot = self.backward.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            return Err(self.freed_error());
        }
        self.check_saved_versions()
    }

    fn freed_error(&self) -> Error {
        Error::Autograd(format!(
            "backward: trying to backward through {} a second time, but its saved tensors were \
             already freed by the first backward; pass retain_graph = true to the first \
             backward_with call if you need to backward twice",
            self.name
        ))
    }

    /// Runs the backward closure; drops it (and its saved tensors) unless `retain_graph`.
    pub(crate) fn run(&self, grad: &Tensor, retain_graph: bool) -> Result<Vec<Option<Tensor>>> {
        let mut slot = self.backward.lock().unwrap_or_else(|p| p.into_inner());
        let Some(f) = slot.as_ref() else {
            return Err(self.freed_error());
        };
        self.check_saved_versions()?;
        let grads = f(grad)?;
        if !retain_graph {
            *slot = None;
        }
        Ok(grads)
    }

    /// Refuses when a tensor this node saved was modified in place after it was saved.
    fn check_saved_versions(&self) -> Result<()> {
        for (cell, seen) in &self.saved {
            if let Some(cell) = cell.upgrade() {
                let now = cell.version();
                if now != *seen {
                    return Err(Error::Autograd(format!(
                        "backward: a tensor saved by {} was modified in place after it was saved \
                         (version {now}, saved at version {seen}); modify a copy (copy_data()) \
                         instead, or do the in-place update after backward",
                        self.name
                    )));
                }
            }
        }
        Ok(())
    }
}
