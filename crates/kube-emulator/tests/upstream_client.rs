//! Upstream kuryr-kubernetes 10.0.0's own Python K8sClient (requests-based) against the emulator:
//! posts, gets, merge patches with resourceVersion preconditions, JSON patches of KuryrPort status
//! through the main resource, finalizers, Events and its streaming watch.
//!
//! The venv comes from `scripts/upstream-kuryr-venv.sh` (the README test command runs it); without
//! it the test says why it skips.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube_emulator::{KubeEmulator, KubeOptions};

// The workspace's one skip behaviour (a failure under KURYR_TEST_REQUIRE_ALL=1); kube-emulator
// cannot depend on kuryr-testbed, which depends on it.
#[allow(dead_code)]
#[path = "../../kuryr-testbed/src/skip.rs"]
mod skip;

/// The venv's python: `Err` with the path looked at when it is not there.
fn upstream_python() -> Result<PathBuf, PathBuf> {
    let from_env = std::env::var_os("KURYR_TEST_UPSTREAM_PYTHON").map(PathBuf::from);
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.upstream-kuryr/venv/bin/python");
    let python = from_env.unwrap_or(default);
    if python.exists() { Ok(python) } else { Err(python) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_kuryr_k8s_client_works_against_the_emulator() {
    let python = match upstream_python() {
        Ok(python) => python,
        Err(missing) => {
            skip::skip(format!(
                "upstream kuryr venv not found (no {}): run scripts/upstream-kuryr-venv.sh (scripts/test-all.sh \
                 does and exports KURYR_TEST_UPSTREAM_PYTHON)",
                missing.display()
            ));
            return;
        }
    };
    let handle = KubeEmulator::start(KubeOptions::default())
        .await
        .expect("emulator");
    let client = kube::Client::try_from(kube::Config::new(handle.url().parse().unwrap())).unwrap();
    let crd_file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds/kuryrports.openstack.org.yaml");
    let crd: CustomResourceDefinition =
        serde_yaml::from_str(&std::fs::read_to_string(crd_file).unwrap()).unwrap();
    Api::<CustomResourceDefinition>::all(client)
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/k8s_client_check.py");
    let url = handle.url().trim_end_matches('/').to_string();
    let out = tokio::task::spawn_blocking(move || Command::new(python).arg(script).arg(url).output())
        .await
        .unwrap()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "upstream client failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("OK 16 checks"), "{stdout}");
}
