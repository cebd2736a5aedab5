//! The controller Deployment with its PodDisruptionBudget, and the CNI DaemonSet.
//!
//! Both run on the host network: pod networking is what kuryr provides, so its own pods cannot
//! wait for it. Resource requests come from docs/benchmarks.md: the daemon measured 12.1 MiB
//! with 500 pods registered and the CNI plugin 8.4 MiB per ADD; the controller holds one cached
//! object per pod and port, so it gets a few times more.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec, DeploymentStrategy,
    RollingUpdateDaemonSet, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvFromSource, EnvVar, EnvVarSource, HTTPGetAction, HostPathVolumeSource, ObjectFieldSelector,
    PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SecretEnvSource,
    SecretVolumeSource, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kuryr_config::KuryrConfig;

use super::base::{CONFIG_KEY, CONFIG_MAP};
use super::credentials::SECRET;
use super::files::{CLOUDS_YAML, Carried, FILES_DIR, FILES_SECRET};
use super::rbac::{CNI, CONTROLLER};
use super::{Doc, Options, common_labels, config_hash, meta};
use crate::cluster_config::HOST_PROC;

/// Pod template annotation holding [`config_hash`].
pub const CONFIG_HASH_ANNOTATION: &str = "kuryr.openstack.org/config-hash";
const CONF_DIR: &str = "/etc/kuryr";
/// Where the daemon records what it plugged: under the host's /var/run, so it survives restarts.
const STATE_DIR: &str = "/var/run/kuryr/cni-daemon";
const BINARY: &str = "/usr/local/bin/kuryr";

fn conf_file() -> String {
    format!("{CONF_DIR}/{CONFIG_KEY}")
}

fn labels(component: &str) -> BTreeMap<String, String> {
    common_labels(Some(component))
}

fn selector(component: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            component.to_owned(),
        )])),
        ..LabelSelector::default()
    }
}

fn requests(cpu: &str, memory: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])),
        ..ResourceRequirements::default()
    }
}

fn http_probe(path: &str, port: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String(port.to_owned()),
            host: Some("127.0.0.1".to_owned()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(5),
        ..Probe::default()
    }
}

