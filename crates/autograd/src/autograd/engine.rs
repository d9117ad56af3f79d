//! The backward engine.
//!
//! `backward` walks the graph once to count, for every reachable node, how many edges point at it;
//! then it runs nodes from the root, summing each node's incoming gradients in a buffer and
//! running the node only when all of its consumers have run (a node whose count reaches zero is
//! ready). Each node drops its saved tensors right after it runs (unless `retain_graph`), and each
//! gradient buffer is dropped once consumed, so memory held by the graph falls as backward
//! proceeds. Gradients are computed with grad mode off (no higher-order graphs). A buffer that
//! already holds a gradient takes the next one by adding into its own memory when no other
//! handle, view or saved copy can see that memory (`Tensor::into_add`), and into a new buffer
//! otherwise, so a sum never changes a tensor anyone else holds.
//!
//! Before any node runs, the walk that counts consumers checks every reachable node: one a
//! backward without `retain_graph` already ran, or one whose saved tensors were modified in
//! place since, refuses the whole backward, so a refused backward changes no `.grad()`
//! (PyTorch refuses when it reaches such a node, after accumulating what ran before it).
//!
//! Leaves are counted like nodes: the gradients a leaf gets along each of its edges are summed
//! first, and once its last edge was processed the sum is added into `.grad()` and the leaf's
//! post-accumulate-grad hooks run (`crate::hooks`), so each reached leaf is accumulated, and its
//! hooks called, exactly once per backward, as soon as its gradient is final (PyTorch's
//! `AccumulateGrad` node). A leaf no gradient reached (every path gave `None`) is not touched.

use super::grad_mode::NoGradGuard;
use super::graph::{Edge, Node};
use super::profile::{self, OpProfile};
use crate::tensor::{fmt_shape, Tensor};
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

fn key(node: &Arc<Node>) -> *const Node {
    Arc::as_ptr(node)
}

/// Consumer counts of every node reachable from `root`, and of every leaf (by its id); an
/// error, before anything ran, when a reachable node cannot run (`Node::check_runnable`).
type Dependencies = (HashMap<*const Node, usize>, HashMap<u64, usize>);
fn dependencies(root: &Arc<Node>) -> Result<Dependencies> {
    let mut deps: HashMap<*const Node, usize> = HashMap::new();
    let mut leaf_deps: HashMap<u64, usize> = HashMap::new();
    let mut stack = vec![root.clone()];
    deps.insert(key(root), 0);
    while let Some(node) = stack.pop() {
        node.check_runnable()?;
        for edge in node.edges.iter().flatten() {
            match edge {
                Edge::Node(next) => {
                    let seen = deps.contains_key(&key(next));
                    *deps.entry(key(next)).or_insert(0) += 1;
                    if !seen {
                        stack.push(next.clone());
                    }
                }
                Edge::Leaf(leaf) => *leaf_deps.entry(leaf.id()).or_insert(0) += 1,
            }
        }
    }
    Ok((deps, leaf_deps))
}

/// Adds a leaf's final gradient of this backward into `.grad()` and runs its hooks.
fn finish_leaf(leaf: &Tensor, grad: Tensor) -> Result<()> {
    leaf.accumulate_grad(grad)?;
    crate::hooks::run_post_accumulate_grad_hooks(leaf)
}

pub(crate) fn run_backward(
    root: &Tensor,
    gradient: Option<&Tensor>,
    retain_graph: bool,
) -> Result<()> {
    // A CPU graph runs on kiln's CPU pool as a whole rather than op by op (`cpu_pool.rs`).
    crate::on_cpu_pool(root.device(), || {
        run_backward_here(root, gradient, retain_graph)
    })
}

