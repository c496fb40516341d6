//! The request handlers of the data plane, one file per concern, each a set of short methods
//! on the connection ([`crate::connection::Conn`]) over the shared state and the author's code:
//!
//! - `hello`: `connector.hello`.
//! - `channel`: `channel.open` / `channel.close` / `descriptor.get` and the channel lookup.
//! - `auth`: `auth.start` / `auth.status` / `auth.cancel` / `auth.logout`.
//! - `tool`: `tool.invoke` with the repeated-call registry ([`crate::tool_calls`]).
//!
//! IM packets go to [`crate::im`].

mod auth;
mod channel;
mod hello;
mod tool;
