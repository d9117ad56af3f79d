// Deferred index checks (launched from deferred.rs; compiled at first use by NVRTC and checked
// for sm_80/sm_90 by `cargo xtask kernels`). The design is in deferred.rs; in short, each thread
// that runs checks on a device has one record of 16 u64 words that all its checks merge into,
// and only the first failing check in stream order leaves its mark:
//
//   word 0  failed_seq  sequence number of the first failing check (~0: none yet)
//   word 1  position    its first bad flat position, row-major (atomicMin; ~0 until set)
//   word 2  value       the index value at that position
//   word 3  op          the op's code (the host's table of op names)
//   word 4  dim, 5 size, 6 ndim, 7..14 shape   what the host needs to build the error
//
//   kiln_deferred_check_range(idx, n, size, has_ignore, ignore, record, seq)
//       every thread that finds an index outside [0, size) (and, when has_ignore, not equal to
//       `ignore`) claims the record for `seq` with atomicCAS(failed_seq, ~0, seq). If the record
//       belongs to `seq` (claimed now or by another thread of this launch) it lowers `position`
//       with atomicMin; if an earlier check already owns it, nothing is written: kernels on one
//       stream run one after another, so an owner other than `seq` is always an earlier check.
//   kiln_deferred_check_finish(idx, record, seq, info)
//       one thread, queued right after the range check on the same stream: when the record
//       belongs to `seq`, it copies idx[position] and `info` (op, dim, size, shape) into it. A
//       second launch, because the value must match the final minimum position, which is only
//       known once every thread of the range check is done.
//
// The host resets the record to all-ones bytes (cuMemsetD8Async, queued on the same stream)
// after each read, so a cleared record reads failed_seq = position = ~0.

typedef unsigned long long u64;
typedef long long i64;

#define KILN_CHECK_NONE 0xffffffffffffffffULL
#define KILN_CHECK_MAX_DIMS 8

// Must match `CheckInfo` in deferred/ledger.rs field for field.
struct CheckInfo {
    u64 op;
    u64 dim;
    u64 size;
    u64 ndim;
    u64 shape[KILN_CHECK_MAX_DIMS];
};

extern "C" __global__ void kiln_deferred_check_range(const i64* __restrict__ idx, u64 n, u64 size,
                                                     int has_ignore, i64 ignore,
                                                     u64* __restrict__ record, u64 seq) {
    const u64 step = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const i64 v = idx[i];
        if (has_ignore && v == ignore) continue;
        if (v < 0 || (u64)v >= size) {
            const u64 owner = atomicCAS(&record[0], KILN_CHECK_NONE, seq);
            if (owner == KILN_CHECK_NONE || owner == seq) atomicMin(&record[1], i);
        }
    }
}

extern "C" __global__ void kiln_deferred_check_finish(const i64* __restrict__ idx,
                                                      u64* __restrict__ record, u64 seq,
                                                      CheckInfo info) {
    if (blockIdx.x != 0 || threadIdx.x != 0 || record[0] != seq) return;
    record[2] = (u64)idx[record[1]];
    record[3] = info.op;
    record[4] = info.dim;
    record[5] = info.size;
    record[6] = info.ndim;
    for (int d = 0; d < KILN_CHECK_MAX_DIMS; ++d) record[7 + d] = info.shape[d];
}
