//! The crate graph keeps the rules ARCHITECTURE.md states: the client machinery every
//! component shares is `kumo-client`, which depends on no component; no crate but the
//! binary depends on the controller-manager; the kubelet knows only the runtime interface
//! (`kumo-cri`), the proxy only its data-plane interface, and neither knows the other or
//! the simulator, which knows neither the kubelet nor the binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;

/// `(package, dependency)` for every normal (not dev or build) kumo dependency.
fn edges() -> Vec<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let mut edges = Vec::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().unwrap_or_default();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default();
            if dep.starts_with("kumo") && d["kind"].is_null() {
                edges.push((name.to_owned(), dep.to_owned()));
            }
        }
    }
    assert!(edges.len() > 10, "{edges:?}");
    edges
}

#[test]
fn only_the_binary_depends_on_the_controller_manager() {
    let users: Vec<_> = edges()
        .into_iter()
        .filter(|(_, d)| d == "kumo-controller-manager")
        .map(|(p, _)| p)
        .collect();
    assert_eq!(users, ["kumo"]);
}

#[test]
fn the_client_machinery_depends_on_no_component() {
    let deps: Vec<_> = edges()
        .into_iter()
        .filter(|(p, _)| p == "kumo-client")
        .map(|(_, d)| d)
        .collect();
    assert!(deps.is_empty(), "{deps:?}");
    for component in [
        "kumo-scheduler",
        "kumo-kubelet",
        "kumo-proxy",
        "kumo-cloud-provider",
        "kumo-controller-manager",
    ] {
        assert!(
            edges().contains(&(component.to_owned(), "kumo-client".to_owned())),
            "{component} uses kumo-client"
        );
    }
}

/// The packages `p` depends on.
fn deps_of(edges: &[(String, String)], p: &str) -> Vec<String> {
    edges
        .iter()
        .filter(|(from, _)| from == p)
        .map(|(_, d)| d.clone())
        .collect()
}

#[test]
fn the_kubelet_and_the_proxy_know_interfaces_not_the_simulator() {
    let edges = edges();
    let deps = |p: &str| deps_of(&edges, p);
    let kubelet = deps("kumo-kubelet");
    assert!(kubelet.contains(&"kumo-cri".to_owned()), "{kubelet:?}");
    for banned in ["kumo-sim", "kumo-proxy"] {
        assert!(!kubelet.contains(&banned.to_owned()), "kubelet -> {banned}");
    }
    let proxy = deps("kumo-proxy");
    for banned in ["kumo-sim", "kumo-kubelet", "kumo-cri"] {
        assert!(!proxy.contains(&banned.to_owned()), "proxy -> {banned}");
    }
    let sim = deps("kumo-sim");
    assert!(sim.contains(&"kumo-cri".to_owned()), "{sim:?}");
    assert!(!sim.contains(&"kumo-kubelet".to_owned()), "{sim:?}");
    assert_eq!(deps("kumo-cri"), Vec::<String>::new());
}

#[test]
fn storage_is_known_through_the_csi_interface_and_the_cloud_only_by_its_driver() {
    let edges = edges();
    let deps = |p: &str| deps_of(&edges, p);
    // The kubelet and the controllers speak CSI through kumo-csi, to any driver.
    for component in ["kumo-kubelet", "kumo-controller-manager"] {
        let d = deps(component);
        assert!(d.contains(&"kumo-csi".to_owned()), "{component}: {d:?}");
        for banned in ["kumo-disk", "kumo-cloud"] {
            assert!(!d.contains(&banned.to_owned()), "{component} -> {banned}");
        }
    }
    // The interface knows no driver and no cloud; the driver is the cloud's.
    let csi = deps("kumo-csi");
    for banned in ["kumo-disk", "kumo-cloud", "kumo-kubelet"] {
        assert!(!csi.contains(&banned.to_owned()), "kumo-csi -> {banned}");
    }
    let disk = deps("kumo-disk");
    assert!(disk.contains(&"kumo-cloud".to_owned()), "{disk:?}");
    assert!(disk.contains(&"kumo-csi".to_owned()), "{disk:?}");
}

#[test]
fn cluster_api_knows_infrastructure_only_through_its_provider() {
    let edges = edges();
    let deps = |p: &str| deps_of(&edges, p);
    // Cluster API's core reaches machines only through contract references: no cloud, no
    // provider, no hypervisor.
    let capi = deps("kumo-capi");
    assert!(capi.contains(&"kumo-client".to_owned()), "{capi:?}");
    for banned in ["kumo-cloud", "kumo-capk", "kumo-sim", "kumo-kubelet"] {
        assert!(!capi.contains(&banned.to_owned()), "kumo-capi -> {banned}");
    }
    // The kumo cloud's provider is the one that talks to the cloud.
    let capk = deps("kumo-capk");
    assert!(capk.contains(&"kumo-cloud".to_owned()), "{capk:?}");
    assert!(capk.contains(&"kumo-capi".to_owned()), "{capk:?}");
    for banned in ["kumo-sim", "kumo-kubelet", "kumo-controller-manager"] {
        assert!(!capk.contains(&banned.to_owned()), "kumo-capk -> {banned}");
    }
}
