//! The answer to a submitted batch: a ticket that resolves once its transaction committed.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;
use xagent_profile_im::StoreError;

use super::Fence;

/// Why a batch was not committed. Nothing of it was applied.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The lease row no longer carries the batch's fence: another process took the Card's
    /// holder lease over. This process must stop delivering and acknowledging.
    #[error(
        "the holder lease of {card} moved on (this process wrote under fencing number {number}); \
         it no longer holds the data plane and must not deliver or acknowledge"
    )]
    Fenced {
        /// The Card.
        card: String,
        /// The stale fencing number.
        number: u64,
    },
    /// The runtime holds no lease it could write under (it is standing by).
    #[error("this process does not hold the holder lease; it writes nothing until it takes it")]
    NotHolder,
    /// The backend failed (or refused a write, e.g. a rename onto a remembered id).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl CommitError {
    /// The refusal of a batch written under `fence`.
    pub(crate) fn fenced(fence: &Fence) -> Self {
        Self::Fenced { card: fence.card.as_str().to_owned(), number: fence.number }
    }

    /// True when the batch was refused for a stale or missing lease.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Self::Fenced { .. } | Self::NotHolder)
    }
}

/// Resolves once the batch's transaction committed (`Ok`) or failed (`Err`, nothing applied).
/// Await it; dropping it does not withdraw the batch.
#[must_use = "await the ticket before acknowledging what the batch records"]
#[derive(Debug)]
pub struct CommitTicket(Inner);

#[derive(Debug)]
enum Inner {
    Ready(Option<Result<(), CommitError>>),
    Waiting(oneshot::Receiver<Result<(), CommitError>>),
}

impl CommitTicket {
    /// A ticket already resolved (a backend that applied the batch at once).
    pub fn resolved(result: Result<(), CommitError>) -> Self {
        Self(Inner::Ready(Some(result)))
    }
}

/// The backend's side of a ticket: answer it once the batch is committed or failed.
#[derive(Debug)]
pub(crate) struct Submitted(oneshot::Sender<Result<(), CommitError>>);

impl Submitted {
    /// A waiting ticket and its answer.
    pub(crate) fn pair() -> (Self, CommitTicket) {
        let (sender, receiver) = oneshot::channel();
        (Self(sender), CommitTicket(Inner::Waiting(receiver)))
    }

    /// Answers the ticket (a dropped ticket is not an error: its submitter stopped waiting).
    pub(crate) fn answer(self, result: Result<(), CommitError>) {
        let _ = self.0.send(result);
    }
}

/// A ticket already resolved.
pub(crate) fn ready(result: Result<(), CommitError>) -> CommitTicket {
    CommitTicket::resolved(result)
}

impl Future for CommitTicket {
    type Output = Result<(), CommitError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            Inner::Ready(result) => Poll::Ready(result.take().unwrap_or_else(|| {
                Err(StoreError::new("commit", "the ticket was awaited twice").into())
            })),
            Inner::Waiting(receiver) => Pin::new(receiver).poll(cx).map(|answer| {
                answer.unwrap_or_else(|_| {
                    Err(StoreError::new(
                        "commit",
                        "the store's writer stopped before it answered; the batch may not be \
                         stored: restart the process",
                    )
                    .into())
                })
            }),
        }
    }
}
