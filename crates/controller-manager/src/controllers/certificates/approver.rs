//! certificatesigningrequest-approving-controller (csrapproving): approves a kubelet's
//! client certificate request — signer `kubernetes.io/kube-apiserver-client-kubelet`, a
//! well-formed node subject — when a SubjectAccessReview says its requestor may create
//! `certificatesigningrequests/selfnodeclient` (a node renewing its own certificate) or
//! `certificatesigningrequests/nodeclient` (a bootstrap token joining a node). Everything
//! else is left for a person (`kubectl certificate approve`); nothing is ever denied.

use std::sync::Arc;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{condition, has_certificate, parse_request, validate_kubelet_client};
use super::{KUBELET_CLIENT, SERVICE_ACCOUNT};
use kumo_client::clients::{ClientBuilder, ClientSource};
use kumo_client::informer::{Change, Informer, InformerFactory};
use kumo_client::worker::{client_for, run_workers, wait_for_sync, SyncError};

/// One way a request can be approved: the subresource its requestor must be allowed to
/// create, and the condition message.
struct Recognizer {
    subresource: &'static str,
    message: &'static str,
    /// Whether the request's subject is its requestor.
    self_only: bool,
}

const RECOGNIZERS: [Recognizer; 2] = [
    Recognizer {
        subresource: "selfnodeclient",
        message: "Auto approving self kubelet client certificate after SubjectAccessReview.",
        self_only: true,
    },
    Recognizer {
        subresource: "nodeclient",
        message: "Auto approving kubelet client certificate after SubjectAccessReview.",
        self_only: false,
    },
];

fn pending(csr: &CertificateSigningRequest) -> bool {
    !has_certificate(csr)
        && condition(csr, "Approved").is_none()
        && condition(csr, "Denied").is_none()
}

struct Ctl {
    client: ClientSource,
    csrs: Arc<Informer<CertificateSigningRequest>>,
}

/// Registers the handlers and returns the controller task.
pub fn start(
    clients: Arc<ClientBuilder>,
    factory: &InformerFactory,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let queue = factory.queue::<String>("certificate");
    let csrs = factory.informer::<CertificateSigningRequest>();
    let q = queue.clone();
    csrs.add_handler(move |c| match c {
        Change::Added(csr) | Change::Updated { new: csr, .. } => {
            if pending(csr) {
                if let Some(n) = &csr.metadata.name {
                    q.add(n.clone());
                }
            }
        }
        Change::Deleted(_) => {}
    });
    tokio::spawn(async move {
        tracing::info!("Starting certificate controller \"csrapproving\"");
        let Some(client) = client_for(&clients, SERVICE_ACCOUNT, &mut stop).await else {
            return;
        };
        let ctl = Arc::new(Ctl { client, csrs });
        if !wait_for_sync(&mut stop, ctl.csrs.wait_synced()).await {
            return;
        }
        let c = ctl.clone();
        let tasks = run_workers("csrapproving", queue, 5, stop, move |key| {
            let c = c.clone();
            async move { c.sync(&key).await }
        });
        futures::future::join_all(tasks).await;
        tracing::info!("Shutting down certificate controller \"csrapproving\"");
    })
}

impl Ctl {
    async fn sync(&self, name: &str) -> Result<(), SyncError> {
        let Some(csr) = self.csrs.get(name) else {
            return Ok(());
        };
        if !pending(&csr) {
            return Ok(());
        }
        let spec = &csr.spec;
        if spec.signer_name != KUBELET_CLIENT {
            return Ok(());
        }
        // A request that does not parse or is no kubelet client request is not ours.
        let Ok(req) = parse_request(&spec.request.0) else {
            return Ok(());
        };
        if validate_kubelet_client(&req, spec.usages.as_deref().unwrap_or_default()).is_err() {
            return Ok(());
        }
        let requestor = spec.username.as_deref().unwrap_or("");
        let mut tried = Vec::new();
        for r in &RECOGNIZERS {
            if r.self_only && requestor != req.common_name {
                continue;
            }
            tried.push(r.subresource);
            if !self.authorized(&csr, r.subresource).await? {
                continue;
            }
            let mut approved = (*csr).clone();
            let status = approved.status.get_or_insert_with(Default::default);
            status.conditions.get_or_insert_with(Vec::new).push(
                CertificateSigningRequestCondition {
                    type_: "Approved".into(),
                    status: "True".into(),
                    reason: Some("AutoApproved".into()),
                    message: Some(r.message.into()),
                    last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                    ..Default::default()
                },
            );
            let api: Api<CertificateSigningRequest> = Api::all(self.client.get());
            api.replace_subresource("approval", name, &PostParams::default(), &approved)
                .await?;
            tracing::info!(csr = name, "{}", r.message);
            return Ok(());
        }
        Err(SyncError::Failed(format!(
            "recognized csr {name:?} as [{}] but subject access review was not approved",
            tried.join(" ")
        )))
    }

    /// Whether the requestor may create `certificatesigningrequests/<subresource>`.
    async fn authorized(
        &self,
        csr: &CertificateSigningRequest,
        subresource: &str,
    ) -> Result<bool, SyncError> {
        let spec = &csr.spec;
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: spec.username.clone(),
                uid: spec.uid.clone(),
                groups: spec.groups.clone(),
                extra: spec.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("certificates.k8s.io".into()),
                    resource: Some("certificatesigningrequests".into()),
                    verb: Some("create".into()),
                    subresource: Some(subresource.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.get());
        let answer = api.create(&PostParams::default(), &sar).await?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}
