//! Whether a `kuryr.conf` can work in a cluster, as installed by `kuryr manifests`.
//!
//! The loader already rejects syntax errors and a chosen `auth_type` without its options. These
//! are the rules that only matter once the services run in pods: every deployment needs some
//! credentials at all, each configured driver needs the options it reads, and the config must
//! agree with how the manifests run the services (namespace, HA, `/host_proc`). Each problem names
//! its section and option so that the operator knows what to edit.

use std::fmt;

use kuryr_config::{KuryrConfig, PodSubnetsDriver, PodVifDriver, ProjectDriver, SecurityGroupsDriver};

/// Where the CNI DaemonSet mounts the host's `/proc`.
pub const HOST_PROC: &str = "/host_proc";

/// One option that stops the config from working in a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub section: String,
    pub option: String,
    pub reason: String,
}

impl Problem {
    fn new(section: &str, option: &str, reason: impl Into<String>) -> Self {
        Self {
            section: section.to_owned(),
            option: option.to_owned(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}: {}", self.section, self.option, self.reason)
    }
}

/// How the manifests will run the services; `None` skips the rules about it (`kuryr status`
/// checks a config without knowing the install).
#[derive(Debug, Clone, Default)]
pub struct Install<'a> {
    pub namespace: Option<&'a str>,
    pub controller_replicas: Option<u32>,
}

/// Problems of the OpenStack credentials: a deployment with neither `auth_type` nor `cloud`.
pub fn credential_problems(config: &KuryrConfig) -> Vec<Problem> {
    config
        .deployments()
        .into_iter()
        .filter(|(_, auth)| auth.auth_type.is_none() && auth.cloud.is_none())
        .map(|(name, _)| {
            let section = if name == kuryr_config::DEFAULT_DEPLOYMENT {
                "neutron".to_owned()
            } else {
                format!("{}{name}", kuryr_config::DEPLOYMENT_SECTION_PREFIX)
            };
            Problem::new(
                &section,
                "auth_type",
                "not set: the services have no OpenStack credentials (set auth_type with its options, \
                 or cloud)",
            )
        })
        .collect()
}

/// Options a configured driver reads but that are left empty.
pub fn driver_problems(config: &KuryrConfig) -> Vec<Problem> {
    let k = &config.kubernetes;
    let mut out = Vec::new();
    for (name, _) in config.deployments() {
        let d = config.deployment_defaults(name);
        let section = if name == kuryr_config::DEFAULT_DEPLOYMENT {
            "neutron_defaults".to_owned()
        } else {
            format!("{}{name}", kuryr_config::DEPLOYMENT_SECTION_PREFIX)
        };
        match k.pod_subnets_driver {
            PodSubnetsDriver::Default => {
                if d.pod_subnet.is_none() && config.neutron_defaults.pod_subnets.is_empty() {
                    out.push(Problem::new(
                        &section,
                        "pod_subnet",
                        "empty, but [kubernetes] pod_subnets_driver = default takes the pods' subnet from it",
                    ));
                }
            }
            PodSubnetsDriver::Namespace => {
                let section = if name == kuryr_config::DEFAULT_DEPLOYMENT {
                    "namespace_subnet".to_owned()
                } else {
                    section.clone()
                };
                for (option, set) in [
                    ("pod_subnet_pool", d.pod_subnet_pool.is_some()),
                    ("pod_router", d.pod_router.is_some()),
                ] {
                    if !set {
                        out.push(Problem::new(
                            &section,
                            option,
                            "empty, but [kubernetes] pod_subnets_driver = namespace creates the namespaces' \
                             subnets with it",
                        ));
                    }
                }
            }
        }
        if k.pod_security_groups_driver == SecurityGroupsDriver::Default && d.pod_security_groups.is_empty() {
            out.push(Problem::new(
                &section,
                "pod_security_groups",
                "empty, but [kubernetes] pod_security_groups_driver = default gives pods these groups",
            ));
        }
    }
    let handler = |name: &str| k.enabled_handlers.iter().any(|h| h == name);
    let needing = [
        ("pod_project_driver", k.pod_project_driver, true, "every port"),
        (
            "namespace_project_driver",
            k.namespace_project_driver,
            handler("namespace") || k.pod_subnets_driver == PodSubnetsDriver::Namespace,
            "the namespaces' networks",
        ),
        (
            "service_project_driver",
            k.service_project_driver,
            handler("service"),
            "every load balancer",
        ),
        (
            "network_policy_project_driver",
            k.network_policy_project_driver,
            handler("kuryrnetworkpolicy"),
            "every policy's security groups",
        ),
    ]
    .into_iter()
    .filter(|(_, driver, used, _)| *used && *driver == ProjectDriver::Default)
    .map(|(option, _, _, what)| format!("[kubernetes] {option} = default creates {what} in it"))
    .collect::<Vec<_>>();
    if !needing.is_empty() && config.neutron_defaults.project.is_none() {
        out.push(Problem::new(
            "neutron_defaults",
            "project",
            format!("empty, but {}", needing.join("; ")),
        ));
    }
    if matches!(
        k.pod_vif_driver,
        PodVifDriver::NestedVlan | PodVifDriver::NestedMacvlan
    ) && config.pod_vif_nested.worker_nodes_subnets.is_empty()
        && config.pod_vif_nested.worker_nodes_subnet.is_none()
    {
        out.push(Problem::new(
            "pod_vif_nested",
            "worker_nodes_subnets",
            format!(
                "empty, but [kubernetes] pod_vif_driver = {} finds each node's VM port in these subnets",
                k.pod_vif_driver
            ),
        ));
    }
    out
}

