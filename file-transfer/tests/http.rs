//! End-to-end tests of the Transfer Plane over a real socket.

mod common;

use common::{API_KEY, CHANNEL_A, CHANNEL_B, START, Server, start};
use reqwest::StatusCode;
use reqwest::multipart::{Form, Part};
use xagent_file_transfer::{NewFile, StoreConfig};
use xagent_protocol_types::{CHANNEL_HEADER, ConnectorChannelId, HttpErrorBody, UploadResponse};

const MIB: u64 = 1024 * 1024;

fn image_form(bytes: &[u8]) -> Form {
    Form::new()
        .part(
            "file",
            Part::bytes(bytes.to_vec()).file_name("photo.png").mime_str("image/png").unwrap(),
        )
        .text("recipient_ref", "wxid_target")
        .text("reply_token", "ctx-token-1")
}

async fn error_code(response: reqwest::Response) -> String {
    let body: HttpErrorBody = response.json().await.unwrap();
    body.error.code.as_str().to_owned()
}

fn upload(server: &Server) -> reqwest::RequestBuilder {
    server.client.post(server.url("/prefix/files/uploads"))
}

/// Registers a text file for `channel` and returns (file_ref, signed url).
async fn stored(server: &Server, channel: &str) -> (String, String) {
    let new_file = NewFile::new(ConnectorChannelId::new(channel), "notes 照片 \"q\".txt");
    let registered = server.store.register_bytes(new_file, b"0123456789").await.unwrap();
    (registered.record.file_ref.to_string(), registered.download.url)
}

