//! The shared listener under a connection flood (issue 23 F1), over real sockets: the attacker
//! connects from 127.0.0.2 and beyond (all of 127/8 is loopback on Linux), everyone else from
//! 127.0.0.1.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use xagent_protocol_types::ManualClock;
use xagent_server_runtime::RuntimeConfig;
use xagent_server_runtime::ops::ServeLimits;
use xagent_testkit::WsClient;

use support::{API_KEY, START, start, temp_dir};

/// A connection from `source` to `addr`, `None` when it was refused at once.
async fn connect_from(source: Ipv4Addr, addr: SocketAddr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::from((source, 0))).ok()?;
    socket.connect(addr).await.ok()
}

/// Holds connections from `source`: half of them with half a request header, half silent.
async fn flood(source: Ipv4Addr, addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for n in 0..count {
        if let Some(mut socket) = connect_from(source, addr).await {
            if n % 2 == 0 {
                let _ = socket.write_all(b"GET /connector-card.json HTTP/1.1\r\nHost: x\r\n").await;
            }
            held.push(socket);
        }
    }
    // Let the server accept (or refuse) every one of them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    held
}

/// How many of `held` the server has not closed.
async fn still_open(held: &mut [TcpStream]) -> usize {
    let mut open = 0;
    for socket in held.iter_mut() {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(20), socket.read(&mut byte)).await {
            Err(_) => open += 1,
            Ok(Ok(0) | Err(_)) => {}
            Ok(Ok(_)) => open += 1,
        }
    }
    open
}

/// A fresh GET of the Connector Card (the public page) from 127.0.0.1.
async fn page(addr: SocketAddr) -> Result<u16, String> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    let response = client
        .get(format!("http://{addr}/connector-card.json"))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    Ok(response.status().as_u16())
}

/// A fresh data-plane socket from 127.0.0.1 whose `connector.hello` is answered.
async fn hello(addr: SocketAddr) -> Result<WsClient, String> {
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut client = WsClient::connect(&format!("ws://{addr}/ws"), Some(API_KEY)).await?;
        let ack = client.hello(None).await;
        if ack.type_str() == "connector.hello.ack" {
            Ok(client)
        } else {
            Err(format!("answered {}", ack.type_str()))
        }
    })
    .await
    .map_err(|_| "no connector.hello.ack within 5 s".to_owned())?
}

fn limits(max_connections: usize, per_address: usize) -> ServeLimits {
    ServeLimits::default()
        .with_max_connections(max_connections)
        .with_per_address(per_address, 1_000, 1_000)
        .with_reserved_data_plane_connections(4)
}

#[tokio::test]
async fn one_address_cannot_take_the_listener() {
    let config = RuntimeConfig::default().with_listener(limits(32, 8));
    let harness = start(temp_dir("listener-one"), ManualClock::new(START), config).await;
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    let mut held = flood(attacker, harness.addr, 80).await;
    let open = still_open(&mut held).await;
    assert!(open <= 8, "one address kept {open} connections open (cap 8)");

    assert_eq!(page(harness.addr).await, Ok(200), "the page from another address");
    let client = hello(harness.addr).await;
    assert!(client.is_ok(), "a /ws hello from another address: {:?}", client.err());

    // The attacker's own new connections are refused at once, before any parsing.
    let mut more = flood(attacker, harness.addr, 4).await;
    assert_eq!(still_open(&mut more).await, 0, "a 9th connection of the attacker stayed open");
    drop(held);
    harness.stop().await;
}

#[tokio::test]
async fn an_authenticated_data_plane_survives_a_flood_from_many_addresses() {
    let config = RuntimeConfig::default().with_listener(limits(16, 4));
    let harness = start(temp_dir("listener-many"), ManualClock::new(START), config).await;
    let mut xagent = hello(harness.addr).await.expect("xAgent connects before the flood");

    // Ten addresses, four connections each: more than every slot of the listener.
    let mut held = Vec::new();
    for last in 2..12 {
        held.extend(flood(Ipv4Addr::new(127, 0, 0, last), harness.addr, 4).await);
    }

    // The established data plane still answers.
    let (channel, ack) = xagent.open_channel(None).await;
    assert_eq!(ack.type_str(), "channel.open.ack");
    assert!(!channel.as_str().is_empty());
    // And xAgent reconnecting during the flood gets in: a waiting flood connection makes room.
    let again = hello(harness.addr).await;
    assert!(again.is_ok(), "a new data plane during the flood: {:?}", again.err());
    // So does a visitor's page.
    assert_eq!(page(harness.addr).await, Ok(200));
    drop(held);
    harness.stop().await;
}

#[tokio::test]
async fn a_websocket_keeps_its_connection_slot_until_it_closes() {
    let config = RuntimeConfig::default().with_listener(limits(16, 2));
    let harness = start(temp_dir("listener-slot"), ManualClock::new(START), config).await;
    let first = hello(harness.addr).await.expect("a first data plane");
    let _second = hello(harness.addr).await.expect("a second data plane");
    // Both upgraded sockets still count against 127.0.0.1's two slots.
    assert!(page(harness.addr).await.is_err(), "a third connection of the address got in");
    drop(first);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(page(harness.addr).await, Ok(200), "a closed WebSocket frees its slot");
    harness.stop().await;
}

#[tokio::test]
async fn a_trusted_proxy_is_exempt_from_the_per_address_limits() {
    let proxy = Ipv4Addr::new(127, 0, 0, 3);
    let trusted = limits(64, 4).with_trusted_proxies(vec![
        xagent_server_runtime::ops::parse_trusted_proxy("127.0.0.3").unwrap(),
    ]);
    let config = RuntimeConfig::default().with_listener(trusted);
    let harness = start(temp_dir("listener-proxy"), ManualClock::new(START), config).await;
    // Every client behind the proxy arrives from its address: 20 connections stay open.
    let mut through_proxy = flood(proxy, harness.addr, 20).await;
    assert_eq!(still_open(&mut through_proxy).await, 20);
    // An address nobody named still gets its 4.
    let mut other = flood(Ipv4Addr::new(127, 0, 0, 4), harness.addr, 20).await;
    assert_eq!(still_open(&mut other).await, 4);
    drop((through_proxy, other));
    harness.stop().await;
}
