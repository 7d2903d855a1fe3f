//! Admission webhooks served by a pod, as the e2e suite deploys them: agnhost's `webhook`
//! server in a Deployment, its TLS certificate from a Secret volume, behind a Service that
//! the webhook configurations name. The API server reaches it through the simulated pod
//! network (never the host's), verifies it with the configuration's caBundle, and the
//! real kubectl sees agnhost's decisions: a refused ConfigMap with agnhost's reason, a
//! mutated one with agnhost's JSON patch applied, and a Deployment's pod refused by name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use base64::Engine;
use kumo::cluster::ClusterConfig;
use kumo_testkit::kubectl::{eventually, get, k, k_in};

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: sample-webhook-deployment
  namespace: hooks
spec:
  replicas: 1
  selector:
    matchLabels: {app: sample-webhook}
  template:
    metadata:
      labels: {app: sample-webhook}
    spec:
      containers:
      - name: sample-webhook
        image: registry.k8s.io/e2e-test-images/agnhost:2.66.1
        args:
        - webhook
        - --tls-cert-file=/webhook.local.config/certificates/tls.crt
        - --tls-private-key-file=/webhook.local.config/certificates/tls.key
        - -v=4
        - --port=8444
        ports:
        - containerPort: 8444
        readinessProbe:
          httpGet: {scheme: HTTPS, port: 8444, path: /readyz}
          periodSeconds: 1
        volumeMounts:
        - {name: webhook-certs, mountPath: /webhook.local.config/certificates, readOnly: true}
      volumes:
      - name: webhook-certs
        secret: {secretName: sample-webhook-secret}
---
apiVersion: v1
kind: Service
metadata:
  name: e2e-test-webhook
  namespace: hooks
spec:
  selector: {app: sample-webhook}
  ports:
  - {port: 8443, targetPort: 8444}
";

