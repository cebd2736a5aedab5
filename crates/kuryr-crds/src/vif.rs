//! The os-vif "versioned object" VIF model shared by the controller and the CNI daemon.
//!
//! Upstream kuryr-kubernetes stores VIFs as `oslo.versionedobjects` primitives:
//!
//! ```json
//! {"versioned_object.name": "VIFVlanNested", "versioned_object.namespace": "os_vif",
//!  "versioned_object.version": "1.0", "versioned_object.data": {...}}
//! ```
//!
//! Nested objects (`Network`, `Subnet`, ...) use the same envelope and object lists nest as
//! `{"versioned_object.data": {"objects": [...]}}`. Every type here (de)serializes to exactly that
//! shape. What this model cannot name is kept rather than dropped: unknown data fields land in
//! `extra`, the envelope's `versioned_object.changes` and version are remembered in [`ObjMeta`], so
//! an object written by upstream survives a read-modify-write by kuryr-rs.

use std::fmt;
use std::net::IpAddr;

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// `versioned_object.namespace` of every object kuryr exchanges (kuryr's own VIF classes
/// inherit it from os-vif's `VIFBase`).
pub const OS_VIF_NAMESPACE: &str = "os_vif";

/// Upstream's limit: kernel `IFNAMSIZ` (16) minus the NUL and room for nothing else, so
/// `tap` + 11 characters of the port id.
const VIF_NAME_ID_CHARS: usize = 11;

/// Host-side interface name upstream derives from a Neutron port id: `"tap"` + the first
/// 11 characters of the id (`tap18f968a5-c4`).
pub fn vif_name_for_port(port_id: &str) -> String {
    let mut name = String::from("tap");
    name.extend(port_id.chars().take(VIF_NAME_ID_CHARS));
    name
}

/// Errors converting VIF JSON.
#[derive(Debug, thiserror::Error)]
pub enum VifError {
    #[error("invalid os-vif object: {0}")]
    Json(#[from] serde_json::Error),
    /// A value read from the wire that does not fit, with the path to it.
    #[error("invalid os-vif object: {0}")]
    Invalid(String),
    #[error("invalid CIDR {value:?} in {field}: {reason}")]
    Cidr {
        field: &'static str,
        value: String,
        reason: String,
    },
}

/// Envelope metadata of one versioned object as it was read (or `None`s for objects built in
/// Rust, which then serialize with this crate's version of the type and no change list).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjMeta {
    /// `versioned_object.version` read from the wire; `None` means the type's current version.
    pub version: Option<String>,
    /// `versioned_object.changes` (oslo's set of changed fields), kept verbatim when present.
    pub changes: Option<Vec<String>>,
}

/// An os-vif object type: its registered name and the version this crate writes.
pub trait VersionedObject: Sized {
    const NAME: &'static str;
    const VERSION: &'static str;
    fn meta(&self) -> &ObjMeta;
    fn meta_mut(&mut self) -> &mut ObjMeta;
}

#[derive(Serialize)]
struct EnvelopeOut<'a, D: Serialize> {
    #[serde(rename = "versioned_object.name")]
    name: &'a str,
    #[serde(rename = "versioned_object.namespace")]
    namespace: &'a str,
    #[serde(rename = "versioned_object.version")]
    version: &'a str,
    #[serde(rename = "versioned_object.changes", skip_serializing_if = "Option::is_none")]
    changes: Option<&'a Vec<String>>,
    #[serde(rename = "versioned_object.data")]
    data: &'a D,
}

#[derive(Deserialize)]
struct EnvelopeIn<D> {
    #[serde(rename = "versioned_object.name")]
    name: String,
    #[serde(rename = "versioned_object.namespace")]
    namespace: String,
    #[serde(rename = "versioned_object.version")]
    version: String,
    #[serde(rename = "versioned_object.changes", default)]
    changes: Option<Vec<String>>,
    #[serde(rename = "versioned_object.data")]
    data: D,
}

