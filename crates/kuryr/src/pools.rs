//! `kuryr pools list|show|populate|free`: the controller's pool management API (unix socket).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use kuryr_config::KuryrConfig;
use kuryr_controller::pool::api;
use kuryr_controller::pool::driver::PoolSummary;

use crate::cli::{PoolsArgs, PoolsCommand};

pub async fn run(args: PoolsArgs) -> anyhow::Result<()> {
    let socket = socket(&args)?;
    match args.command {
        PoolsCommand::List { json } => {
            let pools = api::list_pools(&socket).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&pools)?);
            } else {
                print!("{}", render_list(&pools));
            }
        }
        PoolsCommand::Show { name, json } => {
            let pool = api::show_pool(&socket, &name).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&pool)?);
            } else {
                print!("{}", render_show(&pool));
            }
        }
        PoolsCommand::Populate { name, count } => {
            let reply = api::populate_pool(&socket, &name, count).await?;
            if reply.started {
                println!("populating pool {name}");
            } else {
                println!("pool {name}: a populate is already running or the global populate cap is reached");
            }
        }
        PoolsCommand::Free { name } => {
            let reply = api::free_pool(&socket, &name).await?;
            println!("pool {name}: deleted {} ports", reply.deleted);
        }
    }
    Ok(())
}

/// `--socket`, else `[pool_manager] sock_file` of the given configuration (upstream's option).
fn socket(args: &PoolsArgs) -> anyhow::Result<PathBuf> {
    if let Some(s) = &args.socket {
        return Ok(s.clone());
    }
    let files = args.config.files()?;
    let config = KuryrConfig::load(&files)
        .context("loading the configuration")?
        .config;
    Ok(PathBuf::from(config.pool_manager.sock_file))
}

fn render_list(pools: &[PoolSummary]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<40} {:<8} {:<14} {:<20} {:>9} {:>10} {:>6} {:<10} LAST ERROR",
        "NAME", "DRIVER", "VIF DRIVER", "HOST", "AVAILABLE", "RECYCLABLE", "IN USE", "POPULATING"
    );
    for p in pools {
        let _ = writeln!(
            s,
            "{:<40} {:<8} {:<14} {:<20} {:>9} {:>10} {:>6} {:<10} {}",
            p.name,
            p.pool_driver,
            p.vif_driver,
            p.host,
            p.available,
            p.recyclable,
            p.in_use,
            if p.populating { "yes" } else { "no" },
            p.last_error.as_deref().unwrap_or("-")
        );
    }
    s
}

fn render_show(p: &PoolSummary) -> String {
    let mut s = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    for (k, v) in [
        ("name", p.name.clone()),
        ("pool driver", p.pool_driver.clone()),
        ("vif driver", p.vif_driver.clone()),
        ("deployment", p.deployment.clone()),
        ("host", p.host.clone()),
        ("project", p.project_id.clone()),
        ("network", p.network_id.clone()),
        ("subnet", p.subnet_id.clone()),
        ("security groups", p.security_groups.join(",")),
        ("available", p.available.to_string()),
        ("recyclable", p.recyclable.to_string()),
        ("in use", p.in_use.to_string()),
        ("populating", p.populating.to_string()),
        (
            "oldest available",
            p.oldest_available_secs
                .map_or_else(|| "-".into(), |a| format!("{a}s")),
        ),
        ("last refill", opt(&p.last_refill)),
        ("last error", opt(&p.last_error)),
        ("last error time", opt(&p.last_error_time)),
    ] {
        let _ = writeln!(s, "{k:<17} {v}");
    }
    if !p.ports.is_empty() {
        let _ = writeln!(s, "\n{:<38} {:<11} {:>8}", "PORT", "STATE", "AGE");
        for port in &p.ports {
            let _ = writeln!(s, "{:<38} {:<11} {:>7}s", port.port_id, port.state, port.age_secs);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use kuryr_controller::pool::driver::PortSummary;

    fn pool() -> PoolSummary {
        PoolSummary {
            name: "pool-k8s-node-1-abc".into(),
            pool_driver: "neutron".into(),
            vif_driver: "neutron-vif".into(),
            deployment: "default".into(),
            host: "k8s-node-1".into(),
            project_id: "p".into(),
            network_id: "n".into(),
            subnet_id: "s".into(),
            security_groups: vec!["sg1".into(), "sg2".into()],
            available: 4,
            recyclable: 1,
            in_use: 7,
            populating: true,
            oldest_available_secs: Some(12),
            last_refill: None,
            last_error: Some("OverQuota".into()),
            last_error_time: None,
            ports: vec![PortSummary {
                port_id: "port-1".into(),
                state: "available".into(),
                age_secs: 12,
            }],
        }
    }

    #[test]
    fn list_has_one_row_per_pool_with_counts() {
        let text = render_list(&[pool()]);
        let row: Vec<&str> = text
            .lines()
            .nth(1)
            .map(|l| l.split_whitespace().collect())
            .unwrap_or_default();
        assert_eq!(
            row,
            [
                "pool-k8s-node-1-abc",
                "neutron",
                "neutron-vif",
                "k8s-node-1",
                "4",
                "1",
                "7",
                "yes",
                "OverQuota"
            ]
        );
    }

    #[test]
    fn show_lists_fields_and_ports() {
        let text = render_show(&pool());
        assert!(text.contains("security groups   sg1,sg2"), "{text}");
        assert!(text.contains("oldest available  12s"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["port-1", "available", "12s"])
        );
    }

    #[test]
    fn explicit_socket_wins_over_the_configuration() -> anyhow::Result<()> {
        let args = PoolsArgs {
            config: crate::cli::ConfigArgs::default(),
            socket: Some("/tmp/x.sock".into()),
            command: PoolsCommand::List { json: false },
        };
        assert_eq!(socket(&args)?, PathBuf::from("/tmp/x.sock"));
        let dir = tempfile::tempdir()?;
        let conf = dir.path().join("kuryr.conf");
        std::fs::write(&conf, "[pool_manager]\nsock_file = /run/test/manage.sock\n")?;
        let args = PoolsArgs {
            config: crate::cli::ConfigArgs {
                config_file: vec![conf],
                config_dir: vec![],
            },
            socket: None,
            command: PoolsCommand::List { json: false },
        };
        assert_eq!(socket(&args)?, PathBuf::from("/run/test/manage.sock"));
        Ok(())
    }
}
