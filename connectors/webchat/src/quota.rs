//! The daily visitor upload allowance ([`UploadQuota`]): set by the page's limits, enforced by
//! the store's reservation of each upload.

/// The daily visitor upload allowance as the quota check uses it: one room's and everybody's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UploadQuota {
    /// Bytes one room may upload per day.
    pub room_bytes: u64,
    /// Files one room may upload per day.
    pub room_files: u64,
    /// Bytes all visitors may upload per day.
    pub all_bytes: u64,
    /// Files all visitors may upload per day.
    pub all_files: u64,
}