/// oslo refuses a primitive whose major version differs from its own; so do we.
fn check_envelope(
    expected_name: &str,
    our_version: &str,
    name: &str,
    namespace: &str,
    version: &str,
) -> Result<(), String> {
    if name != expected_name {
        return Err(format!(
            "versioned_object.name: expected {expected_name:?}, got {name:?}"
        ));
    }
    if namespace != OS_VIF_NAMESPACE {
        return Err(format!(
            "{name}: versioned_object.namespace: expected {OS_VIF_NAMESPACE:?}, got {namespace:?}"
        ));
    }
    let major = |v: &str| v.split('.').next().map(str::to_owned);
    if major(version).is_none_or(|m| Some(m) != major(our_version)) || version.is_empty() {
        return Err(format!(
            "{name}: versioned_object.version {version:?} is incompatible with {our_version:?}"
        ));
    }
    Ok(())
}

fn parse_envelope<T: VersionedObject + DeserializeOwned>(env: EnvelopeIn<Value>) -> Result<T, String> {
    check_envelope(T::NAME, T::VERSION, &env.name, &env.namespace, &env.version)?;
    let mut obj: T =
        from_value_at(env.data).map_err(|e| format!("{}: versioned_object.data: {e}", T::NAME))?;
    *obj.meta_mut() = ObjMeta {
        version: Some(env.version),
        changes: env.changes,
    };
    Ok(obj)
}

fn write_envelope<T, S>(obj: &T, name: &str, version: &str, s: S) -> Result<S::Ok, S::Error>
where
    T: VersionedObject + Serialize,
    S: Serializer,
{
    EnvelopeOut {
        name,
        namespace: OS_VIF_NAMESPACE,
        version: obj.meta().version.as_deref().unwrap_or(version),
        changes: obj.meta().changes.as_ref(),
        data: obj,
    }
    .serialize(s)
}

/// Serializes `&T` as a complete envelope.
struct Wrapped<'a, T>(&'a T);

impl<T: VersionedObject + Serialize> Serialize for Wrapped<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        write_envelope(self.0, T::NAME, T::VERSION, s)
    }
}

/// Deserializes a complete envelope into `T`.
struct Unwrapped<T>(T);

impl<'de, T: VersionedObject + DeserializeOwned> Deserialize<'de> for Unwrapped<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Data is parsed only after the envelope checks out, so a wrong object type is
        // reported as such rather than as a missing field.
        let env = EnvelopeIn::<Value>::deserialize(d)?;
        parse_envelope(env).map(Unwrapped).map_err(D::Error::custom)
    }
}

/// `#[serde(with = "enveloped")]` for a field holding a versioned object.
mod enveloped {
    use super::*;

    pub fn serialize<T, S>(v: &T, s: S) -> Result<S::Ok, S::Error>
    where
        T: VersionedObject + Serialize,
        S: Serializer,
    {
        Wrapped(v).serialize(s)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: VersionedObject + DeserializeOwned,
        D: Deserializer<'de>,
    {
        Unwrapped::<T>::deserialize(d).map(|u| u.0)
    }
}

/// `#[serde(with = "enveloped_opt")]` for an optional versioned object (absent or `null`).
mod enveloped_opt {
    use super::*;

    pub fn serialize<T, S>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error>
    where
        T: VersionedObject + Serialize,
        S: Serializer,
    {
        v.as_ref().map(Wrapped).serialize(s)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: VersionedObject + DeserializeOwned,
        D: Deserializer<'de>,
    {
        Ok(Option::<Unwrapped<T>>::deserialize(d)?.map(|u| u.0))
    }
}

/// Serializes a value as the full envelope JSON (oslo's `obj_to_primitive`).
pub fn to_primitive<T: VersionedObject + Serialize>(obj: &T) -> Result<Value, VifError> {
    Ok(serde_json::to_value(Wrapped(obj))?)
}

/// Parses the full envelope JSON (oslo's `obj_from_primitive`).
pub fn from_primitive<T: VersionedObject + DeserializeOwned>(value: Value) -> Result<T, VifError> {
    from_value_at::<Unwrapped<T>>(value)
        .map(|u| u.0)
        .map_err(VifError::Invalid)
}

/// `serde_json::from_value`, with the path to a value that does not fit in
/// front of the message (`subnets.objects[0].cidr: invalid type ...`).
fn from_value_at<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    let copy = value.clone();
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path != "." {
            return format!("{path}: {inner}");
        }
        match culprit_key::<T>(&copy) {
            Some(key) => format!("{key}: {inner}"),
            None => inner.to_string(),
        }
    })
}

