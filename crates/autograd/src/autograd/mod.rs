//! Reverse-mode automatic differentiation: grad mode, graph nodes and the backward engine.

pub(crate) mod attribution;
pub(crate) mod engine;
pub(crate) mod grad_mode;
pub(crate) mod graph;
pub(crate) mod profile;
