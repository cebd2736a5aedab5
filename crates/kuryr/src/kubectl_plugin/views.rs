//! Rows of the plugin's tables, from the objects as JSON (so KuryrPorts written by upstream
//! kuryr-kubernetes show as well as kuryr-rs' own). Pure, tested without a server.

use serde_json::Value;

/// A table: header and rows; `wide` columns come after the normal ones.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Table {
    pub header: Vec<&'static str>,
    pub wide_header: Vec<&'static str>,
    pub rows: Vec<(Vec<String>, Vec<String>)>,
}

impl Table {
    /// kubectl's layout: columns padded to the widest cell, three spaces apart.
    pub fn render(&self, wide: bool) -> String {
        let header: Vec<&str> = self
            .header
            .iter()
            .chain(wide.then_some(&self.wide_header).into_iter().flatten())
            .copied()
            .collect();
        let rows: Vec<Vec<&str>> = self
            .rows
            .iter()
            .map(|(normal, extra)| {
                normal
                    .iter()
                    .chain(wide.then_some(extra).into_iter().flatten())
                    .map(String::as_str)
                    .collect()
            })
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in &rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.len());
                }
            }
        }
        let line = |cells: &[&str]| -> String {
            let mut out = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    out.push_str(cell);
                } else {
                    out.push_str(&format!("{cell:<w$}   ", w = widths[i]));
                }
            }
            out.trim_end().to_owned() + "\n"
        };
        let mut out = line(&header);
        for row in &rows {
            out.push_str(&line(row));
        }
        out
    }
}

fn data(v: &Value) -> &Value {
    v.get("versioned_object.data").unwrap_or(v)
}

pub(crate) fn s(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "<none>".to_owned(),
    }
}

/// The IPs of an os-vif VIF primitive (`network.subnets.objects[].ips.objects[].address`).
fn vif_ips(vif: &Value) -> Vec<String> {
    let subnets = data(&data(vif)["network"])["subnets"].clone();
    data(&subnets)["objects"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|subnet| {
            data(&data(subnet)["ips"])["objects"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|ip| data(&ip)["address"].as_str().map(str::to_owned))
        .collect()
}

/// `kubectl kuryr get vif POD`: one row per interface of the pod's KuryrPort.
pub fn vif_table(kuryrport: &Value) -> Table {
    let mut table = Table {
        header: vec!["INTERFACE", "PORT", "MAC", "IPS", "ACTIVE"],
        wide_header: vec!["TYPE", "VIF NAME", "DEFAULT", "ORIGIN"],
        rows: Vec::new(),
    };
    for (ifname, entry) in kuryrport
        .pointer("/status/vifs")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let vif = &entry["vif"];
        let d = data(vif);
        let ips = vif_ips(vif);
        let origin = match entry.get("kuryrRsOrigin") {
            None => "upstream".to_owned(),
            Some(Value::String(o)) => o.clone(),
            Some(Value::Object(o)) => o.keys().cloned().collect::<Vec<_>>().join(","),
            Some(other) => other.to_string(),
        };
        table.rows.push((
            vec![
                ifname.clone(),
                s(d.get("id")),
                s(d.get("address")),
                if ips.is_empty() {
                    "<none>".into()
                } else {
                    ips.join(",")
                },
                s(d.get("active")),
            ],
            vec![
                s(vif.get("versioned_object.name")),
                s(d.get("vif_name")),
                s(entry.get("default")),
                origin,
            ],
        ));
    }
    table
}

/// `kubectl kuryr pools`: one row per KuryrPortPool.
pub fn pools_table(pools: &[Value]) -> Table {
    let mut table = Table {
        header: vec!["NAME", "HOST", "SUBNET", "AVAILABLE", "RECYCLABLE", "MIN", "MAX"],
        wide_header: vec!["DEPLOYMENT", "PROJECT", "SECURITY GROUPS", "TTL"],
        rows: Vec::new(),
    };
    for pool in pools {
        let key = &pool["spec"]["key"];
        let host = key.get("host").or_else(|| key.get("trunkPortId")).cloned();
        let groups: Vec<String> = key["securityGroupIds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(str::to_owned))
            .collect();
        table.rows.push((
            vec![
                s(pool.pointer("/metadata/name")),
                s(host.as_ref()),
                s(key.get("subnetId")),
                s(pool.pointer("/status/availableCount")).replace("<none>", "0"),
                s(pool.pointer("/status/recyclableCount")).replace("<none>", "0"),
                s(pool.pointer("/spec/min")),
                s(pool.pointer("/spec/max")),
            ],
            vec![
                s(key.get("deployment")),
                s(key.get("projectId")),
                groups.join(","),
                s(pool.pointer("/spec/ttlSeconds")),
            ],
        ));
    }
    table
}

/// The group a binding object is for, as `kuryr bindings` names it: `general`, or its zone and
/// affinity tags.
fn binding_group(b: &Value) -> String {
    let mut group: Vec<String> = Vec::new();
    if let Some(z) = b.pointer("/spec/availabilityZone").and_then(Value::as_str) {
        group.push(format!("az={z}"));
    }
    if let Some(aff) = b.pointer("/spec/resourceAffinity").and_then(Value::as_object) {
        group.extend(
            aff.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())),
        );
    }
    if group.is_empty() {
        "general".to_owned()
    } else {
        group.join(",")
    }
}

