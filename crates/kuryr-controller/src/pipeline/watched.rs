//! The objects of the watches, read straight into a [`DynamicObject`].
//!
//! `DynamicObject`'s own `Deserialize` flattens its type fields and its data, and serde reads a
//! flattened struct by buffering every field of the object first (its `Content` tree), then
//! reading that again into the fields: each object is read twice. For the controller, which reads
//! every watch event of pods and KuryrPorts (and parses queued events again), that second read
//! was a tenth of its CPU in a burst. [`WatchedObject`] reads the same JSON in one pass: the type
//! fields and `metadata` into their types, every other top-level key into `data`.

use std::borrow::Cow;
use std::fmt;

use kube::api::{ApiResource, DynamicObject, ObjectMeta, TypeMeta};
use kube::core::DynamicResourceScope;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

/// A [`DynamicObject`] with a one-pass `Deserialize`; for `Api<WatchedObject>` and the watcher.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchedObject(pub DynamicObject);

impl<'de> Deserialize<'de> for WatchedObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ObjectVisitor)
    }
}

struct ObjectVisitor;

/// A top-level key: the three read into their types are matched without being copied.
enum Key {
    ApiVersion,
    Kind,
    Metadata,
    Other(String),
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl Visitor<'_> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(match key {
            "apiVersion" => Key::ApiVersion,
            "kind" => Key::Kind,
            "metadata" => Key::Metadata,
            other => Key::Other(other.to_owned()),
        })
    }

    fn visit_string<E: serde::de::Error>(self, key: String) -> Result<Key, E> {
        match key.as_str() {
            "apiVersion" | "kind" | "metadata" => self.visit_str(&key),
            _ => Ok(Key::Other(key)),
        }
    }
}

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = WatchedObject;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WatchedObject, A::Error> {
        let mut api_version: Option<String> = None;
        let mut kind: Option<String> = None;
        let mut metadata: Option<ObjectMeta> = None;
        let mut data = Map::new();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::ApiVersion => api_version = Some(map.next_value()?),
                Key::Kind => kind = Some(map.next_value()?),
                Key::Metadata => metadata = Some(map.next_value()?),
                Key::Other(key) => {
                    data.insert(key, map.next_value::<Value>()?);
                }
            }
        }
        // Like DynamicObject's: the type only when both of its fields are there; a lone one is
        // kept with the data rather than dropped.
        let types = match (api_version, kind) {
            (Some(api_version), Some(kind)) => Some(TypeMeta { api_version, kind }),
            (api_version, kind) => {
                if let Some(v) = api_version {
                    data.insert("apiVersion".into(), Value::String(v));
                }
                if let Some(k) = kind {
                    data.insert("kind".into(), Value::String(k));
                }
                None
            }
        };
        Ok(WatchedObject(DynamicObject {
            types,
            metadata: metadata.unwrap_or_default(),
            data: Value::Object(data),
        }))
    }
}

impl serde::Serialize for WatchedObject {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl kube::Resource for WatchedObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::kind(dt)
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::group(dt)
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::version(dt)
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::api_version(dt)
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        DynamicObject::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

/// Reads `json` as a [`DynamicObject`] in one pass.
pub fn from_str(json: &str) -> serde_json::Result<DynamicObject> {
    serde_json::from_str::<WatchedObject>(json).map(|o| o.0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn both_ways(v: Value) -> (DynamicObject, DynamicObject) {
        let text = v.to_string();
        let ours = from_str(&text).unwrap();
        let theirs: DynamicObject = serde_json::from_str(&text).unwrap();
        (ours, theirs)
    }

    #[test]
    fn reads_objects_as_dynamic_objects_own_deserialize_does() {
        let objects = [
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                    "labels": {"a": "b"}, "annotations": {"x": "{\"y\": [1, 2]}"},
                    "finalizers": ["kuryr.openstack.org/pod-finalizer"]},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
                "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.5"}]}
            }),
            json!({
                "metadata": {"name": "kp", "namespace": "ns"},
                "kind": "KuryrPort", "apiVersion": "openstack.org/v1",
                "spec": {"podUid": "u1", "podNodeName": "n1"},
                "status": {"vifs": {"eth0": {"default": true, "vif": {"versioned_object.data": {"id": "p1"}}}}}
            }),
            // No type fields (a list's items may come without them), no metadata.
            json!({"spec": {"x": 1}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}),
            // Unicode and escapes in keys and values.
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                "data": {"k\u{e9}y\n": "v\"al\u{2028}"}}),
        ];
        for o in objects {
            let (ours, theirs) = both_ways(o.clone());
            assert_eq!(ours, theirs, "{o}");
            assert_eq!(
                serde_json::to_value(&ours).unwrap(),
                serde_json::to_value(&theirs).unwrap()
            );
        }
    }

    #[test]
    fn a_lone_type_field_stays_with_the_data() {
        let o = from_str(r#"{"kind": "Pod", "metadata": {"name": "p"}, "spec": {}}"#).unwrap();
        assert_eq!(o.types, None);
        assert_eq!(o.data["kind"], "Pod");
        assert_eq!(o.metadata.name.as_deref(), Some("p"));
    }

    #[test]
    fn what_is_not_an_object_is_an_error_naming_the_field() {
        assert!(from_str("[1, 2]").is_err());
        let e = from_str(r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": 5}}"#).unwrap_err();
        assert!(e.to_string().contains("invalid type: integer `5`"), "{e}");
        assert!(from_str(r#"{"apiVersion": 1, "kind": "Pod"}"#).is_err());
    }

    #[test]
    fn watch_events_read_through_the_one_pass_path() {
        let line = r#"{"type": "MODIFIED", "object": {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "resourceVersion": "9"}, "spec": {"nodeName": "n"}}}"#;
        let ev: kube::api::WatchEvent<WatchedObject> = serde_json::from_str(line).unwrap();
        let kube::api::WatchEvent::Modified(WatchedObject(o)) = ev else {
            panic!("not a MODIFIED event")
        };
        assert_eq!(o.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(o.data["spec"]["nodeName"], "n");
    }
}
