//! Element types and reduction operators of the emulated NCCL, as pure functions on raw host
//! memory. Invariants:
//! - Reductions combine the ranks' values in rank order (0, 1, 2, …), so every rank computes
//!   bit-identical results.
//! - Integers wrap (sum, product) and average by truncating division of the wrapped sum; f32
//!   and f64 accumulate in their own type; f16 and bf16 accumulate in f32 and are rounded once
//!   to nearest even (as NCCL's half-precision reductions). Max and min of floats ignore a NaN
//!   operand (CUDA's `fmaxf`/`fminf`).

use half::{bf16, f16};

/// `ncclDataType_t` values the emulator reduces and moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// `ncclInt8`.
    I8,
    /// `ncclUint8`.
    U8,
    /// `ncclInt32`.
    I32,
    /// `ncclUint32`.
    U32,
    /// `ncclInt64`.
    I64,
    /// `ncclUint64`.
    U64,
    /// `ncclFloat16`.
    F16,
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat64`.
    F64,
    /// `ncclBfloat16`.
    BF16,
}

impl DType {
    /// The type for an `ncclDataType_t` value (`None`: invalid or not emulated, e.g. fp8).
    pub fn from_raw(v: u32) -> Option<DType> {
        Some(match v {
            0 => DType::I8,
            1 => DType::U8,
            2 => DType::I32,
            3 => DType::U32,
            4 => DType::I64,
            5 => DType::U64,
            6 => DType::F16,
            7 => DType::F32,
            8 => DType::F64,
            9 => DType::BF16,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }
}

/// `ncclRedOp_t` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedOp {
    /// `ncclSum`.
    Sum,
    /// `ncclProd`.
    Prod,
    /// `ncclMax`.
    Max,
    /// `ncclMin`.
    Min,
    /// `ncclAvg`.
    Avg,
}

impl RedOp {
    /// The operator for an `ncclRedOp_t` value (`None`: invalid or a user-created operator).
    pub fn from_raw(v: u32) -> Option<RedOp> {
        Some(match v {
            0 => RedOp::Sum,
            1 => RedOp::Prod,
            2 => RedOp::Max,
            3 => RedOp::Min,
            4 => RedOp::Avg,
            _ => return None,
        })
    }
}

/// An element type with its accumulator.
trait Element {
    type Acc: Copy;
    /// # Safety
    /// `p` addresses a readable element.
    unsafe fn load(p: *const u8) -> Self::Acc;
    /// # Safety
    /// `p` addresses a writable element.
    unsafe fn store(p: *mut u8, v: Self::Acc);
    fn combine(a: Self::Acc, b: Self::Acc, op: RedOp) -> Self::Acc;
    fn average(sum: Self::Acc, n: usize) -> Self::Acc;
}

macro_rules! int_element {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Element for $name {
            type Acc = $t;
            unsafe fn load(p: *const u8) -> $t {
                // SAFETY: forwarded from the caller.
                unsafe { (p as *const $t).read_unaligned() }
            }
            unsafe fn store(p: *mut u8, v: $t) {
                // SAFETY: forwarded from the caller.
                unsafe { (p as *mut $t).write_unaligned(v) }
            }
            fn combine(a: $t, b: $t, op: RedOp) -> $t {
                match op {
                    RedOp::Sum | RedOp::Avg => a.wrapping_add(b),
                    RedOp::Prod => a.wrapping_mul(b),
                    RedOp::Max => a.max(b),
                    RedOp::Min => a.min(b),
                }
            }
            fn average(sum: $t, n: usize) -> $t {
                sum / (n as $t)
            }
        }
    };
}

int_element!(I8E, i8);
int_element!(U8E, u8);
int_element!(I32E, i32);
int_element!(U32E, u32);
int_element!(I64E, i64);
int_element!(U64E, u64);

macro_rules! float_element {
    ($name:ident, $t:ty, $acc:ty, $load:expr, $store:expr) => {
        struct $name;
        impl Element for $name {
            type Acc = $acc;
            unsafe fn load(p: *const u8) -> $acc {
                // SAFETY: forwarded from the caller.
                let raw = unsafe { (p as *const $t).read_unaligned() };
                $load(raw)
            }
            unsafe fn store(p: *mut u8, v: $acc) {
                let raw: $t = $store(v);
                // SAFETY: forwarded from the caller.
                unsafe { (p as *mut $t).write_unaligned(raw) }
            }
            fn combine(a: $acc, b: $acc, op: RedOp) -> $acc {
                match op {
                    RedOp::Sum | RedOp::Avg => a + b,
                    RedOp::Prod => a * b,
                    RedOp::Max => a.max(b),
                    RedOp::Min => a.min(b),
                }
            }
            fn average(sum: $acc, n: usize) -> $acc {
                sum / n as $acc
            }
        }
    };
}

float_element!(F32E, f32, f32, |x: f32| x, |v: f32| v);
float_element!(F64E, f64, f64, |x: f64| x, |v: f64| v);
float_element!(
    F16E,
    u16,
    f32,
    |x: u16| f16::from_bits(x).to_f32(),
    |v: f32| f16::from_f32(v).to_bits()
);
float_element!(
    BF16E,
    u16,
    f32,
    |x: u16| bf16::from_bits(x).to_f32(),
    |v: f32| bf16::from_f32(v).to_bits()
);

/// # Safety
/// As [`reduce`].
unsafe fn reduce_typed<E: Element>(
    inputs: &[*const u8],
    out: *mut u8,
    count: usize,
    size: usize,
    op: RedOp,
) {
    for i in 0..count {
        let at = i * size;
        // SAFETY: every input and `out` hold `count` elements.
        unsafe {
            let mut acc = E::load(inputs[0].add(at));
            for input in &inputs[1..] {
                acc = E::combine(acc, E::load(input.add(at)), op);
            }
            if op == RedOp::Avg {
                acc = E::average(acc, inputs.len());
            }
            E::store(out.add(at), acc);
        }
    }
}

/// `out[i] = op(inputs[0][i], inputs[1][i], …)` for `count` elements of `dtype`, in rank order;
/// `Avg` divides by `inputs.len()`. `out` may be one of the inputs.
///
/// # Safety
/// Every input holds `count` readable elements and `out` `count` writable ones; `inputs` is
/// not empty.
pub unsafe fn reduce(inputs: &[*const u8], out: *mut u8, count: usize, dtype: DType, op: RedOp) {
    let size = dtype.size();
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::I8 => reduce_typed::<I8E>(inputs, out, count, size, op),
            DType::U8 => reduce_typed::<U8E>(inputs, out, count, size, op),
            DType::I32 => reduce_typed::<I32E>(inputs, out, count, size, op),
            DType::U32 => reduce_typed::<U32E>(inputs, out, count, size, op),
            DType::I64 => reduce_typed::<I64E>(inputs, out, count, size, op),
            DType::U64 => reduce_typed::<U64E>(inputs, out, count, size, op),
            DType::F16 => reduce_typed::<F16E>(inputs, out, count, size, op),
            DType::F32 => reduce_typed::<F32E>(inputs, out, count, size, op),
            DType::F64 => reduce_typed::<F64E>(inputs, out, count, size, op),
            DType::BF16 => reduce_typed::<BF16E>(inputs, out, count, size, op),
        }
    }
}
