//! Errors: the codes the API answers with, the server's [`ApiError`], and the client's
//! [`Error`].
//!
//! On the wire an error is `{"error":{"code":"...","message":"..."},"requestId":"..."}`
//! with a 4xx or 5xx status; throttling answers carry `Retry-After` (seconds).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The error codes, named as upstream clouds name theirs.
pub mod codes {
    /// 400: the body is not JSON.
    pub const MALFORMED_INPUT: &str = "MalformedInput";
    /// 400: the body has a field the operation does not know.
    pub const UNKNOWN_PARAMETER: &str = "UnknownParameter";
    /// 400: a required field is missing.
    pub const MISSING_PARAMETER: &str = "MissingParameter";
    /// 400: a field has a bad value.
    pub const INVALID_PARAMETER_VALUE: &str = "InvalidParameterValue";
    /// 401: no credentials on the request.
    pub const MISSING_AUTHENTICATION_TOKEN: &str = "MissingAuthenticationToken";
    /// 401: unknown access key or wrong secret.
    pub const AUTH_FAILURE: &str = "AuthFailure";
    /// 403: a deny policy covers the action for the credential.
    pub const ACCESS_DENIED: &str = "AccessDenied";
    /// 404: no such instance.
    pub const INSTANCE_NOT_FOUND: &str = "InvalidInstanceID.NotFound";
    /// 404: no such load balancer.
    pub const LOAD_BALANCER_NOT_FOUND: &str = "LoadBalancerNotFound";
    /// 404: no such route table.
    pub const ROUTE_TABLE_NOT_FOUND: &str = "InvalidRouteTableID.NotFound";
    /// 404: no route with that destination.
    pub const ROUTE_NOT_FOUND: &str = "InvalidRoute.NotFound";
    /// 404: no such subnet.
    pub const SUBNET_NOT_FOUND: &str = "InvalidSubnetID.NotFound";
    /// 404: no such policy statement.
    pub const POLICY_NOT_FOUND: &str = "NoSuchPolicy";
    /// 404: no operation at this path.
    pub const UNKNOWN_OPERATION: &str = "UnknownOperation";
    /// 405: the path exists but not with this method.
    pub const METHOD_NOT_ALLOWED: &str = "MethodNotAllowed";
    /// 409: the instance's state does not allow the operation.
    pub const INCORRECT_INSTANCE_STATE: &str = "IncorrectInstanceState";
    /// 409: a load balancer with that name exists.
    pub const DUPLICATE_LOAD_BALANCER_NAME: &str = "DuplicateLoadBalancerName";
    /// 409: a route with that destination exists.
    pub const ROUTE_ALREADY_EXISTS: &str = "RouteAlreadyExists";
    /// 400: the route's destination overlaps the VPC or another route.
    pub const ROUTE_OVERLAP: &str = "InvalidRoute.Overlap";
    /// 400: a load balancer target is not a usable instance.
    pub const INVALID_TARGET: &str = "InvalidTarget";
    /// 400: the instance quota is used up.
    pub const INSTANCE_LIMIT_EXCEEDED: &str = "InstanceLimitExceeded";
    /// 400: the load-balancer quota is used up.
    pub const LOAD_BALANCER_LIMIT_EXCEEDED: &str = "LoadBalancerLimitExceeded";
    /// 400: the route quota is used up.
    pub const ROUTE_LIMIT_EXCEEDED: &str = "RouteLimitExceeded";
    /// 404: no such volume.
    pub const VOLUME_NOT_FOUND: &str = "InvalidVolume.NotFound";
    /// 409: the volume is attached (to another instance, or at all for a delete).
    pub const VOLUME_IN_USE: &str = "VolumeInUse";
    /// 409: the volume's state does not allow the operation (detaching one not attached).
    pub const INCORRECT_STATE: &str = "IncorrectState";
    /// 400: the volume and the instance are in different zones.
    pub const VOLUME_ZONE_MISMATCH: &str = "InvalidVolume.ZoneMismatch";
    /// 409: a volume of that name exists with another zone or size.
    pub const IDEMPOTENT_PARAMETER_MISMATCH: &str = "IdempotentParameterMismatch";
    /// 400: the volume quota (count or GiB) is used up.
    pub const VOLUME_LIMIT_EXCEEDED: &str = "VolumeLimitExceeded";
    /// 400: the instance has no free device name.
    pub const ATTACHMENT_LIMIT_EXCEEDED: &str = "AttachmentLimitExceeded";
    /// 503: the public or private address pool is empty.
    pub const INSUFFICIENT_ADDRESS_CAPACITY: &str = "InsufficientAddressCapacity";
    /// The private address asked for is taken.
    pub const ADDRESS_IN_USE: &str = "InvalidIPAddress.InUse";
    /// 413: the body is too large.
    pub const REQUEST_TOO_LARGE: &str = "RequestEntityTooLarge";
    /// 503 (injected): try again later.
    pub const SERVICE_UNAVAILABLE: &str = "ServiceUnavailable";
    /// 503 with `Retry-After` (injected): throttled.
    pub const REQUEST_LIMIT_EXCEEDED: &str = "RequestLimitExceeded";
    /// 500.
    pub const INTERNAL_ERROR: &str = "InternalError";
}

