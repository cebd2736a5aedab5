//! `kuryr deployments` (list, maintenance) and `kuryr bindings` (list, show, history, pin, unpin,
//! move), also as `kubectl kuryr ...`: the operator's side of placement, through the Kubernetes API
//! only (the controller follows the objects with watches).

use std::sync::Arc;

use anyhow::Context as _;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use kuryr_controller::placement::kube_store::{self, KubeStore};
use kuryr_controller::placement::store::BindingStore;
use kuryr_controller::placement::{BindingKey, Group, parse_affinity, parse_zone};
use kuryr_crds::events::{Events, Reporter};
use kuryr_crds::{KuryrOpenStackDeployment, KuryrProjectBinding};
use serde_json::{Value, json};

use super::views::{self, Table, s};
use crate::cli::{BindingSelector, BindingsAction, DeploymentsAction, OutputFormat};

/// One row per deployment: zone, maintenance (as the controller follows it now) and until when,
/// usage fraction, the age of that figure at `now`, stale.
pub fn deployments_table(objects: &[Value], now: Timestamp) -> Table {
    let mut t = Table {
        header: vec![
            "NAME",
            "ZONE",
            "MAINTENANCE",
            "UNTIL",
            "MOVE",
            "USAGE",
            "AGE",
            "STALE",
        ],
        wide_header: vec!["REASON", "CONFIGURED", "VALID", "MEASURED", "THRESHOLD"],
        rows: Vec::new(),
    };
    let flag = |o: &Value, path: &str| {
        o.pointer(path)
            .and_then(Value::as_bool)
            .unwrap_or(false)
            .to_string()
    };
    for o in objects {
        let condition = |type_: &str| {
            o.pointer("/status/conditions")
                .and_then(Value::as_array)
                .and_then(|c| {
                    c.iter()
                        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
                })
                .map(|c| s(c.get("status")))
                .unwrap_or_else(|| "<unknown>".into())
        };
        let age = o
            .pointer("/status/measuredAt")
            .and_then(Value::as_str)
            .and_then(|m| m.parse::<Timestamp>().ok())
            .map_or_else(
                || "<none>".to_owned(),
                |m| views::age(now.duration_since(m).as_secs()),
            );
        t.rows.push((
            vec![
                s(o.pointer("/metadata/name")),
                s(o.pointer("/spec/availabilityZone")),
                flag(o, "/status/inMaintenance"),
                s(o.pointer("/spec/maintenance/until")),
                flag(o, "/spec/moveExisting"),
                s(o.pointer("/status/usage/fraction")),
                age,
                flag(o, "/status/stale"),
            ],
            vec![
                s(o.pointer("/spec/maintenance/reason")),
                condition("Configured"),
                condition("Valid"),
                s(o.pointer("/status/measuredAt")),
                // The one decided with (kuryr.conf's when the spec states none).
                s(o.pointer("/status/usageThreshold")
                    .or_else(|| o.pointer("/spec/usageThreshold"))),
            ],
        ));
    }
    t
}

/// `--until`: an RFC 3339 time as given, or a duration from `now` (`90m`, `2h`, `1d`, `30s`);
/// either must be in the future (a window already over puts nothing into maintenance).
pub fn until_time(raw: &str, now: Timestamp) -> anyhow::Result<String> {
    let end = until_end(raw, now)?;
    if end <= now {
        anyhow::bail!(
            "--until {raw:?}: {end} is not in the future (now {now}): the window would be over already"
        );
    }
    Ok(end.to_string())
}

fn until_end(raw: &str, now: Timestamp) -> anyhow::Result<Timestamp> {
    if let Ok(t) = raw.parse::<Timestamp>() {
        return Ok(t);
    }
    let bad = || anyhow::anyhow!("--until {raw:?}: not an RFC 3339 time nor a duration like 90m, 2h or 1d");
    let (n, unit) = raw.split_at(raw.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?);
    let n: i64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3_600),
        "d" => n.saturating_mul(86_400),
        _ => return Err(bad()),
    };
    now.checked_add(SignedDuration::from_secs(secs))
        .map_err(|_| bad())
}