fn port(name: &str, number: u16) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(number),
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_owned(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn config_volume() -> Volume {
    Volume {
        name: "config".to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: CONFIG_MAP.to_owned(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn host_volume(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: path.to_owned(),
            type_: Some(type_.to_owned()),
        }),
        ..Volume::default()
    }
}

fn toleration(key: Option<&str>, effect: Option<&str>) -> Toleration {
    Toleration {
        key: key.map(str::to_owned),
        operator: Some("Exists".to_owned()),
        effect: effect.map(str::to_owned),
        ..Toleration::default()
    }
}

fn template_meta(component: &str, conf_text: &str) -> ObjectMeta {
    ObjectMeta {
        labels: Some(labels(component)),
        annotations: Some(BTreeMap::from([(
            CONFIG_HASH_ANNOTATION.to_owned(),
            config_hash(conf_text),
        )])),
        ..ObjectMeta::default()
    }
}

fn node_selector(opts: &Options) -> Option<BTreeMap<String, String>> {
    (!opts.node_selector.is_empty()).then(|| opts.node_selector.clone())
}

/// The controller Deployment and its PodDisruptionBudget.
/// `credentials`: kuryr.conf's OpenStack credentials are in the [`SECRET`], read as environment
/// variables (a changed Secret takes a rollout restart, as any environment does).
/// `files`: what kuryr.conf names for the OpenStack clients, in the [`FILES_SECRET`] mounted at
/// [`FILES_DIR`] (the clouds.yaml among them found there through `OS_CLIENT_CONFIG_FILE`).
pub fn controller(
    opts: &Options,
    config: &KuryrConfig,
    conf_text: &str,
    credentials: bool,
    files: &Carried,
) -> Vec<Doc> {
    let health = config.health_server.port;
    let metrics = config.prometheus_exporter.controller_exporter_port;
    let mut mounts = vec![mount("config", CONF_DIR, true)];
    let mut volumes = vec![config_volume()];
    let mut env = vec![field_env("POD_NAME", "metadata.name")];
    if !files.is_empty() {
        mounts.push(mount("openstack-files", FILES_DIR, true));
        volumes.push(Volume {
            name: "openstack-files".to_owned(),
            secret: Some(SecretVolumeSource {
                // The default mode (0644): the controller runs as 65534, not the files' owner.
                secret_name: Some(FILES_SECRET.to_owned()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    if files.contains_key(CLOUDS_YAML) {
        env.push(EnvVar {
            name: "OS_CLIENT_CONFIG_FILE".to_owned(),
            value: Some(format!("{FILES_DIR}/{CLOUDS_YAML}")),
            ..EnvVar::default()
        });
    }
    if config.kubernetes.enable_manager
        && let Some(dir) = std::path::Path::new(&config.pool_manager.sock_file).parent()
    {
        // The pool management socket needs a writable directory on a read-only root filesystem.
        mounts.push(mount("manage-socket", &dir.display().to_string(), false));
        volumes.push(Volume {
            name: "manage-socket".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
    }
    let container = Container {
        name: "controller".to_owned(),
        image: Some(opts.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(
            [
                BINARY,
                "controller",
                "--config-file",
                &conf_file(),
                "--identity",
                "$(POD_NAME)",
            ]
            .map(str::to_owned)
            .to_vec(),
        ),
        env: Some(env),
        env_from: credentials.then(|| {
            vec![EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: SECRET.to_owned(),
                    optional: Some(false),
                }),
                ..EnvFromSource::default()
            }]
        }),
        ports: Some(vec![port("health", health), port("metrics", metrics)]),
        readiness_probe: Some(http_probe("/ready", "health", 10, 3)),
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(15),
            ..http_probe("/alive", "health", 10, 3)
        }),
        resources: Some(requests("100m", "128Mi")),
        // The controller only talks to the Kubernetes and OpenStack APIs: no privilege at all.
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65534),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    let deployment = Deployment {
        metadata: ObjectMeta {
            labels: Some(labels(CONTROLLER)),
            ..meta(CONTROLLER, Some(&opts.namespace))
        },
        spec: Some(DeploymentSpec {
            replicas: Some(i32::try_from(opts.replicas).unwrap_or(i32::MAX)),
            selector: selector(CONTROLLER),
            // Host network: two replicas cannot share a node's ports, so no surge; the Lease
            // hands leadership over while one replica is replaced.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(0)),
                    max_unavailable: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                // The carried files too: a renewed certificate rolls the controller, which reads
                // them when it starts.
                metadata: Some(template_meta(CONTROLLER, &with_files(conf_text, files))),
                spec: Some(PodSpec {
                    service_account_name: Some(CONTROLLER.to_owned()),
                    host_network: Some(true),
                    // The node's resolver: cluster DNS runs in pods only kuryr can wire, and the
                    // controller needs Keystone and Neutron by name before any pod has a network.
                    dns_policy: Some("Default".to_owned()),
                    priority_class_name: Some("system-cluster-critical".to_owned()),
                    node_selector: node_selector(opts),
                    // Nodes are NotReady until a CNI works: the controller must start on them.
                    tolerations: Some(vec![
                        toleration(Some("node-role.kubernetes.io/control-plane"), Some("NoSchedule")),
                        toleration(Some("node.kubernetes.io/not-ready"), Some("NoSchedule")),
                    ]),
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            required_during_scheduling_ignored_during_execution: Some(vec![
                                PodAffinityTerm {
                                    label_selector: Some(selector(CONTROLLER)),
                                    topology_key: "kubernetes.io/hostname".to_owned(),
                                    ..PodAffinityTerm::default()
                                },
                            ]),
                            ..PodAntiAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    containers: vec![container],
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    let pdb = PodDisruptionBudget {
        metadata: meta(CONTROLLER, Some(&opts.namespace)),
        spec: Some(PodDisruptionBudgetSpec {
            // One replica may go (a drain proceeds); with two the other keeps wiring pods.
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(selector(CONTROLLER)),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    };
    vec![Doc::new(&deployment), Doc::new(&pdb)]
}

/// `conf_text` followed by each carried file (key and bytes in hex), what the controller's
/// template hash covers.
fn with_files(conf_text: &str, files: &Carried) -> String {
    let mut out = conf_text.to_owned();
    for (key, bytes) in files {
        out.push('\n');
        out.push_str(key);
        out.push('=');
        for b in bytes {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

/// Where the plugin reaches a daemon listening on `bind`, when not at the plugin's built-in
/// address (upstream's 127.0.0.1:5036): a daemon moved to another port is found there (an
/// unspecified address is reached over loopback, as the daemon shares the host's network).
fn daemon_url(bind: std::net::SocketAddr) -> Option<String> {
    let default = std::net::SocketAddr::from(([127, 0, 0, 1], 5036));
    if bind == default {
        return None;
    }
    let ip = match bind.ip() {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => {
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        }
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => {
            std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        }
        ip => ip,
    };
    Some(format!("http://{}", std::net::SocketAddr::new(ip, bind.port())))
}

/// The CNI DaemonSet: `kuryr install-cni` as init container, then the daemon.
pub fn cni_daemonset(opts: &Options, config: &KuryrConfig, conf_text: &str) -> Doc {
    let health = config.cni_health_server.port;
    let metrics = config.prometheus_exporter.cni_exporter_port;
    let mut install = [
        BINARY,
        "install-cni",
        "--bin-dir",
        "/host/opt/cni/bin",
        "--conf-dir",
        "/host/etc/cni/net.d",
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(url) = daemon_url(config.cni_daemon.bind_address) {
        install.extend(["--kuryr-daemon".to_owned(), url]);
    }
    let init = Container {
        name: "install-cni".to_owned(),
        image: Some(opts.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(install),
        // Root to write the host's CNI directories; nothing else.
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                add: Some(vec![
                    "DAC_OVERRIDE".to_owned(),
                    "CHOWN".to_owned(),
                    "FOWNER".to_owned(),
                ]),
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            mount("cni-bin", "/host/opt/cni/bin", false),
            mount("cni-net", "/host/etc/cni/net.d", false),
        ]),
        ..Container::default()
    };
    let mut mounts = vec![
        mount("config", CONF_DIR, true),
        // Pods' network namespaces by PID (docker-style netns paths).
        mount("host-proc", HOST_PROC, true),
        // Named netns (containerd/CRI-O), the OVS database socket and the daemon's state dir;
        // HostToContainer so netns mounted after the daemon started are visible to it.
        VolumeMount {
            mount_propagation: Some("HostToContainer".to_owned()),
            ..mount("host-var-run", "/var/run", false)
        },
    ];
    let mut volumes = vec![
        config_volume(),
        host_volume("host-proc", "/proc", "Directory"),
        host_volume("host-var-run", "/var/run", "Directory"),
        host_volume("cni-bin", "/opt/cni/bin", "DirectoryOrCreate"),
        host_volume("cni-net", "/etc/cni/net.d", "DirectoryOrCreate"),
    ];
    if config.sriov.enable_pod_resource_service {
        // SR-IOV: the kubelet's pod-resources socket says which VF a pod was given.
        let dir = format!(
            "{}/pod-resources",
            config.sriov.kubelet_root_dir.trim_end_matches('/')
        );
        mounts.push(mount("pod-resources", &dir, false));
        volumes.push(host_volume("pod-resources", &dir, "Directory"));
    }
    let daemon = Container {
        name: "kuryr-cni".to_owned(),
        image: Some(opts.image.clone()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(
            [
                BINARY,
                "daemon",
                "--config-file",
                &conf_file(),
                "--state-dir",
                STATE_DIR,
            ]
            .map(str::to_owned)
            .to_vec(),
        ),
        env: Some(vec![field_env("KUBERNETES_NODE_NAME", "spec.nodeName")]),
        ports: Some(vec![port("health", health), port("metrics", metrics)]),
        readiness_probe: Some(http_probe("/ready", "health", 10, 3)),
        liveness_probe: Some(Probe {
            initial_delay_seconds: Some(15),
            ..http_probe("/alive", "health", 10, 3)
        }),
        resources: Some(requests("50m", "64Mi")),
        // Moves interfaces between namespaces, talks netlink and OVS: privileged, as upstream.
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    Doc::new(&DaemonSet {
        metadata: ObjectMeta {
            labels: Some(labels(CNI)),
            ..meta(CNI, Some(&opts.namespace))
        },
        spec: Some(DaemonSetSpec {
            selector: selector(CNI),
            // One node at a time without a daemon; no surge, the old and new pod would share the
            // host's ports.
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_surge: Some(IntOrString::Int(0)),
                    max_unavailable: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(template_meta(CNI, conf_text)),
                spec: Some(PodSpec {
                    service_account_name: Some(CNI.to_owned()),
                    host_network: Some(true),
                    // As the controller's: nothing the daemon reaches is a cluster DNS name.
                    dns_policy: Some("Default".to_owned()),
                    priority_class_name: Some("system-node-critical".to_owned()),
                    node_selector: node_selector(opts),
                    // Every node needs its CNI, whatever its taints.
                    tolerations: Some(vec![toleration(None, None)]),
                    init_containers: Some(vec![init]),
                    containers: vec![daemon],
                    volumes: Some(volumes),
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        ..DaemonSet::default()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unspecified_bind_address_is_reached_over_loopback() {
        let url = |a: &str| super::daemon_url(a.parse().expect("address"));
        assert_eq!(url("127.0.0.1:5036"), None);
        assert_eq!(url("0.0.0.0:5036").as_deref(), Some("http://127.0.0.1:5036"));
        assert_eq!(url("[::]:6000").as_deref(), Some("http://[::1]:6000"));
        assert_eq!(url("10.0.0.5:5036").as_deref(), Some("http://10.0.0.5:5036"));
    }
}
