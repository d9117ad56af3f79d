//! Scalar logging (placeholder while writing).
