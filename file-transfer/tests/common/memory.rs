//! The streaming round trip the memory tests measure (each in its own test binary, so no
//! other test shares the process's memory).

use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::StatusCode;
use reqwest::multipart::{Form, Part};
use xagent_protocol_types::{CHANNEL_HEADER, UploadResponse};

use super::{API_KEY, CHANNEL_A, Server, rss_kib};

pub const MIB: u64 = 1024 * 1024;
const CHUNK: usize = 64 * 1024;

/// A `size`-byte body generated chunk by chunk (never materialised whole).
fn generated_body(size: u64) -> reqwest::Body {
    let chunk = Bytes::from((0..CHUNK).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let stream = futures_util::stream::unfold(size, move |left| {
        let chunk = chunk.clone();
        async move {
            if left == 0 {
                return None;
            }
            let take = left.min(CHUNK as u64);
            let piece = chunk.slice(..take as usize);
            Some((Ok::<_, std::io::Error>(piece), left - take))
        }
    });
    reqwest::Body::wrap_stream(stream)
}

/// Uploads then downloads `size` bytes; returns the growth of peak resident memory in KiB.
pub async fn round_trip(server: Server, size: u64, max_growth_mib: u64) -> u64 {
    // Warm up the client and server paths so one-off allocations are not counted.
    let warm = Form::new().part("file", Part::bytes(vec![0u8; 1024]).file_name("warm.bin"));
    let response = server
        .client
        .post(server.url("/prefix/files/uploads"))
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(warm)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let (before, _) = rss_kib();
    let started = Instant::now();
    let part = Part::stream_with_length(generated_body(size), size).file_name("big.bin");
    let response = server
        .client
        .post(server.url("/prefix/files/uploads"))
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(Form::new().part("file", part))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: UploadResponse = response.json().await.unwrap();
    assert_eq!(body.byte_size, size);
    let upload_time = started.elapsed();

    let response = server
        .client
        .get(server.url(&format!("/prefix/files/refs/{}", body.file_ref)))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.bytes_stream();
    let mut received = 0u64;
    let mut checksum = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        checksum = chunk.iter().fold(checksum, |sum, b| sum.wrapping_add(u64::from(*b)));
        received += chunk.len() as u64;
    }
    assert_eq!(received, size);
    let expected: u64 = (0..size).map(|i| (i % CHUNK as u64) % 251).sum();
    assert_eq!(checksum, expected);

    let (_, peak) = rss_kib();
    let growth = peak.saturating_sub(before);
    eprintln!(
        "round trip of {} MiB: upload {:.1?}, total {:.1?}, RSS before {} KiB, peak {} KiB, growth {} KiB",
        size / MIB,
        upload_time,
        started.elapsed(),
        before,
        peak,
        growth
    );
    assert!(growth < max_growth_mib * 1024, "resident memory grew by {growth} KiB");
    growth
}
