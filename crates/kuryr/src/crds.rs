//! `kuryr crds [--check] [DIR]`.

use std::process::ExitCode;

use kuryr_crds::generate;

use crate::cli::CrdsArgs;

pub fn run(args: &CrdsArgs) -> ExitCode {
    let dir = &args.dir;
    if args.check {
        return match generate::check_dir(dir) {
            Ok(drift) if drift.is_clean() => {
                println!("kuryr crds: {} is up to date", dir.display());
                ExitCode::SUCCESS
            }
            Ok(drift) => {
                eprintln!("kuryr crds: {} is out of date:\n{drift}", dir.display());
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("kuryr crds: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match generate::write_dir(dir) {
        Ok(files) => {
            for f in files {
                println!("wrote {}", dir.join(f).display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kuryr crds: {e}");
            ExitCode::FAILURE
        }
    }
}
