//! What a rank says it is about to do: a collective's [`Signature`] (kind, dtype, element
//! counts, root or operator), checked locally before it is issued and compared across ranks, so
//! a mismatch fails on every rank with a message naming the ranks that differ instead of
//! hanging or mixing buffers of different sizes.
//!
//! Invariants: a signature is a fixed number of `i64` words ([`Signature::WORDS`]), the same on
//! every rank and every backend; a rank whose own arguments were invalid still sends one (with
//! [`Kind::Invalid`]) so its peers fail at once instead of waiting for it; every rank gets the
//! same table, so all of them take the same decision.

use crate::{Error, ReduceOp, Result};
use kiln_autograd::{DType, Device, Tensor};

/// The collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// This rank refused its own arguments.
    Invalid = 0,
    AllReduce = 1,
    Broadcast = 2,
    AllGather = 3,
    ReduceScatter = 4,
    Barrier = 5,
}

impl Kind {
    fn from_word(w: i64) -> Option<Kind> {
        [
            Kind::Invalid,
            Kind::AllReduce,
            Kind::Broadcast,
            Kind::AllGather,
            Kind::ReduceScatter,
            Kind::Barrier,
        ]
        .into_iter()
        .find(|k| *k as i64 == w)
    }

    /// The collective's name in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Invalid => "an invalid collective",
            Kind::AllReduce => "all_reduce",
            Kind::Broadcast => "broadcast",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Barrier => "barrier",
        }
    }
}

/// The dtypes the transports carry, as signature words.
const DTYPES: [DType; 3] = [DType::F32, DType::F64, DType::I64];

fn op_word(op: ReduceOp) -> i64 {
    match op {
        ReduceOp::Sum => 1,
        ReduceOp::Avg => 2,
        ReduceOp::Max => 3,
    }
}

/// One rank's description of its next collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Signature {
    pub(crate) kind: Kind,
    dtype: i64,
    input_numel: i64,
    output_numel: i64,
    /// The root rank (broadcast) or the operator word (reductions).
    arg: i64,
}

impl Signature {
    /// Words per signature.
    pub(crate) const WORDS: usize = 5;

    /// A collective with its element counts (the tensors' dtype is `dtype`).
    pub(crate) fn new(kind: Kind, dtype: DType, input_numel: usize, output_numel: usize) -> Self {
        Signature {
            kind,
            dtype: DTYPES
                .iter()
                .position(|d| *d == dtype)
                .map_or(-1, |i| i as i64),
            input_numel: input_numel as i64,
            output_numel: output_numel as i64,
            arg: 0,
        }
    }

    /// The barrier (no tensors).
    pub(crate) fn barrier() -> Self {
        Signature::new(Kind::Barrier, DType::F32, 0, 0)
    }

    /// The signature a rank sends when its own arguments were refused.
    pub(crate) fn invalid() -> Self {
        Signature::new(Kind::Invalid, DType::F32, 0, 0)
    }

    /// With the reduction operator.
    pub(crate) fn with_op(mut self, op: ReduceOp) -> Self {
        self.arg = op_word(op);
        self
    }

    /// With the root rank.
    pub(crate) fn with_root(mut self, root: usize) -> Self {
        self.arg = root as i64;
        self
    }

    /// The words sent to the peers.
    pub(crate) fn words(&self) -> [i64; Self::WORDS] {
        [
            self.kind as i64,
            self.dtype,
            self.input_numel,
            self.output_numel,
            self.arg,
        ]
    }

    fn from_words(w: &[i64]) -> Option<Self> {
        Some(Signature {
            kind: Kind::from_word(w[0])?,
            dtype: w[1],
            input_numel: w[2],
            output_numel: w[3],
            arg: w[4],
        })
    }

    fn describe(&self) -> String {
        let dtype = usize::try_from(self.dtype)
            .ok()
            .and_then(|i| DTYPES.get(i))
            .map_or("?".to_string(), |d| format!("{d:?}"));
        match self.kind {
            Kind::Invalid => "refused its own arguments (see that rank's error)".into(),
            Kind::Barrier => "barrier".into(),
            Kind::Broadcast => format!(
                "broadcast of {} {dtype} elements from root {}",
                self.input_numel, self.arg
            ),
            Kind::AllReduce => format!("all_reduce of {} {dtype} elements", self.input_numel),
            Kind::AllGather | Kind::ReduceScatter => format!(
                "{} of {} {dtype} elements into {}",
                self.kind.name(),
                self.input_numel,
                self.output_numel
            ),
        }
    }
}

