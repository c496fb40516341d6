//! Minting and recognising file references.

use xagent_protocol_types::{FileRef, IdKind};

/// Prefix of every file reference this crate mints.
pub const FILE_REF_PREFIX: &str = "file_";

/// A fresh random file reference: `file_` followed by 32 lowercase hex digits (128 bits),
/// minted by the project's one id helper ([`xagent_protocol_types::mint_id`]).
pub fn new_file_ref() -> FileRef {
    FileRef::new(IdKind::File.mint(rand::random()))
}

/// True when `value` has exactly the shape [`new_file_ref`] produces. Only such names are ever
/// turned into paths, so a reference read from a sidecar cannot point outside the store.
pub fn is_well_formed(value: &str) -> bool {
    IdKind::File.is_minted(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_refs_are_prefixed_random_and_well_formed() {
        let a = new_file_ref();
        let b = new_file_ref();
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("file_"));
        assert_eq!(a.as_str().len(), 5 + 32);
        assert!(is_well_formed(a.as_str()));
    }

    #[test]
    fn path_like_or_odd_refs_are_not_well_formed() {
        for bad in [
            "",
            "file_",
            "../etc/passwd",
            "file_../../00112233445566778899aabbcc",
            "file_00112233445566778899AABBCCDDEEFF",
            "file_00112233445566778899aabbccddeef",
            "file_00112233445566778899aabbccddeeff0",
            "x_00112233445566778899aabbccddeeff",
        ] {
            assert!(!is_well_formed(bad), "{bad}");
        }
    }
}