/// The key of `value` a flattened field rejected (serde loses the path
/// through `#[serde(flatten)]`): the one whose removal makes the object
/// read, or turns the error into that key missing. Only runs on errors.
fn culprit_key<T: DeserializeOwned>(value: &Value) -> Option<String> {
    let Value::Object(m) = value else { return None };
    m.keys()
        .find(|k| {
            let mut without = m.clone();
            without.remove(k.as_str());
            match serde_json::from_value::<T>(Value::Object(without)) {
                Ok(_) => true,
                Err(e) => e.to_string().contains(&format!("missing field `{k}`")),
            }
        })
        .cloned()
}

/// Element type of an os-vif object list, naming the list class.
pub trait ListItem: VersionedObject {
    const LIST_NAME: &'static str;
    const LIST_VERSION: &'static str;
}

/// An os-vif `ObjectListBase` (`SubnetList`, `FixedIPList`, `RouteList`).
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectList<T> {
    pub objects: Vec<T>,
    pub obj: ObjMeta,
}

impl<T> Default for ObjectList<T> {
    fn default() -> Self {
        Self {
            objects: Vec::new(),
            obj: ObjMeta::default(),
        }
    }
}

impl<T> From<Vec<T>> for ObjectList<T> {
    fn from(objects: Vec<T>) -> Self {
        Self {
            objects,
            obj: ObjMeta::default(),
        }
    }
}

impl<T: ListItem> VersionedObject for ObjectList<T> {
    const NAME: &'static str = T::LIST_NAME;
    const VERSION: &'static str = T::LIST_VERSION;
    fn meta(&self) -> &ObjMeta {
        &self.obj
    }
    fn meta_mut(&mut self) -> &mut ObjMeta {
        &mut self.obj
    }
}

impl<T: VersionedObject + Serialize> Serialize for ObjectList<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Data<'a, T: VersionedObject + Serialize> {
            objects: Vec<Wrapped<'a, T>>,
        }
        Data {
            objects: self.objects.iter().map(Wrapped).collect(),
        }
        .serialize(s)
    }
}

impl<'de, T: VersionedObject + DeserializeOwned> Deserialize<'de> for ObjectList<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(bound = "T: VersionedObject + DeserializeOwned")]
        struct Data<T> {
            #[serde(default = "Vec::new")]
            objects: Vec<Unwrapped<T>>,
        }
        let data = Data::<T>::deserialize(d)?;
        Ok(Self {
            objects: data.objects.into_iter().map(|u| u.0).collect(),
            obj: ObjMeta::default(),
        })
    }
}

macro_rules! versioned {
    ($ty:ty, $name:literal, $version:literal) => {
        impl VersionedObject for $ty {
            const NAME: &'static str = $name;
            const VERSION: &'static str = $version;
            fn meta(&self) -> &ObjMeta {
                &self.obj
            }
            fn meta_mut(&mut self) -> &mut ObjMeta {
                &mut self.obj
            }
        }
    };
}

/// os-vif `FixedIP` 1.0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FixedIp {
    pub address: IpAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floating_ips: Option<Vec<IpAddr>>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(FixedIp, "FixedIP", "1.0");
impl ListItem for FixedIp {
    const LIST_NAME: &'static str = "FixedIPList";
    const LIST_VERSION: &'static str = "1.0";
}
pub type FixedIpList = ObjectList<FixedIp>;

