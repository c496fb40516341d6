//! A test driver for end-to-end tests in other languages (`e2e-mcp/matrix.test.mjs`): starts a
//! throw-away Synapse (testkit: from PyPI, a free port, a temporary directory), registers a
//! bot account and a person, and then acts as that person on a Matrix client of its own,
//! driven by JSON lines on stdin; what it sees goes to stdout as JSON lines.
//!
//! Out, first: `{"homeserver": URL, "bot_user": ID, "bot_password": PW}`.
//! In: `{"cmd": "room", "encrypted": true}` (creates a room, invites the bot, waits until it
//! joined; answers `{"event": "joined", "encrypted": bool}`), `{"cmd": "say", "text": T}`.
//! Out, as they come: `{"event": "message", "from_bot": bool, "body": T, "edit": bool,
//! "encrypted": bool}` for each message in the room. Ends (and stops Synapse) at end of input.

#![recursion_limit = "256"]

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use xagent_connector_matrix::testing::{Account, Human, body_of, is_edit};
use xagent_testkit::synapse::TestSynapse;

fn say(value: Value) {
    println!("{value}");
}

#[tokio::main]
async fn main() {
    let synapse = TestSynapse::shared().await;
    let bot = synapse.register("e2ebot").await;
    let person = synapse.register("e2eperson").await;
    say(
        json!({ "homeserver": synapse.url(), "bot_user": bot.user_id, "bot_password": bot.password }),
    );
    let human = Human::login(
        &synapse.url(),
        Account { user_id: person.user_id, localpart: person.localpart, password: person.password },
    )
    .await;
    let mut room = None;
    let mut shown = 0;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Ok(Some(line)) = line else { break };
                let Ok(command) = serde_json::from_str::<Value>(&line) else { continue };
                match command["cmd"].as_str() {
                    Some("room") => {
                        let encrypted = command["encrypted"].as_bool().unwrap_or(true);
                        let created = human.create_room("MCP room", encrypted, &[&bot.user_id]).await;
                        human.wait_joined(&created, &bot.user_id).await;
                        let state = created.latest_encryption_state().await.map(|s| s.is_encrypted());
                        say(json!({ "event": "joined", "encrypted": state.unwrap_or(false) }));
                        room = Some(created);
                    }
                    Some("say") => {
                        if let (Some(room), Some(text)) = (&room, command["text"].as_str()) {
                            human.say(room, text).await;
                        }
                    }
                    _ => {}
                }
            }
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let Some(room) = &room else { continue };
        let encrypted =
            room.latest_encryption_state().await.map(|s| s.is_encrypted()).unwrap_or(false);
        let all = human.messages_from(room, &bot.user_id);
        for event in all.iter().skip(shown) {
            say(json!({
                "event": "message",
                "from_bot": true,
                "body": body_of(event),
                "edit": is_edit(event),
                "encrypted": encrypted,
            }));
        }
        shown = all.len();
    }
}
