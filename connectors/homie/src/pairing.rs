//! Pairing codes: the operator's proof that whoever binds a device may use it.
//!
//! The operator gives each device a code (`--pairing-code DEVICE_ID=CODE`, or a file of such
//! lines); the device owner types the device id and the code into the `homie_bind` form. Codes
//! are kept only as keyed SHA-256 digests (HMAC with a key drawn at start-up), compared in
//! constant time, and guessing is limited: after [`MAX_FAILURES`] wrong codes for one device id
//! within [`FAILURE_WINDOW_MS`], that device id refuses every code until the window has passed.

use std::collections::BTreeMap;
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use xagent_protocol_types::Secret;

use crate::model::check_id;

/// Shortest pairing code accepted from the operator.
pub const MIN_CODE_LEN: usize = 8;
/// Longest pairing code accepted.
pub const MAX_CODE_LEN: usize = 128;
/// Wrong codes tolerated per device id within the window.
pub const MAX_FAILURES: u32 = 5;
/// The window for counting wrong codes: 15 minutes.
pub const FAILURE_WINDOW_MS: u64 = 15 * 60 * 1000;
/// Largest pairing file read.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Why a pairing code was refused (the message never contains the code).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PairingError {
    /// An operator entry is not `DEVICE_ID=CODE`, or its parts are not acceptable.
    #[error("pairing entry {entry}: {problem}")]
    BadEntry {
        /// Which entry (argument number or file line).
        entry: String,
        /// What is wrong.
        problem: String,
    },
    /// The pairing file could not be read.
    #[error("cannot read the pairing file {path}: {problem}")]
    File {
        /// The path.
        path: String,
        /// Why.
        problem: String,
    },
    /// Unknown device id or wrong code (deliberately not saying which).
    #[error("the device id or the pairing code is wrong; check both with the device's operator")]
    Mismatch,
    /// Too many wrong codes for this device id.
    #[error("too many wrong pairing codes for this device; try again in {0} minutes")]
    Locked(u64),
}

#[derive(Clone, Copy, Debug, Default)]
struct Failures {
    count: u32,
    since: u64,
}

/// The operator's pairing codes, hashed.
pub struct PairingCodes {
    key: [u8; 32],
    digests: BTreeMap<String, [u8; 32]>,
    failures: BTreeMap<String, Failures>,
}

