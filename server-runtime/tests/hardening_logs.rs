//! Finding L2 of the issue-14 attack run: request traces never carry a URL signature or a
//! query, at any level. In a test binary of its own: a thread-local log subscriber can miss
//! events while other tests in the same process register tracing callsites at the same time.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

/// A log sink for one test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn l2_request_traces_never_carry_a_url_signature_at_any_level() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    // The test runtime has one thread: the server's tasks log through this subscriber too.
    let _guard = tracing::subscriber::set_default(subscriber);
    let h = support::start_default().await;
    let url = h.http("/files/refs/file_0123456789abcdef0123456789abcdef?exp=1&sig=c2lnbmF0dXJl");
    let _ = reqwest::get(url).await;
    let _ = reqwest::get(h.http("/health?token=leak-me")).await;
    h.stop().await;
    let log = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(log.contains("/files/refs/"), "the request was traced: {log}");
    assert!(!log.contains("sig="), "a signature reached the log: {log}");
    assert!(!log.contains("leak-me"), "a query reached the log: {log}");
}
