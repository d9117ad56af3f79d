//! [`Layout`]: how a logical n-d shape maps onto a flat buffer (shape, strides, offset).
//!
//! Views (permute, narrow, expand, ...) only make a new `Layout` over the same buffer; kernels read
//! any layout through [`StridedIndex`] and always write contiguous (row-major) outputs. Strides are
//! in elements, never negative; a stride of 0 is a broadcast dimension. Validation of user input
//! (dims in range, sizes that fit) happens in `kiln-autograd`, which knows the op name for the
//! error message; the methods here assume valid arguments. A shape from user input goes through
//! [`checked_numel`] first: once it passes, its element count and every contiguous stride fit in
//! `isize`.
//!
//! **Invariant** of every `Layout` a tensor holds: its element count and its extent
//! ([`Layout::required_len`]) are at most `isize::MAX` ([`Layout::check`] tests it;
//! [`Layout::checked_new`] builds only such layouts). The views here keep it for in-range
//! arguments: they reorder or drop dims, or move the offset inside the extent. The methods do
//! not trust it: every size they compute saturates at `usize::MAX` instead of wrapping, so a
//! layout that breaks it yields sizes no buffer has (every allocation and view bounds check
//! then refuses it) and never a small wrapped number that would pass those checks.

use crate::error::{Error, Result};

/// Shape, strides (in elements) and starting offset of a strided view.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// The element count of `shape`, or `None` when the product of its nonzero dims exceeds
/// `isize::MAX` (then a contiguous stride or the element count would wrap). Zero dims are left out
/// of the bound so that `[0, 2^62, 2^62]`, whose strides still overflow, is refused too.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    let mut nonzero_product = 1usize;
    let mut has_zero = false;
    for &d in shape {
        if d == 0 {
            has_zero = true;
        } else {
            nonzero_product = nonzero_product.checked_mul(d)?;
        }
    }
    if nonzero_product > isize::MAX as usize {
        return None;
    }
    Some(if has_zero { 0 } else { nonzero_product })
}

/// The product of `factors` (an element count, a byte count), or [`Error::SizeOverflow`] naming
/// `op` and `what` when it exceeds `isize::MAX` (no buffer can be larger). Kernels call it for
/// every size they compute from shapes, output sizes and scratch byte counts alike.
pub fn checked_size(op: &'static str, what: &str, factors: &[usize]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| Error::SizeOverflow {
            op,
            what: format!("{what} = product of {factors:?}"),
        })
}

/// The element count of `shape` as [`checked_size`] computes it (the product of every dim).
pub fn checked_shape_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    checked_size(op, "the element count of the shape", shape)
}

fn saturating_product(dims: &[usize]) -> usize {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .unwrap_or(if dims.contains(&0) { 0 } else { usize::MAX })
}

/// Row-major strides of a contiguous tensor of `shape` (saturating at `usize::MAX` for a shape
/// that breaks the module's invariant).
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d);
    }
    strides
}

impl Layout {
    /// A contiguous row-major layout of `shape` starting at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// A layout from its parts, or [`Error::SizeOverflow`] naming `op` when its element count
    /// or extent passes `isize::MAX` (see the module's invariant), or
    /// [`Error::LengthMismatch`] when shape and strides differ in length.
    pub fn checked_new(
        op: &'static str,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
    ) -> Result<Self> {
        if shape.len() != strides.len() {
            return Err(Error::LengthMismatch {
                op,
                what: format!("shape {shape:?} and strides {strides:?} differ in length"),
            });
        }
        let layout = Layout::new(shape, strides, offset);
        layout.check(op)?;
        Ok(layout)
    }

    /// Checks the module's invariant: element count and extent at most `isize::MAX`.
    pub fn check(&self, op: &'static str) -> Result<()> {
        crate::checked_shape_numel(op, &self.shape)?;
        if self.required_len() > isize::MAX as usize {
            return Err(Error::SizeOverflow {
                op,
                what: format!(
                    "the extent of the view (shape {:?}, strides {:?}, offset {})",
                    self.shape, self.strides, self.offset
                ),
            });
        }
        Ok(())
    }

    /// A layout from its parts (no checks; see [`checked_new`](Self::checked_new)).
    pub fn new(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Self {
        Layout {
            shape,
            strides,
            offset,
        }
    }

    /// The logical shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Offset of element `[0, 0, ...]` in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (`usize::MAX` for a shape whose product overflows: no buffer has
    /// that many, so every check against a buffer refuses it).
    pub fn numel(&self) -> usize {
        saturating_product(&self.shape)
    }

    /// True when the elements are densely packed in row-major order (size-1 dims may have any
    /// stride, as in PyTorch).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    /// One past the largest buffer index this layout touches (0 for an empty tensor;
    /// `usize::MAX` when that index overflows, which no buffer reaches).
    pub fn required_len(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset, |acc, (&d, &s)| {
                acc.checked_add((d - 1).checked_mul(s)?)
            })
            .and_then(|last| last.checked_add(1))
            .unwrap_or(usize::MAX)
    }

