//! Lists with label/field selectors and `limit`/`continue` paging.

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{ListOpts, ListPage, Store};
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
        let mut st = self.lock();
        if opts.continue_.is_some() && self.take_continued_compaction() {
            st.compact();
        }
        let mut rv = st.rv;
        // The pages of one list are served at the current state (no snapshots here), but they
        // keep the first page's version, as the real server's do: it is what a watch that
        // follows the list starts from, and what expires when history is compacted past it.
        let continued = opts.continue_.as_deref().map(decode_continue).transpose()?;
        if let Some((cns, cname, first)) = &continued
            && *first >= 0
        {
            let first = u64::try_from(*first).unwrap_or_default();
            if first < st.history_start {
                return Err(ApiError::continue_expired(encode_continue(cns, cname, -1)));
            }
            rv = first;
        }
        let Some(objs) = st.objects.get(&def.storage_key()) else {
            return Ok(ListPage {
                items: Vec::new(),
                resource_version: rv,
                continue_: None,
                remaining: None,
            });
        };
        let start = match continued {
            Some((cns, cname, _)) => std::ops::Bound::Excluded((cns, cname)),
            None => std::ops::Bound::Included((ns.unwrap_or_default().to_string(), String::new())),
        };
        let matches = |((ons, _), obj): &(&(String, String), &Arc<Value>)| {
            ns.is_none_or(|n| n == ons) && opts.labels.matches(obj) && opts.fields.matches(obj)
        };
        let mut iter = objs
            .range((start, std::ops::Bound::Unbounded))
            .take_while(|((ons, _), _)| ns.is_none_or(|n| n == ons))
            .filter(matches);
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
