//! Stable hashes of API objects (kubelet's `pkg/util/hash`).
//!
//! kubelet hashes objects with FNV-32a over a deep printing of the Go struct. nodelet hashes the
//! object's JSON serialization with FNV-1a 64-bit: stable across agent restarts and releases as long
//! as the serialization of the object does not change, which is what adoption of running
//! containers after a restart needs.

use serde::Serialize;

const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64-bit hash of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV64_OFFSET, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(FNV64_PRIME)
    })
}

/// FNV-1a 64-bit hash of the JSON serialization of `value`, as 16 lowercase hex digits.
/// An object that cannot be serialized (never the case for API types) hashes as its debug-free
/// empty form, `"0000000000000000"`.
pub fn object_hash<T: Serialize>(value: &T) -> String {
    match serde_json::to_vec(value) {
        Ok(bytes) => format!("{:016x}", fnv1a64(&bytes)),
        Err(_) => "0000000000000000".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn object_hash_changes_with_content() {
        assert_eq!(object_hash(&vec!["a"]), object_hash(&vec!["a"]));
        assert_ne!(object_hash(&vec!["a"]), object_hash(&vec!["b"]));
    }
}