    /// Dimensions reordered: result dim `i` is input dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Self {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Dims `a` and `b` swapped.
    pub fn transpose(&self, a: usize, b: usize) -> Self {
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        l
    }

    /// Elements `start..start + len` of dim `dim`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Self {
        let mut l = self.clone();
        l.offset = l
            .offset
            .saturating_add(start.saturating_mul(self.strides[dim]));
        l.shape[dim] = len;
        l
    }

    /// Index `index` of dim `dim`, removing the dim.
    pub fn select(&self, dim: usize, index: usize) -> Self {
        let mut l = self.clone();
        l.offset = l
            .offset
            .saturating_add(index.saturating_mul(self.strides[dim]));
        l.shape.remove(dim);
        l.strides.remove(dim);
        l
    }

    /// A size-1 dim inserted at `dim`.
    pub fn unsqueeze(&self, dim: usize) -> Self {
        let mut l = self.clone();
        let stride = if dim < self.rank() {
            self.shape[dim].saturating_mul(self.strides[dim])
        } else {
            1
        };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, stride);
        l
    }

    /// The size-1 dim `dim` removed.
    pub fn squeeze_dim(&self, dim: usize) -> Self {
        let mut l = self.clone();
        l.shape.remove(dim);
        l.strides.remove(dim);
        l
    }

    /// Broadcast to `shape` (right-aligned; size-1 or missing dims get stride 0). The caller has
    /// checked that the shapes are broadcast-compatible.
    pub fn broadcast_to(&self, shape: &[usize]) -> Self {
        let extra = shape.len() - self.rank();
        let strides = shape
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if i < extra {
                    0
                } else {
                    let (sd, ss) = (self.shape[i - extra], self.strides[i - extra]);
                    if sd == d {
                        ss
                    } else {
                        0
                    }
                }
            })
            .collect();
        Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        }
    }

    /// Strides that view this layout's elements as `new_shape` without copying, or `None` when
    /// no such strides exist (then a copy is needed: PyTorch's `computeStride` rule). Dims are
    /// split or merged only across runs of input dims that are contiguous with each other.
    pub fn view_strides(&self, new_shape: &[usize]) -> Option<Vec<usize>> {
        // A product that overflows can never equal a real element count (it could wrap to one).
        let numel = checked_numel(new_shape)?;
        if numel != self.numel() {
            return None;
        }
        if numel == 0 {
            return Some(contiguous_strides(new_shape));
        }
        let mut new_strides = vec![0; new_shape.len()];
        // Walk input dims from the back, grouping runs that are contiguous with each other.
        let mut view_d = new_shape.len() as isize - 1;
        let mut chunk_base_stride = *self.strides.last().unwrap_or(&1);
        let mut tensor_numel = 1;
        let mut view_numel = 1;
        for tensor_d in (0..self.rank()).rev() {
            tensor_numel *= self.shape[tensor_d];
            let run_ends = tensor_d == 0
                || (self.shape[tensor_d - 1] != 1
                    && self.strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
            if run_ends {
                while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1)
                {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= new_shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = self.strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            // Only leading size-1 dims can remain.
            while view_d >= 0 {
                if new_shape[view_d as usize] != 1 {
                    return None;
                }
                new_strides[view_d as usize] = 1;
                view_d -= 1;
            }
        }
        Some(new_strides)
    }

    /// This layout's elements viewed as `new_shape`, if that needs no copy.
    pub fn view(&self, new_shape: &[usize]) -> Option<Self> {
        self.view_strides(new_shape).map(|strides| Layout {
            shape: new_shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Buffer offsets of the elements in row-major logical order.
    pub fn offsets(&self) -> StridedIndex<'_> {
        StridedIndex::new(self, 0)
    }

    /// If the elements form one dense run `[start, start + numel)` in logical order, its start.
    pub fn contiguous_offset(&self) -> Option<usize> {
        self.is_contiguous().then_some(self.offset)
    }
}

/// Iterator over buffer offsets of a [`Layout`] in row-major logical order, starting at any
/// logical index (so parallel kernels can give each thread its own range).
#[derive(Debug, Clone)]
pub struct StridedIndex<'a> {
    layout: &'a Layout,
    index: Vec<usize>,
    next_offset: usize,
    remaining: usize,
}

impl<'a> StridedIndex<'a> {
    /// Offsets from logical (row-major) index `start` to the end.
    pub fn new(layout: &'a Layout, start: usize) -> Self {
        let numel = layout.numel();
        let mut index = vec![0; layout.rank()];
        let mut rem = start.min(numel);
        let mut offset = layout.offset;
        for d in (0..layout.rank()).rev() {
            let size = layout.shape[d].max(1);
            index[d] = rem % size;
            rem /= size;
            offset += index[d] * layout.strides[d];
        }
        StridedIndex {
            layout,
            index,
            next_offset: offset,
            remaining: numel.saturating_sub(start),
        }
    }
}

impl Iterator for StridedIndex<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let out = self.next_offset;
        if self.remaining > 0 {
            let shape = &self.layout.shape;
            let strides = &self.layout.strides;
            let mut d = shape.len();
            loop {
                d -= 1;
                self.index[d] += 1;
                self.next_offset += strides[d];
                if self.index[d] < shape[d] {
                    break;
                }
                self.next_offset -= strides[d] * shape[d];
                self.index[d] = 0;
            }
        }
        Some(out)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for StridedIndex<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_of_a_transposed_layout() {
        let l = Layout::contiguous(&[2, 3]).transpose(0, 1);
        assert_eq!(l.offsets().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(StridedIndex::new(&l, 4).collect::<Vec<_>>(), vec![2, 5]);
        assert!(!l.is_contiguous());
    }

    #[test]
    fn view_strides_follow_pytorch() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.view_strides(&[6, 4]), Some(vec![4, 1]));
        assert_eq!(l.view_strides(&[2, 12]), Some(vec![12, 1]));
        let p = l.permute(&[0, 2, 1]); // shape [2,4,3], strides [12,1,4]
        assert_eq!(p.view_strides(&[8, 3]), None);
        assert_eq!(p.view_strides(&[2, 4, 3, 1]), Some(vec![12, 1, 4, 4]));
        let t = Layout::contiguous(&[4, 6]).narrow(1, 0, 3); // [4,3] strides [6,1]
        assert_eq!(t.view_strides(&[4, 3, 1]), Some(vec![6, 1, 1]));
        assert_eq!(t.view_strides(&[12]), None);
    }

    #[test]
    fn checked_numel_refuses_wrapping_shapes() {
        assert_eq!(checked_numel(&[2, 3]), Some(6));
        assert_eq!(checked_numel(&[]), Some(1));
        assert_eq!(checked_numel(&[0, 5]), Some(0));
        assert_eq!(checked_numel(&[1 << 32, 1 << 32]), None);
        assert_eq!(checked_numel(&[(1 << 63) + 1, 2]), None);
        assert_eq!(checked_numel(&[0, 1 << 62, 1 << 62]), None);
        assert_eq!(checked_numel(&[1 << 62, 2]), None);
    }

    #[test]
    fn checked_size_refuses_products_past_isize() {
        assert_eq!(checked_size("op", "n", &[3, 4, 5]).unwrap(), 60);
        assert_eq!(checked_size("op", "n", &[]).unwrap(), 1);
        assert_eq!(checked_size("op", "n", &[0, usize::MAX]).unwrap(), 0);
        assert_eq!(
            checked_shape_numel("op", &[1 << 31, 1 << 31]).unwrap(),
            1 << 62
        );
        for factors in [
            &[1usize << 32, 1 << 32][..],
            &[1 << 62, 2],
            &[usize::MAX, 1],
        ] {
            let e = checked_size("matmul", "the output's element count", factors).unwrap_err();
            assert!(matches!(e, Error::SizeOverflow { op: "matmul", .. }), "{e}");
            assert!(e.to_string().contains("the output's element count"), "{e}");
        }
    }

    #[test]
    fn layout_sizes_saturate_instead_of_wrapping() {
        // Built unchecked past the invariant: every size is one no buffer has, never a wrap.
        let huge = Layout::contiguous(&[1 << 32, 1 << 32]);
        assert_eq!(huge.numel(), usize::MAX);
        assert_eq!(huge.required_len(), usize::MAX);
        assert_eq!(huge.strides(), &[1 << 32, 1]);
        assert_eq!(Layout::contiguous(&[0, 1 << 40, 1 << 40]).numel(), 0);
        let wide = Layout::new(vec![3, 2], vec![usize::MAX / 2, 1], 0);
        assert_eq!(wide.required_len(), usize::MAX);
        assert_eq!(wide.narrow(0, 2, 1).offset(), usize::MAX - 1);
        assert_eq!(wide.select(0, 3).offset(), usize::MAX);
        assert!(huge.is_contiguous());
        // A reshape whose product wraps to the real count (0) is no view.
        assert_eq!(
            Layout::contiguous(&[0]).view_strides(&[1 << 32, 1 << 32]),
            None
        );
        assert_eq!(
            Layout::contiguous(&[0]).view_strides(&[1 << 32, 0]),
            Some(vec![0, 1])
        );
    }

    #[test]
    fn checked_layouts_keep_the_invariant() {
        let ok = Layout::checked_new("view", vec![2, 3], vec![3, 1], 4).unwrap();
        assert_eq!(ok.required_len(), 10);
        for (shape, strides, offset) in [
            (vec![1 << 32, 1 << 32], vec![1 << 32, 1], 0),
            (vec![2], vec![1 << 63], 0),
            (vec![2], vec![1], usize::MAX - 1),
        ] {
            let e = Layout::checked_new("view", shape, strides, offset).unwrap_err();
            assert!(matches!(e, Error::SizeOverflow { op: "view", .. }), "{e}");
        }
        let e = Layout::checked_new("view", vec![2], vec![], 0).unwrap_err();
        assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    }

    #[test]
    fn broadcast_gives_zero_strides() {
        let l = Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 4]);
        assert_eq!(l.strides(), &[0, 1, 0]);
        assert_eq!(l.offsets().take(5).collect::<Vec<_>>(), vec![0, 0, 0, 0, 1]);
    }
}