impl FixedIp {
    pub fn new(address: IpAddr) -> Self {
        Self {
            address,
            floating_ips: None,
            extra: Map::new(),
            obj: ObjMeta::default(),
        }
    }
}

/// os-vif `Route` 1.0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Route {
    /// Destination, e.g. `10.0.0.0/8`.
    pub cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(Route, "Route", "1.0");
impl ListItem for Route {
    const LIST_NAME: &'static str = "RouteList";
    const LIST_VERSION: &'static str = "1.0";
}
pub type RouteList = ObjectList<Route>;

impl Route {
    pub fn new(cidr: impl Into<String>, gateway: Option<IpAddr>) -> Self {
        Self {
            cidr: cidr.into(),
            gateway,
            interface: None,
            extra: Map::new(),
            obj: ObjMeta::default(),
        }
    }
}

/// os-vif `Subnet` 1.0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Subnet {
    /// e.g. `10.11.9.0/24`; see [`parse_cidr`].
    pub cidr: String,
    #[serde(default)]
    pub dns: Vec<IpAddr>,
    /// Absent for subnets without a gateway (`gateway_ip: null` in Neutron).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    #[serde(with = "enveloped", default)]
    pub ips: FixedIpList,
    #[serde(with = "enveloped", default)]
    pub routes: RouteList,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp_server: Option<IpAddr>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(Subnet, "Subnet", "1.0");
impl ListItem for Subnet {
    const LIST_NAME: &'static str = "SubnetList";
    const LIST_VERSION: &'static str = "1.0";
}
pub type SubnetList = ObjectList<Subnet>;

impl Subnet {
    pub fn new(cidr: impl Into<String>, gateway: Option<IpAddr>) -> Self {
        Self {
            cidr: cidr.into(),
            dns: Vec::new(),
            gateway,
            ips: FixedIpList::default(),
            routes: RouteList::default(),
            dhcp_server: None,
            extra: Map::new(),
            obj: ObjMeta::default(),
        }
    }

    /// The subnet's CIDR as (network address, prefix length).
    pub fn parsed_cidr(&self) -> Result<(IpAddr, u8), VifError> {
        parse_cidr("Subnet.cidr", &self.cidr)
    }
}

/// Parses `addr/prefix`, checking the prefix fits the address family. `field` names the value
/// in the error.
pub fn parse_cidr(field: &'static str, value: &str) -> Result<(IpAddr, u8), VifError> {
    let err = |reason: &str| VifError::Cidr {
        field,
        value: value.to_owned(),
        reason: reason.to_owned(),
    };
    let (addr, prefix) = value.split_once('/').ok_or_else(|| err("missing '/prefix'"))?;
    let addr: IpAddr = addr.parse().map_err(|_| err("bad address"))?;
    let prefix: u8 = prefix.parse().map_err(|_| err("bad prefix length"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(err("prefix length too large for the address family"));
    }
    Ok((addr, prefix))
}

/// os-vif `Network` 1.1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Neutron network id.
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(with = "enveloped", default)]
    pub subnets: SubnetList,
    #[serde(default)]
    pub multi_host: bool,
    #[serde(default)]
    pub should_provide_bridge: bool,
    #[serde(default)]
    pub should_provide_vlan: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_interface: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(Network, "Network", "1.1");

impl Network {
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            bridge: None,
            label: None,
            subnets: SubnetList::default(),
            multi_host: false,
            should_provide_bridge: false,
            should_provide_vlan: false,
            bridge_interface: None,
            vlan: None,
            mtu: None,
            extra: Map::new(),
            obj: ObjMeta::default(),
        }
    }
}

/// A port profile (`VIFPortProfileOpenVSwitch`, ...). Kept generic because its version differs
/// between os-vif releases and kuryr only ever reads `interface_id`.
#[derive(Clone, Debug, PartialEq)]
pub struct PortProfile {
    pub name: String,
    pub version: String,
    pub changes: Option<Vec<String>>,
    pub data: Map<String, Value>,
}