/// Rules tying the config to the manifests: `[kubernetes] controller_namespace` is the install's
/// namespace (the controller's Lease and KuryrPortPools, and the Role granting them, live there),
/// two replicas need the Lease, the daemon finds netns under `/host_proc`.
pub fn install_problems(config: &KuryrConfig, install: &Install<'_>) -> Vec<Problem> {
    let k = &config.kubernetes;
    let mut out = Vec::new();
    if let Some(ns) = install.namespace
        && k.controller_namespace != ns
    {
        out.push(Problem::new(
            "kubernetes",
            "controller_namespace",
            format!(
                "{:?}, but the manifests install into namespace {ns:?} (--namespace): the controller's \
                 Lease, pools and Role must be in the same namespace",
                k.controller_namespace
            ),
        ));
    }
    if let Some(replicas) = install.controller_replicas
        && replicas > 1
        && !k.controller_ha
    {
        out.push(Problem::new(
            "kubernetes",
            "controller_ha",
            format!("False, but --replicas {replicas}: without the Lease every replica would act"),
        ));
    }
    if config.cni_daemon.netns_proc_dir.as_deref() != Some(HOST_PROC) {
        out.push(Problem::new(
            "cni_daemon",
            "netns_proc_dir",
            format!(
                "must be {HOST_PROC}: the daemon runs in a container where the host's /proc is mounted there"
            ),
        ));
    }
    out
}

/// Every problem of `config` for a cluster install.
pub fn problems(config: &KuryrConfig, install: &Install<'_>) -> Vec<Problem> {
    let mut out = credential_problems(config);
    out.extend(driver_problems(config));
    out.extend(install_problems(config, install));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "[kubernetes]\ncontroller_namespace = kuryr\ncontroller_ha = True\n\
        [neutron]\nauth_type = password\nauth_url = https://keystone:5000/v3\nusername = kuryr\npassword = p\n\
    user_domain_name = Default\nproject_name = k8s\nproject_domain_name = Default\n\
        [neutron_defaults]\nproject = p1\npod_subnet = s1\npod_security_groups = sg1\n\
        [cni_daemon]\nnetns_proc_dir = /host_proc\n";

    fn config(ini: &str) -> KuryrConfig {
        match KuryrConfig::from_ini_str(ini) {
            Ok(l) => l.config,
            Err(e) => panic!("test config: {e}"),
        }
    }

    fn install() -> Install<'static> {
        Install {
            namespace: Some("kuryr"),
            controller_replicas: Some(2),
        }
    }

    fn names(problems: &[Problem]) -> Vec<String> {
        problems
            .iter()
            .map(|p| format!("[{}] {}", p.section, p.option))
            .collect()
    }

    #[test]
    fn a_complete_config_has_no_problem() {
        assert_eq!(problems(&config(GOOD), &install()), vec![]);
    }

    #[test]
    fn missing_credentials_name_the_section_of_each_deployment() {
        let ini = GOOD.replace("auth_type = password\n", "") + "[deployment:east]\npod_subnet = s2\n";
        assert_eq!(
            names(&credential_problems(&config(&ini))),
            vec!["[neutron] auth_type", "[deployment:east] auth_type"]
        );
    }

    #[test]
    fn each_driver_names_the_option_it_needs() {
        let ini = GOOD
            .replace("project = p1\n", "")
            .replace("pod_subnet = s1\n", "")
            .replace("pod_security_groups = sg1\n", "")
            .replace("[kubernetes]\n", "[kubernetes]\npod_vif_driver = nested-vlan\n");
        assert_eq!(
            names(&driver_problems(&config(&ini))),
            vec![
                "[neutron_defaults] pod_subnet",
                "[neutron_defaults] pod_security_groups",
                "[neutron_defaults] project",
                "[pod_vif_nested] worker_nodes_subnets",
            ]
        );
        let ns = GOOD.replace("[kubernetes]\n", "[kubernetes]\npod_subnets_driver = namespace\n");
        assert_eq!(
            names(&driver_problems(&config(&ns))),
            vec![
                "[namespace_subnet] pod_subnet_pool",
                "[namespace_subnet] pod_router"
            ]
        );
    }

    #[test]
    fn the_install_must_match_namespace_ha_and_host_proc() {
        let ini = GOOD
            .replace("controller_namespace = kuryr\n", "")
            .replace("controller_ha = True\n", "")
            .replace("netns_proc_dir = /host_proc\n", "");
        assert_eq!(
            names(&install_problems(&config(&ini), &install())),
            vec![
                "[kubernetes] controller_namespace",
                "[kubernetes] controller_ha",
                "[cni_daemon] netns_proc_dir",
            ]
        );
        let one = Install {
            namespace: None,
            controller_replicas: Some(1),
        };
        assert_eq!(
            names(&install_problems(&config(&ini), &one)),
            vec!["[cni_daemon] netns_proc_dir"]
        );
    }
}
