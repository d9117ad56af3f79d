//! Helpers shared by the recipe's integration tests.

use kiln::models::LayerExt;

/// Every state-dict tensor of `model` as the bit patterns of its values (as f64), by name: two
/// models are bit-identical when these are equal.
pub fn bits(model: &kiln::models::models::ResNet) -> Vec<(String, Vec<u64>)> {
    model
        .state_dict()
        .into_iter()
        .map(|(n, t)| {
            let v = t.to_vec_f64().unwrap().into_iter().map(f64::to_bits);
            (n, v.collect())
        })
        .collect()
}

/// Asserts two [`bits`] lists name the same tensors with the same bits.
pub fn assert_same_bits(a: &[(String, Vec<u64>)], b: &[(String, Vec<u64>)]) {
    assert_eq!(a.len(), b.len());
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        assert!(va == vb, "{na} differs after resume");
    }
}
