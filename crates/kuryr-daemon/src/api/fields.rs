//! Checks of single request fields. Each is cheap (no I/O) and its error
//! names the field, so a bad request is answered before the daemon waits
//! for anything.

/// Longest path Linux takes (PATH_MAX).
const MAX_PATH: usize = 4096;
/// Longest DNS-1123 label (namespace names).
const MAX_LABEL: usize = 63;
/// Longest DNS-1123 subdomain (pod names).
const MAX_SUBDOMAIN: usize = 253;
/// Container runtimes use 64 hex digits; the CNI spec sets no limit, this
/// only bounds what a log line or an interface alias carries.
const MAX_CONTAINER_ID: usize = 256;
/// Pod UIDs are UUIDs (36) or, for static pods, 32 hex digits.
const MAX_UID: usize = 128;

fn dns1123_label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// `K8S_POD_NAMESPACE`: a DNS-1123 label, as Kubernetes requires.
pub fn namespace(v: &str) -> Result<(), String> {
    if v.len() > MAX_LABEL || !dns1123_label_chars(v) {
        return Err(format!(
            "K8S_POD_NAMESPACE {v:?} is not a namespace name (lower-case letters, digits and '-', at most {MAX_LABEL})"
        ));
    }
    Ok(())
}

/// `K8S_POD_NAME`: a DNS-1123 subdomain, as Kubernetes requires.
pub fn pod_name(v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > MAX_SUBDOMAIN || !v.split('.').all(dns1123_label_chars) {
        return Err(format!(
            "K8S_POD_NAME {v:?} is not a pod name (lower-case letters, digits, '-' and '.', at most {MAX_SUBDOMAIN})"
        ));
    }
    Ok(())
}

/// `K8S_POD_UID`: letters, digits and '-'.
pub fn pod_uid(v: &str) -> Result<(), String> {
    if v.len() > MAX_UID || !v.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-') {
        return Err(format!(
            "K8S_POD_UID {v:?} is not a pod UID (letters, digits and '-', at most {MAX_UID})"
        ));
    }
    Ok(())
}

/// `CNI_CONTAINERID`: the CNI spec's alphabet (a letter or digit first, then
/// letters, digits, '_', '.', '-').
pub fn container_id(v: &str) -> Result<(), String> {
    let ok = v.len() <= MAX_CONTAINER_ID
        && v.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && v.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if !ok {
        return Err(format!(
            "CNI_CONTAINERID {:?} is not a container ID (a letter or digit, then letters, digits, '_', '.', '-', at most {MAX_CONTAINER_ID})",
            truncated(v)
        ));
    }
    Ok(())
}

/// `CNI_NETNS`: an absolute path without `..` (the daemon may map it under
/// `netns_proc_dir`, which `..` would escape).
pub fn netns_path(v: &str) -> Result<(), String> {
    let why = if v.len() > MAX_PATH {
        Some("is longer than PATH_MAX")
    } else if !v.starts_with('/') {
        Some("is not an absolute path")
    } else if v.contains('\0') {
        Some("contains a NUL byte")
    } else if v.split('/').any(|c| c == "..") {
        Some("contains '..'")
    } else {
        None
    };
    match why {
        Some(why) => Err(format!("CNI_NETNS {:?} {why}", truncated(v))),
        None => Ok(()),
    }
}

/// `CNI_COMMAND` is informational (the path says what to do), but when set it
/// must be a CNI command.
pub fn command(v: &str) -> Result<(), String> {
    match v {
        "" | "ADD" | "DEL" | "CHECK" | "GC" | "STATUS" | "VERSION" => Ok(()),
        other => Err(format!("CNI_COMMAND {:?} is not a CNI command", truncated(other))),
    }
}

/// At most 64 characters of a value, for error messages.
fn truncated(v: &str) -> String {
    match v.char_indices().nth(64) {
        Some((i, _)) => format!("{}...", &v[..i]),
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_names_follow_dns1123() {
        assert!(namespace("kube-system").is_ok());
        assert!(namespace("a").is_ok());
        for bad in ["", "Kube", "-a", "a-", "a.b", &"a".repeat(64), "a b", "ä"] {
            assert!(
                namespace(bad).is_err_and(|e| e.contains("K8S_POD_NAMESPACE")),
                "{bad:?}"
            );
        }
        assert!(pod_name("web-0.x").is_ok());
        for bad in ["", "Web", "a..b", ".a", "a.", "a_b", &"a".repeat(254)] {
            assert!(
                pod_name(bad).is_err_and(|e| e.contains("K8S_POD_NAME")),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn container_ids_and_uids_use_their_alphabets() {
        assert!(container_id(&"0123abcdef".repeat(6)).is_ok());
        assert!(container_id("c1_a.b-c").is_ok());
        for bad in ["", "-c", "c/1", "c 1", "c;1", &"c".repeat(257)] {
            assert!(
                container_id(bad).is_err_and(|e| e.contains("CNI_CONTAINERID")),
                "{bad:?}"
            );
        }
        assert!(pod_uid("0b5e6a9c-1f7e-4b8e-9a5e-000000000000").is_ok());
        assert!(pod_uid("u/1").is_err_and(|e| e.contains("K8S_POD_UID")));
    }

    #[test]
    fn netns_paths_are_absolute_and_stay_put() {
        assert!(netns_path("/var/run/netns/cni-1").is_ok());
        assert!(netns_path("/proc/42/ns/net").is_ok());
        for bad in [
            "netns/x",
            "/proc/../etc/passwd",
            "/a\0b",
            &format!("/{}", "a".repeat(4096)),
        ] {
            assert!(netns_path(bad).is_err_and(|e| e.contains("CNI_NETNS")), "{bad:?}");
        }
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let e = container_id(&format!("-{}", "x".repeat(1000)))
            .err()
            .unwrap_or_default();
        assert!(e.len() < 300, "{e}");
        assert!(command("ADD").is_ok() && command("").is_ok());
        assert!(command("add").is_err_and(|e| e.contains("CNI_COMMAND")));
    }
}
