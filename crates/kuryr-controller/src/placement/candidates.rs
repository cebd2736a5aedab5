//! The scheduler's candidates from `kuryr.conf` (credentials, defaults) and the
//! `KuryrOpenStackDeployment` objects (the operator's live settings). Pure.

use kube::ResourceExt;
use kuryr_config::KuryrConfig;
use kuryr_crds::KuryrOpenStackDeployment;

use super::{Candidate, UsageFigure};

/// A deployment object the configuration cannot serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unconfigured {
    pub object: String,
    pub message: String,
}

/// One candidate per `kuryr.conf` deployment, overlaid with its object when there is one (the
/// object's fields win; unset fields keep the configuration's). Objects without a deployment in
/// `kuryr.conf` have no credentials: they are no candidate and are reported.
pub fn build(
    config: &KuryrConfig,
    objects: &[KuryrOpenStackDeployment],
) -> (Vec<Candidate>, Vec<Unconfigured>) {
    let pb = &config.pod_binding;
    let cands = config
        .deployments()
        .into_iter()
        .enumerate()
        .map(|(order, (name, s))| {
            let mut c = Candidate {
                name: name.to_string(),
                order: i64::try_from(order).unwrap_or(i64::MAX),
                availability_zone: s.availability_zone.clone(),
                resource_affinity: s.resource_affinity.clone(),
                maintenance: !s.binding_enabled,
                move_existing: false,
                threshold: pb.usage_threshold,
                hysteresis: pb.usage_hysteresis,
                usage: UsageFigure::Unmeasured,
                project_usage: Default::default(),
                project_ids: s.project_ids.clone(),
            };
            if let Some(o) = objects.iter().find(|o| o.name_any() == name) {
                let spec = &o.spec;
                if spec.availability_zone.is_some() {
                    c.availability_zone = spec.availability_zone.clone();
                }
                if !spec.resource_affinity.is_empty() {
                    c.resource_affinity = spec.resource_affinity.clone();
                }
                if let Some(w) = spec.weight {
                    c.order = w;
                }
                if let Some(t) = spec.usage_threshold {
                    c.threshold = t;
                }
                if let Some(h) = spec.headroom {
                    c.hysteresis = h;
                }
                if let Some(m) = &spec.maintenance {
                    c.maintenance = m.enabled;
                }
                c.move_existing = spec.move_existing;
                c.project_ids.extend(spec.project_ids.clone());
            }
            c
        })
        .collect();
    let names: Vec<&str> = config.deployments().into_iter().map(|(n, _)| n).collect();
    let problems = objects
        .iter()
        .filter(|o| !names.contains(&o.name_any().as_str()))
        .map(|o| Unconfigured {
            object: o.name_any(),
            message: format!(
                "kuryr.conf has no [deployment:{}] section: no credentials for this deployment, so no \
                 project is bound to it",
                o.name_any()
            ),
        })
        .collect();
    (cands, problems)
}

#[cfg(test)]
mod tests {
    use kuryr_crds::{KuryrOpenStackDeploymentSpec, Maintenance};

    use super::*;

    fn config() -> KuryrConfig {
        KuryrConfig::from_ini_str(
            "[neutron]\nauth_type = noauth\nendpoint_override = http://a\navailability_zone = az1\n\
             [deployment:west]\nauth_type = noauth\nendpoint_override = http://b\nproject_ids = p1:w1\n",
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .config
    }

    #[test]
    fn objects_override_the_configuration_and_unknown_objects_are_reported() {
        let mut west = KuryrOpenStackDeployment::new(
            "west",
            KuryrOpenStackDeploymentSpec {
                weight: Some(-5),
                usage_threshold: Some(0.5),
                maintenance: Some(Maintenance {
                    enabled: true,
                    reason: Some("upgrade".into()),
                    until: None,
                }),
                move_existing: true,
                ..Default::default()
            },
        );
        west.spec.project_ids.insert("p2".into(), "w2".into());
        let ghost = KuryrOpenStackDeployment::new("ghost", KuryrOpenStackDeploymentSpec::default());
        let (c, problems) = build(&config(), &[west, ghost]);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].name.as_str(), c[0].order, c[0].maintenance),
            ("default", 0, false)
        );
        assert_eq!(c[0].availability_zone.as_deref(), Some("az1"));
        assert_eq!(
            (c[1].order, c[1].threshold, c[1].maintenance, c[1].move_existing),
            (-5, 0.5, true, true)
        );
        assert_eq!(
            (
                c[1].project_id("p1"),
                c[1].project_id("p2"),
                c[1].project_id("p3")
            ),
            ("w1", "w2", "p3")
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].object, "ghost");
        assert!(
            problems[0].message.contains("[deployment:ghost]"),
            "{}",
            problems[0].message
        );
    }
}