fn configurations(ca_bundle: &str) -> String {
    let hook = |name: &str, path: &str, resources: &str, ops: &str| {
        format!(
            "- name: {name}
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  namespaceSelector:
    matchLabels: {{webhook-test: \"yes\"}}
  rules:
  - {{apiGroups: [\"\"], apiVersions: [v1], operations: [{ops}], resources: [{resources}]}}
  clientConfig:
    caBundle: {ca_bundle}
    service: {{namespace: hooks, name: e2e-test-webhook, path: {path}, port: 8443}}
"
        )
    };
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: deny-unwanted
webhooks:
{}{}{}---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutate-configmaps
webhooks:
{}",
        hook(
            "deny-configmaps.kumo.test",
            "/configmaps",
            "configmaps",
            "CREATE, UPDATE"
        ),
        hook("deny-pods.kumo.test", "/pods", "pods", "CREATE, UPDATE"),
        hook(
            "deny-attach.kumo.test",
            "/pods/attach",
            "pods/attach",
            "CONNECT"
        ),
        hook(
            "mutate-configmaps.kumo.test",
            "/mutating-configmaps",
            "configmaps",
            "CREATE, UPDATE"
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn agnhost_webhook_pod_admits_through_its_service() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ClusterConfig::new(dir.path().join("kumo"));
    cfg.port = 0;
    cfg.node_name = "webhook-node".into();
    let cluster = kumo::cluster::start(cfg).await.unwrap();
    let kc = cluster.api.admin_kubeconfig.clone();
    let kc = kc.as_path();
    cluster
        .wait_nodes_ready(&cluster.node_names(), Duration::from_secs(30), |_| {})
        .await
        .unwrap();

    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = kumo_testkit::certs::serving(&certs, "webhook-test-ca", "e2e-test-webhook.hooks.svc")
        .unwrap();
    let ok = |out: kumo_testkit::kubectl::Out| {
        assert!(out.ok, "{}", out.stderr);
        out.stdout
    };
    ok(k(kc, &["create", "namespace", "hooks"]).await);
    let crt = certs.join("tls.crt");
    let key = certs.join("tls.key");
    ok(k(
        kc,
        &[
            "create",
            "secret",
            "generic",
            "sample-webhook-secret",
            "-n",
            "hooks",
            &format!("--from-file=tls.crt={}", crt.display()),
            &format!("--from-file=tls.key={}", key.display()),
        ],
    )
    .await);
    eventually(30, "the default ServiceAccount of hooks", || async {
        get(kc, &["serviceaccount", "default", "-n", "hooks"]).await
    })
    .await;
    ok(k_in(kc, &["apply", "-f", "-"], Some(DEPLOYMENT)).await);
    eventually(60, "a ready endpoint of e2e-test-webhook", || async {
        let slices = get(
            kc,
            &[
                "endpointslices",
                "-n",
                "hooks",
                "-l",
                "kubernetes.io/service-name=e2e-test-webhook",
            ],
        )
        .await?;
        slices["items"]
            .as_array()?
            .iter()
            .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
            .any(|e| e["conditions"]["ready"] == true)
            .then_some(())
    })
    .await;

    let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    ok(k_in(kc, &["apply", "-f", "-"], Some(&configurations(&bundle))).await);
    ok(k(kc, &["create", "namespace", "guarded"]).await);
    ok(k(kc, &["label", "namespace", "guarded", "webhook-test=yes"]).await);
    eventually(30, "the default ServiceAccount of guarded", || async {
        get(kc, &["serviceaccount", "default", "-n", "guarded"]).await
    })
    .await;

    // The validating webhook refuses with agnhost's reason, as upstream words a denial.
    let out = k(
        kc,
        &[
            "create",
            "configmap",
            "unwanted",
            "-n",
            "guarded",
            "--from-literal=webhook-e2e-test=webhook-disallow",
        ],
    )
    .await;
    assert!(!out.ok);
    assert_eq!(
        out.stderr.trim(),
        "error: failed to create configmap: admission webhook \"deny-configmaps.kumo.test\" denied the request: the configmap contains unwanted key and value"
    );
    assert!(get(kc, &["configmap", "unwanted", "-n", "guarded"])
        .await
        .is_none());

    // The mutating webhook's JSON patch is applied before the object is stored.
    ok(k(
        kc,
        &[
            "create",
            "configmap",
            "mutated",
            "-n",
            "guarded",
            "--from-literal=mutation-start=yes",
        ],
    )
    .await);
    let cm = get(kc, &["configmap", "mutated", "-n", "guarded"])
        .await
        .unwrap();
    assert_eq!(cm["data"]["mutation-stage-1"], "yes", "{cm}");

    // A pod with an unwanted container name is refused; outside the labelled namespace
    // nothing is asked.
    let out = k(
        kc,
        &[
            "run",
            "webhook-disallow",
            "-n",
            "guarded",
            "--image=registry.k8s.io/pause:3.10",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "admission webhook \"deny-pods.kumo.test\" denied the request: the pod contains unwanted container name;"
        ),
        "{}",
        out.stderr
    );

    // A CONNECT (kubectl attach) is admitted with its PodAttachOptions: agnhost refuses
    // stdin to container1 of to-be-attached-pod.
    ok(k(
        kc,
        &[
            "run",
            "to-be-attached-pod",
            "-n",
            "guarded",
            "--image=registry.k8s.io/pause:3.10",
            "--overrides={\"spec\":{\"containers\":[{\"name\":\"container1\",\"image\":\"registry.k8s.io/pause:3.10\"}]}}",
        ],
    )
    .await);
    let out = k(
        kc,
        &[
            "attach",
            "-n",
            "guarded",
            "to-be-attached-pod",
            "-i",
            "-c",
            "container1",
        ],
    )
    .await;
    assert!(!out.ok);
    assert!(
        out.stderr.contains(
            "admission webhook \"deny-attach.kumo.test\" denied the request: attaching to pod 'to-be-attached-pod' is not allowed"
        ),
        "{}",
        out.stderr
    );

    ok(k(
        kc,
        &[
            "create",
            "configmap",
            "unguarded",
            "--from-literal=webhook-e2e-test=webhook-disallow",
        ],
    )
    .await);
}
