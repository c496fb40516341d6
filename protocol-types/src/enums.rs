//! Named wire values. Each has an `Other` fallback so that reading a newer peer never fails.

open_enum! {
    /// Kind of target system a Connector bridges (`supports.target_types`, `connection.target_type`).
    TargetType {
        /// Instant messaging.
        Im = "im",
        /// Email.
        Email = "email",
        /// Calendars.
        Calendar = "calendar",
        /// Ticket systems.
        Ticket = "ticket",
        /// Observable or controllable devices.
        Device = "device",
    }
}

open_enum! {
    /// `supports.user_channel_mode`: how many channels one user may open (xAgent-side limit).
    UserChannelMode {
        /// One channel per user; also what an omitted field means.
        Single = "single",
        /// Several channels per user.
        Multiple = "multiple",
    }
}

open_enum! {
    /// `auth_flows[].type`.
    AuthFlowType {
        /// Scan a QR code with the target app.
        QrLogin = "qr_login",
        /// Fill in a form of declared fields.
        Form = "form",
    }
}

open_enum! {
    /// `auth_flows[].fields[].input_type`.
    InputType {
        /// Plain text input.
        Text = "text",
        /// Masked input; the field should also be `secret`.
        Password = "password",
    }
}

open_enum! {
    /// `security.trust_level`.
    TrustLevel {
        /// Not known.
        Unknown = "unknown",
        /// Shipped with xAgent.
        Builtin = "builtin",
        /// Reviewed third party.
        Verified = "verified",
        /// Unreviewed third party.
        ThirdParty = "third_party",
        /// Runs on the user's machine.
        Local = "local",
    }
}

open_enum! {
    /// `connection.status` of a Descriptor.
    ConnectionStatus {
        /// Channel created, not authenticated.
        Created = "created",
        /// Authentication or binding in progress.
        Authenticating = "authenticating",
        /// Bound, online and available.
        Connected = "connected",
        /// Bound, some capabilities degraded.
        Degraded = "degraded",
        /// Bound, but the target or the Connector is offline (still signed in).
        Offline = "offline",
        /// Authentication material expired.
        Expired = "expired",
        /// Authorization revoked.
        Revoked = "revoked",
        /// Unclassified error (still signed in).
        Error = "error",
    }
}

open_enum! {
    /// `tools[].status` of a Descriptor.
    ToolStatus {
        /// Callable now.
        Available = "available",
        /// Not callable now.
        Unavailable = "unavailable",
        /// The target system denies it.
        DeniedByTarget = "denied_by_target",
        /// The user must authenticate again.
        RequiresReauth = "requires_reauth",
        /// Not supported for this binding.
        NotSupported = "not_supported",
    }
}

open_enum! {
    /// `tools[].target_permission_state` of a Descriptor.
    PermissionState {
        /// Not known.
        Unknown = "unknown",
        /// Granted by the target.
        Granted = "granted",
        /// Denied by the target.
        Denied = "denied",
        /// Needs a new authentication.
        RequiresReauth = "requires_reauth",
    }
}

open_enum! {
    /// `status` of `auth.start.ack` / `auth.status.ack`, and `auth_status` of `auth.cancel.ack`.
    AuthStatus {
        /// Waiting for the user.
        Pending = "pending",
        /// QR code scanned, waiting for confirmation.
        Scanned = "scanned",
        /// Done; a Descriptor accompanies it.
        Authenticated = "authenticated",
        /// Not signed in (status polls and cancels only).
        Unauthenticated = "unauthenticated",
        /// The session expired.
        Expired = "expired",
        /// The QR code must be refreshed (`auth.status` with `refresh: true`).
        QrRefreshRequired = "qr_refresh_required",
        /// Failed.
        Failed = "failed",
    }
}

impl AuthStatus {
    /// True for states after which the session cannot progress by itself.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Authenticated | Self::Expired | Self::Failed | Self::Unauthenticated)
    }
}

open_enum! {
    /// `status` of `auth.cancel.ack`.
    CancelStatus {
        /// The session was canceled.
        Canceled = "canceled",
        /// Nothing to cancel (e.g. already authenticated).
        Ignored = "ignored",
        /// No such session.
        NotFound = "not_found",
    }
}

open_enum! {
    /// `status` of `channel.close.ack` and `auth.logout.ack`.
    OkStatus {
        /// Done.
        Ok = "ok",
    }
}

open_enum! {
    /// `files[].type` of an IM message.
    FileType {
        /// An image.
        Image = "image",
        /// A video.
        Video = "video",
        /// An audio clip.
        Audio = "audio",
        /// Any other file.
        File = "file",
    }
}

impl FileType {
    /// Picks a file type from a MIME type (`image/*`, `video/*`, `audio/*`, else `file`).
    pub fn from_mime(mime: &str) -> Self {
        match mime.split('/').next().unwrap_or_default() {
            "image" => Self::Image,
            "video" => Self::Video,
            "audio" => Self::Audio,
            _ => Self::File,
        }
    }
}

open_enum! {
    /// `status` of `chat.activity` (IM v2).
    ActivityStatus {
        /// The agent is thinking.
        Thinking = "thinking",
        /// The agent is running a Tool (`tool_name` says which).
        Tool = "tool",
        /// Nothing in progress; clears the indicator.
        Idle = "idle",
    }
}

open_enum! {
    /// `status` of `chat.message.ack` (IM v2).
    AckStatus {
        /// Accepted for the first time.
        Accepted = "accepted",
        /// Already accepted earlier; not processed again.
        Duplicate = "duplicate",
        /// Rejected; `code` and `retryable` say why and whether to retry.
        Rejected = "rejected",
    }
}

impl AckStatus {
    /// `accepted` and `duplicate` both end the sender's responsibility.
    pub fn is_delivered(&self) -> bool {
        matches!(self, Self::Accepted | Self::Duplicate)
    }
}
