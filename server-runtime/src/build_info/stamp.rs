//! The protocol's `YYMMDDHHMM` stamp (UTC) of a Unix time, with no date crate. Plain `std`
//! only: the build script includes this file too (`#[path]`), so the runtime's compile-time
//! stamp and its run-time ones are computed by the same code.

/// `secs` since the Unix epoch as `YYMMDDHHMM` in UTC.
pub(crate) fn stamp(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (hour, minute) = (rem / 3600, (rem % 3600) / 60);
    // Civil-from-days (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{:02}{:02}{:02}{:02}{:02}", year % 100, month, day, hour, minute)
}
