//! The container runtime interface the kubelet drives, shaped like the CRI (sandboxes,
//! image pulls, containers and their status), and `sim`, a runtime whose containers only
//! behave as told: by default a container runs until it is stopped; pod annotations make
//! it exit, fail or fail to pull, so every path of the pod lifecycle can be exercised on one
//! machine without images.
//!
//! Annotations read by `sim` (per container `<c>`, or for all containers without the
//! `/<c>` suffix):
//! * `sim.kumo.io/exit-after-seconds[/<c>]`: the container exits after that many seconds;
//! * `sim.kumo.io/exit-code[/<c>]`: with that code (0 by default);
//! * `sim.kumo.io/pull[/<c>]: fail`: pulling the image fails (ErrImagePull);
//! * `sim.kumo.io/probe-fail[/<c>]: readiness,liveness,startup`: those probes fail (the
//!   kubelet reads this one: probes are the kubelet's).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// What a container is to run.
#[derive(Clone, Debug, Default)]
pub struct ContainerConfig {
    pub name: String,
    pub image: String,
    /// The pod's annotations (the sim runtime's instructions).
    pub annotations: BTreeMap<String, String>,
}

/// A container's state, as the CRI reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Created,
    Running {
        started_at: SystemTime,
    },
    Exited {
        exit_code: i32,
        started_at: SystemTime,
        finished_at: SystemTime,
    },
}

/// One container's status.
#[derive(Clone, Debug)]
pub struct ContainerStatus {
    pub id: String,
    pub name: String,
    pub image: String,
    pub image_ref: String,
    pub state: State,
}

/// Errors a runtime reports.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("failed to pull and unpack image \"{image}\": {reason}")]
    Pull { image: String, reason: String },
    #[error("no such container {0}")]
    NotFound(String),
}

/// The CRI-shaped runtime interface (a subset: what the kubelet's pod workers use).
pub trait Runtime: Send + Sync {
    /// `(runtime name, runtime version)`, e.g. `("sim", "0.1.0")`.
    fn version(&self) -> (String, String);
    /// Pulls an image; returns its digest reference.
    fn pull_image(
        &self,
        image: &str,
        annotations: &BTreeMap<String, String>,
        container: &str,
    ) -> Result<String, RuntimeError>;
    /// Creates a pod sandbox; returns its id.
    fn run_pod_sandbox(&self, pod_uid: &str) -> String;
    /// Stops and removes a sandbox with every container in it.
    fn remove_pod_sandbox(&self, sandbox: &str);
    fn create_container(&self, sandbox: &str, config: &ContainerConfig, image_ref: &str) -> String;
    fn start_container(&self, id: &str) -> Result<(), RuntimeError>;
    /// Stops a container (SIGTERM, then SIGKILL after `grace`).
    fn stop_container(&self, id: &str, grace: Duration) -> Result<(), RuntimeError>;
    fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError>;
    /// Kills a container at once (SIGKILL: exit code 137), as after a failed liveness probe.
    fn kill_container(&self, id: &str) -> Result<(), RuntimeError>;
}

struct SimContainer {
    status: ContainerStatus,
    sandbox: String,
    exit_after: Option<Duration>,
    exit_code: i32,
}

/// The simulated runtime.
#[derive(Default)]
pub struct Sim {
    containers: Mutex<HashMap<String, SimContainer>>,
}

fn annotation<'a>(a: &'a BTreeMap<String, String>, key: &str, container: &str) -> Option<&'a str> {
    a.get(&format!("{key}/{container}"))
        .or_else(|| a.get(key))
        .map(String::as_str)
}

fn digest(image: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, image.as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let repo = image.split([':', '@']).next().unwrap_or(image);
    let repo = if repo.contains('/') {
        repo.to_owned()
    } else {
        format!("docker.io/library/{repo}")
    };
    format!("{repo}@sha256:{hex}")
}

impl Sim {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SimContainer>> {
        self.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Containers whose time has come exit on their own.
    fn advance(c: &mut SimContainer) {
        if let (State::Running { started_at }, Some(after)) = (&c.status.state, c.exit_after) {
            let ends = *started_at + after;
            if SystemTime::now() >= ends {
                c.status.state = State::Exited {
                    exit_code: c.exit_code,
                    started_at: *started_at,
                    finished_at: ends,
                };
            }
        }
    }
}

impl Runtime for Sim {
    fn version(&self) -> (String, String) {
        ("sim".into(), "0.1.0".into())
    }

