//! `kiln-alloc-cache`: a caching allocator over a `MemoryBackend` (filled by the allocator issue).
