//! Flags of admission control: how many requests and content streams run at once, in total and per
//! user, how long one past a bound waits before 429, and when a stalled download is cut.

use std::time::Duration;

use crate::apiserver::fairness::FairnessLimits;

#[derive(Clone, Debug, clap::Args)]
pub struct AdmissionOptions {
    /// Read-only requests (get, list, watch while it starts) served at once, all users together.
    #[arg(long, default_value_t = FairnessLimits::default().max_read_only)]
    pub max_requests_inflight: usize,
    /// Mutating requests (create, update, patch, delete) served at once, all users together.
    #[arg(long, default_value_t = FairnessLimits::default().max_mutating)]
    pub max_mutating_requests_inflight: usize,
    /// Read-only plus mutating requests of one user served at once.
    #[arg(long, default_value_t = FairnessLimits::default().max_per_user)]
    pub max_requests_inflight_per_user: usize,
    /// Content downloads and uploads streaming at once, all users together.
    #[arg(long, default_value_t = FairnessLimits::default().max_content_streams)]
    pub max_content_streams: usize,
    /// Content downloads and uploads of one user streaming at once.
    #[arg(long, default_value_t = FairnessLimits::default().max_content_streams_per_user)]
    pub max_content_streams_per_user: usize,
    /// How long a request past one of these bounds waits for a turn before it gets 429.
    #[arg(long, default_value = "2s", value_parser = super::parse_duration)]
    pub request_queue_wait: Duration,
    /// A download whose client takes no bytes for this long is cut (watches are not cut while
    /// they have nothing to send).
    #[arg(long, default_value = "60s", value_parser = super::parse_duration)]
    pub stream_stall_timeout: Duration,
}

impl AdmissionOptions {
    pub fn limits(&self) -> FairnessLimits {
        FairnessLimits {
            max_read_only: self.max_requests_inflight,
            max_mutating: self.max_mutating_requests_inflight,
            max_per_user: self.max_requests_inflight_per_user,
            max_content_streams: self.max_content_streams,
            max_content_streams_per_user: self.max_content_streams_per_user,
            queue_wait: self.request_queue_wait,
        }
    }
}
