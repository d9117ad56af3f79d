//! The machinery of the backend seam: how a method of an op-family trait reaches the device
//! storage inside a [`crate::Storage`], and the operand types shared by several families.
//!
//! Invariants:
//! - Each op-family trait (`crate::ops::<family>::<Family>Ops`) is declared once, inside
//!   [`seam_trait!`], which also emits `impl <Family>Ops for Storage`. So a method's signature is
//!   written in the trait and in the CPU and CUDA implementations only; nothing forwards by hand.
//! - The generated `Storage` method matches the receiver's variant, then converts every other
//!   operand with [`Lower`] into that device's type: a [`crate::Storage`] operand on another
//!   device (another variant, or another CUDA ordinal) is `Error::DeviceMismatch { op, lhs, rhs }`
//!   with `lhs` the receiver's device, `rhs` the first operand (in argument order, or in the order
//!   of the method's `order(..)` clause) that is not on it, and `op` the method's name or the
//!   name given by its `op(..)` clause. Plain values
//!   (layouts, shapes, scalars, geometries, op codes) pass through unchanged.
//! - Results come back through [`Lift`]: every device storage in them (alone, in an `Option`,
//!   array, tuple or named struct) becomes a [`crate::Storage`]; other values pass unchanged.
//! - Constructors (a first parameter `device: Device` instead of `&self`) dispatch on that
//!   device; without the `cuda` feature a CUDA device is `Error::CudaUnavailable`.

use crate::{DType, Device, Error, Layout, Result};

