//! The `kubectl kuryr` plugin: the `kuryr` binary invoked as `kubectl-kuryr` (kubectl runs plugins
//! found on PATH by that name) or as `kuryr kubectl ...`. Subcommands `get vif POD`, `pools`,
//! `bindings` and `status`, with kubectl's `-n/--namespace`, `--context`, `--kubeconfig` and
//! `-o json|yaml|wide`.

pub mod placement;
pub mod views;

use std::ffi::OsString;
use std::process::ExitCode;

use anyhow::Context as _;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::Value;

use crate::cli::{BindingsAction, DeploymentsAction, KubectlArgs, KubectlCommand, KubectlGet, OutputFormat};

/// The executable name kubectl looks for.
pub const PLUGIN_NAME: &str = "kubectl-kuryr";

/// The install's namespace when `-n` is not given (pools and the ConfigMap live there).
const INSTALL_NAMESPACE: &str = "kuryr";

/// `argv` rewritten to `kuryr kubectl ...` when the binary runs as the plugin.
pub fn plugin_argv(argv: Vec<OsString>) -> Vec<OsString> {
    let invoked_as = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name().map(|n| n.to_os_string()));
    if invoked_as.as_deref() != Some(PLUGIN_NAME.as_ref()) {
        return argv;
    }
    let mut out: Vec<OsString> = vec!["kuryr".into(), "kubectl".into()];
    out.extend(argv.into_iter().skip(1));
    out
}

fn kuryr_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "openstack.org".into(),
        version: "v1".into(),
        api_version: "openstack.org/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The client and default namespace the way kubectl picks them: `--kubeconfig`, else
/// `$KUBECONFIG`, else `~/.kube/config`; `--context` else the current context.
async fn connect(args: &KubectlArgs) -> anyhow::Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: args.kube.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &args.kube.kubeconfig {
        Some(path) => {
            let file =
                Kubeconfig::read_from(path).with_context(|| format!("--kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options).await
        }
        None => kube::Config::from_kubeconfig(&options).await,
    }
    .context("kubeconfig")?;
    let namespace = config.default_namespace.clone();
    Ok((Client::try_from(config).context("Kubernetes client")?, namespace))
}

pub(crate) fn print_objects(value: &Value, format: OutputFormat) -> anyhow::Result<()> {
    match format {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(value)?),
        OutputFormat::Yaml => print!("{}", serde_yaml::to_string(value)?),
        OutputFormat::Wide => {}
    }
    Ok(())
}

fn print_table(table: &views::Table, output: Option<OutputFormat>, what: &str, namespace: &str) {
    if table.rows.is_empty() {
        eprintln!("No {what} found in {namespace} namespace.");
        return;
    }
    print!("{}", table.render(output == Some(OutputFormat::Wide)));
}

pub(crate) fn as_list(items: Vec<Value>) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

async fn run_command(args: KubectlArgs) -> anyhow::Result<ExitCode> {
    let (client, context_namespace) = connect(&args).await?;
    let output = args.kube.output;
    let structured = matches!(output, Some(OutputFormat::Json | OutputFormat::Yaml));
    match &args.command {
        KubectlCommand::Get(KubectlGet::Vif { pod }) => {
            let ns = args.kube.namespace.clone().unwrap_or(context_namespace);
            let api: Api<DynamicObject> =
                Api::namespaced_with(client, &ns, &kuryr_resource("KuryrPort", "kuryrports"));
            let kp = api
                .get_opt(pod)
                .await?
                .with_context(|| format!("pod {ns}/{pod} has no KuryrPort (not wired by kuryr yet?)"))?;
            let value = serde_json::to_value(&kp)?;
            if let (true, Some(format)) = (structured, output) {
                let vifs = value.pointer("/status/vifs").cloned().unwrap_or(Value::Null);
                print_objects(&vifs, format)?;
            } else {
                print_table(&views::vif_table(&value), output, "VIFs", &ns);
            }
        }
        KubectlCommand::Pools => {
            let ns = args
                .kube
                .namespace
                .clone()
                .unwrap_or_else(|| INSTALL_NAMESPACE.to_owned());
            let api: Api<DynamicObject> =
                Api::namespaced_with(client, &ns, &kuryr_resource("KuryrPortPool", "kuryrportpools"));
            let pools: Vec<Value> = api
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<_, _>>()?;
            if let (true, Some(format)) = (structured, output) {
                print_objects(&as_list(pools), format)?;
            } else {
                print_table(&views::pools_table(&pools), output, "pools", &ns);
            }
        }
        KubectlCommand::Bindings {
            action:
                action @ (None
                | Some(BindingsAction::List | BindingsAction::Show(_) | BindingsAction::History { .. })),
        } => placement::bindings_view(client, action.as_ref(), output).await?,
        KubectlCommand::Bindings { action: Some(action) } => {
            placement::binding_action(client, action.clone()).await?
        }
        KubectlCommand::Deployments {
            action: Some(action @ DeploymentsAction::Maintenance { .. }),
        } => placement::deployment_action(client, action.clone()).await?,
        KubectlCommand::Deployments { .. } => {
            let objects: Vec<Value> = Api::<kuryr_crds::KuryrOpenStackDeployment>::all(client)
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<_, _>>()?;
            if let (true, Some(format)) = (structured, output) {
                print_objects(&as_list(objects), format)?;
            } else {
                print_table(
                    &placement::deployments_table(&objects, k8s_openapi::jiff::Timestamp::now()),
                    output,
                    "OpenStack deployments",
                    "any",
                );
            }
        }
        KubectlCommand::Status { skip_neutron } => {
            let ns = args
                .kube
                .namespace
                .clone()
                .unwrap_or_else(|| INSTALL_NAMESPACE.to_owned());
            let findings = crate::status::report(&client, None, &ns, !skip_neutron).await?;
            if let (true, Some(format)) = (structured, output) {
                let rows: Vec<Value> = findings
                    .iter()
                    .map(|f| serde_json::json!({"check": f.check, "result": f.level.to_string(), "details": f.detail}))
                    .collect();
                print_objects(&Value::Array(rows), format)?;
                let worst = findings.iter().map(|f| f.level).max();
                return Ok(ExitCode::from(worst.map(|l| l.exit_code()).unwrap_or(0)));
            }
            return Ok(crate::status::print(&findings));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn run(args: KubectlArgs) -> ExitCode {
    match run_command(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn invoked_as_the_plugin_the_arguments_become_kuryr_kubectl() {
        assert_eq!(
            plugin_argv(os(&[
                "/usr/local/bin/kubectl-kuryr",
                "get",
                "vif",
                "web",
                "-n",
                "ns1"
            ])),
            os(&["kuryr", "kubectl", "get", "vif", "web", "-n", "ns1"])
        );
        assert_eq!(plugin_argv(os(&["kuryr", "status"])), os(&["kuryr", "status"]));
        assert_eq!(
            plugin_argv(os(&["/opt/kubectl-kuryrx"])),
            os(&["/opt/kubectl-kuryrx"])
        );
    }
}