fn pinned(b: &Value) -> String {
    b.pointer("/spec/pinned")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        .to_string()
}

fn history(b: &Value) -> Vec<Value> {
    b.pointer("/status/history")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// `kuryr bindings` (list): one row per (project, group) binding, where it is now and since when,
/// from the `KuryrProjectBinding` objects (each a JSON object).
pub fn bindings_table(bindings: &[Value]) -> Table {
    let mut table = Table {
        header: vec!["PROJECT", "GROUP", "DEPLOYMENT", "SINCE", "PINNED"],
        wide_header: vec!["WHY", "OBJECT"],
        rows: Vec::new(),
    };
    for b in bindings {
        let current = history(b)
            .into_iter()
            .rev()
            .find(|r| r.get("unboundAt").is_none());
        table.rows.push((
            vec![
                s(b.pointer("/spec/projectId")),
                binding_group(b),
                s(b.pointer("/status/deployment")),
                s(current.as_ref().and_then(|r| r.get("boundAt"))),
                pinned(b),
            ],
            vec![
                s(current.as_ref().and_then(|r| r.get("why"))),
                s(b.pointer("/metadata/name")),
            ],
        ));
    }
    table
}

/// `kuryr bindings history`: one row per (project, group, period), oldest first per binding.
pub fn binding_history_table(bindings: &[Value]) -> Table {
    let mut table = Table {
        header: vec!["PROJECT", "GROUP", "DEPLOYMENT", "SINCE", "UNTIL"],
        wide_header: vec!["PINNED", "WHY"],
        rows: Vec::new(),
    };
    for b in bindings {
        let group = binding_group(b);
        for record in history(b) {
            table.rows.push((
                vec![
                    s(b.pointer("/spec/projectId")),
                    group.clone(),
                    s(record.get("deployment")),
                    s(record.get("boundAt")),
                    record
                        .get("unboundAt")
                        .map(|e| s(Some(e)))
                        .unwrap_or_else(|| "-".to_owned()),
                ],
                vec![pinned(b), s(record.get("why"))],
            ));
        }
    }
    table
}

/// `kuryr bindings show`: one binding as `key: value` lines, then its history table.
pub fn binding_details(b: &Value) -> String {
    let mut out = String::new();
    for (k, v) in [
        ("Project", s(b.pointer("/spec/projectId"))),
        ("Group", binding_group(b)),
        ("Deployment", s(b.pointer("/status/deployment"))),
        ("Pinned", pinned(b)),
        (
            "Object",
            format!("kuryrprojectbinding/{}", s(b.pointer("/metadata/name"))),
        ),
    ] {
        out.push_str(&format!("{:<12}{v}\n", format!("{k}:")));
    }
    out.push_str("History:\n");
    // The key is said above: each row keeps the deployment, the period and why.
    let rows = binding_history_table(std::slice::from_ref(b)).rows;
    let t = Table {
        header: vec!["DEPLOYMENT", "BOUND AT", "UNBOUND AT", "WHY"],
        wide_header: vec![],
        rows: rows
            .into_iter()
            .map(|(r, w)| {
                let mut cells = r[2..].to_vec();
                cells.push(w[1].clone());
                (cells, vec![])
            })
            .collect(),
    };
    for line in t.render(false).lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// A duration as kubectl prints ages: `45s`, `12m`, `5h`, `3d`.
pub fn age(secs: i64) -> String {
    let secs = secs.max(0);
    match secs {
        0..120 => format!("{secs}s"),
        120..7_200 => format!("{}m", secs / 60),
        7_200..172_800 => format!("{}h", secs / 3_600),
        _ => format!("{}d", secs / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kuryrport() -> Value {
        json!({"status": {"vifs": {
            "eth0": {"default": true, "kuryrRsOrigin": {"pool": {"name": "p"}}, "vif": {
                "versioned_object.name": "VIFOpenVSwitch",
                "versioned_object.data": {"id": "port-1", "address": "fa:16:3e:00:00:01", "active": true,
                    "vif_name": "tap1", "network": {"versioned_object.data": {"subnets": {"versioned_object.data": {
                        "objects": [{"versioned_object.data": {"ips": {"versioned_object.data": {"objects": [
                            {"versioned_object.data": {"address": "10.0.0.5"}}]}}}}]}}}}}}},
            "eth1": {"default": false, "vif": {"versioned_object.data": {"id": "port-2", "active": false}}}
        }}})
    }

    #[test]
    fn vif_rows_show_ports_addresses_and_where_they_came_from() {
        let t = vif_table(&kuryrport());
        assert_eq!(
            t.rows[0].0,
            ["eth0", "port-1", "fa:16:3e:00:00:01", "10.0.0.5", "true"]
        );
        assert_eq!(t.rows[0].1, ["VIFOpenVSwitch", "tap1", "true", "pool"]);
        assert_eq!(t.rows[1].0, ["eth1", "port-2", "<none>", "<none>", "false"]);
        assert_eq!(
            t.rows[1].1[3], "upstream",
            "no kuryr-rs origin: recorded by upstream"
        );
    }

    #[test]
    fn tables_align_columns_and_add_wide_ones_only_when_asked() {
        let t = vif_table(&kuryrport());
        let narrow = t.render(false);
        let mut lines = narrow.lines();
        let header = lines.next().unwrap_or_default();
        assert!(header.starts_with("INTERFACE   PORT  "), "{narrow}");
        assert!(!header.contains("TYPE"));
        let col = header.find("MAC").unwrap_or(0);
        for line in lines {
            assert_eq!(line.find("fa:16").or(line.find("<none>")), Some(col), "{narrow}");
        }
        assert!(
            t.render(true)
                .lines()
                .next()
                .unwrap_or_default()
                .ends_with("ORIGIN")
        );
    }

    #[test]
    fn pools_and_bindings_rows() {
        let pools = [json!({"metadata": {"name": "n1-abc"},
            "spec": {"key": {"deployment": "default", "host": "n1", "projectId": "p", "networkId": "n",
                     "subnetId": "s", "securityGroupIds": ["a", "b"]}, "min": 1, "batch": 2, "max": 0},
            "status": {"availableCount": 3}})];
        let t = pools_table(&pools);
        assert_eq!(t.rows[0].0, ["n1-abc", "n1", "s", "3", "0", "1", "0"]);
        assert_eq!(t.rows[0].1, ["default", "p", "a,b", "<none>"]);

        let b = json!({"spec": {"projectId": "p1", "resourceAffinity": {"resource": "cad"}},
            "status": {"deployment": "east", "history": [
                {"deployment": "default", "boundAt": "t0", "unboundAt": "t1", "why": "new binding"},
                {"deployment": "east", "boundAt": "t1", "why": "maintenance"}]}});
        let t = binding_history_table(std::slice::from_ref(&b));
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[0].0, ["p1", "resource=cad", "default", "t0", "t1"]);
        assert_eq!(t.rows[1].0, ["p1", "resource=cad", "east", "t1", "-"]);
        assert_eq!(t.rows[1].1, ["false", "maintenance"]);
        let t = bindings_table(std::slice::from_ref(&b));
        assert_eq!(t.rows.len(), 1, "one row per binding");
        assert_eq!(t.rows[0].0, ["p1", "resource=cad", "east", "t1", "false"]);
        assert_eq!(t.rows[0].1[0], "maintenance");
        let shown = binding_details(&b);
        assert!(shown.contains("Deployment: east\n"), "{shown}");
        assert!(shown.contains("Group:      resource=cad\n"), "{shown}");
        let rows: Vec<&str> = shown.lines().skip_while(|l| *l != "History:").skip(1).collect();
        assert_eq!(rows.len(), 3, "header and two periods: {shown}");
        assert!(rows[0].trim_start().starts_with("DEPLOYMENT"), "{shown}");
        assert!(
            rows[1].contains("default") && rows[1].contains("new binding"),
            "{shown}"
        );
        assert!(
            rows[2].contains("east") && rows[2].trim_end().ends_with("maintenance"),
            "{shown}"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(
            [
                age(-3),
                age(45),
                age(119),
                age(120),
                age(7_199),
                age(7_200),
                age(200_000)
            ],
            ["0s", "45s", "119s", "2m", "119m", "2h", "2d"]
        );
    }
}
