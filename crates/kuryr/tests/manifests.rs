//! `kuryr manifests` as an operator runs it: the committed deploy/manifests must be what the
//! committed deploy/kuryr.conf generates with the default flags.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kuryr(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kuryr"))
        .current_dir(repo())
        .args(args)
        .output()
        .expect("kuryr runs")
}

#[test]
fn committed_manifests_are_up_to_date() {
    let out = kuryr(&[
        "manifests",
        "--config-file",
        "deploy/kuryr.conf",
        "--check",
        "deploy/manifests",
    ]);
    assert!(
        out.status.success(),
        "deploy/manifests is stale: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_stale_copy_fails_the_check_naming_the_file() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let target = dir.path().join("manifests");
    let target_s = target.display().to_string();
    let conf = repo().join("deploy/kuryr.conf").display().to_string();
    let write = kuryr(&["manifests", "--config-file", &conf, "--output-dir", &target_s]);
    assert!(
        write.status.success(),
        "{}",
        String::from_utf8_lossy(&write.stderr)
    );
    std::fs::write(target.join("04-controller.yaml"), "edited by hand\n")?;
    let check = kuryr(&["manifests", "--config-file", &conf, "--check", &target_s]);
    assert!(!check.status.success());
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(stderr.contains("stale: 04-controller.yaml"), "{stderr}");
    Ok(())
}

#[test]
fn printing_without_a_directory_gives_every_document_and_bad_config_names_the_option() -> std::io::Result<()>
{
    let conf = repo().join("deploy/kuryr.conf");
    let out = kuryr(&[
        "manifests",
        "--config-file",
        &conf.display().to_string(),
        "--replicas",
        "1",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("kind: DaemonSet") && stdout.contains("kind: CustomResourceDefinition"));
    assert!(stdout.contains("replicas: 1"));

    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("kuryr.conf");
    let text =
        std::fs::read_to_string(&conf)?.replace("pod_security_groups = CHANGE_ME_SECURITY_GROUP_ID\n", "");
    std::fs::write(&bad, text)?;
    let out = kuryr(&["manifests", "--config-file", &bad.display().to_string()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[neutron_defaults] pod_security_groups"),
        "{stderr}"
    );
    Ok(())
}
