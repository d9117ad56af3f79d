//! The host side of one device's deferred checks: which thread owns which record slot, each
//! slot's sequence numbers and pending count, the table of op names, and turning a record (read
//! back as 16 plain `u64`s) into the error the CPU would have raised. No driver calls, so all of
//! it is tested without a GPU; the design is in [`super`].

use crate::ops::KernelError;

/// Words (`u64`) in the device record.
pub(crate) const RECORD_WORDS: usize = 16;
/// Bytes of the device record.
pub(crate) const RECORD_BYTES: usize = RECORD_WORDS * 8;
/// "No failure yet" / "no position yet": the all-ones word a cleared record holds.
pub(crate) const NONE: u64 = u64::MAX;
/// Records per device allocation: slots grow by chunks of this many (4 KiB).
pub(crate) const SLOTS_PER_CHUNK: usize = 32;
/// Dims of the index tensor the record can describe; a check of a tensor with more dims is
/// settled at the op (eagerly), where the full shape is still at hand.
pub(crate) const MAX_CHECK_DIMS: usize = 8;

// Word offsets in the record (see deferred.cu).
const FAILED_SEQ: usize = 0;
const POSITION: usize = 1;
const VALUE: usize = 2;
const OP: usize = 3;
const DIM: usize = 4;
const SIZE: usize = 5;
const NDIM: usize = 6;
const SHAPE: usize = 7;

/// What the finish kernel copies into the record when its check is the one that failed (must
/// match `struct CheckInfo` in deferred.cu field for field).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckInfo {
    /// Code of the op's name in [`Ledger`]'s table.
    pub(crate) op: u64,
    /// The indexed dimension.
    pub(crate) dim: u64,
    /// That dimension's size (the valid range is `[0, size)`).
    pub(crate) size: u64,
    /// Dims of the index tensor (at most [`MAX_CHECK_DIMS`] are stored).
    pub(crate) ndim: u64,
    /// The index tensor's shape, padded with 1s.
    pub(crate) shape: [u64; MAX_CHECK_DIMS],
}

/// One issued check, held by the op that issued it (never by the ledger, so the ledger's size
/// does not grow with the number of checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ticket {
    /// The record slot of the issuing thread.
    pub(crate) slot: usize,
    /// Issue order in that slot, from 0.
    pub(crate) seq: u64,
    /// The op's name.
    pub(crate) op: &'static str,
    /// What the device record gets when this check fails.
    pub(crate) info: CheckInfo,
    /// The full shape of the index tensor.
    pub(crate) shape: Vec<usize>,
}

impl Ticket {
    /// Whether the record can describe this check's index tensor (at most [`MAX_CHECK_DIMS`]
    /// dims); when not, the op settles it eagerly.
    pub(crate) fn fits_record(&self) -> bool {
        self.shape.len() <= MAX_CHECK_DIMS
    }
}

/// The first failing check found in a record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    /// Its sequence number.
    pub(crate) seq: u64,
    /// The op that issued it.
    pub(crate) op: &'static str,
    /// The error the CPU raises for the same index tensor.
    pub(crate) error: KernelError,
}

/// Counters of the deferred checks the calling thread ran on one device (see
/// [`crate::cuda::deferred_check_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DeferredCheckStats {
    /// Checks issued since the thread's first check.
    pub issued: u64,
    /// Checks issued since the record was last read (not yet reported on).
    pub pending: u64,
    /// Times the record was read back: each is one wait on the stream plus one 128-byte copy,
    /// made only at a synchronisation point (or at the op, in eager mode) and only when checks
    /// were pending.
    pub reads: u64,
}

/// The book of one record slot.
#[derive(Debug, Default, Clone)]
struct SlotBook {
    in_use: bool,
    next_seq: u64,
    pending: u64,
    reads: u64,
}

/// The host-side state of one device's checks: a book per record slot (one slot per thread that
/// ran a check and is still alive; freed slots are reused) plus the table of op names, which
/// holds each distinct `&'static str` once. Nothing grows with the number of checks.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    ops: Vec<&'static str>,
    slots: Vec<SlotBook>,
    free: Vec<usize>,
}

