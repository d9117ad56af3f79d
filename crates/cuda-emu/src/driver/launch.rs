//! Modules and launches: filled in next.
