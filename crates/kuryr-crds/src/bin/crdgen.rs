//! Writes (or with `--check`, verifies) the CRD manifests: `crdgen [--check] <dir>`.

use std::path::PathBuf;
use std::process::ExitCode;

use kuryr_crds::generate;

fn main() -> ExitCode {
    let mut check = false;
    let mut dir: Option<PathBuf> = None;
    for arg in std::env::args_os().skip(1) {
        match arg.to_str() {
            Some("--check") => check = true,
            Some("-h" | "--help") => {
                println!(
                    "usage: crdgen [--check] <dir>\n  writes one YAML per kuryr CRD into <dir>; --check only compares"
                );
                return ExitCode::SUCCESS;
            }
            _ if dir.is_none() => dir = Some(PathBuf::from(arg)),
            _ => {
                eprintln!("crdgen: unexpected argument {arg:?}; usage: crdgen [--check] <dir>");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("crdgen: missing output directory; usage: crdgen [--check] <dir>");
        return ExitCode::from(2);
    };
    if check {
        match generate::check_dir(&dir) {
            Ok(drift) if drift.is_clean() => {
                println!("crdgen: {} is up to date", dir.display());
                ExitCode::SUCCESS
            }
            Ok(drift) => {
                eprintln!("crdgen: {} is out of date:\n{drift}", dir.display());
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("crdgen: {e}");
                ExitCode::FAILURE
            }
        }
    } else {
        match generate::write_dir(&dir) {
            Ok(files) => {
                for f in files {
                    println!("wrote {}", dir.join(f).display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("crdgen: {e}");
                ExitCode::FAILURE
            }
        }
    }
}
