//! The data plane's driver, on the connection core (`xagent-connection`): starting a data
//! plane ([`crate::DataPlane::connect`]), the reconnect loop, one connection's life (hello and
//! its checks, reopening remembered channels), the holder lease (`holder`), the reader and the dispatch of accepted packets
//! to the IM and Tool layers. It sits above them; the state they share is `crate::connection`.

mod frames;
mod hello;
mod holder;
mod reconnect;
mod reopen;
mod start;
pub use reopen::REOPEN_CONCURRENCY;
