//! The schedulers, grouped by family.

pub(crate) mod basic;
pub(crate) mod compose;
pub(crate) mod cosine;
pub(crate) mod cyclic;
pub(crate) mod lambda;
pub(crate) mod plateau;
