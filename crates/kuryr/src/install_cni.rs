//! `kuryr install-cni`: the CNI DaemonSet's init step. Puts the `kuryr-cni` executable into the host's
//! CNI plugin directory and `10-kuryr.conflist` into the host's CNI configuration directory.
//!
//! Upstream's init script deletes both files and copies them again on every start, which leaves a window
//! in which the kubelet finds no configuration or execs a half-copied plugin. Here each file is written to
//! a temp file in its target directory, synced and renamed over the old one, and a file that already has
//! the right content is left alone.

use std::fmt;
use std::fs::{self, File, Permissions};
use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cli::InstallCniArgs;

/// Upstream's file name; the `10-` prefix matters because the kubelet uses the first file in name order.
pub const CONFLIST_NAME: &str = "10-kuryr.conflist";
/// The plugin's file name, which is also the `type` in the conflist.
pub const CNI_NAME: &str = "kuryr-cni";

const BIN_MODE: u32 = 0o755;
const CONF_MODE: u32 = 0o644;

/// An error naming the path it is about.
#[derive(Debug)]
pub struct InstallError {
    path: PathBuf,
    reason: String,
}

impl InstallError {
    fn new(path: &Path, reason: impl fmt::Display) -> Self {
        Self {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        }
    }
}

impl fmt::Display for InstallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

/// What happened to one file.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Written,
    /// Same content; only the mode was wrong and has been set.
    ModeFixed,
    Unchanged,
}

pub fn run(args: &InstallCniArgs) -> ExitCode {
    match install(args) {
        Ok(results) => {
            for (path, outcome) in &results {
                let what = match outcome {
                    Outcome::Written => "installed",
                    Outcome::ModeFixed => "fixed the mode of",
                    Outcome::Unchanged => "unchanged",
                };
                println!("kuryr install-cni: {what} {}", path.display());
            }
            if results.iter().all(|(_, o)| *o == Outcome::Unchanged) {
                println!("kuryr install-cni: already installed, nothing changed");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kuryr install-cni: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The conflist, byte for byte upstream's `10-kuryr.conflist` with the default options; the kuryr-rs
/// keys only appear when their options are given.
pub fn conflist(args: &InstallCniArgs) -> String {
    // Written out by hand rather than through serde_json so the key order and layout stay upstream's.
    let s = |v: &str| serde_json::Value::String(v.to_owned()).to_string();
    let mut plugin = vec![
        format!("\"type\": {}", s(CNI_NAME)),
        format!("\"kuryr_conf\": {}", s(&args.kuryr_conf)),
        format!("\"debug\": {}", args.debug),
    ];
    if let Some(daemon) = &args.kuryr_daemon {
        plugin.push(format!("\"kuryr_daemon\": {}", s(daemon)));
    }
    if let Some(timeout) = args.kuryr_daemon_timeout {
        plugin.push(format!("\"kuryr_daemon_timeout\": {timeout}"));
    }
    format!(
        "{{\n  \"name\": \"kuryr\",\n  \"cniVersion\": \"0.3.1\",\n  \"plugins\": [\n    {{\n      {}\n    }}\n  ]\n}}\n",
        plugin.join(",\n      ")
    )
}

fn default_cni_bin() -> Result<PathBuf, InstallError> {
    let exe = std::env::current_exe()
        .map_err(|e| InstallError::new(Path::new("kuryr"), format!("cannot find this executable: {e}")))?;
    let dir = exe
        .parent()
        .ok_or_else(|| InstallError::new(&exe, "this executable has no parent directory"))?;
    Ok(dir.join(CNI_NAME))
}

fn check_dir(flag: &str, dir: &Path) -> Result<(), InstallError> {
    let meta = fs::metadata(dir).map_err(|e| InstallError::new(dir, format!("{flag}: {e}")))?;
    if !meta.is_dir() {
        return Err(InstallError::new(dir, format!("{flag}: not a directory")));
    }
    Ok(())
}

/// Installs the plugin, then the conflist, and returns what happened to each.
pub fn install(args: &InstallCniArgs) -> Result<Vec<(PathBuf, Outcome)>, InstallError> {
    let src = match &args.cni_bin {
        Some(p) => p.clone(),
        None => default_cni_bin()?,
    };
    // Everything that can be checked without writing is checked first, so bad input writes nothing.
    check_dir("--bin-dir", &args.bin_dir)?;
    check_dir("--conf-dir", &args.conf_dir)?;
    let src_meta = fs::metadata(&src).map_err(|e| InstallError::new(&src, format!("CNI plugin: {e}")))?;
    if !src_meta.is_file() {
        return Err(InstallError::new(&src, "CNI plugin: not a regular file"));
    }
    let binary = fs::read(&src).map_err(|e| InstallError::new(&src, format!("CNI plugin: {e}")))?;
    let conf = conflist(args);

    // The plugin goes first: a conflist that is visible before its plugin would make the kubelet
    // fail pod set-ups on this node.
    let bin_path = args.bin_dir.join(CNI_NAME);
    let bin = put_file(&bin_path, &binary, BIN_MODE)?;
    let conf_path = args.conf_dir.join(CONFLIST_NAME);
    let conf = put_file(&conf_path, conf.as_bytes(), CONF_MODE)?;
    Ok(vec![(bin_path, bin), (conf_path, conf)])
}

/// Makes `path` hold exactly `content` with `mode`, atomically: readers see the old file or the new one.
fn put_file(path: &Path, content: &[u8], mode: u32) -> Result<Outcome, InstallError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => {
            // Compared by content, not by size or time: an unchanged file is never rewritten, so a
            // restarted DaemonSet pod does not replace a plugin the kubelet may be executing.
            if fs::read(path).map_err(|e| InstallError::new(path, e))? == content {
                if meta.permissions().mode() & 0o7777 == mode {
                    return Ok(Outcome::Unchanged);
                }
                fs::set_permissions(path, Permissions::from_mode(mode))
                    .map_err(|e| InstallError::new(path, format!("cannot set mode {mode:o}: {e}")))?;
                return Ok(Outcome::ModeFixed);
            }
        }
        Ok(meta) if meta.is_dir() => return Err(InstallError::new(path, "is a directory")),
        // A symlink or any other file is replaced by the rename below.
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(InstallError::new(path, e)),
    }
    let dir = path
        .parent()
        .ok_or_else(|| InstallError::new(path, "has no parent directory"))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A dot-name with a `.tmp` suffix: container runtimes only load `*.conf`, `*.conflist` and
    // `*.json` from the configuration directory, so the temp file is never taken for a config.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| InstallError::new(dir, format!("cannot create a temp file: {e}")))?;
    let tmp_path = tmp.path().to_path_buf();
    let io_err = |e: io::Error| InstallError::new(&tmp_path, e);
    tmp.write_all(content).map_err(io_err)?;
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(io_err)?;
    tmp.as_file().sync_all().map_err(io_err)?;
    // On failure the temp file is dropped, which deletes it.
    tmp.persist(path)
        .map_err(|e| InstallError::new(path, format!("cannot rename into place: {}", e.error)))?;
    // The rename is only durable once the directory entry is.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| InstallError::new(dir, format!("cannot sync the directory: {e}")))?;
    Ok(Outcome::Written)
}
