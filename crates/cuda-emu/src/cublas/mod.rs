//! PLACEHOLDER for the emulator's cublas entry points (see the crate docs).