/// Why `target` cannot take the binding `k`: the controller would move it straight back
/// (unpinned), or wire the namespaces somewhere they did not ask for (pinned).
fn move_refusal(target: &KuryrOpenStackDeployment, k: &BindingKey, now: Timestamp) -> Option<String> {
    let to = target.name_any();
    if let Some(why) = unconfigured(target) {
        return Some(format!(
            "--to {to}: the controller has no kuryr.conf section for it ({why})"
        ));
    }
    // The spec as the controller reads it (the status follows it only while a controller runs).
    let by_spec = target
        .spec
        .maintenance
        .as_ref()
        .is_some_and(|m| kuryr_controller::placement::candidates::in_maintenance(m, now));
    if by_spec || target.status.as_ref().is_some_and(|s| s.in_maintenance) {
        return Some(format!(
            "--to {to}: it is in maintenance and takes no binding; take it out first (kuryr deployments maintenance {to} off)"
        ));
    }
    if let (Some(want), Some(has)) = (&k.group.availability_zone, &target.spec.availability_zone)
        && want != has
    {
        return Some(format!(
            "--to {to}: its availability zone is {has}, the binding's namespaces ask for {want} (--zone)"
        ));
    }
    // A fresh figure at the threshold the controller decides with: its next decision moves the
    // binding off again. The spec's when it states one (an edit not followed yet included), else
    // kuryr.conf's as the controller publishes it for the spec it follows.
    let threshold = target.spec.usage_threshold.or_else(|| {
        target
            .status
            .as_ref()
            .filter(|s| s.observed_generation == target.metadata.generation)
            .and_then(|s| s.usage_threshold)
    });
    let fraction = target
        .status
        .as_ref()
        .filter(|s| !s.stale)
        .and_then(|s| s.usage.as_ref())
        .and_then(|u| u.get("fraction"))
        .and_then(|f| {
            f.as_str()
                .and_then(|f| f.parse::<f64>().ok())
                .or_else(|| f.as_f64())
        });
    if let (Some(used), Some(threshold)) = (fraction, threshold)
        && used >= threshold
    {
        return Some(format!(
            "--to {to}: its usage {used:.3} is at its usageThreshold {threshold:.3}: the controller would move \
             the binding off again"
        ));
    }
    // An object stating an affinity is followed as it stands (kuryr.conf's only when it states
    // none): each pair the binding asks for must be in it.
    let has = &target.spec.resource_affinity;
    if !has.is_empty() {
        for (key, want) in &k.group.resource_affinity {
            if has.get(key) != Some(want) {
                let stated = has
                    .get(key)
                    .map_or_else(|| format!("has no {key}"), |v| format!("is {key}={v}"));
                return Some(format!(
                    "--to {to}: its resource affinity {stated}, the binding's namespaces ask for {key}={want} (--affinity)"
                ));
            }
        }
    }
    None
}

fn key(b: &BindingSelector) -> anyhow::Result<BindingKey> {
    // The parsers name the namespace annotations they read for the controller; here the flag.
    let flag = |name: &str, e: kuryr_controller::Error| match e {
        kuryr_controller::Error::InvalidInput { message, .. } => anyhow::anyhow!("{name}: {message}"),
        e => anyhow::anyhow!("{name}: {e}"),
    };
    Ok(BindingKey {
        project: b.project.clone(),
        group: Group {
            availability_zone: b
                .zone
                .as_deref()
                .map(parse_zone)
                .transpose()
                .map_err(|e| flag("--zone", e))?,
            resource_affinity: b
                .affinity
                .as_deref()
                .map(parse_affinity)
                .transpose()
                .map_err(|e| flag("--affinity", e))?
                .unwrap_or_default(),
        },
    })
}

async fn binding_object(client: &Client, k: &BindingKey) -> anyhow::Result<KuryrProjectBinding> {
    kube_store::binding_object(&Api::all(client.clone()), k)
        .await?
        .with_context(|| format!("binding {k}: no KuryrProjectBinding (not bound yet?)"))
}

/// Tells the cluster an operator moved a binding: a Normal Event on its object, as the controller
/// does for the moves it makes itself (`kubectl get events` and `kubectl describe kpb` show it).
async fn record_move(client: &Client, k: &BindingKey, from: Option<&str>, to: &str) {
    let result = async {
        let obj = binding_object(client, k).await?;
        // An operator's own action: told whatever the services' use_events says.
        let recorder = Events::new(
            client.clone(),
            Reporter {
                controller: "kuryr-bindings".into(),
                instance: None,
            },
            true,
        );
        let note = format!(
            "project {} group {} moved from deployment {} to {to} by an operator",
            k.project,
            k.group,
            from.unwrap_or("(none)")
        );
        kuryr_crds::events::publish(
            &recorder,
            &obj.object_ref(&()),
            false,
            "ProjectMoved",
            &note,
            "Move",
        )
        .await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        eprintln!("warning: the move is done, but its Event could not be recorded: {e:#}");
    }
}

