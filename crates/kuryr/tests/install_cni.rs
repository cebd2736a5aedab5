//! `kuryr install-cni` against temp directories: content and modes of both files, idempotence,
//! atomicity (no temp files left, old content intact after a failure) and errors that name the path.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;

/// Upstream kuryr-kubernetes' `etc/cni/net.d/10-kuryr.conflist`, byte for byte.
const UPSTREAM_CONFLIST: &str = r#"{
  "name": "kuryr",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "kuryr-cni",
      "kuryr_conf": "/etc/kuryr/kuryr.conf",
      "debug": true
    }
  ]
}
"#;

struct Host {
    root: TempDir,
    src: PathBuf,
    bin: PathBuf,
    conf: PathBuf,
}

impl Host {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        // Readable by the unprivileged user of `unwritable_dir_as_non_root`.
        fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let src = root.path().join("kuryr-cni.src");
        fs::write(&src, b"#!/bin/sh\necho plugin v1\n").unwrap();
        fs::set_permissions(&src, fs::Permissions::from_mode(0o600)).unwrap();
        let bin = root.path().join("opt-cni-bin");
        let conf = root.path().join("etc-cni-net.d");
        fs::create_dir(&bin).unwrap();
        fs::create_dir(&conf).unwrap();
        Host { root, src, bin, conf }
    }

    /// `install-cni --cni-bin [2] --bin-dir [4] --conf-dir [6]`.
    fn args(&self) -> Vec<String> {
        vec![
            "install-cni".into(),
            "--cni-bin".into(),
            self.src.display().to_string(),
            "--bin-dir".into(),
            self.bin.display().to_string(),
            "--conf-dir".into(),
            self.conf.display().to_string(),
        ]
    }

    fn run(&self, extra: &[&str]) -> Output {
        kuryr(&self.args(), extra, None)
    }

    fn installed_bin(&self) -> PathBuf {
        self.bin.join("kuryr-cni")
    }

    fn installed_conf(&self) -> PathBuf {
        self.conf.join("10-kuryr.conflist")
    }
}

fn kuryr(args: &[String], extra: &[&str], uid: Option<u32>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kuryr"));
    cmd.args(args).args(extra);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    cmd.output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_ok(o: &Output) {
    assert!(
        o.status.success(),
        "failed: {}\n{}{}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

fn assert_fails_naming(o: &Output, path: &Path, reason: &str) {
    assert!(!o.status.success(), "should fail: {}", stdout(o));
    let err = stderr(o);
    assert!(
        err.contains(&path.display().to_string()),
        "no path {} in: {err}",
        path.display()
    );
    assert!(err.contains(reason), "no {reason:?} in: {err}");
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Every name in `dir`; a leftover temp file would show up here.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(p).unwrap().ino()
}

#[test]
fn installs_upstream_conflist_and_plugin_with_modes() {
    let h = Host::new();
    let o = h.run(&[]);
    assert_ok(&o);
    assert_eq!(fs::read_to_string(h.installed_conf()).unwrap(), UPSTREAM_CONFLIST);
    assert_eq!(fs::read(h.installed_bin()).unwrap(), fs::read(&h.src).unwrap());
    assert_eq!(mode(&h.installed_bin()), 0o755);
    assert_eq!(mode(&h.installed_conf()), 0o644);
    assert_eq!(names(&h.bin), ["kuryr-cni"]);
    assert_eq!(names(&h.conf), ["10-kuryr.conflist"]);
    assert!(stdout(&o).contains("installed"), "{}", stdout(&o));
    // The conflist is valid JSON with upstream's keys.
    let v: serde_json::Value = serde_json::from_str(UPSTREAM_CONFLIST).unwrap();
    assert_eq!(v["plugins"][0]["type"], "kuryr-cni");
}

#[test]
fn kuryr_rs_additions_only_with_their_options() {
    let h = Host::new();
    let o = h.run(&[
        "--kuryr-conf",
        "/etc/kuryr-rs/kuryr.conf",
        "--debug",
        "false",
        "--kuryr-daemon",
        "unix:///run/kuryr/daemon.sock",
        "--kuryr-daemon-timeout",
        "30",
    ]);
    assert_ok(&o);
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(h.installed_conf()).unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "name": "kuryr",
            "cniVersion": "0.3.1",
            "plugins": [{
                "type": "kuryr-cni",
                "kuryr_conf": "/etc/kuryr-rs/kuryr.conf",
                "debug": false,
                "kuryr_daemon": "unix:///run/kuryr/daemon.sock",
                "kuryr_daemon_timeout": 30
            }]
        })
    );
}

#[test]
fn second_run_changes_nothing_and_says_so() {
    let h = Host::new();
    assert_ok(&h.run(&[]));
    let (bin_ino, conf_ino) = (inode(&h.installed_bin()), inode(&h.installed_conf()));
    let o = h.run(&[]);
    assert_ok(&o);
    assert!(stdout(&o).contains("nothing changed"), "{}", stdout(&o));
    // Not rewritten: a rename would have given new inodes.
    assert_eq!(inode(&h.installed_bin()), bin_ino);
    assert_eq!(inode(&h.installed_conf()), conf_ino);

    // A new plugin replaces the old one (new inode, new bytes), the unchanged conflist stays.
    fs::write(&h.src, b"#!/bin/sh\necho plugin v2\n").unwrap();
    let o = h.run(&[]);
    assert_ok(&o);
    assert!(!stdout(&o).contains("nothing changed"));
    assert_eq!(
        fs::read(h.installed_bin()).unwrap(),
        b"#!/bin/sh\necho plugin v2\n"
    );
    assert_ne!(inode(&h.installed_bin()), bin_ino);
    assert_eq!(inode(&h.installed_conf()), conf_ino);

    // Same content with a wrong mode: only the mode is set.
    fs::set_permissions(h.installed_conf(), fs::Permissions::from_mode(0o600)).unwrap();
    let o = h.run(&[]);
    assert_ok(&o);
    assert!(stdout(&o).contains("fixed the mode"), "{}", stdout(&o));
    assert_eq!(mode(&h.installed_conf()), 0o644);
    assert_eq!(inode(&h.installed_conf()), conf_ino);
}

