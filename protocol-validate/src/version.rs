//! Protocol version parsing and admission.
//!
//! Versions are `MAJOR.MINOR` strings compared numerically (they are parsed as semver with a
//! `.0` patch). An omitted version means `1.0`. The xAgent side admits a Connector whose version
//! lies in a closed `[minimum, current]` window (default `[3.0, 3.0]`); the Connector side
//! admits a hello whose version is at least the minimum and whose major equals its own.

use std::fmt;
use std::str::FromStr;

use xagent_protocol_types::{ErrorCode, WireError};

/// A protocol version `MAJOR.MINOR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProtocolVersion {
    /// Major part; a change means an incompatible wire.
    pub major: u64,
    /// Minor part.
    pub minor: u64,
}

impl ProtocolVersion {
    /// The version this toolkit implements (`3.0`).
    pub const CURRENT: Self = Self { major: 3, minor: 0 };
    /// The version an omitted `protocol_version` stands for (`1.0`).
    pub const IMPLIED: Self = Self { major: 1, minor: 0 };

    /// A version from its parts.
    pub const fn new(major: u64, minor: u64) -> Self {
        Self { major, minor }
    }

    /// Parses `MAJOR.MINOR` (digits only, no leading zeros, no patch part).
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let malformed = || VersionError::Malformed { value: text.to_owned() };
        let (major, minor) = text.split_once('.').ok_or_else(malformed)?;
        let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return Err(malformed());
        }
        // semver does the numeric parsing and rejects leading zeros and overflow.
        let parsed =
            semver::Version::parse(&format!("{major}.{minor}.0")).map_err(|_| malformed())?;
        Ok(Self { major: parsed.major, minor: parsed.minor })
    }

    /// Reads an optional wire version: absent means `1.0`.
    pub fn from_wire(value: Option<&str>) -> Result<Self, VersionError> {
        match value {
            Some(text) => Self::parse(text),
            None => Ok(Self::IMPLIED),
        }
    }
}

impl Default for ProtocolVersion {
    fn default() -> Self {
        Self::CURRENT
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for ProtocolVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Why a version was not admitted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// The value is not `MAJOR.MINOR`.
    #[error("protocol_version {value:?} is not MAJOR.MINOR; send a version such as \"3.0\"")]
    Malformed {
        /// The offending value.
        value: String,
    },
    /// The version lies outside what this side admits.
    #[error("protocol version {version} is not admitted; this side accepts {accepted}")]
    NotAdmitted {
        /// The peer's version.
        version: ProtocolVersion,
        /// Human description of the accepted range.
        accepted: String,
    },
}

impl VersionError {
    /// The wire code: always `protocol_version_unsupported`.
    pub fn code(&self) -> ErrorCode {
        ErrorCode::ProtocolVersionUnsupported
    }

    /// The wire error to answer with.
    pub fn to_wire(&self) -> WireError {
        WireError::new(self.code(), self.to_string())
    }
}

/// The versions one side admits: a closed window `[minimum, current]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdmissionWindow {
    /// Lowest admitted version.
    pub minimum: ProtocolVersion,
    /// This side's own version; the highest the xAgent side admits.
    pub current: ProtocolVersion,
}

impl Default for AdmissionWindow {
    /// `[3.0, 3.0]`.
    fn default() -> Self {
        Self { minimum: ProtocolVersion::CURRENT, current: ProtocolVersion::CURRENT }
    }
}

impl AdmissionWindow {
    /// A window; `minimum` above `current` admits nothing.
    pub const fn new(minimum: ProtocolVersion, current: ProtocolVersion) -> Self {
        Self { minimum, current }
    }

    /// The xAgent-side rule: `minimum <= version <= current`. An omitted version is `1.0`.
    pub fn admit(&self, value: Option<&str>) -> Result<ProtocolVersion, VersionError> {
        let version = ProtocolVersion::from_wire(value)?;
        if version >= self.minimum && version <= self.current {
            Ok(version)
        } else {
            Err(VersionError::NotAdmitted {
                version,
                accepted: format!("versions {} to {}", self.minimum, self.current),
            })
        }
    }

