//! Lists with label/field selectors and `limit`/`continue` paging.

use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{ListOpts, ListPage, Store};
use crate::error::{ApiError, ApiResult};
use crate::resources::ResourceDef;

fn encode_continue(ns: &str, name: &str, rv: u64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"ns": ns, "name": name, "rv": rv}).to_string())
}

fn decode_continue(token: &str) -> ApiResult<(String, String)> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((
        v.get("ns").and_then(Value::as_str).ok_or_else(bad)?.to_string(),
        v.get("name").and_then(Value::as_str).ok_or_else(bad)?.to_string(),
    ))
}

impl Store {
    pub fn list(&self, def: &ResourceDef, ns: Option<&str>, opts: &ListOpts) -> ApiResult<ListPage> {
        let st = self.lock();
        let rv = st.rv;
        let Some(objs) = st.objects.get(&def.storage_key()) else {
            return Ok(ListPage {
                items: Vec::new(),
                resource_version: rv,
                continue_: None,
                remaining: None,
            });
        };
        let start = match &opts.continue_ {
            Some(token) => {
                let (cns, cname) = decode_continue(token)?;
                std::ops::Bound::Excluded((cns, cname))
            }
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
            (n, Some((lns, lname))) => (Some(encode_continue(&lns, &lname, rv)), Some(n)),
        };
        Ok(ListPage {
            items,
            resource_version: rv,
            continue_,
            remaining,
        })
    }
}
