//! PLACEHOLDER for the emulator's nccl entry points (see the crate docs).
