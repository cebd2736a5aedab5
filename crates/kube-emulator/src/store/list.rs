//! Lists with label/field selectors and `limit`/`continue` paging.

use std::collections::HashMap;
use std::ops::Bound;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{EventType, ListOpts, ListPage, Objects, Store};
use crate::error::{ApiError, ApiResult};
use crate::resources::ResourceDef;

/// A continue token: where the next page starts and the version of the list's first page (its
/// snapshot, as far as expiry goes); `-1` is the real server's "inconsistent" token, which goes
/// on at whatever version is current.
fn encode_continue(ns: &str, name: &str, rv: i64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"ns": ns, "name": name, "rv": rv}).to_string())
}

fn decode_continue(token: &str) -> ApiResult<(String, String, i64)> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((
        v.get("ns").and_then(Value::as_str).ok_or_else(bad)?.to_string(),
        v.get("name").and_then(Value::as_str).ok_or_else(bad)?.to_string(),
        v.get("rv").and_then(Value::as_i64).ok_or_else(bad)?,
    ))
}

impl Store {
    pub fn list(&self, def: &ResourceDef, ns: Option<&str>, opts: &ListOpts) -> ApiResult<ListPage> {
        let continued = opts.continue_.as_deref().map(decode_continue).transpose()?;
        let mut st = self.lock();
        // Only a token that can expire uses up an asked-for compaction (not the inconsistent one).
        if continued.as_ref().is_some_and(|(_, _, first)| *first >= 0) && self.take_continued_compaction() {
            st.compact();
        }
        let key = def.storage_key();
        let mut rv = st.rv;
        // The pages of one list are its first page's snapshot, as the real server's are: they
        // carry that page's version (what a watch that follows the list starts from, and what
        // expires when history is compacted past it), and objects changed since are shown as
        // they were then. The history holds every change after a token that has not expired.
        let mut then: HashMap<(String, String), Option<Arc<Value>>> = HashMap::new();
        if let Some((cns, cname, first)) = &continued
            && *first >= 0
        {
            let first = u64::try_from(*first).unwrap_or_default();
            if first < st.history_start {
                return Err(ApiError::continue_expired(encode_continue(cns, cname, -1)));
            }
            rv = first;
            let later = st.history.partition_point(|e| e.1.rv <= first);
            for e in st.history.iter().skip(later).filter(|e| e.0 == key) {
                let name =
                    e.1.object
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                // Before its first change since: absent if that change created it.
                then.entry((e.1.ns.clone(), name.to_string()))
                    .or_insert_with(|| match e.1.type_ {
                        EventType::Added => None,
                        _ => Some(e.1.old.clone().unwrap_or_else(|| e.1.object.clone())),
                    });
            }
        }
        let empty = Objects::new();
        let objs = st.objects.get(&key).unwrap_or(&empty);
        let start = match continued {
            Some((cns, cname, _)) => Bound::Excluded((cns, cname)),
            None => Bound::Included((ns.unwrap_or_default().to_string(), String::new())),
        };
        let in_namespace = |(ons, _): &(String, String)| ns.is_none_or(|n| n == ons);
        let mut candidates: Vec<(&(String, String), &Arc<Value>)> = objs
            .range((start.clone(), Bound::Unbounded))
            .take_while(|(k, _)| in_namespace(k))
            .filter(|(k, _)| !then.contains_key(*k))
            .collect();
        if !then.is_empty() {
            let after_start = |k: &(String, String)| match &start {
                Bound::Excluded(s) => k > s,
                Bound::Included(s) => k >= s,
                Bound::Unbounded => true,
            };
            candidates.extend(
                then.iter()
                    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
                    .filter(|(k, _)| in_namespace(k) && after_start(k)),
            );
            candidates.sort_by(|a, b| a.0.cmp(b.0));
        }
        let mut iter = candidates
            .into_iter()
            .filter(|(_, obj)| opts.labels.matches(obj) && opts.fields.matches(obj));
        let mut items = Vec::new();
        let limit = opts.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut last = None;
        for (k, v) in iter.by_ref() {
            items.push(v.clone());
            last = Some(k.clone());
            if items.len() >= limit {
                break;
            }
        }
        let remaining = iter.count() as u64;
        let (continue_, remaining) = match (remaining, last) {
            (0, _) | (_, None) => (None, None),
            (n, Some((lns, lname))) => (
                Some(encode_continue(&lns, &lname, i64::try_from(rv).unwrap_or(-1))),
                Some(n),
            ),
        };
        Ok(ListPage {
            items,
            resource_version: rv,
            continue_,
            remaining,
        })
    }
}