impl PortProfile {
    /// `VIFPortProfileOpenVSwitch` naming the Neutron port as the OVS `iface-id`. Version 1.0:
    /// only 1.0 fields are set, and every os-vif release accepts 1.0.
    pub fn open_vswitch(interface_id: impl Into<String>) -> Self {
        let mut data = Map::new();
        data.insert("interface_id".into(), Value::String(interface_id.into()));
        Self {
            name: "VIFPortProfileOpenVSwitch".into(),
            version: "1.0".into(),
            changes: None,
            data,
        }
    }

    pub fn interface_id(&self) -> Option<&str> {
        self.data.get("interface_id").and_then(Value::as_str)
    }
}

impl Serialize for PortProfile {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EnvelopeOut {
            name: &self.name,
            namespace: OS_VIF_NAMESPACE,
            version: &self.version,
            changes: self.changes.as_ref(),
            data: &self.data,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for PortProfile {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let env = EnvelopeIn::<Map<String, Value>>::deserialize(d)?;
        if !env.name.starts_with("VIFPortProfile") {
            return Err(D::Error::custom(format!(
                "port_profile: versioned_object.name {:?} is not a VIFPortProfile*",
                env.name
            )));
        }
        if env.namespace != OS_VIF_NAMESPACE {
            return Err(D::Error::custom(format!(
                "port_profile: versioned_object.namespace: expected {OS_VIF_NAMESPACE:?}, got {:?}",
                env.namespace
            )));
        }
        Ok(Self {
            name: env.name,
            version: env.version,
            changes: env.changes,
            data: env.data,
        })
    }
}

fn default_true() -> bool {
    true
}

/// Fields of os-vif `VIFBase` plus `vif_name`, which every VIF class kuryr uses adds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VifBase {
    /// Neutron port id.
    pub id: String,
    /// MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(with = "enveloped_opt", default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// os-vif plugin (`noop`, `ovs`, `linux_bridge`).
    pub plugin: String,
    #[serde(default = "default_true")]
    pub active: bool,
    #[serde(default)]
    pub preserve_on_delete: bool,
    #[serde(default)]
    pub has_traffic_filtering: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_profile: Option<PortProfile>,
    /// Host-side device name, normally [`vif_name_for_port`].
    pub vif_name: String,
    /// Data fields this model does not know, kept for round trips.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl VifBase {
    pub fn new(id: impl Into<String>, plugin: impl Into<String>) -> Self {
        let id = id.into();
        Self {
            vif_name: vif_name_for_port(&id),
            id,
            address: None,
            network: None,
            plugin: plugin.into(),
            active: false,
            preserve_on_delete: false,
            has_traffic_filtering: false,
            port_profile: None,
            extra: Map::new(),
        }
    }
}

/// os-vif `VIFOpenVSwitch` 1.0 (bare metal, OVS agent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VifOpenVSwitch {
    #[serde(flatten)]
    pub base: VifBase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_name: Option<String>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(VifOpenVSwitch, "VIFOpenVSwitch", "1.0");

/// os-vif `VIFBridge` 1.0 (bare metal, hybrid plug or linux bridge).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VifBridge {
    #[serde(flatten)]
    pub base: VifBase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_name: Option<String>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(VifBridge, "VIFBridge", "1.0");

/// kuryr `VIFVlanNested` 1.0 (trunk subport inside a VM).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VifVlanNested {
    #[serde(flatten)]
    pub base: VifBase,
    pub vlan_id: u16,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(VifVlanNested, "VIFVlanNested", "1.0");

/// kuryr `VIFMacvlanNested` 1.0 (allowed-address-pair port on a VM's port).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VifMacvlanNested {
    #[serde(flatten)]
    pub base: VifBase,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(VifMacvlanNested, "VIFMacvlanNested", "1.0");

