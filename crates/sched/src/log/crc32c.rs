//! CRC-32C (Castagnoli), the checksum TFRecord framing uses, and TensorFlow's "masked" form.
//!
//! Table-driven, one byte at a time: event files hold a few hundred bytes per step, so speed
//! is irrelevant and 30 lines beat a dependency. The table is built at compile time.

/// Reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// TensorFlow's masked CRC (`crc32c::Mask`): rotate right by 15 and add a constant, so that a
/// CRC stored inside checksummed data does not checksum to a fixed value.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // The standard check value, and RFC 3720 (iSCSI) test vectors.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&ascending), 0x46DD_794E);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn masked_values_match_tensorboards_implementation() {
        // From tensorboard's own `masked_crc32c` (tensorflow_stub.pywrap_tensorflow).
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
        assert_eq!(masked_crc32c(&24u64.to_le_bytes()), 0x224B_7FA3);
    }
}
