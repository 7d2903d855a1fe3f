//! The object machinery shared by the API server and its clients-to-be: the `Status`
//! errors the API answers with, label and field selectors, the name and label
//! validation rules of k8s.io/apimachinery, with upstream's messages, and the Kubernetes
//! protobuf encoding of the built-in types.

pub mod gojson;
pub mod openapi;
pub mod protobuf;
pub mod quantity;
pub mod query;
pub mod quota;
pub mod selector;
pub mod status;
pub mod storage;
pub mod validation;
pub mod websocket;
pub mod yaml;

/// Timestamps as the API writes them: RFC 3339 in UTC, whole seconds (`metav1.Time`).
pub mod time {
    /// Seconds since the epoch as `2026-12-02T17:05:00Z`; `None` outside years 0000–9999.
    pub fn format_rfc3339(secs: i64) -> Option<String> {
        crate::protobuf::gotime::format_rfc3339(secs, None)
    }

    /// Parses RFC 3339 as Go's `time.Parse(time.RFC3339, ...)`; seconds since the epoch.
    pub fn parse_rfc3339(s: &str) -> Option<i64> {
        crate::protobuf::gotime::parse_rfc3339(s).map(|(secs, _)| secs)
    }

    /// A non-negative duration as Go's `time.ParseDuration` reads it (`5m0s`, `1.5h`,
    /// `300ms`, `0`), for the components' duration flags.
    pub fn parse_go_duration(s: &str) -> Option<std::time::Duration> {
        let ns = crate::protobuf::gotime::parse_duration(s)?;
        u64::try_from(ns).ok().map(std::time::Duration::from_nanos)
    }

    /// Whether Go's `time.ParseDuration` accepts `s` (negative durations included).
    pub fn is_go_duration(s: &str) -> bool {
        crate::protobuf::gotime::parse_duration(s).is_some()
    }

    /// A duration as Go's `time.Duration.String()` prints it (`15.012s`, `1m0s`), as
    /// metav1.Duration fields hold it.
    pub fn format_go_duration(d: std::time::Duration) -> String {
        crate::protobuf::gotime::format_duration(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}
