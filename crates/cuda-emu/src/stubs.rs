//! PLACEHOLDER: every entry point of the emulated libraries that is not implemented, exported so
//! that a call logs its name and returns "not supported" (see the crate docs).
