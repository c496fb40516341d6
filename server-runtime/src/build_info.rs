//! Build stamps. The runtime stamps its own build at compile time (see `build.rs`); a connector
//! author normally stamps theirs with [`build_info!`](crate::build_info) or passes any
//! [`BuildInfo`] to the builder. `/health` echoes exactly the Card's.

use xagent_protocol_types::BuildInfo;

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
        let fallback = $crate::runtime_build_info();
        let mut info = $crate::BuildInfo::new(
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
    fn macro_stamps_caller_version() {
        let info = crate::build_info!();
        assert_eq!(info.version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
        assert_eq!(info.build_time.len(), 10);
    }
}
