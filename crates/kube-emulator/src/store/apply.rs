//! Server-side apply: field ownership per manager, pruning what a manager stopped applying.

use serde_json::Value;

use super::write::check_body_identity;
use super::{State, Store, WriteOpts, WriteOutcome, meta_mut, meta_str, now};
use crate::error::{ApiError, ApiResult};
use crate::fields::{self, Entry};
use crate::patch;
use crate::resources::ResourceDef;

impl State {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        mut body: Value,
        status_only: bool,
        opts: &WriteOpts,
        store: &Store,
    ) -> ApiResult<WriteOutcome> {
        let Some(manager) = opts.field_manager.clone().filter(|m| !m.is_empty()) else {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml: fieldManager must be set",
            ));
        };
        check_body_identity(def, ns, name, &mut body)?;
        let rv = meta_str(&body, "resourceVersion").map(String::from);
        if let Some(Value::Object(m)) = body.get_mut("metadata") {
            m.remove("managedFields");
            m.remove("resourceVersion");
        }
        let mut applied = fields::set_of(&body, fields::Schema { builtin: !def.custom });
        if def.status_subresource {
            // The main resource ignores status and the status subresource everything else.
            applied.retain(|p| (p.first().map(String::as_str) == Some("f:status")) == status_only);
        }
        let subresource = if status_only { "status" } else { "" };
        let Some(cur) = self.get(def, ns, name) else {
            let entry = Entry {
                manager,
                operation: "Apply".into(),
                subresource: subresource.into(),
                api_version: def.api_version(),
                time: None,
                set: applied,
                touched: true,
            };
            meta_mut(&mut body).insert("managedFields".into(), fields::render(&[entry], &now()));
            return self.create(def, ns, body, opts, store);
        };
        if let Some(rv) = rv
            && Some(rv.as_str()) != meta_str(&cur, "resourceVersion")
        {
            return Err(ApiError::stale(&def.group, &def.plural, name));
        }
        let mut doc = (*cur).clone();
        // Fields this manager no longer applies go, unless another manager still owns them.
        let entries = fields::entries(&cur);
        let mine = |e: &&Entry| e.same_owner(&manager, "Apply", subresource);
        let last = entries
            .iter()
            .find(mine)
            .map(|e| e.set.clone())
            .unwrap_or_default();
        let others: Vec<&Entry> = entries.iter().filter(|e| !mine(e)).collect();
        fields::prune(&mut doc, &last, &applied, &others);
        if def.custom {
            // Custom resources: merge semantics (atomic lists), except ObjectMeta's keyed lists.
            let meta = match &mut body {
                Value::Object(m) => m.remove("metadata"),
                _ => None,
            };
            patch::merge_patch(&mut doc, &body)?;
            if let Some(meta) = meta {
                patch::strategic_merge(&mut doc["metadata"], &meta)?;
            }
        } else {
            patch::strategic_merge(&mut doc, &body)?
        }
        self.update_existing(def, ns, &cur, doc, status_only, opts, Some(applied), store)
    }
}