#[test]
fn default_plugin_is_the_one_next_to_kuryr() {
    // A copy of `kuryr` in its own directory, so the "next to the binary" lookup is under test control.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let exe = dir.path().join("kuryr");
    fs::copy(env!("CARGO_BIN_EXE_kuryr"), &exe).unwrap();
    let h = Host::new();
    let run = || {
        // A child another test thread forks between our copy's open and close inherits the
        // copy's write descriptor until it execs: the kernel refuses to run the copy meanwhile
        // (ETXTBSY), so that case is tried again.
        let mut tries = 0;
        loop {
            match Command::new(&exe)
                .args([
                    "install-cni",
                    "--bin-dir",
                    &h.bin.display().to_string(),
                    "--conf-dir",
                    &h.conf.display().to_string(),
                ])
                .output()
            {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                r => break r.unwrap(),
            }
        }
    };
    let o = run();
    assert_fails_naming(&o, &dir.path().join("kuryr-cni"), "No such file");
    assert!(names(&h.bin).is_empty() && names(&h.conf).is_empty());

    fs::write(dir.path().join("kuryr-cni"), b"next to kuryr").unwrap();
    assert_ok(&run());
    assert_eq!(fs::read(h.installed_bin()).unwrap(), b"next to kuryr");
}

#[test]
fn bad_input_names_the_path_and_writes_nothing() {
    // Missing source binary.
    let h = Host::new();
    let missing = h.root.path().join("no-such-kuryr-cni");
    let mut args = h.args();
    args[2] = missing.display().to_string();
    let o = kuryr(&args, &[], None);
    assert_fails_naming(&o, &missing, "No such file");
    assert!(names(&h.bin).is_empty() && names(&h.conf).is_empty());

    // Missing conf dir: the plugin is not installed either.
    let gone = h.root.path().join("no-such-dir");
    let mut args = h.args();
    args[6] = gone.display().to_string();
    let o = kuryr(&args, &[], None);
    assert_fails_naming(&o, &gone, "--conf-dir");
    assert!(names(&h.bin).is_empty());

    // A file where a directory is expected.
    let file = h.root.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let mut args = h.args();
    args[4] = file.display().to_string();
    let o = kuryr(&args, &[], None);
    assert_fails_naming(&o, &file, "not a directory");
    assert!(names(&h.conf).is_empty());

    // A directory where the conflist should go.
    fs::create_dir(h.installed_conf()).unwrap();
    let o = h.run(&[]);
    assert_fails_naming(&o, &h.installed_conf(), "is a directory");
    // The plugin went in whole; no temp file is left in either directory.
    assert_eq!(names(&h.bin), ["kuryr-cni"]);
    assert_eq!(names(&h.conf), ["10-kuryr.conflist"]);
}

#[test]
fn unwritable_target_keeps_the_old_file_and_leaves_no_temp_file() {
    let h = Host::new();
    assert_ok(&h.run(&[]));
    let old = fs::read(h.installed_conf()).unwrap();

    // An immutable conf dir (root ignores mode bits, not the immutable attribute). Skipped where
    // chattr is not available or the filesystem does not support it.
    let immutable = Command::new("chattr").arg("+i").arg(&h.conf).status();
    if matches!(immutable, Ok(s) if s.success()) {
        let o = h.run(&["--kuryr-conf", "/etc/other/kuryr.conf"]);
        let _ = Command::new("chattr").arg("-i").arg(&h.conf).status();
        assert_fails_naming(&o, &h.conf, "cannot create a temp file");
        assert_eq!(fs::read(h.installed_conf()).unwrap(), old);
        assert_eq!(names(&h.conf), ["10-kuryr.conflist"]);
    } else {
        eprintln!("chattr +i unavailable here: immutable-directory case skipped");
    }
}

#[test]
fn unwritable_dir_as_non_root() {
    // A 0555 directory refuses writes to everyone but root; as root the check runs the binary as
    // `nobody`, which is what a non-root installer would see.
    let h = Host::new();
    fs::set_permissions(&h.src, fs::Permissions::from_mode(0o644)).unwrap();
    let old_bin = b"old plugin".to_vec();
    fs::write(h.installed_bin(), &old_bin).unwrap();
    fs::set_permissions(h.installed_bin(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&h.bin, fs::Permissions::from_mode(0o555)).unwrap();
    let is_root = nix_uid() == 0;
    let o = kuryr(&h.args(), &[], is_root.then_some(65534));
    fs::set_permissions(&h.bin, fs::Permissions::from_mode(0o755)).unwrap();
    assert_fails_naming(&o, &h.bin, "Permission denied");
    assert_eq!(fs::read(h.installed_bin()).unwrap(), old_bin);
    assert_eq!(names(&h.bin), ["kuryr-cni"]);
    assert!(names(&h.conf).is_empty());
}

fn nix_uid() -> u32 {
    use std::os::unix::fs::MetadataExt as _;
    // The owner of a file this process just created is its effective uid.
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid()
}