/// `bindings` (list, show, history) as a table, or the objects with `-o json|yaml`.
pub async fn bindings_view(
    client: Client,
    action: Option<&BindingsAction>,
    output: Option<OutputFormat>,
) -> anyhow::Result<()> {
    let all = || async {
        anyhow::Ok(
            Api::<KuryrProjectBinding>::all(client.clone())
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<Vec<Value>, _>>()?,
        )
    };
    let structured = match output {
        Some(f @ (OutputFormat::Json | OutputFormat::Yaml)) => Some(f),
        _ => None,
    };
    let wide = output == Some(OutputFormat::Wide);
    let print = |table: Table| {
        if table.rows.is_empty() {
            eprintln!("No project bindings found.");
        } else {
            print!("{}", table.render(wide));
        }
    };
    match action {
        None | Some(BindingsAction::List) => {
            let items = all().await?;
            match structured {
                Some(f) => super::print_objects(&super::as_list(items), f)?,
                None => print(views::bindings_table(&items)),
            }
        }
        Some(BindingsAction::History { project }) => {
            let items: Vec<Value> = all()
                .await?
                .into_iter()
                .filter(|b| {
                    project
                        .as_deref()
                        .is_none_or(|p| b.pointer("/spec/projectId").and_then(Value::as_str) == Some(p))
                })
                .collect();
            match structured {
                Some(f) => super::print_objects(&super::as_list(items), f)?,
                None => print(views::binding_history_table(&items)),
            }
        }
        Some(BindingsAction::Show(b)) => {
            let obj = serde_json::to_value(binding_object(&client, &key(b)?).await?)?;
            match structured {
                Some(f) => super::print_objects(&obj, f)?,
                None => print!("{}", views::binding_details(&obj)),
            }
        }
        Some(_) => {}
    }
    Ok(())
}

/// Why the controller cannot bind to `d`: its `Configured` condition is `False` (the object
/// outlives its deployment's removal from kuryr.conf).
fn unconfigured(d: &KuryrOpenStackDeployment) -> Option<String> {
    d.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Configured" && c.status == "False")
        .map(|c| {
            if c.message.is_empty() {
                c.reason.clone()
            } else {
                c.message.clone()
            }
        })
}

pub async fn binding_action(client: Client, action: BindingsAction) -> anyhow::Result<()> {
    let store: Arc<dyn BindingStore> = Arc::new(KubeStore::new(client.clone()));
    match action {
        BindingsAction::List | BindingsAction::Show(_) | BindingsAction::History { .. } => {
            bindings_view(client, Some(&action), None).await?
        }
        BindingsAction::Pin(b) => {
            let k = key(&b)?;
            store.set_pinned(&k, true).await?;
            println!("binding {k} pinned");
        }
        BindingsAction::Unpin(b) => {
            let k = key(&b)?;
            store.set_pinned(&k, false).await?;
            println!("binding {k} unpinned");
        }
        BindingsAction::Move { binding, to } => {
            let k = key(&binding)?;
            let target = Api::<KuryrOpenStackDeployment>::all(client.clone())
                .get_opt(&to)
                .await?
                .with_context(|| format!("--to {to}: no KuryrOpenStackDeployment of that name"))?;
            if let Some(why) = move_refusal(&target, &k, Timestamp::now()) {
                anyhow::bail!("{why}");
            }
            let current = store.get(&k).await?.and_then(|st| st.current());
            if current.as_deref() == Some(to.as_str()) {
                println!("binding {k} is already on {to}");
                return Ok(());
            }
            if !store
                .claim(&k, current.as_deref(), None, &to, "moved by an operator")
                .await?
            {
                anyhow::bail!("binding {k} changed meanwhile; run the command again");
            }
            record_move(&client, &k, current.as_deref(), &to).await;
            println!(
                "binding {k} moved from {} to {to}; pin it to keep it there",
                current.as_deref().unwrap_or("(none)")
            );
        }
    }
    Ok(())
}

