//! The bridge's channel: found among the remembered ones or opened, then signed in with the
//! runtime's sign-in driver (a QR flow followed in the background).

use std::sync::Arc;
use std::time::Duration;

use xagent_client_runtime::SignIn as Flow;
use xagent_protocol_types::{AuthInput, AuthProgress, AuthStatus, ConnectorChannelId};

use super::{Link, LinkConfig, LinkError, Notice, OWNER, SignIn, lock};
use crate::uris::SIGN_IN_URI;

impl Link {
    /// Finds the channel the runtime remembered for the bridge's user (reopened after hello)
    /// or opens a new one, then signs in when needed.
    pub(super) async fn open_channel(
        self: &Arc<Self>,
        config: &LinkConfig,
    ) -> Result<(), LinkError> {
        let remembered = self.plane.directory().owned_by(OWNER).next().cloned();
        if let Some(entry) = remembered {
            let id = entry.connector_channel_id.clone();
            // The runtime reopens remembered channels itself after hello: wait for the Descriptor.
            let reopened = tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    let directory = self.plane.directory();
                    if let Some(entry) = directory.owned_by(OWNER).next()
                        && entry.descriptor.is_some()
                    {
                        return entry.clone();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await;
            match reopened {
                Ok(entry) if entry.is_authenticated() => {
                    tracing::info!(channel = %entry.connector_channel_id, "remembered channel reopened, signed in");
                    let persisted = self.persisted_of(&entry.connector_channel_id).await;
                    *lock(&self.channel) = Some(persisted);
                    lock(&self.sign_in).status = Some(AuthStatus::Authenticated);
                    self.tools_maybe_changed();
                    return Ok(());
                }
                Ok(entry) => {
                    tracing::info!(channel = %entry.connector_channel_id, "remembered channel is not signed in any more");
                    let persisted = self.persisted_of(&entry.connector_channel_id).await;
                    *lock(&self.channel) = Some(persisted);
                    return self.sign_in_with(config, &entry.connector_channel_id).await;
                }
                Err(_) => {
                    tracing::warn!(%id, "the remembered channel did not reopen; opening a new one");
                    self.plane.forget_channel(&id).await;
                }
            }
        }
        let opened = self.plane.open_channel_for(OWNER, None).await?;
        let channel = opened.connector_channel_id.clone();
        *lock(&self.channel) = Some(channel.clone());
        tracing::info!(%channel, "channel open");
        self.sign_in_with(config, &channel).await
    }

    async fn sign_in_with(
        self: &Arc<Self>,
        config: &LinkConfig,
        channel: &ConnectorChannelId,
    ) -> Result<(), LinkError> {
        match &config.flow {
            Some(flow) => self.run_flow(channel, flow, &config.inputs).await,
            None => {
                tracing::warn!(
                    "the channel is not signed in and no --flow was given: the Connector's Tools stay unavailable"
                );
                Ok(())
            }
        }
    }

    /// Signs the channel in with the runtime's driver. A flow the Connector leaves pending (a
    /// QR code to scan) is followed in the background: each step updates [`Link::sign_in`]
    /// and the resources; the Tools are announced once it is authenticated.
    async fn run_flow(
        self: &Arc<Self>,
        channel: &ConnectorChannelId,
        flow: &str,
        inputs: &AuthInput,
    ) -> Result<(), LinkError> {
        let driver = self.plane.sign_in(channel, flow, inputs.clone()).await?;
        let progress = driver.progress();
        self.apply_auth(flow, &progress);
        match progress.status {
            AuthStatus::Authenticated => Ok(()),
            _ if driver.is_following() => {
                if let Some(link) = &progress.qr_code_text {
                    tracing::info!(%link, "open this link (or scan the QR code) to finish signing in; MCP clients find it in the sign-in resource and in connector_channels_list");
                }
                tokio::spawn(Arc::clone(self).follow_flow(driver));
                Ok(())
            }
            other => Err(LinkError::Config(format!(
                "sign-in with {flow:?} ended {other}: {}",
                progress.message.as_deref().unwrap_or("no reason given")
            ))),
        }
    }

    /// Shows each step of a followed sign-in until it ends.
    async fn follow_flow(self: Arc<Self>, driver: Flow) {
        let flow = driver.flow_id().to_owned();
        let mut steps = driver.watch();
        let ended = async {
            while steps.changed().await.is_ok() {
                let progress = steps.borrow_and_update().clone();
                self.apply_auth(&flow, &progress);
            }
        };
        // The watch ends when the driver does; its outcome says how.
        let (outcome, ()) = tokio::join!(driver.finished(), ended);
        match outcome {
            Ok(progress) => {
                self.apply_auth(&flow, &progress);
                tracing::info!(status = %progress.status, "sign-in ended");
            }
            Err(error) => tracing::warn!(%error, "the sign-in could not be followed to its end"),
        }
    }

    fn apply_auth(&self, flow: &str, progress: &AuthProgress) {
        let shown = SignIn {
            status: Some(progress.status.clone()),
            flow: Some(flow.to_owned()),
            qr_code_text: progress.qr_code_text.clone(),
            qr_code_image: progress.qr_code_image.clone(),
            message: progress.message.clone(),
        };
        {
            let mut current = lock(&self.sign_in);
            if *current == shown {
                return;
            }
            *current = shown;
        }
        self.notify(Notice::ResourcesChanged);
        self.notify(Notice::ResourceUpdated(SIGN_IN_URI.to_owned()));
        self.tools_maybe_changed();
    }
}