/// A record with no failure (what the device record holds after a reset).
#[cfg(test)]
fn cleared_record() -> [u64; RECORD_WORDS] {
    [NONE; RECORD_WORDS]
}

/// The record's words from its bytes as copied from the device (native byte order).
pub(crate) fn record_from_bytes(bytes: &[u8; RECORD_BYTES]) -> [u64; RECORD_WORDS] {
    std::array::from_fn(|w| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&bytes[8 * w..8 * w + 8]);
        u64::from_ne_bytes(word)
    })
}

/// Coordinates of row-major position `flat` in `shape`.
fn unravel(mut flat: u64, shape: &[usize]) -> Vec<usize> {
    let mut coords = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1) as u64;
        coords[d] = (flat % n) as usize;
        flat /= n;
    }
    coords
}

impl Ledger {
    /// A slot for a thread: a freed one when there is one, else a new one. The caller clears
    /// the slot's record on the stream before its first check (a freed slot may hold a failure
    /// its last thread never synchronised), and allocates a new chunk of records when the slot
    /// index reaches `chunks * SLOTS_PER_CHUNK`.
    pub(crate) fn acquire_slot(&mut self) -> usize {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(SlotBook::default());
            self.slots.len() - 1
        });
        self.slots[slot] = SlotBook {
            in_use: true,
            ..SlotBook::default()
        };
        slot
    }

    /// Gives a slot back (its thread ended); a failure still pending in it is dropped.
    pub(crate) fn release_slot(&mut self, slot: usize) {
        if self.slots.get(slot).is_some_and(|book| book.in_use) {
            self.slots[slot].in_use = false;
            self.free.push(slot);
        }
    }

    /// Slots ever created (the device holds that many records, rounded up to whole chunks).
    #[cfg(test)]
    fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Registers a check in `slot` of an index tensor of `shape` against `[0, size)` along
    /// `dim`.
    pub(crate) fn issue(
        &mut self,
        slot: usize,
        op: &'static str,
        dim: usize,
        size: usize,
        shape: &[usize],
    ) -> Ticket {
        let code = match self.ops.iter().position(|&known| known == op) {
            Some(code) => code,
            None => {
                self.ops.push(op);
                self.ops.len() - 1
            }
        };
        let mut stored = [1u64; MAX_CHECK_DIMS];
        for (s, &d) in stored.iter_mut().zip(shape) {
            *s = d as u64;
        }
        let book = &mut self.slots[slot];
        let seq = book.next_seq;
        book.next_seq += 1;
        book.pending += 1;
        Ticket {
            slot,
            seq,
            op,
            info: CheckInfo {
                op: code as u64,
                dim: dim as u64,
                size: size as u64,
                ndim: shape.len().min(MAX_CHECK_DIMS) as u64,
                shape: stored,
            },
            shape: shape.to_vec(),
        }
    }

    /// Checks issued in `slot` since its record was last read.
    pub(crate) fn pending(&self, slot: usize) -> u64 {
        self.slots.get(slot).map_or(0, |book| book.pending)
    }

    /// Distinct op names seen (bounded by the ops the code names).
    #[cfg(test)]
    fn op_names(&self) -> usize {
        self.ops.len()
    }

    /// The counters of `slot`.
    pub(crate) fn stats(&self, slot: usize) -> DeferredCheckStats {
        self.slots
            .get(slot)
            .map(|book| DeferredCheckStats {
                issued: book.next_seq,
                pending: book.pending,
                reads: book.reads,
            })
            .unwrap_or_default()
    }

    /// Takes `slot`'s record just read from the device (the device copy is reset right after):
    /// nothing is pending there any more, and the first failing check, if any, comes back.
    /// `own` is the ticket of the op settling its own check, whose full shape is used when it is
    /// the one that failed.
    pub(crate) fn settle(
        &mut self,
        slot: usize,
        record: &[u64; RECORD_WORDS],
        own: Option<&Ticket>,
    ) -> Option<Failure> {
        if let Some(book) = self.slots.get_mut(slot) {
            book.pending = 0;
            book.reads += 1;
        }
        let seq = record[FAILED_SEQ];
        if seq == NONE {
            return None;
        }
        let flat = record[POSITION];
        let index = record[VALUE] as i64;
        if let Some(t) = own.filter(|t| t.slot == slot && t.seq == seq) {
            return Some(Failure {
                seq,
                op: t.op,
                error: KernelError::IndexOutOfRange {
                    op: t.op,
                    index,
                    position: unravel(flat, &t.shape),
                    dim: t.info.dim as usize,
                    size: t.info.size as usize,
                },
            });
        }
        // A failure whose finish kernel never ran (its launch failed) has no op code.
        let op = usize::try_from(record[OP])
            .ok()
            .and_then(|code| self.ops.get(code).copied())
            .unwrap_or("an indexing op");
        let ndim = (record[NDIM] as usize).min(MAX_CHECK_DIMS);
        let shape: Vec<usize> = record[SHAPE..SHAPE + ndim]
            .iter()
            .map(|&d| d as usize)
            .collect();
        Some(Failure {
            seq,
            op,
            error: KernelError::IndexOutOfRange {
                op,
                index,
                position: unravel(flat, &shape),
                dim: record[DIM] as usize,
                size: record[SIZE] as usize,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the two kernels of deferred.cu do to the record for one check whose index tensor
    /// holds `values` (the contract the device side keeps; written out here so the decoding is
    /// tested against it).
    fn run_check(record: &mut [u64; RECORD_WORDS], t: &Ticket, values: &[i64]) {
        for (i, &v) in values.iter().enumerate() {
            if v < 0 || v as u64 >= t.info.size {
                if record[FAILED_SEQ] == NONE {
                    record[FAILED_SEQ] = t.seq;
                }
                if record[FAILED_SEQ] == t.seq {
                    record[POSITION] = record[POSITION].min(i as u64);
                }
            }
        }
        if record[FAILED_SEQ] == t.seq {
            record[VALUE] = values[record[POSITION] as usize] as u64;
            record[OP] = t.info.op;
            record[DIM] = t.info.dim;
            record[SIZE] = t.info.size;
            record[NDIM] = t.info.ndim;
            record[SHAPE..SHAPE + MAX_CHECK_DIMS].copy_from_slice(&t.info.shape);
        }
    }

    fn out_of_range(
        op: &'static str,
        index: i64,
        position: Vec<usize>,
        dim: usize,
        size: usize,
    ) -> KernelError {
        KernelError::IndexOutOfRange {
            op,
            index,
            position,
            dim,
            size,
        }
    }

    #[test]
    fn tickets_count_up_per_slot_and_share_op_codes() {
        let mut ledger = Ledger::default();
        let (x, y) = (ledger.acquire_slot(), ledger.acquire_slot());
        assert_eq!((x, y), (0, 1));
        let a = ledger.issue(x, "embedding", 0, 10, &[2, 3]);
        let b = ledger.issue(y, "gather", 1, 4, &[5]);
        let c = ledger.issue(x, "embedding", 0, 7, &[4]);
        assert_eq!((a.seq, b.seq, c.seq), (0, 0, 1));
        assert_eq!((a.slot, b.slot, c.slot), (0, 1, 0));
        assert_eq!((a.info.op, b.info.op, c.info.op), (0, 1, 0));
        assert_eq!(a.info.shape, [2, 3, 1, 1, 1, 1, 1, 1]);
        assert_eq!((a.info.ndim, a.info.dim, a.info.size), (2, 0, 10));
        assert_eq!((ledger.pending(x), ledger.pending(y)), (2, 1));
        assert_eq!(ledger.op_names(), 2);
    }

    #[test]
    fn a_clean_record_clears_only_its_own_slot() {
        let mut ledger = Ledger::default();
        let (x, y) = (ledger.acquire_slot(), ledger.acquire_slot());
        ledger.issue(x, "gather", 0, 3, &[4]);
        ledger.issue(x, "gather", 0, 3, &[4]);
        ledger.issue(y, "gather", 0, 3, &[4]);
        assert_eq!(ledger.settle(x, &cleared_record(), None), None);
        let stats = ledger.stats(x);
        assert_eq!((stats.issued, stats.pending, stats.reads), (2, 0, 1));
        assert_eq!(ledger.pending(y), 1);
        assert_eq!(ledger.stats(7), DeferredCheckStats::default());
    }

    #[test]
    fn freed_slots_are_reused_with_fresh_books() {
        let mut ledger = Ledger::default();
        let slots: Vec<usize> = (0..3).map(|_| ledger.acquire_slot()).collect();
        ledger.issue(slots[1], "embedding", 0, 5, &[3]);
        ledger.release_slot(slots[1]);
        ledger.release_slot(slots[1]); // twice is harmless
        assert_eq!(ledger.acquire_slot(), 1);
        assert_eq!(ledger.stats(1), DeferredCheckStats::default());
        assert_eq!(ledger.acquire_slot(), 3);
        assert_eq!(ledger.slot_count(), 4);
    }

    #[test]
    fn the_first_failing_check_in_issue_order_is_reported_with_its_coordinates() {
        let mut ledger = Ledger::default();
        let slot = ledger.acquire_slot();
        let mut record = cleared_record();
        let good = ledger.issue(slot, "embedding", 0, 10, &[2, 2]);
        run_check(&mut record, &good, &[1, 2, 3, 9]);
        let first = ledger.issue(slot, "index_select", 2, 5, &[2, 3]);
        // bad at flat 4 (value 7) and flat 5 (value -1): the smallest position wins
        run_check(&mut record, &first, &[0, 1, 2, 3, 7, -1]);
        let later = ledger.issue(slot, "gather", 1, 4, &[3]);
        run_check(&mut record, &later, &[9, 9, 9]);
        assert_eq!(record[FAILED_SEQ], first.seq);
        let failure = ledger.settle(slot, &record, None).unwrap();
        assert_eq!(failure.seq, 1);
        assert_eq!(failure.op, "index_select");
        let want = out_of_range("index_select", 7, vec![1, 1], 2, 5);
        assert_eq!(failure.error, want);
        assert_eq!(ledger.pending(slot), 0);
        // the same record bytes decode the same way
        let bytes: Vec<u8> = record.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(record_from_bytes(&bytes.try_into().unwrap()), record);
    }

    #[test]
    fn an_own_failure_uses_the_full_shape_and_a_lost_op_code_still_decodes() {
        let mut ledger = Ledger::default();
        let slot = ledger.acquire_slot();
        let shape = [2, 1, 1, 1, 1, 1, 1, 1, 3]; // 9 dims: more than the record holds
        let t = ledger.issue(slot, "gather", 8, 3, &shape);
        assert!(!t.fits_record());
        let mut record = cleared_record();
        let mut values = vec![0i64; 6];
        values[4] = 3;
        run_check(&mut record, &t, &values);
        let failure = ledger.settle(slot, &record, Some(&t)).unwrap();
        let position = vec![1, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(failure.error, out_of_range("gather", 3, position, 8, 3));

        // a range check whose finish kernel did not run: no op code, no shape
        let mut partial = cleared_record();
        partial[FAILED_SEQ] = 0;
        partial[POSITION] = 2;
        let failure = ledger.settle(slot, &partial, None).unwrap();
        assert_eq!(failure.op, "an indexing op");
    }

    #[test]
    fn memory_stays_bounded_however_many_checks_are_pending() {
        let mut ledger = Ledger::default();
        let slot = ledger.acquire_slot();
        for i in 0..100_000usize {
            let op = ["embedding", "cross_entropy", "gather"][i % 3];
            ledger.issue(slot, op, 0, 10, &[i % 7 + 1, 3]);
        }
        assert_eq!(ledger.pending(slot), 100_000);
        assert_eq!(ledger.op_names(), 3);
        assert_eq!(ledger.slot_count(), 1);
        assert!(ledger.ops.capacity() <= 4 && ledger.free.capacity() == 0);
    }
}