#[tokio::test]
async fn upload_with_key_and_channel_stores_the_file() {
    let server = start(MIB).await;
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(image_form(b"png bytes"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: UploadResponse = response.json().await.unwrap();
    assert!(body.file_ref.as_str().starts_with("file_"));
    assert_eq!(body.file_type.as_str(), "image");
    assert_eq!(body.filename, "photo.png");
    assert_eq!(body.byte_size, 9);
    assert_eq!(body.expires_at, START + 24 * 60 * 60 * 1000);

    let record = server.store.get(&body.file_ref).await.unwrap().unwrap();
    assert_eq!(record.connector_channel_id, ConnectorChannelId::new(CHANNEL_A));
    assert_eq!(record.recipient_ref.as_deref(), Some("wxid_target"));
    assert_eq!(record.reply_token.as_deref(), Some("ctx-token-1"));
    assert_eq!(record.mime_type, "image/png");

    // xAgent can read it back with the key.
    let url = server.url(&format!("/prefix/files/refs/{}", body.file_ref));
    let back = server.client.get(url).bearer_auth(API_KEY).send().await.unwrap();
    assert_eq!(back.status(), StatusCode::OK);
    assert_eq!(back.bytes().await.unwrap().as_ref(), b"png bytes");
}

#[tokio::test]
async fn upload_guesses_the_type_from_the_extension_when_undeclared() {
    let server = start(MIB).await;
    let form = Form::new().part("file", Part::bytes(b"ID3".to_vec()).file_name("voice.mp3"));
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: UploadResponse = response.json().await.unwrap();
    assert_eq!(body.file_type.as_str(), "audio");
}

#[tokio::test]
async fn upload_without_api_key_is_401_with_bearer_challenge() {
    let server = start(MIB).await;
    let response = upload(&server)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(image_form(b"x"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert_eq!(error_code(response).await, "unauthorized");
    assert_eq!(server.store.usage().await.unwrap().files, 0);
}

#[tokio::test]
async fn upload_with_wrong_api_key_is_401() {
    let server = start(MIB).await;
    for auth in ["Bearer wrong-key", "Basic dXNlcjpwYXNz", "Bearer", "test-system-api-key"] {
        let response = upload(&server)
            .header("authorization", auth)
            .header(CHANNEL_HEADER, CHANNEL_A)
            .multipart(image_form(b"x"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{auth}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let text = response.text().await.unwrap();
        assert!(!text.contains(API_KEY), "error body leaks the key: {text}");
    }
}

#[tokio::test]
async fn rule_bearer_scheme_is_case_insensitive_on_uploads() {
    // RFC 7235: the auth-scheme is case-insensitive. The Transfer Plane parses the header with
    // the project's one Bearer parser (`xagent_protocol_types::bearer_token`), the same one the
    // runtime's /ws uses, so `BEARER k` works on both.
    let server = start(MIB).await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let response = upload(&server)
            .header("authorization", format!("{scheme} {API_KEY}"))
            .header(CHANNEL_HEADER, CHANNEL_A)
            .multipart(image_form(b"x"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{scheme}");
    }
}

#[tokio::test]
async fn upload_without_channel_header_is_400_connector_channel_id_required() {
    let server = start(MIB).await;
    let response =
        upload(&server).bearer_auth(API_KEY).multipart(image_form(b"x")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(response).await, "connector_channel_id_required");
}

#[tokio::test]
async fn upload_for_unknown_channel_is_404_connection_not_found() {
    let server = start(MIB).await;
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, "cch_nobody")
        .multipart(image_form(b"x"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(response).await, "connection_not_found");
}

#[tokio::test]
async fn upload_over_the_limit_is_413_and_leaves_nothing() {
    let server = start(64 * 1024).await;
    let big = vec![7u8; 64 * 1024 + 1];
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(image_form(&big))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(response).await, "payload_too_large");
    assert_eq!(server.store.usage().await.unwrap().files, 0);
    assert_eq!(server.store.usage().await.unwrap().pending_files, 0);
    assert_eq!(std::fs::read_dir(&server.dir.0).unwrap().count(), 0);

    // Exactly at the limit is fine.
    let exact = vec![7u8; 64 * 1024];
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(image_form(&exact))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn upload_far_over_the_limit_is_413_while_streaming() {
    // Well past limit + form overhead, sent as a stream without Content-Length.
    let server = start(64 * 1024).await;
    let chunk = bytes::Bytes::from(vec![1u8; 256 * 1024]);
    let stream =
        futures_util::stream::iter((0..16).map(move |_| Ok::<_, std::io::Error>(chunk.clone())));
    let form = Form::new()
        .part("file", Part::stream(reqwest::Body::wrap_stream(stream)).file_name("big.bin"));
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(form)
        .send()
        .await;
    // The server answers as soon as the limit is crossed, before the body ends.
    let response = response.expect("the 413 arrives before the connection closes");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(response).await, "payload_too_large");
    assert_eq!(server.store.usage().await.unwrap().pending_files, 0);
    assert_eq!(server.store.usage().await.unwrap().files, 0);
}

#[tokio::test]
async fn upload_without_file_field_is_400() {
    let server = start(MIB).await;
    let form = Form::new().text("recipient_ref", "r");
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(response).await, "invalid_arguments");

    let not_multipart = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .body("plain")
        .send()
        .await
        .unwrap();
    assert_eq!(not_multipart.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(not_multipart).await, "invalid_arguments");
}

#[tokio::test]
async fn upload_when_store_is_full_is_507_capacity_exceeded() {
    let config = StoreConfig::default().with_max_files(1);
    let server = common::start_with(MIB, config).await;
    let send = || {
        upload(&server)
            .bearer_auth(API_KEY)
            .header(CHANNEL_HEADER, CHANNEL_A)
            .multipart(image_form(b"x"))
            .send()
    };
    assert_eq!(send().await.unwrap().status(), StatusCode::OK);
    let full = send().await.unwrap();
    assert_eq!(full.status(), StatusCode::INSUFFICIENT_STORAGE);
    assert_eq!(error_code(full).await, "capacity_exceeded");
}

#[tokio::test]
async fn download_with_signature_returns_bytes_type_and_disposition() {
    let server = start(MIB).await;
    let (_, url) = stored(&server, CHANNEL_A).await;
    assert!(url.starts_with("/prefix/files/refs/file_"), "{url}");
    let response = server.client.get(server.url(&url)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/plain");
    assert_eq!(headers["content-length"], "10");
    assert_eq!(headers["accept-ranges"], "bytes");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"notes __ _q_.txt\"; filename*=UTF-8''notes%20%E7%85%A7%E7%89%87%20%22q%22.txt"
    );
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"0123456789");
}

#[tokio::test]
async fn download_with_api_key_needs_no_signature() {
    let server = start(MIB).await;
    let (file_ref, _) = stored(&server, CHANNEL_A).await;
    let url = server.url(&format!("/prefix/files/refs/{file_ref}"));
    let response = server.client.get(&url).bearer_auth(API_KEY).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"0123456789");
    // The same channel in the header is fine too.
    let response = server
        .client
        .get(&url)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn download_without_any_credential_is_401() {
    let server = start(MIB).await;
    let (file_ref, _) = stored(&server, CHANNEL_A).await;
    let url = server.url(&format!("/prefix/files/refs/{file_ref}"));
    let response = server.client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let wrong = server.client.get(&url).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn download_with_bad_signature_is_403() {
    let server = start(MIB).await;
    let (file_ref, url) = stored(&server, CHANNEL_A).await;
    let (path, query) = url.split_once('?').unwrap();
    let exp = query.split('&').find_map(|kv| kv.strip_prefix("exp=")).unwrap();
    let exp_later: u64 = exp.parse::<u64>().unwrap() + 1;
    let cases = [
        format!("{path}?exp={exp}&sig={}", "0".repeat(64)),
        format!("{path}?exp={exp}&sig=not-hex"),
        format!("{path}?exp={exp}"),
        format!("{path}?sig=abcd"),
        format!("{path}?exp=soon&sig=abcd"),
        // A genuine signature with a tampered expiry.
        url.replace(&format!("exp={exp}"), &format!("exp={exp_later}")),
    ];
    for case in cases {
        let response = server.client.get(server.url(&case)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{case}");
        assert_eq!(error_code(response).await, "forbidden");
    }
    // A signature of another file does not open this one.
    let (_, other_url) = stored(&server, CHANNEL_A).await;
    let other_query = other_url.split_once('?').unwrap().1;
    let swapped = format!("/prefix/files/refs/{file_ref}?{other_query}");
    let response = server.client.get(server.url(&swapped)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn download_of_a_file_of_another_channel_is_403() {
    let server = start(MIB).await;
    let (file_ref, url) = stored(&server, CHANNEL_A).await;
    let signed =
        server.client.get(server.url(&url)).header(CHANNEL_HEADER, CHANNEL_B).send().await.unwrap();
    assert_eq!(signed.status(), StatusCode::FORBIDDEN);
    assert_eq!(error_code(signed).await, "forbidden");
    let keyed = server
        .client
        .get(server.url(&format!("/prefix/files/refs/{file_ref}")))
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_B)
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn download_with_expired_url_or_expired_file_is_404() {
    let server = start(MIB).await;
    let (file_ref, url) = stored(&server, CHANNEL_A).await;
    server.clock.advance(15 * 60 * 1000 + 1);
    let response = server.client.get(server.url(&url)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(response).await, "file_not_found");

    // A fresh URL works until the file itself expires.
    let record = server.store.get(&file_ref.as_str().into()).await.unwrap().unwrap();
    let fresh = server.store.download_url(&record).url;
    assert_eq!(
        server.client.get(server.url(&fresh)).send().await.unwrap().status(),
        StatusCode::OK
    );
    server.clock.advance(24 * 60 * 60 * 1000);
    let keyed = server
        .client
        .get(server.url(&format!("/prefix/files/refs/{file_ref}")))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(keyed.status(), StatusCode::NOT_FOUND);
    assert_eq!(error_code(keyed).await, "file_not_found");
}

#[tokio::test]
async fn download_of_unknown_file_is_404() {
    let server = start(MIB).await;
    for file_ref in ["file_00000000000000000000000000000000", "..%2F..%2Fetc%2Fpasswd", "x"] {
        let url = server.url(&format!("/prefix/files/refs/{file_ref}"));
        let response = server.client.get(url).bearer_auth(API_KEY).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{file_ref}");
        assert_eq!(error_code(response).await, "file_not_found");
    }
}

#[tokio::test]
async fn download_of_a_removed_channel_file_is_404() {
    let server = start(MIB).await;
    let (_, url) = stored(&server, CHANNEL_A).await;
    server.store.remove_channel(&ConnectorChannelId::new(CHANNEL_A)).await.unwrap();
    let response = server.client.get(server.url(&url)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn download_with_range_is_206_with_content_range() {
    let server = start(MIB).await;
    let (_, url) = stored(&server, CHANNEL_A).await;
    for (range, body, content_range) in [
        ("bytes=2-5", &b"2345"[..], "bytes 2-5/10"),
        ("bytes=7-", b"789", "bytes 7-9/10"),
        ("bytes=-2", b"89", "bytes 8-9/10"),
        ("bytes=9-100", b"9", "bytes 9-9/10"),
    ] {
        let response =
            server.client.get(server.url(&url)).header("range", range).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT, "{range}");
        assert_eq!(response.headers()["content-range"], content_range);
        assert_eq!(response.headers()["content-length"], body.len().to_string().as_str());
        assert_eq!(response.bytes().await.unwrap().as_ref(), body);
    }
    // Several ranges are answered with the whole file.
    let multi =
        server.client.get(server.url(&url)).header("range", "bytes=0-1,4-5").send().await.unwrap();
    assert_eq!(multi.status(), StatusCode::OK);
    assert_eq!(multi.bytes().await.unwrap().len(), 10);
}

#[tokio::test]
async fn download_with_unsatisfiable_range_is_416() {
    let server = start(MIB).await;
    let (_, url) = stored(&server, CHANNEL_A).await;
    let response =
        server.client.get(server.url(&url)).header("range", "bytes=10-").send().await.unwrap();
    assert_eq!(response.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(response.headers()["content-range"], "bytes */10");
}

#[tokio::test]
async fn head_request_gives_headers_without_body() {
    let server = start(MIB).await;
    let (_, url) = stored(&server, CHANNEL_A).await;
    let response = server.client.head(server.url(&url)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-length"], "10");
    assert!(response.bytes().await.unwrap().is_empty());
}

#[tokio::test]
async fn without_a_configured_key_uploads_are_open_and_downloads_need_a_signature() {
    let server = common::start_full(MIB, StoreConfig::default(), None).await;
    let response = upload(&server)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(image_form(b"x"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: UploadResponse = response.json().await.unwrap();
    let plain = server.url(&format!("/prefix/files/refs/{}", body.file_ref));
    // Any bearer token is meaningless without a configured key: a signature is still needed.
    let response = server.client.get(&plain).bearer_auth("anything").send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let record = server.store.get(&body.file_ref).await.unwrap().unwrap();
    let signed = server.store.download_url(&record).url;
    let response = server.client.get(server.url(&signed)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn upload_with_two_file_fields_is_400() {
    let server = start(MIB).await;
    let form = Form::new()
        .part("file", Part::bytes(b"1".to_vec()).file_name("a.txt"))
        .part("file", Part::bytes(b"2".to_vec()).file_name("b.txt"));
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(response).await, "invalid_arguments");
    assert_eq!(server.store.usage().await.unwrap().files, 0);
    assert_eq!(server.store.usage().await.unwrap().pending_files, 0);
}

#[tokio::test]
async fn upload_with_an_oversized_reference_field_is_413() {
    let server = start(MIB).await;
    let form = image_form(b"x").text("recipient_ref", "r".repeat(9 * 1024));
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(server.store.usage().await.unwrap().files, 0);
}

#[tokio::test]
async fn upload_fields_may_come_in_any_order_and_unknown_ones_are_skipped() {
    let server = start(MIB).await;
    let form = Form::new()
        .text("reply_token", "tok")
        .text("something_new", "ignored")
        .part("file", Part::bytes(b"abc".to_vec()).file_name("../../x.txt"));
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_B)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: UploadResponse = response.json().await.unwrap();
    assert_eq!(body.filename, "x.txt");
    let record = server.store.get(&body.file_ref).await.unwrap().unwrap();
    assert_eq!(record.reply_token.as_deref(), Some("tok"));
    assert_eq!(record.recipient_ref, None);
    assert_eq!(record.connector_channel_id, ConnectorChannelId::new(CHANNEL_B));
}

#[tokio::test]
async fn signed_download_with_its_own_channel_in_the_header_is_allowed() {
    let server = start(MIB).await;
    let (_, url) = stored(&server, CHANNEL_A).await;
    let response =
        server.client.get(server.url(&url)).header(CHANNEL_HEADER, CHANNEL_A).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn upload_declaring_a_length_far_over_the_limit_is_413_before_reading() {
    let server = start(64 * 1024).await;
    let response = upload(&server)
        .bearer_auth(API_KEY)
        .header(CHANNEL_HEADER, CHANNEL_A)
        .multipart(image_form(&vec![0u8; 2 * MIB as usize]))
        .send()
        .await;
    let response = response.expect("the 413 arrives before the connection closes");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(response).await, "payload_too_large");
    assert_eq!(server.store.usage().await.unwrap().files, 0);
    assert_eq!(server.store.usage().await.unwrap().pending_files, 0);
}
