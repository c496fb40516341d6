//! Multipart upload parsing: `POST /files/uploads` with any body under a fixed boundary (or a
//! boundary taken from the input). Every answer is 200 with an upload response, or a 4xx with
//! the error object; never a panic, never a 5xx. Accepted files are removed again so the
//! store stays small.

#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;
use xagent_file_transfer::{ChannelDirectory, FileStore, StoreConfig, TransferState, UrlSigner};
use xagent_protocol_types::{
    CHANNEL_HEADER, ConnectorChannelId, Secret, SystemClock, UploadResponse, paths,
};

const CHANNEL: &str = "cch_fuzz";

struct OneChannel;

impl ChannelDirectory for OneChannel {
    async fn channel_exists(&self, channel: &ConnectorChannelId) -> bool {
        channel.as_str() == CHANNEL
    }
}

struct World {
    runtime: tokio::runtime::Runtime,
    store: FileStore,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let dir = std::env::temp_dir().join(format!("xagent-fuzz-upload-{}", std::process::id()));
        let store = runtime.block_on(async {
            let signer =
                UrlSigner::new(Secret::new("fuzzing secret of 16+ bytes")).expect("signer");
            FileStore::open(&dir, StoreConfig::default(), signer, SystemClock)
                .await
                .expect("a file store in the temp dir")
        });
        World { runtime, store }
    })
}

fuzz_target!(|data: &[u8]| {
    let world = world();
    // First line: the boundary when it is short and printable; the rest is the body.
    let (boundary, body) = match data.iter().position(|b| *b == b'\n') {
        Some(at) if at > 0 && at <= 70 && data[..at].iter().all(|b| b.is_ascii_graphic()) => {
            (String::from_utf8_lossy(&data[..at]).into_owned(), &data[at + 1..])
        }
        _ => ("XFUZZBOUNDARY".to_string(), data),
    };
    let router = TransferState::new(world.store.clone(), OneChannel)
        .with_max_upload_bytes(64 * 1024)
        .into_router();
    let request = Request::builder()
        .method("POST")
        .uri(paths::FILE_UPLOADS)
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .header(CHANNEL_HEADER, CHANNEL)
        .body(Body::from(body.to_vec()))
        .expect("a request");
    world.runtime.block_on(async {
        let response = router.oneshot(request).await.expect("the router is infallible");
        let status = response.status();
        assert!(!status.is_server_error(), "upload answered {status}");
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("a bounded response body");
        let json: serde_json::Value =
            serde_json::from_slice(&bytes).expect("every answer is a JSON body");
        if status == StatusCode::OK {
            let upload: UploadResponse =
                serde_json::from_value(json).expect("a 200 carries an upload response");
            world.store.remove(&upload.file_ref).await.expect("a stored upload is removed");
        } else {
            assert!(json.get("error").is_some(), "a refusal carries the error object: {json}");
        }
    });
});
