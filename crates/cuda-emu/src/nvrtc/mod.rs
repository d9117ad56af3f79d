//! PLACEHOLDER for the emulator's nvrtc entry points (see the crate docs).
