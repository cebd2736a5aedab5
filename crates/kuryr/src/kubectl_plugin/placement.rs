//! `kubectl kuryr deployments` and `kubectl kuryr bindings pin|unpin|move`: the operator's side of
//! placement, through the Kubernetes API only (the controller follows the objects with a watch).

use std::sync::Arc;

use anyhow::Context as _;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kuryr_controller::placement::kube_store::KubeStore;
use kuryr_controller::placement::store::BindingStore;
use kuryr_controller::placement::{BindingKey, Group, parse_affinity, parse_zone};
use kuryr_crds::KuryrOpenStackDeployment;
use serde_json::{Value, json};

use super::views::{Table, s};
use crate::cli::{BindingSelector, BindingsAction, DeploymentsAction};

/// One row per deployment: zone, maintenance, usage fraction, when measured, stale.
pub fn deployments_table(objects: &[Value]) -> Table {
    let mut t = Table {
        header: vec![
            "NAME",
            "ZONE",
            "MAINTENANCE",
            "MOVE",
            "USAGE",
            "MEASURED",
            "STALE",
        ],
        wide_header: vec!["REASON", "CONFIGURED"],
        rows: Vec::new(),
    };
    for o in objects {
        let configured = o
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| {
                c.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some("Configured"))
            })
            .map(|c| s(c.get("status")))
            .unwrap_or_else(|| "<unknown>".into());
        t.rows.push((
            vec![
                s(o.pointer("/metadata/name")),
                s(o.pointer("/spec/availabilityZone")),
                o.pointer("/spec/maintenance/enabled")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    .to_string(),
                o.pointer("/spec/moveExisting")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    .to_string(),
                s(o.pointer("/status/usage/fraction")),
                s(o.pointer("/status/measuredAt")),
                o.pointer("/status/stale")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
                    .to_string(),
            ],
            vec![s(o.pointer("/spec/maintenance/reason")), configured],
        ));
    }
    t
}

fn key(b: &BindingSelector) -> anyhow::Result<BindingKey> {
    Ok(BindingKey {
        project: b.project.clone(),
        group: Group {
            availability_zone: b.zone.as_deref().map(parse_zone).transpose()?,
            resource_affinity: b
                .affinity
                .as_deref()
                .map(parse_affinity)
                .transpose()?
                .unwrap_or_default(),
        },
    })
}

pub async fn binding_action(client: Client, action: BindingsAction) -> anyhow::Result<()> {
    let store: Arc<dyn BindingStore> = Arc::new(KubeStore::new(client.clone()));
    match action {
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
            Api::<KuryrOpenStackDeployment>::all(client)
                .get_opt(&to)
                .await?
                .with_context(|| format!("--to {to}: no KuryrOpenStackDeployment of that name"))?;
            let current = store.get(&k).await?.and_then(|st| st.current());
            if current.as_deref() == Some(to.as_str()) {
                println!("binding {k} is already on {to}");
                return Ok(());
            }
            if !store
                .claim(&k, current.as_deref(), &to, "moved by an operator")
                .await?
            {
                anyhow::bail!("binding {k} changed meanwhile; run the command again");
            }
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
        DeploymentsAction::Maintenance {
            name,
            state,
            reason,
            move_existing,
        } => {
            let on = state == "on";
            let patch = json!({"spec": {
                "maintenance": {"enabled": on, "reason": reason},
                "moveExisting": on && move_existing,
            }});
            Api::<KuryrOpenStackDeployment>::all(client)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("KuryrOpenStackDeployment {name}"))?;
            println!("deployment {name}: maintenance {state}");
        }
    }
    Ok(())
}
