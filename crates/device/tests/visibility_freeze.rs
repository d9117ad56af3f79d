//! `set_visible_devices` works until kiln first initialises CUDA, then refuses loudly.
//! (Its own test binary: the freeze is per process, so no other test may initialise CUDA first.)

use kiln_device::{cuda_status, set_visible_devices, Device, Error};

#[test]
fn mask_is_accepted_before_init_and_refused_after() {
    set_visible_devices(&["1", "0"]).unwrap();
    // Until CUDA initialises, the mask can still be replaced.
    set_visible_devices(&["0"]).unwrap();
    // Bad entries are refused whatever the state, with the entry named.
    let bad = set_visible_devices(&["cuda:0"]).unwrap_err();
    assert!(
        matches!(bad, Error::InvalidVisibleDevice { index: 0, .. }),
        "{bad}"
    );

    // Any device query initialises kiln's CUDA state (here, whether or not a GPU exists).
    let status = cuda_status();
    let _ = Device::best();

    let late = set_visible_devices(&["0"]).unwrap_err();
    assert!(matches!(late, Error::VisibilityFrozen), "{late:?}");
    let msg = late.to_string();
    assert!(msg.contains("after CUDA was initialised"), "{msg}");
    assert!(msg.contains("before any device query"), "{msg}");
    // Refusing changed nothing: the status is the same object, the mask still the first one.
    assert!(std::ptr::eq(status, cuda_status()));
    if status.is_available() {
        assert_eq!(
            status.device_count(),
            1,
            "the mask [\"0\"] leaves one device"
        );
    }
}
