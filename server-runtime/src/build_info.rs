//! Build stamps. An author's Connector reports its own build, not the toolkit's: by default
//! the version given to [`crate::Connector::builder`] and the build time of the running
//! executable (its modification time) as `build_time` in the protocol's `YYMMDDHHMM` format,
//! UTC (e.g. `2611301842` for 2026-11-30 18:42 UTC). [`build_info!`](crate::build_info) also
//! stamps the author crate's version and git revision at compile time; any [`BuildInfo`] can
//! be passed to [`crate::ConnectorBuilder::build_info`]. `/health` echoes exactly the Card's.

use std::time::{SystemTime, UNIX_EPOCH};

use xagent_protocol_types::BuildInfo;

mod stamp;

pub(crate) use stamp::stamp;

/// The build time of the running executable (its modification time), `YYMMDDHHMM` UTC.
pub fn executable_build_time() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let modified = std::fs::metadata(exe).ok()?.modified().ok()?;
    Some(stamp(modified.duration_since(UNIX_EPOCH).ok()?.as_secs()))
}

/// The default stamp of an author's Connector: `version` and the executable's build time
/// (the runtime's own build time when the executable cannot be read).
pub(crate) fn executable_build_info(version: &str) -> BuildInfo {
    let build_time = executable_build_time().unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| stamp(d.as_secs()))
            .unwrap_or_else(|_| runtime_build_info().build_time)
    });
    BuildInfo::new(build_time).with_version(version)
}

/// The build stamp of this runtime crate, taken at compile time: crate version, git tag and
/// revision when the build ran in a git checkout, build time `YYMMDDHHMM` UTC.
pub fn runtime_build_info() -> BuildInfo {
    let mut info =
        BuildInfo::new(env!("XAGENT_RUNTIME_BUILD_TIME")).with_version(env!("CARGO_PKG_VERSION"));
    let rev = env!("XAGENT_RUNTIME_GIT_REV");
    if !rev.is_empty() {
        info = info.with_git_rev(rev);
    }
    let tag = env!("XAGENT_RUNTIME_GIT_TAG");
    if !tag.is_empty() {
        info = info.with_git_tag(tag);
    }
    info
}

/// Builds a [`BuildInfo`] for the calling crate: its `CARGO_PKG_VERSION`, plus the compile-time
/// environment variables `XAGENT_BUILD_TIME`, `XAGENT_GIT_REV` and `XAGENT_GIT_TAG` when the
/// caller's build sets them; the build time falls back to the runtime's own stamp.
#[macro_export]
macro_rules! build_info {
    () => {{
        let fallback = $crate::ops::runtime_build_info();
        let mut info = $crate::ops::BuildInfo::new(
            option_env!("XAGENT_BUILD_TIME").map(str::to_owned).unwrap_or(fallback.build_time),
        )
        .with_version(env!("CARGO_PKG_VERSION"));
        if let Some(rev) = option_env!("XAGENT_GIT_REV").or(fallback.git_rev.as_deref()) {
            info = info.with_git_rev(rev);
        }
        if let Some(tag) = option_env!("XAGENT_GIT_TAG") {
            info = info.with_git_tag(tag);
        }
        info
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_stamp_has_ten_digit_build_time() {
        let info = runtime_build_info();
        assert_eq!(info.build_time.len(), 10, "{}", info.build_time);
        assert!(info.build_time.chars().all(|c| c.is_ascii_digit()));
        assert_eq!(info.version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn stamps_are_yymmddhhmm_utc() {
        // 2026-11-30 18:42:00 UTC.
        assert_eq!(stamp(1_796_064_120), "2611301842");
        assert_eq!(stamp(0), "7001010000");
    }

    #[test]
    fn a_connector_reports_its_own_version_not_the_toolkit() {
        let info = executable_build_info("7.3.1");
        assert_eq!(info.version.as_deref(), Some("7.3.1"));
        assert_eq!(info.build_time.len(), 10);
    }

    #[test]
    fn macro_stamps_caller_version() {
        let info = crate::build_info!();
        assert_eq!(info.version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(info.build_time.len(), 10);
    }
}
