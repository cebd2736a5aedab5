//! kuryr-cni: the CNI plugin executable. It forwards every CNI call to the
//! kuryr daemon on the node and prints the CNI result; all the work happens
//! in the daemon. No async runtime: one blocking HTTP request per call.
//!
//! Daemon address: netconf `"kuryr_daemon"` (`http://host:port`, `host:port`,
//! `unix:///path` or `/path`), default `127.0.0.1:5036`. Timeout: netconf
//! `"kuryr_daemon_timeout"` seconds (default 180, longer than the daemon's
//! worst ADD with its defaults, shorter than the kubelet's 4 minutes); it is
//! sent in `config_kuryr`, and the daemon answers within it, so its 504
//! reaches the runtime.

mod cni;
mod http;
#[cfg(test)]
mod proptests;

use std::io::Read;

fn main() {
    let env = cni::Env::from_process();
    let mut stdin = Vec::new();
    // VERSION may come without stdin; a read error means an empty netconf.
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let (out, ok) = match cni::run(&env, &stdin) {
        Ok(Some(v)) => (Some(v), true),
        Ok(None) => (None, true),
        Err(e) => (Some(e.to_json()), false),
    };
    if let Some(v) = out {
        println!("{v}");
    }
    if !ok {
        std::process::exit(1);
    }
}