    /// The Connector-side rule for a hello: `version >= minimum` and the same major as
    /// `current` (a newer minor of our major is compatible by definition of the version
    /// scheme). An omitted version is `1.0`.
    pub fn admit_hello(&self, value: Option<&str>) -> Result<ProtocolVersion, VersionError> {
        let version = ProtocolVersion::from_wire(value)?;
        if version >= self.minimum && version.major == self.current.major {
            Ok(version)
        } else {
            Err(VersionError::NotAdmitted {
                version,
                accepted: format!("{} or a later {}.x", self.minimum, self.current.major),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{IMPLIED_PROTOCOL_VERSION, PROTOCOL_VERSION};

    #[test]
    fn parses_major_minor() {
        assert_eq!(ProtocolVersion::parse("3.0").unwrap(), ProtocolVersion::new(3, 0));
        assert_eq!(ProtocolVersion::parse("10.12").unwrap(), ProtocolVersion::new(10, 12));
        assert_eq!(ProtocolVersion::parse(PROTOCOL_VERSION).unwrap(), ProtocolVersion::CURRENT);
        assert_eq!(
            ProtocolVersion::parse(IMPLIED_PROTOCOL_VERSION).unwrap(),
            ProtocolVersion::IMPLIED
        );
    }

    #[test]
    fn version_malformed_is_rejected() {
        for bad in ["", "3", "3.", ".0", "3.0.0", "v3.0", "03.0", "3.00", "3.-1", "3.a", " 3.0"] {
            assert!(
                matches!(ProtocolVersion::parse(bad), Err(VersionError::Malformed { .. })),
                "{bad:?} should be malformed"
            );
        }
    }

    #[test]
    fn compares_numerically() {
        assert!(ProtocolVersion::parse("3.10").unwrap() > ProtocolVersion::parse("3.9").unwrap());
        assert!(ProtocolVersion::parse("10.0").unwrap() > ProtocolVersion::parse("9.9").unwrap());
    }

    #[test]
    fn omitted_version_is_1_0_and_rejected_by_default() {
        assert_eq!(ProtocolVersion::from_wire(None).unwrap(), ProtocolVersion::IMPLIED);
        let window = AdmissionWindow::default();
        let err = window.admit(None).unwrap_err();
        assert_eq!(err.code(), ErrorCode::ProtocolVersionUnsupported);
        assert!(window.admit_hello(None).is_err());
    }

    #[test]
    fn default_window_admits_only_3_0() {
        let window = AdmissionWindow::default();
        assert!(window.admit(Some("3.0")).is_ok());
        assert!(window.admit(Some("2.9")).is_err());
        assert!(window.admit(Some("3.1")).is_err());
        assert!(window.admit(Some("4.0")).is_err());
    }

    #[test]
    fn configurable_window() {
        let window = AdmissionWindow::new(ProtocolVersion::new(3, 0), ProtocolVersion::new(3, 2));
        assert!(window.admit(Some("3.1")).is_ok());
        assert!(window.admit(Some("3.2")).is_ok());
        assert!(window.admit(Some("3.3")).is_err());
        let empty = AdmissionWindow::new(ProtocolVersion::new(4, 0), ProtocolVersion::new(3, 0));
        assert!(empty.admit(Some("3.0")).is_err());
    }

    #[test]
    fn connector_side_admits_newer_minor_of_same_major() {
        let window = AdmissionWindow::default();
        assert!(window.admit_hello(Some("3.0")).is_ok());
        assert!(window.admit_hello(Some("3.4")).is_ok());
        assert!(window.admit_hello(Some("2.0")).is_err());
        assert!(window.admit_hello(Some("4.0")).is_err());
    }

    #[test]
    fn errors_say_what_to_do() {
        let err = ProtocolVersion::parse("x").unwrap_err();
        assert!(err.to_string().contains("MAJOR.MINOR"));
        assert_eq!(err.to_wire().code, ErrorCode::ProtocolVersionUnsupported);
    }
}
