//! [`Layout`]: how a logical n-d shape maps onto a flat buffer (shape, strides, offset).
//!
//! Views (permute, narrow, expand, ...) only make a new `Layout` over the same buffer; kernels read
//! any layout through [`StridedIndex`] and always write contiguous (row-major) outputs. Strides are
//! in elements, never negative; a stride of 0 is a broadcast dimension. Validation of user input
//! (dims in range, sizes that fit) happens in `kiln-autograd`, which knows the op name for the
//! error message; the methods here assume valid arguments. A shape from user input goes through
//! [`checked_numel`] first: once it passes, its element count and every contiguous stride fit in
//! `isize`, so the unchecked arithmetic below cannot wrap.

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

/// Row-major strides of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc *= d;
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

    /// A layout from its parts (no checks).
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

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the elements are densely packed in row-major order (size-1 dims may have any
    /// stride, as in PyTorch).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// One past the largest buffer index this layout touches (0 for an empty tensor).
    pub fn required_len(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
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
        l.offset += start * self.strides[dim];
        l.shape[dim] = len;
        l
    }

    /// Index `index` of dim `dim`, removing the dim.
    pub fn select(&self, dim: usize, index: usize) -> Self {
        let mut l = self.clone();
        l.offset += index * self.strides[dim];
        l.shape.remove(dim);
        l.strides.remove(dim);
        l
    }

    /// A size-1 dim inserted at `dim`.
    pub fn unsqueeze(&self, dim: usize) -> Self {
        let mut l = self.clone();
        let stride = if dim < self.rank() {
            self.shape[dim] * self.strides[dim]
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
        let numel: usize = new_shape.iter().product();
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
    fn broadcast_gives_zero_strides() {
        let l = Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 4]);
        assert_eq!(l.strides(), &[0, 1, 0]);
        assert_eq!(l.offsets().take(5).collect::<Vec<_>>(), vec![0, 0, 0, 0, 1]);
    }
}