/// An operand in its device form: `Self` converted for device storage type `S`, or a
/// device-mismatch error naming `op` when it holds a storage not on `device` (the receiver's).
pub trait Lower<S> {
    /// The operand as the device implementation takes it.
    type Out;
    /// Converts the operand, checking every storage in it is on `device`.
    fn lower(self, op: &'static str, device: Device) -> Result<Self::Out>;
}

/// A result in its [`crate::Storage`] form: every device storage in `Self` wrapped back.
pub trait Lift<T> {
    /// Converts the result.
    fn lift(self) -> T;
}

/// What the generated dispatch needs of a device storage: the device it is on (implemented for
/// every `BufferOps` type in `crate::ops::buffer`, so this file names no op family).
pub trait OnDevice {
    /// The device holding the buffer.
    fn on_device(&self) -> Device;
}

/// Implements [`Lower`] (for every device storage type) and [`Lift`] as the identity for plain
/// value types that carry no storage; `ref T, ..` implements [`Lower`] for `&T`.
macro_rules! pass_through {
    (ref $($t:ty),* $(,)?) => {$(
        impl<'a, S> $crate::seam::Lower<S> for &'a $t {
            type Out = &'a $t;
            fn lower(self, _op: &'static str, _device: $crate::Device) -> $crate::Result<&'a $t> {
                Ok(self)
            }
        }
    )*};
    ($($t:ty),* $(,)?) => {$(
        impl<S> $crate::seam::Lower<S> for $t {
            type Out = $t;
            fn lower(self, _op: &'static str, _device: $crate::Device) -> $crate::Result<$t> {
                Ok(self)
            }
        }
        impl $crate::seam::Lift<$t> for $t {
            fn lift(self) -> $t {
                self
            }
        }
    )*};
}
pub(crate) use pass_through;

pass_through!(f64, u64, i64, usize, bool, (), DType, Device);
pass_through!(ref Layout, [usize]);

impl<S, T: Lower<S>> Lower<S> for Option<T> {
    type Out = Option<T::Out>;
    fn lower(self, op: &'static str, device: Device) -> Result<Self::Out> {
        self.map(|x| x.lower(op, device)).transpose()
    }
}

impl<S, A: Lower<S>, B: Lower<S>> Lower<S> for (A, B) {
    type Out = (A::Out, B::Out);
    fn lower(self, op: &'static str, device: Device) -> Result<Self::Out> {
        Ok((self.0.lower(op, device)?, self.1.lower(op, device)?))
    }
}

impl<S, T: Lower<S>> Lower<S> for [T; 2] {
    type Out = [T::Out; 2];
    fn lower(self, op: &'static str, device: Device) -> Result<Self::Out> {
        let [a, b] = self;
        Ok([a.lower(op, device)?, b.lower(op, device)?])
    }
}

impl<A: Lift<B>, B> Lift<Result<B>> for Result<A> {
    fn lift(self) -> Result<B> {
        self.map(Lift::lift)
    }
}

impl<A: Lift<B>, B> Lift<Option<B>> for Option<A> {
    fn lift(self) -> Option<B> {
        self.map(Lift::lift)
    }
}

impl<A: Lift<B>, B, const N: usize> Lift<[B; N]> for [A; N] {
    fn lift(self) -> [B; N] {
        self.map(Lift::lift)
    }
}

impl<A: Lift<C>, B: Lift<D>, C, D> Lift<(C, D)> for (A, B) {
    fn lift(self) -> (C, D) {
        (self.0.lift(), self.1.lift())
    }
}

/// The device-mismatch error of an operand on `rhs` for an op whose receiver is on `lhs`.
pub(crate) fn mismatch(op: &'static str, lhs: Device, rhs: Device) -> Error {
    Error::DeviceMismatch { op, lhs, rhs }
}

/// The error of a constructor asked for a CUDA device in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub(crate) fn no_cuda(device: Device) -> Error {
    Error::CudaUnavailable(format!(
        "{device} requested but kiln-device was built without the `cuda` feature; rebuild with it"
    ))
}

/// Declares an op-family trait and implements it for [`crate::Storage`] by dispatch.
///
/// Syntax: a trait declaration whose supertraits are plain names joined by `+`; each method
/// is `fn name(&self, arg: Type, ..) -> Ret;` (or with a default body), or a constructor
/// `fn name(device: Device, arg: Type, ..) -> Ret;`. A method may be preceded (after its doc
/// comment) by `op(EXPR)`, the `&'static str` its device-mismatch errors name (it may read the
/// arguments; the default is the method's name), and then by `order(arg, ..)`, the operands to
/// check, in that order (the default: every argument, in argument order).
macro_rules! seam_trait {
    (
        $(#[$attr:meta])*
        pub trait $name:ident: $first:ident $(+ $more:ident)* { $($body:tt)* }
    ) => {
        $crate::seam::seam_trait!(@munch [$(#[$attr])* $name [$first $(+ $more)*]] [] $($body)*);
    };

    // One method with a receiver, declared or with a default body.
    (@munch $head:tt [$($done:tt)*]
        $(#[$m:meta])* $(op($o:expr))? $(order($($ord:ident),+))?
        fn $f:ident(&$this:ident $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty; $($rest:tt)*
    ) => {
        $crate::seam::seam_trait!(@munch $head [$($done)*
            { [$(#[$m])*] [[$($o)?] [$($($ord),+)?]] (method $this) $f [$($arg: $ty),*] [$ret] [;] }
        ] $($rest)*);
    };
    (@munch $head:tt [$($done:tt)*]
        $(#[$m:meta])* $(op($o:expr))? $(order($($ord:ident),+))?
        fn $f:ident(&$this:ident $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty $default:block
        $($rest:tt)*
    ) => {
        $crate::seam::seam_trait!(@munch $head [$($done)*
            { [$(#[$m])*] [[$($o)?] [$($($ord),+)?]] (method $this) $f [$($arg: $ty),*] [$ret] [$default] }
        ] $($rest)*);
    };
    // One constructor: the device to build on comes first.
    (@munch $head:tt [$($done:tt)*]
        $(#[$m:meta])*
        fn $f:ident(device: Device $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty; $($rest:tt)*
    ) => {
        $crate::seam::seam_trait!(@munch $head [$($done)*
            { [$(#[$m])*] [[] []] (constructor) $f [$($arg: $ty),*] [$ret] [;] }
        ] $($rest)*);
    };
    // Every method read: emit the trait and the `Storage` implementation.
    (@munch [$(#[$attr:meta])* $name:ident [$($supertrait:tt)*]] [$({
        [$(#[$m:meta])*] $op:tt $kind:tt $f:ident $args:tt $ret:tt $tail:tt
    })*]) => {
        $(#[$attr])*
        pub trait $name: $($supertrait)* {
            $($crate::seam::seam_trait!(@declare [$(#[$m])*] $kind $f $args $ret $tail);)*
        }

        impl $name for $crate::Storage {
            $($crate::seam::seam_trait!(@forward $name $op $kind $f $args $ret);)*
        }
    };

    (@declare [$(#[$m:meta])*] (method $this:ident) $f:ident [$($arg:ident: $ty:ty),*] [$ret:ty]
        [$($tail:tt)*]
    ) => {
        $(#[$m])*
        fn $f(&$this $(, $arg: $ty)*) -> $ret $($tail)*
    };
    (@declare [$(#[$m:meta])*] (constructor) $f:ident [$($arg:ident: $ty:ty),*] [$ret:ty] [$($tail:tt)*]) => {
        $(#[$m])*
        fn $f(device: $crate::Device $(, $arg: $ty)*) -> $ret $($tail)*
    };

    (@forward $name:ident [$op:tt $order:tt] (method $this:ident) $f:ident
        [$($arg:ident: $ty:ty),*] [$ret:ty]
    ) => {
        fn $f(&$this $(, $arg: $ty)*) -> $ret {
            let op: &'static str = $crate::seam::seam_trait!(@op_name $f $op);
            match $this {
                $crate::Storage::Cpu(buffer) => $crate::seam::seam_trait!(
                    @call $crate::CpuStorage, $name, $f, buffer, op, $order [$($arg),*]
                ),
                #[cfg(feature = "cuda")]
                $crate::Storage::Cuda(buffer) => $crate::seam::seam_trait!(
                    @call $crate::CudaStorage, $name, $f, buffer, op, $order [$($arg),*]
                ),
            }
        }
    };
    (@forward $name:ident $op:tt (constructor) $f:ident [$($arg:ident: $ty:ty),*] [$ret:ty]) => {
        fn $f(device: $crate::Device $(, $arg: $ty)*) -> $ret {
            let op: &'static str = stringify!($f);
            match device {
                $crate::Device::Cpu => $crate::seam::Lift::lift(<$crate::CpuStorage as $name>::$f(
                    device
                    $(, $crate::seam::Lower::<$crate::CpuStorage>::lower($arg, op, device)?)*
                )),
                #[cfg(feature = "cuda")]
                $crate::Device::Cuda(_) => {
                    $crate::seam::Lift::lift(<$crate::CudaStorage as $name>::$f(
                        device
                        $(, $crate::seam::Lower::<$crate::CudaStorage>::lower($arg, op, device)?)*
                    ))
                }
                #[cfg(not(feature = "cuda"))]
                $crate::Device::Cuda(_) => {
                    let _ = op;
                    Err($crate::seam::no_cuda(device))
                }
            }
        }
    };

    // One variant's arm: lower the operands for its device, call its implementation, lift the
    // result.
    (@call $storage:ty, $name:ident, $f:ident, $buffer:ident, $op:ident, $order:tt
        [$($arg:ident),*]
    ) => {{
        let device = $crate::seam::OnDevice::on_device($buffer);
        let _ = ($op, device);
        $crate::seam::seam_trait!(@lower $storage, $op, device, $order [$($arg),*]);
        $crate::seam::Lift::lift(<$storage as $name>::$f($buffer $(, $arg)*))
    }};

    // Every operand lowered in argument order, or only those an `order(..)` clause names, in
    // its order (the others pass unchanged; a storage among them would not type-check).
    (@lower $storage:ty, $op:ident, $device:ident, [] [$($arg:ident),*]) => {
        $(let $arg = $crate::seam::Lower::<$storage>::lower($arg, $op, $device)?;)*
    };
    (@lower $storage:ty, $op:ident, $device:ident, [$($ord:ident),+] [$($arg:ident),*]) => {
        $(let $ord = $crate::seam::Lower::<$storage>::lower($ord, $op, $device)?;)+
    };

    (@op_name $f:ident []) => { stringify!($f) };
    (@op_name $f:ident [$o:expr]) => { $o };
}
pub(crate) use seam_trait;

/// Which gradients a backward computes (PyTorch's `output_mask`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GradMask {
    /// The gradient of the input (the tensor the op was applied to).
    pub input: bool,
    /// The gradient of the weight.
    pub weight: bool,
    /// The gradient of the bias.
    pub bias: bool,
}

/// The gradients of an op with input, weight and bias; `None` where not asked for.
#[derive(Debug, Clone)]
pub struct InputGrads<S> {
    /// The gradient of the input.
    pub input: Option<S>,
    /// The gradient of the weight.
    pub weight: Option<S>,
    /// The gradient of the bias.
    pub bias: Option<S>,
}

impl GradMask {
    /// Every gradient.
    pub const ALL: GradMask = GradMask {
        input: true,
        weight: true,
        bias: true,
    };
}

impl<S> InputGrads<S> {
    /// The gradients in input, weight, bias order.
    pub fn into_array(self) -> [Option<S>; 3] {
        [self.input, self.weight, self.bias]
    }
}

impl<S> Default for InputGrads<S> {
    fn default() -> Self {
        InputGrads {
            input: None,
            weight: None,
            bias: None,
        }
    }
}

impl<A: Lift<B>, B> Lift<InputGrads<B>> for InputGrads<A> {
    fn lift(self) -> InputGrads<B> {
        InputGrads {
            input: self.input.lift(),
            weight: self.weight.lift(),
            bias: self.bias.lift(),
        }
    }
}

pass_through!(GradMask);

/// An operand read through a layout: a buffer and the view of it the op uses.
pub type Strided<'a, S> = (&'a S, &'a Layout);