/// The error body on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// Code and message.
    pub error: ErrorDetail,
    /// The request's id (also in the `x-kumo-request-id` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Code and message of an error.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// One of [`codes`].
    pub code: String,
    /// What went wrong, for people.
    pub message: String,
}

/// An error the server answers with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// One of [`codes`].
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 InvalidParameterValue.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(400, codes::INVALID_PARAMETER_VALUE, message)
    }

    /// 404 InvalidInstanceID.NotFound.
    pub fn instance_not_found(id: &str) -> ApiError {
        ApiError::new(
            404,
            codes::INSTANCE_NOT_FOUND,
            format!("The instance ID '{id}' does not exist"),
        )
    }

    /// 404 LoadBalancerNotFound.
    pub fn load_balancer_not_found(id: &str) -> ApiError {
        ApiError::new(
            404,
            codes::LOAD_BALANCER_NOT_FOUND,
            format!("The load balancer '{id}' does not exist"),
        )
    }

    /// 404 InvalidVolume.NotFound.
    pub fn volume_not_found(id: &str) -> ApiError {
        ApiError::new(
            404,
            codes::VOLUME_NOT_FOUND,
            format!("The volume '{id}' does not exist."),
        )
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, codes::INTERNAL_ERROR, message)
    }
}

/// An error of the [`Client`](crate::Client).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud answered with an error.
    #[error("{code}: {message} (HTTP {status}, request {})", request_id.as_deref().unwrap_or("-"))]
    Api {
        /// HTTP status.
        status: u16,
        /// The cloud's code (see [`codes`]).
        code: String,
        /// The cloud's message.
        message: String,
        /// The request id.
        request_id: Option<String>,
        /// From `Retry-After`, on throttling.
        retry_after: Option<Duration>,
    },
    /// Connecting, TLS or HTTP failed; the operation may or may not have happened.
    #[error("cloud transport: {0}")]
    Transport(String),
    /// No answer in time (or a waited-for state was not reached in time).
    #[error("cloud timeout: {0}")]
    Timeout(String),
    /// The answer was not what the API describes.
    #[error("cloud answer: {0}")]
    Decode(String),
    /// The client's configuration (endpoint, credentials, CA) is unusable.
    #[error("cloud client configuration: {0}")]
    Config(String),
}

impl Error {
    /// The cloud's error code, for [`Error::Api`].
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The cloud's message, for [`Error::Api`].
    pub fn message(&self) -> Option<&str> {
        match self {
            Error::Api { message, .. } => Some(message),
            _ => None,
        }
    }

    /// The HTTP status, for [`Error::Api`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the resource does not exist (any 404 answer).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// How long the cloud asked to wait: `Retry-After` on throttling, none otherwise.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether retrying later may succeed (5xx, throttling, transport failures).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Api { status, .. } => *status >= 500 || *status == 429,
            Error::Transport(_) | Error::Timeout(_) => true,
            _ => false,
        }
    }
}