impl std::fmt::Debug for PairingCodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PairingCodes")
            .field("devices", &self.digests.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Default for PairingCodes {
    fn default() -> Self {
        Self::new()
    }
}

impl PairingCodes {
    /// No codes (every bind is refused until the operator adds some).
    pub fn new() -> Self {
        Self { key: rand::random(), digests: BTreeMap::new(), failures: BTreeMap::new() }
    }

    fn digest(&self, device_id: &str, code: &str) -> [u8; 32] {
        // HMAC-SHA256 accepts keys of any length, so this cannot fail; an all-zero digest
        // would never match a stored one.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else { return [0; 32] };
        mac.update(device_id.as_bytes());
        mac.update(&[0]);
        mac.update(code.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Adds (or replaces) the code of a device.
    pub fn add(&mut self, device_id: &str, code: &Secret, entry: &str) -> Result<(), PairingError> {
        let bad = |problem: String| PairingError::BadEntry { entry: entry.to_owned(), problem };
        check_id(device_id).map_err(|e| bad(e.to_string()))?;
        let len = code.expose().chars().count();
        if !(MIN_CODE_LEN..=MAX_CODE_LEN).contains(&len) {
            return Err(bad(format!(
                "the code must have {MIN_CODE_LEN} to {MAX_CODE_LEN} characters"
            )));
        }
        let digest = self.digest(device_id, code.expose());
        self.digests.insert(device_id.to_owned(), digest);
        Ok(())
    }

    /// Adds one `DEVICE_ID=CODE` entry (a command-line argument).
    pub fn add_entry(&mut self, text: &str, entry: &str) -> Result<(), PairingError> {
        let Some((device, code)) = text.split_once('=') else {
            return Err(PairingError::BadEntry {
                entry: entry.to_owned(),
                problem: "expected DEVICE_ID=CODE".into(),
            });
        };
        self.add(device.trim(), &Secret::new(code.trim()), entry)
    }

    /// Adds every entry of a file: one `DEVICE_ID=CODE` per line, blank lines and lines
    /// starting with `#` ignored.
    pub fn add_file(&mut self, path: &Path) -> Result<usize, PairingError> {
        let shown = path.display().to_string();
        let file_err = |problem: String| PairingError::File { path: shown.clone(), problem };
        let meta = std::fs::metadata(path).map_err(|e| file_err(e.to_string()))?;
        if meta.len() > MAX_FILE_BYTES {
            return Err(file_err(format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
        let mut added = 0;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            self.add_entry(line, &format!("{shown}:{}", i + 1))?;
            added += 1;
        }
        Ok(added)
    }

    /// Device ids that have a code.
    pub fn devices(&self) -> impl Iterator<Item = &str> {
        self.digests.keys().map(String::as_str)
    }

    /// Checks a code typed by the device owner at time `now` (Unix ms).
    pub fn verify(&mut self, device_id: &str, code: &Secret, now: u64) -> Result<(), PairingError> {
        let key = device_id.chars().take(crate::model::MAX_ID_LEN).collect::<String>();
        if let Some(f) = self.failures.get(&key).copied() {
            let elapsed = now.saturating_sub(f.since);
            if elapsed >= FAILURE_WINDOW_MS {
                self.failures.remove(&key);
            } else if f.count >= MAX_FAILURES {
                let minutes = (FAILURE_WINDOW_MS - elapsed).div_ceil(60_000);
                return Err(PairingError::Locked(minutes));
            }
        }
        let candidate = self.digest(device_id, code.expose());
        let stored = self.digests.get(device_id).copied().unwrap_or([0xff; 32]);
        let known = self.digests.contains_key(device_id);
        if known && bool::from(candidate.ct_eq(&stored)) {
            self.failures.remove(&key);
            return Ok(());
        }
        // Count failures for known and unknown ids alike (bounded map: unknown ids are only
        // counted while the map is small, so a flood of made-up ids cannot grow it).
        if known || self.failures.len() < 4096 {
            let f = self.failures.entry(key).or_insert(Failures { count: 0, since: now });
            f.count += 1;
        }
        Err(PairingError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_790_000_000_000;

    #[test]
    fn codes_are_kept_hashed_and_checked() {
        let mut p = PairingCodes::new();
        p.add_entry("thermo-1=correct-horse", "--pairing-code 1").unwrap();
        assert!(!format!("{p:?}").contains("correct-horse"));
        p.verify("thermo-1", &Secret::new("correct-horse"), T0).unwrap();
        assert_eq!(
            p.verify("thermo-1", &Secret::new("wrong-horse"), T0),
            Err(PairingError::Mismatch)
        );
        assert_eq!(
            p.verify("other", &Secret::new("correct-horse"), T0),
            Err(PairingError::Mismatch),
            "a code belongs to its device"
        );
    }

    #[test]
    fn rule_pairing_guesses_are_rate_limited() {
        let mut p = PairingCodes::new();
        p.add_entry("thermo-1=correct-horse", "1").unwrap();
        for _ in 0..MAX_FAILURES {
            assert_eq!(
                p.verify("thermo-1", &Secret::new("guess-guess"), T0),
                Err(PairingError::Mismatch)
            );
        }
        // Even the right code is refused while locked.
        assert_eq!(
            p.verify("thermo-1", &Secret::new("correct-horse"), T0 + 1),
            Err(PairingError::Locked(15))
        );
        p.verify("thermo-1", &Secret::new("correct-horse"), T0 + FAILURE_WINDOW_MS).unwrap();
    }

    #[test]
    fn bad_operator_entries_are_refused_without_echoing_the_code() {
        let mut p = PairingCodes::new();
        for bad in ["no-equals", "BAD ID=long-enough-code", "dev=short", "dev/x=long-enough-code"] {
            let err = p.add_entry(bad, "arg").unwrap_err();
            assert!(!err.to_string().contains("long-enough-code"), "{err}");
        }
    }

    #[test]
    fn pairing_file_lines_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("codes");
        std::fs::write(
            &path,
            "# operator codes\n\nthermo-1 = correct-horse\ncam-2=battery-staple\n",
        )
        .unwrap();
        let mut p = PairingCodes::new();
        assert_eq!(p.add_file(&path).unwrap(), 2);
        assert_eq!(p.devices().collect::<Vec<_>>(), vec!["cam-2", "thermo-1"]);
        std::fs::write(&path, "thermo-1=x\n").unwrap();
        let err = PairingCodes::new().add_file(&path).unwrap_err();
        assert!(err.to_string().contains(":1"), "{err}");
    }
}
