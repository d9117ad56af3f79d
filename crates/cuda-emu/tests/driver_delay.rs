//! `KILN_EMU_DELAY=1`: stream work starts after a random delay, so a host read of a page-locked
//! buffer before synchronising sees stale data, and a synchronised read never does.

mod common;

use common::{alloc, bind, setup, stream};
use cudarc::driver::sys::CUresult;
use kiln_cuda_emu::driver::*;

const ENV: &[(&str, &str)] = &[("KILN_EMU_DELAY", "1"), ("KILN_EMU_MEMORY", "16M")];

#[test]
fn unsynchronised_reads_see_stale_data() {
    let _g = setup(ENV);
    bind(0);
    let s = stream(1);
    let d = alloc(4).unwrap();
    let mut stale = 0;
    unsafe {
        let mut host = std::ptr::null_mut();
        assert_eq!(cuMemHostAlloc(&mut host, 4, 0), CUresult::CUDA_SUCCESS);
        let host = host as *mut u32;
        for round in 1..=20u32 {
            host.write_volatile(0);
            assert_eq!(cuMemsetD32Async(d, round, 1, s), CUresult::CUDA_SUCCESS);
            assert_eq!(
                cuMemcpyDtoHAsync_v2(host.cast(), d, 4, s),
                CUresult::CUDA_SUCCESS
            );
            if host.read_volatile() != round {
                stale += 1;
            }
            assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_SUCCESS);
            assert_eq!(host.read_volatile(), round, "after synchronising");
        }
        assert_eq!(cuMemFreeHost(host.cast()), CUresult::CUDA_SUCCESS);
        cuStreamDestroy_v2(s);
        cuMemFree_v2(d);
    }
    assert!(stale > 0, "no read before synchronising was stale");
}
