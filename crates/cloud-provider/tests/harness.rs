//! The test harness itself: the CCM starts with its own identity and leads.
mod common;

#[tokio::test(flavor = "multi_thread")]
async fn ccm_starts_with_its_own_identity_and_takes_the_lease() {
    let env = common::start().await;
    let mut cfg = common::ccm_config(&env, &["*"]);
    cfg.leader_elect = true;
    let mut ccm = common::start_ccm_with(&env, cfg).await;
    ccm.wait_leading().await;
    let lease = common::eventually(20, "the cloud-controller-manager lease", || async {
        common::get(
            &env.admin,
            &["-n", "kube-system", "lease", "cloud-controller-manager"],
        )
        .await
    })
    .await;
    assert_eq!(
        lease["spec"]["holderIdentity"].as_str(),
        Some(ccm.identity.as_str())
    );
    ccm.shutdown().await.unwrap();
}
