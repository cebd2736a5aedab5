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

/// `kubectl kuryr bindings`: the placement history, one row per (project, group, period), from the
/// `KuryrProjectBinding` objects (each a JSON object).
pub fn bindings_table(bindings: &[Value]) -> Table {
    let mut table = Table {
        header: vec!["PROJECT", "GROUP", "DEPLOYMENT", "SINCE", "UNTIL"],
        wide_header: vec!["PINNED", "WHY"],
        rows: Vec::new(),
    };
    for b in bindings {
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
        let group = if group.is_empty() {
            "general".to_owned()
        } else {
            group.join(",")
        };
        let history = b
            .pointer("/status/history")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for record in history {
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
                vec![
                    b.pointer("/spec/pinned")
                        .and_then(Value::as_bool)
                        .unwrap_or(false)
                        .to_string(),
                    s(record.get("why")),
                ],
            ));
        }
    }
    table
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
        let t = bindings_table(&[b]);
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[0].0, ["p1", "resource=cad", "default", "t0", "t1"]);
        assert_eq!(t.rows[1].0, ["p1", "resource=cad", "east", "t1", "-"]);
        assert_eq!(t.rows[1].1, ["false", "maintenance"]);
    }
}
