//! The control and transfer planes as seen from xAgent: Card, Skill, health, uploads, downloads.

use reqwest::StatusCode;
use xagent_protocol_types::{
    CHANNEL_HEADER, ConnectorCard, ConnectorChannelId, HealthResponse, Secret, UploadResponse,
};

use crate::download::Downloader;
use crate::download::{DownloadError, Downloaded};
use crate::{BaseUrl, ClientError, DownloadPolicy};

/// An HTTP client bound to one Connector's Base URL and system API key.
#[derive(Clone)]
pub struct ControlPlane {
    base: BaseUrl,
    api_key: Option<Secret>,
    http: reqwest::Client,
    /// Inbound downloads: their own client, under the download policy.
    downloads: Downloader,
    /// The certificate authorities both clients trust.
    tls: crate::TlsTrust,
    policy: DownloadPolicy,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("base", &self.base)
            .field("api_key", &self.api_key)
            .finish()
    }
}

/// The Skill endpoint's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkillDocument {
    /// 200 with Markdown.
    Present(String),
    /// 204 or 404: no primary Skill.
    Absent,
}

impl SkillDocument {
    /// The Markdown, `None` when the Connector serves no Skill.
    pub fn markdown(&self) -> Option<&str> {
        match self {
            Self::Present(text) => Some(text),
            Self::Absent => None,
        }
    }
}

impl From<Option<String>> for SkillDocument {
    /// A stored Skill (`None`: the Connector served none).
    fn from(markdown: Option<String>) -> Self {
        markdown.map_or(Self::Absent, Self::Present)
    }
}

/// The control and transfer planes' client: bounded connect and request times.
fn http_client(tls: &crate::TlsTrust) -> reqwest::Client {
    let builder = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(30));
    tls.http(builder).build().unwrap_or_default()
}

impl ControlPlane {
    /// A client for a Base URL; `api_key` is sent as `Authorization: Bearer` where required.
    /// Downloads follow the default [`DownloadPolicy`] (the Connector's own origin only).
    pub fn new(base: BaseUrl, api_key: Option<Secret>) -> Self {
        let tls = crate::TlsTrust::system();
        let policy = DownloadPolicy::default();
        Self {
            http: http_client(&tls),
            downloads: Downloader::new(&base, &policy, &tls),
            base,
            api_key,
            tls,
            policy,
        }
    }

    /// Downloads under `policy` instead of the default one.
    #[must_use]
    pub fn with_download_policy(mut self, policy: &DownloadPolicy) -> Self {
        self.downloads = Downloader::new(&self.base, policy, &self.tls);
        self.policy = policy.clone();
        self
    }

    /// Trusts these certificate authorities (an `https` Base URL behind a private CA) for
    /// requests and downloads alike.
    #[must_use]
    pub fn with_tls(mut self, tls: &crate::TlsTrust) -> Self {
        self.tls = tls.clone();
        self.http = http_client(tls);
        self.downloads = Downloader::new(&self.base, &self.policy, tls);
        self
    }

    /// The Base URL.
    pub fn base(&self) -> &BaseUrl {
        &self.base
    }

    /// The API key, if any.
    pub fn api_key(&self) -> Option<&Secret> {
        self.api_key.as_ref()
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key.expose()),
            None => request,
        }
    }

    async fn send(
        &self,
        endpoint: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        request.send().await.map_err(|e| ClientError::transport(endpoint, &e.without_url()))
    }

    async fn expect_success(
        endpoint: &str,
        response: reqwest::Response,
    ) -> Result<reqwest::Response, ClientError> {
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(ClientError::Unauthorized {
                endpoint: endpoint.to_owned(),
                status: status.as_u16(),
            });
        }
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(ClientError::Http {
                endpoint: endpoint.to_owned(),
                status: status.as_u16(),
                body: body.chars().take(300).collect(),
            });
        }
        Ok(response)
    }

    /// `GET /connector-card.json` as raw JSON (validate before trusting it). Sent without the
    /// API key: the Card is public.
    pub async fn card_json(&self) -> Result<serde_json::Value, ClientError> {
        let endpoint = self.base.card_url();
        let response = self.send(&endpoint, self.http.get(&endpoint)).await?;
        let response = Self::expect_success(&endpoint, response).await?;
        response.json().await.map_err(|e| {
            ClientError::NotAdmissible(format!(
                "{endpoint} did not return a JSON object: {}",
                e.without_url()
            ))
        })
    }

    /// `GET /connector-card.json`, parsed.
    pub async fn card(&self) -> Result<ConnectorCard, ClientError> {
        let value = self.card_json().await?;
        serde_json::from_value(value)
            .map_err(|e| ClientError::NotAdmissible(format!("the Card does not parse: {e}")))
    }

    /// `GET /skill.md`; 204 and 404 mean no Skill. Sent without the API key.
    pub async fn skill(&self) -> Result<SkillDocument, ClientError> {
        let endpoint = self.base.skill_url();
        let response = self.send(&endpoint, self.http.get(&endpoint)).await?;
        if matches!(response.status(), StatusCode::NO_CONTENT | StatusCode::NOT_FOUND) {
            return Ok(SkillDocument::Absent);
        }
        let response = Self::expect_success(&endpoint, response).await?;
        let text = response.text().await.map_err(|e| ClientError::Transport {
            endpoint: endpoint.clone(),
            reason: e.without_url().to_string(),
        })?;
        Ok(SkillDocument::Present(text))
    }

    /// `GET /health` with the API key.
    pub async fn health(&self) -> Result<HealthResponse, ClientError> {
        let endpoint = self.base.health_url();
        let response = self.send(&endpoint, self.authorized(self.http.get(&endpoint))).await?;
        let response = Self::expect_success(&endpoint, response).await?;
        response.json().await.map_err(|e| ClientError::Http {
            endpoint: endpoint.clone(),
            status: 200,
            body: format!("not a health document: {}", e.without_url()),
        })
    }

    /// `POST /files/uploads` for a channel; returns the Connector's `file_ref`.
    pub async fn upload(
        &self,
        channel: &ConnectorChannelId,
        filename: &str,
        mime_type: &str,
        bytes: Vec<u8>,
    ) -> Result<UploadResponse, ClientError> {
        let endpoint = self.base.uploads_url();
        let part = reqwest::multipart::Part::bytes(bytes)
            .file_name(filename.to_owned())
            .mime_str(mime_type)
            .map_err(|e| ClientError::InvalidInput(format!("bad MIME type {mime_type:?}: {e}")))?;
        let form = reqwest::multipart::Form::new().part("file", part);
        let request = self
            .authorized(self.http.post(&endpoint))
            .header(CHANNEL_HEADER, channel.as_str())
            .multipart(form);
        let response = self.send(&endpoint, request).await?;
        let response = Self::expect_success(&endpoint, response).await?;
        response.json().await.map_err(|e| {
            ClientError::Protocol(format!(
                "the upload response is not an upload document: {}",
                e.without_url()
            ))
        })
    }

    /// Downloads a message file by its `download_url` (relative URLs resolve under the Base
    /// URL) under the download policy: the Connector's own origin or an allowed one, public
    /// addresses only outside the Connector's origin, redirects checked at every hop, the size
    /// limit counted while reading. Sent without an API key, as the xAgent download chain does.
    pub async fn download(&self, download_url: &str) -> Result<Downloaded, DownloadError> {
        self.downloads.fetch(download_url).await
    }

    /// The underlying HTTP client, for callers that need a request this type does not offer.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }
}
