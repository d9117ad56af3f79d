//! kiln: a deep-learning training framework in Rust.
//!
//! This facade re-exports every kiln crate under one name, so an application can depend on
//! `kiln` alone, or on the individual crates it needs:
//!
//! | module | crate | job |
//! |---|---|---|
//! | [`device`] | `kiln-device` | devices, visibility, properties, kernels |
//! | [`alloc`] | `kiln-alloc-cache` | the caching allocator behind all tensor memory |
//! | [`autograd`] | `kiln-autograd` | tensors, views, reverse-mode autograd |
//! | [`optim`] | `kiln-optim` | optimizers, gradient clipping, AMP scaling |
//! | [`sched`] | `kiln-sched` | learning-rate schedulers and scalar logging |
//! | [`losses`] | `kiln-losses` | loss functions |
//! | [`models`] | `kiln-models` | layers, models, summaries, checkpoints |
//! | [`data`] | `kiln-data` | datasets (synthetic, MNIST, CIFAR-10), transforms, data loader, image input |
//! | [`distributed`] | `kiln-distributed` | process groups on NCCL and MPI, data-parallel training |

//!
//! [`recipe`] holds the training recipe of `cargo run --release --example train` (model by
//! configuration, the training loop, checkpoints that resume bit for bit, single-image
//! prediction) as library code shared by the `train` and `predict` examples and the tests.
//! [`memory_picture`] draws `memory.svg` (one step's memory by category, per-epoch curves).

pub use kiln_alloc_cache as alloc;
pub use kiln_autograd as autograd;
pub use kiln_data as data;
pub use kiln_device as device;
pub use kiln_distributed as distributed;
pub use kiln_losses as losses;
pub use kiln_models as models;
pub use kiln_optim as optim;
pub use kiln_sched as sched;

pub mod memory_picture;
pub mod recipe;
