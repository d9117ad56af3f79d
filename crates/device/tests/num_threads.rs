//! `KILN_NUM_THREADS` caps the CPU pool. Its own test binary (own process), so the variable is set
//! before the pool is first built.

#[test]
fn kiln_num_threads_caps_the_pool() {
    std::env::set_var("KILN_NUM_THREADS", "1");
    assert_eq!(kiln_device::threads::num_threads(), 1);
    // Kernels still run (and split work) on a one-thread pool.
    let n = 1 << 16;
    let data: Vec<f32> = (0..n).map(|v| v as f32).collect();
    let l = kiln_device::Layout::contiguous(&[n]);
    let out = kiln_device::ops::elementwise::cpu::map1(&data, &l, |v: f32| v * 2.0);
    assert_eq!(out[n - 1], 2.0 * (n - 1) as f32);
}
