//! Post-accumulate-grad hooks on leaf tensors (PyTorch's
//! `Tensor.register_post_accumulate_grad_hook`).
//!
//! Invariants: a hook belongs to one leaf handle (its [`Tensor::id`], never reused), not to the
//! buffer, so a detached view of a parameter does not inherit it. The backward engine calls a
//! leaf's hooks exactly once per backward call that reached the leaf, right after the leaf's
//! gradient for that call (the sum over every path to it) was added into `.grad()`, in the order
//! the hooks were registered, with grad mode off. Hooks are called with no lock held, so a hook
//! may read or replace `.grad()`, register or remove hooks. Removing goes through the
//! [`HookHandle`]; dropping the handle keeps the hook (as in PyTorch), and the registry forgets the
//! hooks of a leaf once every handle of that leaf was dropped and a new hook is registered.

use crate::tensor::{Tensor, TensorImpl};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A function the engine calls with the leaf after its gradient was accumulated.
pub type PostAccumulateGradHook = Arc<dyn Fn(&Tensor) -> Result<()> + Send + Sync>;

struct LeafHooks {
    leaf: Weak<TensorImpl>,
    hooks: Vec<(u64, PostAccumulateGradHook)>,
}

/// The registry: leaf id to its hooks. `HOOK_COUNT` lets the engine skip the lock when no hook
/// exists anywhere.
static REGISTRY: Mutex<Option<HashMap<u64, LeafHooks>>> = Mutex::new(None);
static HOOK_COUNT: AtomicUsize = AtomicUsize::new(0);
static NEXT_HOOK_ID: AtomicU64 = AtomicU64::new(1);

fn registry() -> std::sync::MutexGuard<'static, Option<HashMap<u64, LeafHooks>>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes a registered hook ([`HookHandle::remove`]). Dropping it keeps the hook.
#[derive(Debug)]
#[must_use = "dropping the handle keeps the hook forever; keep it to remove the hook later"]
pub struct HookHandle {
    leaf_id: u64,
    hook_id: u64,
}

impl HookHandle {
    /// Unregisters the hook; later backward calls no longer call it. Removing twice (or after
    /// the leaf was dropped) does nothing.
    pub fn remove(self) {
        let mut guard = registry();
        let Some(map) = guard.as_mut() else { return };
        let Some(entry) = map.get_mut(&self.leaf_id) else {
            return;
        };
        let before = entry.hooks.len();
        entry.hooks.retain(|(id, _)| *id != self.hook_id);
        let removed = before - entry.hooks.len();
        HOOK_COUNT.fetch_sub(removed, Ordering::AcqRel);
        if entry.hooks.is_empty() {
            map.remove(&self.leaf_id);
        }
    }
}

impl Tensor {
    /// Registers `hook`, called by every later backward that reaches this leaf, right after the
    /// leaf's gradient of that backward was accumulated into `.grad()` (PyTorch's
    /// `register_post_accumulate_grad_hook`). The hook gets this leaf and reads `.grad()`; an
    /// error it returns stops the backward and is returned by it. Refused on a tensor that is
    /// not a leaf or does not require grad (no gradient would ever be accumulated).
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<()> + Send + Sync + 'static,
    ) -> Result<HookHandle> {
        if !self.is_leaf() {
            return Err(Error::Autograd(format!(
                "register_post_accumulate_grad_hook: only leaf tensors accumulate gradients, but \
                 this one was made by {}; register the hook on the leaf (the parameter) instead",
                self.grad_fn_name().unwrap_or("an op")
            )));
        }
        if !self.requires_grad() {
            return Err(Error::Autograd(
                "register_post_accumulate_grad_hook: the tensor does not require grad, so no \
                 gradient is ever accumulated into it; call set_requires_grad(true) first"
                    .into(),
            ));
        }
        let hook_id = NEXT_HOOK_ID.fetch_add(1, Ordering::Relaxed);
        let mut guard = registry();
        let map = guard.get_or_insert_with(HashMap::new);
        // Forget the hooks of leaves that no longer exist, so the registry does not grow with
        // models that were dropped without removing their hooks.
        let mut dead = 0;
        map.retain(|_, entry| {
            let alive = entry.leaf.strong_count() > 0;
            if !alive {
                dead += entry.hooks.len();
            }
            alive
        });
        HOOK_COUNT.fetch_sub(dead, Ordering::AcqRel);
        map.entry(self.id())
            .or_insert_with(|| LeafHooks {
                leaf: Arc::downgrade(&self.0),
                hooks: Vec::new(),
            })
            .hooks
            .push((hook_id, Arc::new(hook)));
        HOOK_COUNT.fetch_add(1, Ordering::AcqRel);
        Ok(HookHandle {
            leaf_id: self.id(),
            hook_id,
        })
    }
}

/// Calls `leaf`'s post-accumulate-grad hooks in registration order (the engine's side).
pub(crate) fn run_post_accumulate_grad_hooks(leaf: &Tensor) -> Result<()> {
    if HOOK_COUNT.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let hooks: Vec<PostAccumulateGradHook> = {
        let guard = registry();
        match guard.as_ref().and_then(|m| m.get(&leaf.id())) {
            Some(entry) => entry.hooks.iter().map(|(_, h)| h.clone()).collect(),
            None => return Ok(()),
        }
    };
    for hook in hooks {
        hook(leaf)?;
    }
    Ok(())
}
