//! The scheduler's candidates from `kuryr.conf` (credentials, defaults) and the
//! `KuryrOpenStackDeployment` objects (the operator's live settings). Pure.

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kuryr_config::KuryrConfig;
use kuryr_crds::{KuryrOpenStackDeployment, Maintenance};

use super::{Candidate, UsageFigure};

/// A deployment object the configuration cannot serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unconfigured {
    pub object: String,
    pub message: String,
}

/// Whether maintenance `m` holds at `now`: enabled and, with an `until`, before it. An `until`
/// that does not parse keeps the maintenance on (the safe reading); [`spec_problems`] names it.
pub fn in_maintenance(m: &Maintenance, now: Timestamp) -> bool {
    m.enabled
        && m.until
            .as_deref()
            .is_none_or(|u| u.parse::<Timestamp>().map_or(true, |end| now < end))
}

/// The next time an object's maintenance window ends by itself: the candidates must be built
/// again then, with no event to say so.
pub fn next_change(objects: &[KuryrOpenStackDeployment], now: Timestamp) -> Option<Timestamp> {
    objects
        .iter()
        .filter_map(|o| o.spec.maintenance.as_ref())
        .filter(|m| m.enabled)
        .filter_map(|m| m.until.as_deref()?.parse::<Timestamp>().ok())
        .filter(|end| *end > now)
        .min()
}

/// What in an object's spec cannot be followed as written and its schema cannot refuse, each
/// naming the field: `threshold` and `hysteresis` are the configuration's defaults for the fields
/// the object leaves unset.
pub fn spec_problems(obj: &KuryrOpenStackDeployment, threshold: f64, hysteresis: f64) -> Vec<String> {
    let spec = &obj.spec;
    let mut out = Vec::new();
    for key in spec.resource_affinity.keys() {
        // A namespace asks with `key=value,...`: a key with `,` or `=` or blanks around could never
        // be asked for, so the deployment would silently match nothing.
        if key.is_empty() || key.trim() != key || key.contains([',', '=']) {
            out.push(format!(
                "spec.resourceAffinity: key {:?} can never be asked for by a namespace annotation \
                 (non-empty, no ',' or '=', no blanks around)",
                key.chars().take(64).collect::<String>()
            ));
        }
    }
    let t = spec.usage_threshold.unwrap_or(threshold);
    let h = spec.headroom.unwrap_or(hysteresis);
    if h >= t {
        out.push(format!(
            "spec.headroom: {h} is not below the usage threshold {t}, so no new binding would ever be \
             admitted (new bindings need usage below threshold - headroom)"
        ));
    }
    if let Some(u) = spec.maintenance.as_ref().and_then(|m| m.until.as_deref())
        && let Err(e) = u.parse::<Timestamp>()
    {
        out.push(format!(
            "spec.maintenance.until: {u:?} is not an RFC 3339 time ({e}); the maintenance stays on \
             until spec.maintenance.enabled is set false"
        ));
    }
    out
}

/// One candidate per `kuryr.conf` deployment, overlaid with its object when there is one (the
/// object's fields win; unset fields keep the configuration's), maintenance as it holds at `now`.
/// Objects without a deployment in `kuryr.conf` have no credentials: they are no candidate and
/// are reported.
pub fn build(
    config: &KuryrConfig,
    objects: &[KuryrOpenStackDeployment],
    now: Timestamp,
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
                pending: 0.0,
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
                    c.maintenance = in_maintenance(m, now);
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
        let (c, problems) = build(&config(), &[west, ghost], Timestamp::now());
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

    fn with_maintenance(until: Option<&str>) -> KuryrOpenStackDeployment {
        KuryrOpenStackDeployment::new(
            "west",
            KuryrOpenStackDeploymentSpec {
                maintenance: Some(Maintenance {
                    enabled: true,
                    reason: None,
                    until: until.map(str::to_string),
                }),
                ..Default::default()
            },
        )
    }

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap_or_else(|e| panic!("{t}: {e}"))
    }

    #[test]
    fn maintenance_ends_at_its_until_and_the_next_end_is_known() {
        let window = with_maintenance(Some("2026-11-27T12:00:00Z"));
        let open_ended = with_maintenance(None);
        let before = at("2026-11-27T11:59:59Z");
        let after = at("2026-11-27T12:00:00Z");
        let m = |o: &KuryrOpenStackDeployment| o.spec.maintenance.clone().unwrap_or_default();
        assert!(in_maintenance(&m(&window), before));
        assert!(!in_maintenance(&m(&window), after), "ends at until");
        assert!(in_maintenance(&m(&open_ended), after));
        let (c, _) = build(&config(), std::slice::from_ref(&window), before);
        assert!(c[1].maintenance);
        let (c, _) = build(&config(), std::slice::from_ref(&window), after);
        assert!(!c[1].maintenance, "a candidate again once the window ended");
        assert_eq!(
            next_change(&[window.clone(), open_ended.clone()], before),
            Some(after)
        );
        assert_eq!(
            next_change(&[window, open_ended], after),
            None,
            "nothing left to wait for"
        );
        // Unparseable: stays on (the safe reading), and the problem names the field.
        let bad = with_maintenance(Some("2026-13-01T00:00:00Z"));
        assert!(in_maintenance(&m(&bad), after));
        let problems = spec_problems(&bad, 0.9, 0.05);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("spec.maintenance.until"), "{problems:?}");
    }

    #[test]
    fn spec_problems_name_affinity_keys_and_headroom_the_schema_cannot_refuse() {
        let mut o = KuryrOpenStackDeployment::new("west", KuryrOpenStackDeploymentSpec::default());
        assert!(spec_problems(&o, 0.9, 0.05).is_empty());
        o.spec.resource_affinity.insert("a,b".into(), "x".into());
        o.spec.resource_affinity.insert(" pad".into(), "x".into());
        o.spec.resource_affinity.insert("resource".into(), "cad".into());
        o.spec.headroom = Some(0.5);
        o.spec.usage_threshold = Some(0.5);
        let problems = spec_problems(&o, 0.9, 0.05);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert_eq!(
            problems
                .iter()
                .filter(|p| p.starts_with("spec.resourceAffinity: key"))
                .count(),
            2
        );
        assert!(problems[2].starts_with("spec.headroom: 0.5"), "{problems:?}");
        // The configuration's defaults count for unset fields.
        let mut o = KuryrOpenStackDeployment::new("west", KuryrOpenStackDeploymentSpec::default());
        o.spec.headroom = Some(0.95);
        assert_eq!(spec_problems(&o, 0.9, 0.05).len(), 1);
    }
}