    fn pull_image(
        &self,
        image: &str,
        annotations: &BTreeMap<String, String>,
        container: &str,
    ) -> Result<String, RuntimeError> {
        if annotation(annotations, "sim.kumo.io/pull", container) == Some("fail") {
            return Err(RuntimeError::Pull {
                image: image.to_owned(),
                reason: "not found".into(),
            });
        }
        Ok(digest(image))
    }

    fn run_pod_sandbox(&self, pod_uid: &str) -> String {
        format!("sandbox-{pod_uid}")
    }

    fn remove_pod_sandbox(&self, sandbox: &str) {
        self.lock().retain(|_, c| c.sandbox != sandbox);
    }

    fn create_container(&self, sandbox: &str, config: &ContainerConfig, image_ref: &str) -> String {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let a = &config.annotations;
        let exit_after = annotation(a, "sim.kumo.io/exit-after-seconds", &config.name)
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        let exit_code = annotation(a, "sim.kumo.io/exit-code", &config.name)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        self.lock().insert(
            id.clone(),
            SimContainer {
                status: ContainerStatus {
                    id: id.clone(),
                    name: config.name.clone(),
                    image: config.image.clone(),
                    image_ref: image_ref.to_owned(),
                    state: State::Created,
                },
                sandbox: sandbox.to_owned(),
                exit_after,
                exit_code,
            },
        );
        id
    }

    fn start_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        c.status.state = State::Running {
            started_at: SystemTime::now(),
        };
        Ok(())
    }

    fn stop_container(&self, id: &str, _grace: Duration) -> Result<(), RuntimeError> {
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Self::advance(c);
        if let State::Running { started_at } = c.status.state {
            // A simulated process honours SIGTERM at once and exits cleanly.
            c.status.state = State::Exited {
                exit_code: 0,
                started_at,
                finished_at: SystemTime::now(),
            };
        }
        Ok(())
    }

    fn kill_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Self::advance(c);
        if let State::Running { started_at } = c.status.state {
            c.status.state = State::Exited {
                exit_code: 137,
                started_at,
                finished_at: SystemTime::now(),
            };
        }
        Ok(())
    }

    fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let mut all = self.lock();
        let c = all
            .get_mut(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        Self::advance(c);
        Ok(c.status.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_containers_behave_as_annotated() {
        let sim = Sim::default();
        let mut a = BTreeMap::new();
        a.insert(
            "sim.kumo.io/exit-after-seconds/job".to_owned(),
            "0".to_owned(),
        );
        a.insert("sim.kumo.io/exit-code/job".to_owned(), "3".to_owned());
        let sb = sim.run_pod_sandbox("u1");
        let image = sim.pull_image("nginx:1.29", &a, "web").expect("pull");
        assert!(image.starts_with("docker.io/library/nginx@sha256:"));
        let web = sim.create_container(
            &sb,
            &ContainerConfig {
                name: "web".into(),
                image: "nginx".into(),
                annotations: a.clone(),
            },
            &image,
        );
        let job = sim.create_container(
            &sb,
            &ContainerConfig {
                name: "job".into(),
                image: "busybox".into(),
                annotations: a.clone(),
            },
            &image,
        );
        sim.start_container(&web).expect("start");
        sim.start_container(&job).expect("start");
        assert!(matches!(
            sim.container_status(&web).expect("status").state,
            State::Running { .. }
        ));
        assert!(matches!(
            sim.container_status(&job).expect("status").state,
            State::Exited { exit_code: 3, .. }
        ));
        sim.stop_container(&web, Duration::from_secs(30))
            .expect("stop");
        assert!(matches!(
            sim.container_status(&web).expect("status").state,
            State::Exited { exit_code: 0, .. }
        ));
        a.insert("sim.kumo.io/pull".to_owned(), "fail".to_owned());
        assert!(sim.pull_image("nginx", &a, "web").is_err());
        sim.remove_pod_sandbox(&sb);
        assert!(sim.container_status(&web).is_err());
    }
}