/// [`run_backward`] on this thread.
fn run_backward_here(root: &Tensor, gradient: Option<&Tensor>, retain_graph: bool) -> Result<()> {
    // Backward runs in the dtypes the forward recorded, never under autocast (PyTorch's rule).
    let _no_autocast = crate::autocast::AutocastGuard::disabled();
    if !root.requires_grad() {
        return Err(Error::Autograd(
            "backward: the tensor does not require grad and has no grad_fn; call \
             set_requires_grad(true) on the leaves it is computed from (outside no_grad)"
                .into(),
        ));
    }
    let grad = match gradient {
        Some(g) => {
            if g.shape() != root.shape() {
                return Err(Error::Shape {
                    op: "backward",
                    msg: format!(
                        "gradient shape {} does not match the tensor's shape {}",
                        fmt_shape(g.shape()),
                        fmt_shape(root.shape())
                    ),
                });
            }
            root.check_same_kind("backward", g)?;
            g.detach()
        }
        None => {
            if root.numel() != 1 {
                return Err(Error::Autograd(format!(
                    "backward: a gradient can be implied only for scalar outputs, but this tensor has shape {}; \
                     reduce it first (e.g. .sum_all()) or pass a gradient of the same shape to backward_with",
                    fmt_shape(root.shape())
                )));
            }
            root.ones_like()?
        }
    };
    let _no_grad = NoGradGuard::new();
    let Some(root_node) = root.grad_fn_node() else {
        return finish_leaf(root, grad);
    };
    let (mut deps, mut leaf_deps) = dependencies(&root_node)?;
    let mut buffers: HashMap<*const Node, Tensor> = HashMap::new();
    let mut leaf_buffers: HashMap<u64, Tensor> = HashMap::new();
    buffers.insert(key(&root_node), grad);
    let mut ready = vec![root_node];
    while let Some(node) = ready.pop() {
        let grads = match buffers.remove(&key(&node)) {
            Some(g) => {
                let _scope = super::attribution::backward_node(node.name);
                profile::timed(node.name, || node.run(&g, retain_graph))?
            }
            None => vec![None; node.edges.len()],
        };
        for (edge, g) in node.edges.iter().zip(grads) {
            let Some(edge) = edge else { continue };
            match edge {
                Edge::Leaf(leaf) => {
                    let k = leaf.id();
                    if let Some(g) = g {
                        if leaf.requires_grad() {
                            let summed = match leaf_buffers.remove(&k) {
                                None => g,
                                Some(prev) => {
                                    profile::timed(OpProfile::GRADIENT_SUM, || prev.into_add(&g))?
                                }
                            };
                            leaf_buffers.insert(k, summed);
                        }
                    }
                    let count = leaf_deps
                        .get_mut(&k)
                        .expect("every reachable leaf was counted");
                    *count -= 1;
                    if *count == 0 {
                        if let Some(g) = leaf_buffers.remove(&k) {
                            profile::timed(OpProfile::ACCUMULATE_GRAD, || finish_leaf(leaf, g))?;
                        }
                    }
                }
                Edge::Node(next) => {
                    let k = key(next);
                    if let Some(g) = g {
                        let summed = match buffers.remove(&k) {
                            None => g,
                            Some(prev) => {
                                profile::timed(OpProfile::GRADIENT_SUM, || prev.into_add(&g))?
                            }
                        };
                        buffers.insert(k, summed);
                    }
                    let count = deps.get_mut(&k).expect("every reachable node was counted");
                    *count -= 1;
                    if *count == 0 {
                        ready.push(next.clone());
                    }
                }
            }
        }
    }
    Ok(())
}

impl Tensor {
    /// Backpropagates from this scalar: accumulates d(self)/d(leaf) into every leaf's `.grad()`
    /// and frees the graph. An error on a non-scalar (use [`Tensor::backward_with`]).
    pub fn backward(&self) -> Result<()> {
        run_backward(self, None, false)
    }

    /// Backpropagates with an explicit output `gradient` (required for non-scalars) and,
    /// with `retain_graph`, keeps the saved tensors so backward can run again.
    pub fn backward_with(&self, gradient: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        run_backward(self, gradient, retain_graph)
    }
}
