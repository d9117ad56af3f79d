//! Virtual memory management: filled in next.