pub async fn deployment_action(client: Client, action: DeploymentsAction) -> anyhow::Result<()> {
    match action {
        DeploymentsAction::List => {}
        DeploymentsAction::Maintenance {
            name,
            state,
            reason,
            move_existing,
            until,
        } => {
            let on = state == "on";
            if !on && until.is_some() {
                anyhow::bail!("--until goes with maintenance on");
            }
            let until = until
                .as_deref()
                .map(|u| until_time(u, Timestamp::now()))
                .transpose()?;
            // A merge patch: null removes an `until` left from an earlier window.
            let patch = json!({"spec": {
                "maintenance": {"enabled": on, "reason": reason, "until": until},
                "moveExisting": on && move_existing,
            }});
            Api::<KuryrOpenStackDeployment>::all(client)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("KuryrOpenStackDeployment {name}"))?;
            match until {
                Some(u) => println!("deployment {name}: maintenance {state} until {u}"),
                None => println!("deployment {name}: maintenance {state}"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap_or_else(|e| panic!("{t}: {e}"))
    }

    #[test]
    fn until_takes_a_time_or_a_duration_from_now() {
        let now = at("2026-11-27T10:00:00Z");
        assert_eq!(
            until_time("2026-12-01T06:00:00+01:00", now).ok().as_deref(),
            Some("2026-12-01T05:00:00Z")
        );
        assert_eq!(
            until_time("90m", now).ok().as_deref(),
            Some("2026-11-27T11:30:00Z")
        );
        assert_eq!(
            until_time("1d", now).ok().as_deref(),
            Some("2026-11-28T10:00:00Z")
        );
        for bad in ["", "m", "5w", "soon", "-3h", "0m", "2026-11-27T09:00:00Z"] {
            let e = until_time(bad, now).expect_err(bad).to_string();
            assert!(e.starts_with("--until"), "{e}");
        }
        let e = until_time("2020-01-01T00:00:00Z", now)
            .expect_err("past")
            .to_string();
        assert!(e.contains("not in the future"), "{e}");
    }

    /// A bad `--zone` or `--affinity` is an error naming the flag (the parsers are the
    /// controller's, which name the namespace annotations).
    #[test]
    fn a_bad_zone_or_affinity_names_its_flag() {
        let sel = |zone: Option<&str>, affinity: Option<&str>| BindingSelector {
            project: "p".into(),
            zone: zone.map(Into::into),
            affinity: affinity.map(Into::into),
        };
        let e = key(&sel(Some(" az1"), None)).expect_err("blank").to_string();
        assert!(e.starts_with("--zone: ") && e.contains("blanks"), "{e}");
        assert!(!e.contains("openstack.org/"), "{e}");
        let e = key(&sel(None, Some("resource")))
            .expect_err("no value")
            .to_string();
        assert!(e.starts_with("--affinity: "), "{e}");
        assert!(key(&sel(Some("az1"), Some("resource=cad"))).is_ok());
    }

    /// A move the controller would undo at once, or that wires namespaces where they did not
    /// ask to be, is refused naming the field.
    #[test]
    fn a_move_to_a_deployment_the_binding_does_not_fit_is_refused() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().expect("time");
        let object = |spec: serde_json::Value, status: serde_json::Value| -> KuryrOpenStackDeployment {
            serde_json::from_value(json!({
                "apiVersion": "openstack.org/v1", "kind": "KuryrOpenStackDeployment",
                "metadata": {"name": "west"}, "spec": spec, "status": status}))
            .expect("object")
        };
        let target = |spec: serde_json::Value, in_maintenance: bool| {
            object(spec, json!({"inMaintenance": in_maintenance}))
        };
        let k = key(&BindingSelector {
            project: "p".into(),
            zone: Some("az1".into()),
            affinity: Some("resource=cad".into()),
        })
        .expect("key");
        let fits = json!({"availabilityZone": "az1", "resourceAffinity": {"resource": "cad"}});
        assert_eq!(move_refusal(&target(fits.clone(), false), &k, now), None);
        let why = move_refusal(&target(json!({"availabilityZone": "az2"}), false), &k, now).expect("zone");
        assert!(why.contains("az2") && why.contains("--zone"), "{why}");
        let why = move_refusal(
            &target(json!({"resourceAffinity": {"resource": "general"}}), false),
            &k,
            now,
        )
        .expect("affinity");
        assert!(
            why.contains("resource=general") && why.contains("--affinity"),
            "{why}"
        );
        let why = move_refusal(
            &target(json!({"resourceAffinity": {"gpu": "yes"}}), false),
            &k,
            now,
        )
        .expect("affinity without the key");
        assert!(why.contains("has no resource"), "{why}");
        let why = move_refusal(&target(json!({}), true), &k, now).expect("maintenance");
        assert!(why.contains("maintenance"), "{why}");
        // Maintenance the spec asks for, before any controller followed it (or with none running);
        // one whose window ended is none.
        let mut spec = fits.clone();
        spec["maintenance"] = json!({"enabled": true});
        let why = move_refusal(&target(spec.clone(), false), &k, now).expect("maintenance by spec");
        assert!(why.contains("maintenance"), "{why}");
        spec["maintenance"] = json!({"enabled": true, "until": "2026-12-01T09:00:00Z"});
        assert_eq!(move_refusal(&target(spec, false), &k, now), None);
        // A fresh figure at the threshold the object states: moved off again at once. A stale one
        // or one below it is no reason.
        let mut spec = fits;
        spec["usageThreshold"] = json!(0.8);
        let full = |fraction: &str, stale: bool| {
            object(
                spec.clone(),
                json!({"usage": {"fraction": fraction}, "stale": stale}),
            )
        };
        let why = move_refusal(&full("0.850", false), &k, now).expect("full");
        assert!(why.contains("usageThreshold"), "{why}");
        assert_eq!(move_refusal(&full("0.850", true), &k, now), None);
        assert_eq!(move_refusal(&full("0.500", false), &k, now), None);
        // No threshold in the spec: kuryr.conf's, as the controller publishes it for the
        // generation it follows (not one it published for an older spec).
        let conf = |generation: i64| -> KuryrOpenStackDeployment {
            serde_json::from_value(json!({
                "apiVersion": "openstack.org/v1", "kind": "KuryrOpenStackDeployment",
                "metadata": {"name": "west", "generation": 3}, "spec": {"availabilityZone": "az1",
                    "resourceAffinity": {"resource": "cad"}},
                "status": {"usage": {"fraction": "0.920"}, "usageThreshold": 0.9,
                    "observedGeneration": generation}}))
            .expect("object")
        };
        let why = move_refusal(&conf(3), &k, now).expect("full by kuryr.conf's threshold");
        assert!(why.contains("0.900"), "{why}");
        assert_eq!(move_refusal(&conf(2), &k, now), None);
    }

    #[test]
    fn a_deployment_without_a_kuryr_conf_section_is_no_move_target() {
        let d = |status: &str| -> KuryrOpenStackDeployment {
            serde_json::from_value(json!({
                "apiVersion": "openstack.org/v1", "kind": "KuryrOpenStackDeployment",
                "metadata": {"name": "ghost"}, "spec": {},
                "status": {"conditions": [{"type": "Configured", "status": status,
                    "reason": "NoCredentials", "message": "no [deployment:ghost] section",
                    "lastTransitionTime": "2026-11-27T10:00:00Z"}]}}))
            .expect("object")
        };
        assert_eq!(
            unconfigured(&d("False")).as_deref(),
            Some("no [deployment:ghost] section")
        );
        assert_eq!(unconfigured(&d("True")), None);
    }

    #[test]
    fn deployment_rows_show_maintenance_as_followed_and_the_age_of_the_usage() {
        let o = json!({"metadata": {"name": "east"},
            "spec": {"availabilityZone": "az1", "maintenance": {"enabled": true, "reason": "upgrade",
                     "until": "2026-11-27T09:00:00Z"}},
            "status": {"inMaintenance": false, "usage": {"fraction": 0.25},
                       "measuredAt": "2026-11-27T09:59:15Z",
                       "conditions": [{"type": "Configured", "status": "True"},
                                      {"type": "Valid", "status": "False"}]}});
        let t = deployments_table(&[o], at("2026-11-27T10:00:00Z"));
        assert_eq!(
            t.rows[0].0,
            [
                "east",
                "az1",
                "false",
                "2026-11-27T09:00:00Z",
                "false",
                "0.25",
                "45s",
                "false"
            ]
        );
        assert_eq!(t.rows[0].1[..3], ["upgrade", "True", "False"]);
    }
}