/// kuryr `VIFSriov` 1.1 (extends os-vif `VIFDirect`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VifSriov {
    #[serde(flatten)]
    pub base: VifBase,
    /// PCI address of the VF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_address: Option<String>,
    /// `VIFDirect` mode (`vepa`, `passthrough`, `bridge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_link: Option<String>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(VifSriov, "VIFSriov", "1.1");

/// kuryr `VIFDPDKNested` 1.0 (extends os-vif `VIFNestedDPDK`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VifDpdkNested {
    #[serde(flatten)]
    pub base: VifBase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// Driver the device was bound to before DPDK took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_driver: Option<String>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(VifDpdkNested, "VIFDPDKNested", "1.0");

/// os-vif `VIFVHostUser` 1.1 (kuryr's OVS-DPDK `vhostuser_mode` ports).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VifVHostUser {
    #[serde(flatten)]
    pub base: VifBase,
    /// UNIX socket path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Socket mode (`client` or `server`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Upstream also sets `bridge_name` on it; kept here for round trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge_name: Option<String>,
    #[serde(skip)]
    pub obj: ObjMeta,
}
versioned!(VifVHostUser, "VIFVHostUser", "1.1");

/// A VIF of any type kuryr produces. (De)serializes as the full os-vif envelope.
#[derive(Clone, Debug, PartialEq)]
pub enum Vif {
    OpenVSwitch(VifOpenVSwitch),
    Bridge(VifBridge),
    VlanNested(VifVlanNested),
    MacvlanNested(VifMacvlanNested),
    Sriov(VifSriov),
    DpdkNested(VifDpdkNested),
    VHostUser(VifVHostUser),
}

/// Dispatches on the variant, binding the inner value.
macro_rules! each_vif {
    ($self:expr, $v:ident => $body:expr) => {
        match $self {
            Vif::OpenVSwitch($v) => $body,
            Vif::Bridge($v) => $body,
            Vif::VlanNested($v) => $body,
            Vif::MacvlanNested($v) => $body,
            Vif::Sriov($v) => $body,
            Vif::DpdkNested($v) => $body,
            Vif::VHostUser($v) => $body,
        }
    };
}

/// Object names [`Vif`] accepts.
pub const VIF_OBJECT_NAMES: [&str; 7] = [
    VifOpenVSwitch::NAME,
    VifBridge::NAME,
    VifVlanNested::NAME,
    VifMacvlanNested::NAME,
    VifSriov::NAME,
    VifDpdkNested::NAME,
    VifVHostUser::NAME,
];

impl Vif {
    /// `versioned_object.name` of this VIF.
    pub fn object_name(&self) -> &'static str {
        fn name<T: VersionedObject>(_: &T) -> &'static str {
            T::NAME
        }
        each_vif!(self, v => name(v))
    }

    pub fn base(&self) -> &VifBase {
        each_vif!(self, v => &v.base)
    }

    pub fn base_mut(&mut self) -> &mut VifBase {
        each_vif!(self, v => &mut v.base)
    }

    pub fn meta(&self) -> &ObjMeta {
        each_vif!(self, v => &v.obj)
    }

    /// Neutron port id.
    pub fn id(&self) -> &str {
        &self.base().id
    }

    pub fn vif_name(&self) -> &str {
        &self.base().vif_name
    }

    pub fn address(&self) -> Option<&str> {
        self.base().address.as_deref()
    }

    pub fn active(&self) -> bool {
        self.base().active
    }

    pub fn network(&self) -> Option<&Network> {
        self.base().network.as_ref()
    }

    /// VLAN id of a nested VLAN VIF.
    pub fn vlan_id(&self) -> Option<u16> {
        match self {
            Vif::VlanNested(v) => Some(v.vlan_id),
            _ => None,
        }
    }

    /// Every fixed IP of the VIF with the subnet it belongs to.
    pub fn fixed_ips(&self) -> impl Iterator<Item = (&Subnet, IpAddr)> {
        self.network()
            .into_iter()
            .flat_map(|n| n.subnets.objects.iter())
            .flat_map(|s| s.ips.objects.iter().map(move |ip| (s, ip.address)))
    }

    /// The envelope JSON (what upstream stores in KuryrPort status and returns from `/addNetwork`).
    pub fn to_primitive(&self) -> Result<Value, VifError> {
        Ok(serde_json::to_value(self)?)
    }

    pub fn from_primitive(value: Value) -> Result<Self, VifError> {
        from_value_at(value).map_err(VifError::Invalid)
    }
}