/// Compares the gathered signatures (`world_size` times [`Signature::WORDS`] words, rank `r`'s
/// at `r * WORDS`) with this rank's; an error names every rank that differs from rank 0 and
/// what each issued.
pub(crate) fn check_table(
    rank: usize,
    world_size: usize,
    op: &'static str,
    table: &[i64],
) -> Result<()> {
    let sigs: Vec<Option<Signature>> = table
        .chunks(Signature::WORDS)
        .map(Signature::from_words)
        .collect();
    let reference = sigs.first().copied().flatten();
    let consistent = sigs.iter().all(|s| s.is_some() && *s == reference);
    if consistent && reference.is_some_and(|s| s.kind != Kind::Invalid) {
        return Ok(());
    }
    let lines: Vec<String> = sigs
        .iter()
        .enumerate()
        .map(|(r, s)| {
            let what = s.map_or("sent an unreadable signature".into(), |s| s.describe());
            format!("rank {r}: {what}")
        })
        .collect();
    let bad: Vec<String> = sigs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_none_or(|s| s.kind == Kind::Invalid || Some(s) != reference))
        .map(|(r, _)| r.to_string())
        .collect();
    Err(Error::Collective {
        rank,
        world_size,
        op,
        msg: format!(
            "the ranks issued different collectives (rank(s) {} differ: {}); every rank must \
             issue the same collectives in the same order with tensors of the same shape and \
             dtype",
            bad.join(", "),
            lines.join("; ")
        ),
    })
}

/// The checks every backend makes on a tensor before handing it to the transport.
pub(crate) fn check_tensor(
    op: &'static str,
    what: &str,
    t: &Tensor,
    device: Device,
    dtypes: &[DType],
) -> Result<()> {
    let bad = |msg: String| Err(Error::InvalidArgument { op, msg });
    if t.device() != device {
        return bad(format!(
            "the {what} tensor is on {:?} but this group's transport works on {device:?}; move \
             it with .to_device() or make the group for its device",
            t.device()
        ));
    }
    if !t.is_contiguous() {
        return bad(format!(
            "the {what} tensor (shape {:?}, strides {:?}) is not contiguous; pass \
             .contiguous() of it",
            t.shape(),
            t.strides()
        ));
    }
    if !dtypes.contains(&t.dtype()) {
        return bad(format!(
            "the {what} tensor has dtype {:?}; this transport carries {dtypes:?}: cast it with \
             .to_dtype()",
            t.dtype()
        ));
    }
    Ok(())
}

/// Refuses an output that is not `factor` times as long as the input (or the other way
/// round), of another dtype, or sharing the input's buffer.
pub(crate) fn check_pair(
    op: &'static str,
    small: &Tensor,
    large: &Tensor,
    world_size: usize,
) -> Result<()> {
    let bad = |msg: String| Err(Error::InvalidArgument { op, msg });
    if small.dtype() != large.dtype() {
        return bad(format!(
            "input and output dtypes differ ({:?} and {:?}); pass tensors of one dtype",
            small.dtype(),
            large.dtype()
        ));
    }
    let want = small.numel().checked_mul(world_size);
    if want != Some(large.numel()) {
        return bad(format!(
            "the larger tensor has {} elements but must have world_size ({world_size}) times \
             the smaller's {}",
            large.numel(),
            small.numel()
        ));
    }
    if small.storage_key() == large.storage_key() {
        return bad("input and output share one buffer; pass separate tensors".into());
    }
    Ok(())
}

/// Refuses an average of integers (it would truncate).
pub(crate) fn check_avg(op: &'static str, t: &Tensor, reduce: ReduceOp) -> Result<()> {
    if reduce == ReduceOp::Avg && t.dtype() == DType::I64 {
        return Err(Error::InvalidArgument {
            op,
            msg: "ReduceOp::Avg of an i64 tensor would truncate; reduce with Sum and divide".into(),
        });
    }
    Ok(())
}

/// Refuses a root outside the group.
pub(crate) fn check_root(op: &'static str, root: usize, world_size: usize) -> Result<()> {
    if root >= world_size {
        return Err(Error::InvalidArgument {
            op,
            msg: format!(
                "root rank {root} is not in the group of {world_size} ranks (0 to {})",
                world_size - 1
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(sigs: &[Signature]) -> Vec<i64> {
        sigs.iter().flat_map(|s| s.words()).collect()
    }

    #[test]
    fn equal_signatures_pass_and_differences_name_the_rank() {
        let a = Signature::new(Kind::AllReduce, DType::F32, 4, 4).with_op(ReduceOp::Sum);
        assert!(check_table(1, 2, "all_reduce", &table(&[a, a])).is_ok());
        let b = Signature::new(Kind::AllReduce, DType::F32, 6, 6).with_op(ReduceOp::Sum);
        let msg = check_table(0, 3, "all_reduce", &table(&[a, a, b]))
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("rank 0 of 3: all_reduce:"), "{msg}");
        assert!(msg.contains("rank(s) 2 differ"), "{msg}");
        assert!(
            msg.contains("rank 2: all_reduce of 6 F32 elements"),
            "{msg}"
        );
        assert!(
            msg.contains("rank 0: all_reduce of 4 F32 elements"),
            "{msg}"
        );
        let msg = check_table(
            1,
            2,
            "barrier",
            &table(&[Signature::barrier(), Signature::invalid()]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("rank(s) 1 differ") && msg.contains("refused its own"),
            "{msg}"
        );
        let root1 = Signature::new(Kind::Broadcast, DType::F64, 3, 3).with_root(1);
        let root0 = Signature::new(Kind::Broadcast, DType::F64, 3, 3).with_root(0);
        let msg = check_table(0, 2, "broadcast", &table(&[root0, root1]))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("from root 1"), "{msg}");
    }
}
