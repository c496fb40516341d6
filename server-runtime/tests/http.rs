//! Control plane over HTTP on 127.0.0.1, with and without a Base URL path prefix.

mod support;

use xagent_protocol_types::ManualClock;
use xagent_server_runtime::RuntimeConfig;

#[tokio::test]
async fn card_skill_and_health_are_served_and_health_matches_the_card() {
    let h = support::start_default().await;
    let http = reqwest::Client::new();
    let card: serde_json::Value =
        http.get(h.http("/connector-card.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(card["schema"], "xagent.connector/v1");
    assert_eq!(card["protocol_version"], "3.0");
    let schema = &card["tools"][0]["input_schema"];
    assert_eq!(schema["properties"]["connector_channel_id"]["type"], "string");
    assert!(schema["required"].as_array().unwrap().iter().any(|v| v == "connector_channel_id"));
    assert_eq!(card["tools"][0]["profile"], "xagent.im.v2");

    let skill = http.get(h.http("/skill.md")).send().await.unwrap();
    assert_eq!(skill.status(), 200);
    assert!(skill.text().await.unwrap().contains("connector-im-echo"));

    let no_key = http.get(h.http("/health")).send().await.unwrap();
    assert_eq!(no_key.status(), 401);
    assert_eq!(no_key.headers()["www-authenticate"], "Bearer");
    let health: serde_json::Value = http
        .get(h.http("/health"))
        .bearer_auth(support::API_KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["protocol_version"], card["protocol_version"]);
    assert_eq!(health["build"], card["build"]);
    assert_eq!(health["connector_card_version"], card["connector"]["version"]);
    h.stop().await;
}

#[tokio::test]
async fn base_url_path_prefix_works_for_every_endpoint() {
    let config = RuntimeConfig::default().with_base_path("/connectors/echo");
    let h =
        support::start(support::temp_dir("prefix"), ManualClock::new(support::START), config).await;
    let http = reqwest::Client::new();
    assert_eq!(http.get(h.http("/connector-card.json")).send().await.unwrap().status(), 200);
    assert_eq!(
        http.get(format!("http://{}/connector-card.json", h.addr)).send().await.unwrap().status(),
        404
    );
    assert_eq!(
        http.get(h.http("/health")).bearer_auth(support::API_KEY).send().await.unwrap().status(),
        200
    );
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let file = h.server.handle().register_file(&channel, "a.txt", None, b"abc").await.unwrap();
    let url = file.download_url.unwrap();
    assert!(url.starts_with("/connectors/echo/files/refs/"), "{url}");
    let got = http.get(format!("http://{}{}", h.addr, url)).send().await.unwrap();
    assert_eq!(got.status(), 200);
    h.stop().await;
}

#[tokio::test]
async fn skill_is_204_when_absent() {
    use xagent_protocol_types::{PROFILE_IM_V1, TargetDeclaration, TargetType};
    let connector = xagent_server_runtime::Connector::builder("im.plain", "Plain", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "plain", "Plain"))
        .profile(PROFILE_IM_V1)
        .build()
        .unwrap();
    let server = xagent_server_runtime::ConnectorServer::builder(connector).build().await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let running = server.clone();
    let task = tokio::spawn(async move { running.serve(listener, std::future::pending()).await });
    let skill = reqwest::get(format!("http://{addr}/skill.md")).await.unwrap();
    assert_eq!(skill.status(), 204);
    // Without an API key configured, /health is open.
    assert_eq!(reqwest::get(format!("http://{addr}/health")).await.unwrap().status(), 200);
    server.shutdown();
    let _ = task.await;
}