impl Serialize for Vif {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        each_vif!(self, v => Wrapped(v).serialize(s))
    }
}

impl<'de> Deserialize<'de> for Vif {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let env = EnvelopeIn::<Value>::deserialize(d)?;
        let vif = match env.name.as_str() {
            VifOpenVSwitch::NAME => parse_envelope(env).map(Vif::OpenVSwitch),
            VifBridge::NAME => parse_envelope(env).map(Vif::Bridge),
            VifVlanNested::NAME => parse_envelope(env).map(Vif::VlanNested),
            VifMacvlanNested::NAME => parse_envelope(env).map(Vif::MacvlanNested),
            VifSriov::NAME => parse_envelope(env).map(Vif::Sriov),
            VifDpdkNested::NAME => parse_envelope(env).map(Vif::DpdkNested),
            VifVHostUser::NAME => parse_envelope(env).map(Vif::VHostUser),
            other => Err(format!(
                "versioned_object.name {other:?} is not a supported VIF type (expected one of {})",
                VIF_OBJECT_NAMES.join(", ")
            )),
        };
        vif.map_err(D::Error::custom)
    }
}

impl fmt::Display for Vif {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({}, {})", self.object_name(), self.id(), self.vif_name())
    }
}

impl From<VifOpenVSwitch> for Vif {
    fn from(v: VifOpenVSwitch) -> Self {
        Vif::OpenVSwitch(v)
    }
}
impl From<VifBridge> for Vif {
    fn from(v: VifBridge) -> Self {
        Vif::Bridge(v)
    }
}
impl From<VifVlanNested> for Vif {
    fn from(v: VifVlanNested) -> Self {
        Vif::VlanNested(v)
    }
}
impl From<VifMacvlanNested> for Vif {
    fn from(v: VifMacvlanNested) -> Self {
        Vif::MacvlanNested(v)
    }
}
impl From<VifSriov> for Vif {
    fn from(v: VifSriov) -> Self {
        Vif::Sriov(v)
    }
}
impl From<VifVHostUser> for Vif {
    fn from(v: VifVHostUser) -> Self {
        Vif::VHostUser(v)
    }
}
impl From<VifDpdkNested> for Vif {
    fn from(v: VifDpdkNested) -> Self {
        Vif::DpdkNested(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn vif_name_is_tap_plus_eleven_chars() {
        assert_eq!(
            vif_name_for_port("18f968a5-c420-4318-92d7-941eb5f9e60e"),
            "tap18f968a5-c4"
        );
        assert_eq!(vif_name_for_port("abc"), "tapabc");
        assert!(vif_name_for_port("18f968a5-c420-4318-92d7-941eb5f9e60e").len() < 16);
    }

    #[test]
    fn cidr_parsing_checks_prefix() {
        assert_eq!(
            parse_cidr("x", "10.0.0.0/24").ok(),
            Some((IpAddr::from([10, 0, 0, 0]), 24))
        );
        assert!(parse_cidr("x", "10.0.0.0/33").is_err());
        assert!(parse_cidr("x", "fd00::/64").is_ok());
        let err = parse_cidr("Subnet.cidr", "10.0.0.0").err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("invalid CIDR \"10.0.0.0\" in Subnet.cidr: missing '/prefix'")
        );
    }

    #[test]
    fn wrong_namespace_and_major_version_are_rejected() {
        let fixed = |ns: &str, ver: &str| {
            json!({"versioned_object.name": "FixedIP", "versioned_object.namespace": ns,
                   "versioned_object.version": ver, "versioned_object.data": {"address": "10.0.0.1"}})
        };
        assert!(from_primitive::<FixedIp>(fixed("os_vif", "1.0")).is_ok());
        assert!(from_primitive::<FixedIp>(fixed("os_vif", "1.7")).is_ok());
        assert!(from_primitive::<FixedIp>(fixed("nova", "1.0")).is_err());
        assert!(from_primitive::<FixedIp>(fixed("os_vif", "2.0")).is_err());
        let wrong_name = json!({"versioned_object.name": "Route", "versioned_object.namespace": "os_vif",
                   "versioned_object.version": "1.0", "versioned_object.data": {"cidr": "0.0.0.0/0"}});
        let err = from_primitive::<FixedIp>(wrong_name).err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("expected \"FixedIP\"")),
            "{err:?}"
        );
    }

    #[test]
    fn unknown_vif_type_names_the_type() {
        let v = json!({"versioned_object.name": "VIFGeneric", "versioned_object.namespace": "os_vif",
                       "versioned_object.version": "1.1", "versioned_object.data": {}});
        let err = Vif::from_primitive(v).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("\"VIFGeneric\" is not a supported VIF type")),
            "{err:?}"
        );
    }

    #[test]
    fn missing_vlan_id_is_reported_with_the_type() {
        let v = json!({"versioned_object.name": "VIFVlanNested", "versioned_object.namespace": "os_vif",
                       "versioned_object.version": "1.0",
                       "versioned_object.data": {"id": "p", "plugin": "noop", "vif_name": "tapp"}});
        let err = Vif::from_primitive(v).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("VIFVlanNested") && e.contains("vlan_id")),
            "{err:?}"
        );
    }

    #[test]
    fn built_vif_serializes_with_current_versions_and_no_changes() -> Result<(), VifError> {
        let mut subnet = Subnet::new("10.0.0.0/24", Some(IpAddr::from([10, 0, 0, 1])));
        subnet.ips.objects.push(FixedIp::new(IpAddr::from([10, 0, 0, 5])));
        let mut net = Network::new("net-1");
        net.mtu = Some(1450);
        net.subnets.objects.push(subnet);
        let mut base = VifBase::new("18f968a5-c420-4318-92d7-941eb5f9e60e", "noop");
        base.network = Some(net);
        base.address = Some("fa:16:3e:00:00:01".into());
        let vif = Vif::VlanNested(VifVlanNested {
            base,
            vlan_id: 42,
            obj: ObjMeta::default(),
        });
        let v = vif.to_primitive()?;
        assert_eq!(v["versioned_object.name"], "VIFVlanNested");
        assert_eq!(v["versioned_object.version"], "1.0");
        assert!(v.get("versioned_object.changes").is_none());
        let data = &v["versioned_object.data"];
        assert_eq!(data["vif_name"], "tap18f968a5-c4");
        assert_eq!(data["vlan_id"], 42);
        assert_eq!(data["network"]["versioned_object.version"], "1.1");
        let subnets = &data["network"]["versioned_object.data"]["subnets"];
        assert_eq!(subnets["versioned_object.name"], "SubnetList");
        let ip = &subnets["versioned_object.data"]["objects"][0]["versioned_object.data"]["ips"]["versioned_object.data"]
            ["objects"][0];
        assert_eq!(ip["versioned_object.name"], "FixedIP");
        assert_eq!(ip["versioned_object.data"]["address"], "10.0.0.5");
        // and it reads back equal, apart from the remembered envelope versions
        let back = Vif::from_primitive(v.clone())?;
        assert_eq!(back.to_primitive()?, v);
        assert_eq!(back.vlan_id(), Some(42));
        assert_eq!(
            back.fixed_ips().map(|(_, ip)| ip).collect::<Vec<_>>(),
            vec![IpAddr::from([10, 0, 0, 5])]
        );
        Ok(())
    }
}
