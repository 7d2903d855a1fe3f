//! certificatesigningrequest-cleaner-controller (csrcleaner): every hour, deletes the
//! CertificateSigningRequests that have served their purpose — issued, denied or failed an
//! hour ago, pending for a day, or whose certificate has expired.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{condition, has_certificate, SERVICE_ACCOUNT};
use kumo_client::clients::ClientBuilder;
use kumo_client::error::is_not_found;
use kumo_client::informer::{Informer, InformerFactory};
use kumo_client::worker::{client_for, wait_for_sync};

const POLLING_INTERVAL: Duration = Duration::from_secs(3600);
const APPROVED_EXPIRATION: SignedDuration = SignedDuration::from_hours(1);
const DENIED_EXPIRATION: SignedDuration = SignedDuration::from_hours(1);
const PENDING_EXPIRATION: SignedDuration = SignedDuration::from_hours(24);

/// Why `csr` is to be deleted at `now`, if it is.
pub fn expired(csr: &CertificateSigningRequest, now: Timestamp) -> Option<&'static str> {
    let older =
        |t: Option<Timestamp>, d: SignedDuration| t.is_some_and(|t| now.duration_since(t) > d);
    let updated =
        |type_: &str| condition(csr, type_).and_then(|c| c.last_update_time.as_ref().map(|t| t.0));
    if has_certificate(csr) && condition(csr, "Approved").is_some() {
        if older(updated("Approved"), APPROVED_EXPIRATION) {
            return Some(
                "Cleaning CSR as it is more than approvedExpiration duration old and approved.",
            );
        }
        if certificate_expired(csr, now) {
            return Some("Cleaning CSR as the associated certificate is expired.");
        }
    }
    if older(updated("Denied"), DENIED_EXPIRATION) {
        return Some("Cleaning CSR as it is more than deniedExpiration duration old and denied.");
    }
    if older(updated("Failed"), DENIED_EXPIRATION) {
        return Some("Cleaning CSR as it is more than deniedExpiration duration old and failed.");
    }
    let no_conditions = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_none_or(Vec::is_empty);
    let created = csr.metadata.creation_timestamp.as_ref().map(|t| t.0);
    if no_conditions && older(created, PENDING_EXPIRATION) {
        return Some(
            "Cleaning CSR as it is more than pendingExpiration duration old and unhandled.",
        );
    }
    None
}

/// Whether the (first) issued certificate's NotAfter has passed; unreadable ones have not.
fn certificate_expired(csr: &CertificateSigningRequest, now: Timestamp) -> bool {
    let Some(pem) = csr.status.as_ref().and_then(|s| s.certificate.as_ref()) else {
        return false;
    };
    let Ok((_, block)) = x509_parser::pem::parse_x509_pem(&pem.0) else {
        return false;
    };
    let Ok(cert) = block.parse_x509() else {
        return false;
    };
    cert.validity().not_after.timestamp() < now.as_second()
}

/// Returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let csrs: Arc<Informer<CertificateSigningRequest>> = factory.informer();
    tokio::spawn(async move {
        tracing::info!("Starting CSR cleaner controller");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        if !wait_for_sync(&mut stop, csrs.wait_synced()).await {
            return;
        }
        loop {
            let api: Api<CertificateSigningRequest> = Api::all(client.get());
            for csr in csrs.list() {
                let name = csr.metadata.name.clone().unwrap_or_default();
                let Some(why) = expired(&csr, Timestamp::now()) else {
                    continue;
                };
                tracing::info!(csr = %name, "{why}");
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => tracing::error!(csr = %name, error = %e, "unable to delete CSR"),
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(POLLING_INTERVAL) => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        tracing::info!("Shutting down CSR cleaner controller");
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestCondition, CertificateSigningRequestStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn csr(age_h: i64, cond: Option<(&str, i64)>, cert: bool) -> CertificateSigningRequest {
        let now = Timestamp::now();
        let ago = |h: i64| Time(now - SignedDuration::from_hours(h));
        let mut c = CertificateSigningRequest::default();
        c.metadata.creation_timestamp = Some(ago(age_h));
        c.status = Some(CertificateSigningRequestStatus {
            conditions: cond.map(|(t, h)| {
                vec![CertificateSigningRequestCondition {
                    type_: t.into(),
                    status: "True".into(),
                    last_update_time: Some(ago(h)),
                    ..Default::default()
                }]
            }),
            certificate: cert.then(|| k8s_openapi::ByteString(b"not a pem".to_vec())),
        });
        c
    }

    #[test]
    fn what_is_cleaned_and_when() {
        let now = Timestamp::now();
        assert!(expired(&csr(2, Some(("Approved", 2)), true), now).is_some());
        assert!(expired(&csr(2, Some(("Approved", 0)), true), now).is_none());
        // Approved but not issued yet: kept.
        assert!(expired(&csr(2, Some(("Approved", 2)), false), now).is_none());
        assert!(expired(&csr(2, Some(("Denied", 2)), false), now).is_some());
        assert!(expired(&csr(2, Some(("Failed", 2)), false), now).is_some());
        assert!(expired(&csr(25, None, false), now).is_some());
        assert!(expired(&csr(23, None, false), now).is_none());
    }
}
