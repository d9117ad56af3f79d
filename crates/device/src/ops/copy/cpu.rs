//! CPU copies and casts.

use crate::dtype::Element;
use crate::layout::Layout;
use crate::ops::elementwise::cpu::{map1, map1_into};

/// The elements of `layout`, contiguous.
pub fn copy_contiguous<T: Element>(src: &[T], layout: &Layout) -> Vec<T> {
    map1(src, layout, |v: T| v)
}

/// Writes the elements of `layout` contiguously into `out` (`layout.numel()` elements).
pub fn copy_contiguous_into<T: Element>(src: &[T], layout: &Layout, out: &mut [T]) {
    match layout.contiguous_offset() {
        Some(o) => out.copy_from_slice(&src[o..o + out.len()]),
        None => map1_into(src, layout, out, |v: T| v),
    }
}

/// Writes `src` (through `layout`) into `dst` (through `dst_layout`, same shape).
pub fn copy_into<T: Element>(src: &[T], layout: &Layout, dst: &mut [T], dst_layout: &Layout) {
    match (layout.contiguous_offset(), dst_layout.contiguous_offset()) {
        (Some(s), Some(d)) => {
            let n = layout.numel();
            dst[d..d + n].copy_from_slice(&src[s..s + n]);
        }
        _ => {
            for (i, j) in layout.offsets().zip(dst_layout.offsets()) {
                dst[j] = src[i];
            }
        }
    }
}

/// The elements of `layout` converted to `U` (floats to integers truncate toward zero).
pub fn cast<T: Element, U: Element>(src: &[T], layout: &Layout) -> Vec<U> {
    map1(src, layout, |v: T| U::from_f64(v.to_f64()))
}

/// Writes the elements of `layout` converted to `U` into `out` (`layout.numel()` elements).
pub fn cast_into<T: Element, U: Element>(src: &[T], layout: &Layout, out: &mut [U]) {
    map1_into(src, layout, out, |v: T| U::from_f64(v.to_f64()))
}
