//! Uploads and downloads are streamed: resident memory must not grow with the file size.
//! Kept in its own test binary so no other test shares (and disturbs) the process's memory.

mod common;

use common::memory::{MIB, round_trip};
use common::start;

/// Always on: 48 MiB must not grow resident memory by even half that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_and_download_are_streamed_not_buffered() {
    round_trip(start(48 * MIB).await, 48 * MIB, 24).await;
}

/// The big variant: 256 MiB by default (set `XAGENT_FT_BIG_MIB` for another size, e.g. 1024)
/// must grow resident memory by less than 64 MiB. Run with
/// `cargo test -p xagent-file-transfer --release --test memory -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: moves hundreds of MiB through the socket"]
async fn large_upload_keeps_resident_memory_flat() {
    let mib: u64 =
        std::env::var("XAGENT_FT_BIG_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    round_trip(start(mib * MIB).await, mib * MIB, 64).await;
}
