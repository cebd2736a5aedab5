//! The committed `deploy/crds/` must match what the Rust types generate.

use std::path::PathBuf;

use kuryr_crds::generate;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
}

#[test]
fn committed_crd_yaml_is_up_to_date() -> Result<(), generate::GenerateError> {
    let drift = generate::check_dir(&deploy_dir())?;
    assert!(
        drift.is_clean(),
        "deploy/crds is out of date with the kuryr-crds types:\n{drift}"
    );
    Ok(())
}

#[test]
fn check_detects_stale_missing_and_extra_files() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("kuryr-crds-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let written = generate::write_dir(&dir)?;
    assert_eq!(written.len(), 8);
    assert!(generate::check_dir(&dir)?.is_clean());

    std::fs::write(dir.join("kuryrports.openstack.org.yaml"), "stale")?;
    std::fs::remove_file(dir.join("kuryrnetworks.openstack.org.yaml"))?;
    std::fs::write(dir.join("kuryrnets.openstack.org.yaml"), "old crd")?;
    let drift = generate::check_dir(&dir)?;
    assert_eq!(drift.changed, vec!["kuryrports.openstack.org.yaml"]);
    assert_eq!(drift.missing, vec!["kuryrnetworks.openstack.org.yaml"]);
    assert_eq!(drift.extra, vec!["kuryrnets.openstack.org.yaml"]);
    assert!(drift.to_string().contains(generate::REGENERATE_COMMAND));

    generate::write_dir(&dir)?;
    assert!(generate::check_dir(&dir)?.is_clean());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn crds_match_upstream_names_and_status_subresources() {
    let crds = generate::crds();
    let names: Vec<_> = crds
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.spec.names.short_names.clone().unwrap_or_default(),
                c.spec.scope.clone(),
            )
        })
        .collect();
    let expect = |n: &str, s: &str| (n.to_owned(), vec![s.to_owned()], "Namespaced".to_owned());
    let cluster = |n: &str, s: &str| (n.to_owned(), vec![s.to_owned()], "Cluster".to_owned());
    assert_eq!(
        names,
        vec![
            expect("kuryrports.openstack.org", "kp"),
            expect("kuryrnetworks.openstack.org", "kns"),
            expect("kuryrnetworkpolicies.openstack.org", "knp"),
            expect("kuryrloadbalancers.openstack.org", "klb"),
            expect("kuryrportpools.openstack.org", "kpp"),
            expect("network-attachment-definitions.k8s.cni.cncf.io", "net-attach-def"),
            cluster("kuryropenstackdeployments.openstack.org", "kosd"),
            cluster("kuryrprojectbindings.openstack.org", "kpb"),
        ]
    );
    for crd in &crds {
        let version = &crd.spec.versions[0];
        let has_status = version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some();
        // Only the kuryr-rs kinds have a status subresource: upstream's kinds keep upstream's
        // shape (status written through the main resource), the NAD has no status at all.
        let is_new = matches!(
            crd.spec.names.kind.as_str(),
            "KuryrPortPool" | "KuryrOpenStackDeployment" | "KuryrProjectBinding"
        );
        assert_eq!(has_status, is_new, "{:?}", crd.metadata.name);
    }
}

#[test]
fn free_form_fields_preserve_unknown_fields() -> Result<(), serde_json::Error> {
    let crds = generate::crds();
    let schema = |name: &str| -> serde_json::Value {
        let crd = crds
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no CRD {name}"));
        serde_json::to_value(&crd.spec.versions[0].schema).unwrap_or_default()
    };
    let preserved = |v: &serde_json::Value| v["x-kubernetes-preserve-unknown-fields"] == true;
    let kp = schema("kuryrports.openstack.org");
    assert!(preserved(
        &kp["openAPIV3Schema"]["properties"]["status"]["properties"]["vifs"]
    ));
    let kns = schema("kuryrnetworks.openstack.org");
    let p = &kns["openAPIV3Schema"]["properties"];
    assert!(preserved(&p["spec"]["properties"]["nsLabels"]));
    assert!(preserved(&p["status"]["properties"]["nsLabels"]));
    let knp = schema("kuryrnetworkpolicies.openstack.org");
    let p = &knp["openAPIV3Schema"]["properties"];
    assert!(preserved(&p["spec"]["properties"]["podSelector"]));
    assert!(preserved(&p["status"]["properties"]["podSelector"]));
    Ok(())
}
