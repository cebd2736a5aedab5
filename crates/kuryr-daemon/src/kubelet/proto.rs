//! Hand-written protobuf decoding of the kubelet's `ListPodResourcesResponse`
//! (`k8s.io/kubelet/pkg/apis/podresources/v1` and `v1alpha1` share the fields
//! used here). Only the fields the SR-IOV binding needs are kept; every other
//! field, of any wire type, is skipped, so newer kubelets (topology, CPU ids,
//! memory, dynamic resources) decode fine.
//!
//! ```text
//! ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
//! PodResources       { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
//! ContainerResources { string name = 1; repeated ContainerDevices devices = 2; }
//! ContainerDevices   { string resource_name = 1; repeated string device_ids = 2; }
//! ```

/// Devices of one pod as the kubelet lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodResources {
    pub name: String,
    pub namespace: String,
    pub containers: Vec<ContainerResources>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerResources {
    pub name: String,
    pub devices: Vec<ContainerDevices>,
}

/// Devices of one resource (`intel.com/sriov_a`) given to a container; for
/// the SR-IOV network device plugin the ids are VF PCI addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerDevices {
    pub resource_name: String,
    pub device_ids: Vec<String>,
}

/// Why a message could not be decoded; `field` names the message field
/// being read (`PodResources.name`, ...).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protobuf {field}: {message}")]
pub struct DecodeError {
    pub field: String,
    pub message: String,
}

fn err(field: &str, message: impl Into<String>) -> DecodeError {
    DecodeError {
        field: field.to_string(),
        message: message.into(),
    }
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;
/// Deeper group nesting than any real message has: a malicious or broken input.
const MAX_GROUP_DEPTH: usize = 64;

/// A cursor over one message's bytes.
struct Reader<'a> {
    buf: &'a [u8],
    /// The message being read, for errors.
    message: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], message: &'static str) -> Self {
        Self { buf, message }
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn varint(&mut self, field: &str) -> Result<u64, DecodeError> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let (&byte, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| err(field, "truncated varint"))?;
            self.buf = rest;
            // The 10th byte may only carry the top bit of a u64.
            if i == 9 && byte > 1 {
                return Err(err(field, "varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(err(field, "varint longer than 10 bytes"))
    }

    fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.buf.len())
            .ok_or_else(|| {
                err(
                    field,
                    format!("truncated: {n} bytes announced, {} left", self.buf.len()),
                )
            })?;
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// The next field's (number, wire type).
    fn key(&mut self) -> Result<(u64, u8), DecodeError> {
        let key = self.varint(&format!("{} field key", self.message))?;
        let number = key >> 3;
        let wire = (key & 7) as u8;
        if number == 0 {
            return Err(err(self.message, "field number 0"));
        }
        Ok((number, wire))
    }

    /// Length-delimited payload of field `name`, which must have wire type LEN.
    fn bytes(&mut self, wire: u8, name: &str) -> Result<&'a [u8], DecodeError> {
        let field = format!("{}.{name}", self.message);
        if wire != LEN {
            return Err(err(
                &field,
                format!("wire type {wire}, expected 2 (length-delimited)"),
            ));
        }
        let len = self.varint(&field)?;
        self.take(len, &field)
    }

    fn string(&mut self, wire: u8, name: &str) -> Result<String, DecodeError> {
        let bytes = self.bytes(wire, name)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| err(&format!("{}.{name}", self.message), "not UTF-8"))
    }

    /// Skip an unknown field `number` of wire type `wire` (groups included).
    fn skip(&mut self, number: u64, wire: u8) -> Result<(), DecodeError> {
        let field = format!("{} field {number}", self.message);
        match wire {
            VARINT => self.varint(&field).map(drop),
            FIXED64 => self.take(8, &field).map(drop),
            LEN => {
                let len = self.varint(&field)?;
                self.take(len, &field).map(drop)
            }
            FIXED32 => self.take(4, &field).map(drop),
            START_GROUP => {
                // Skip to the END_GROUP of this number, nested groups included.
                let mut open = vec![number];
                while let Some(&current) = open.last() {
                    if open.len() > MAX_GROUP_DEPTH {
                        return Err(err(&field, "groups nested too deeply"));
                    }
                    if self.is_empty() {
                        return Err(err(&field, "truncated group"));
                    }
                    let (n, w) = self.key()?;
                    match w {
                        START_GROUP => open.push(n),
                        END_GROUP if n == current => {
                            open.pop();
                        }
                        END_GROUP => {
                            return Err(err(&field, format!("group {current} closed by end of group {n}")));
                        }
                        VARINT => self.varint(&field).map(drop)?,
                        FIXED64 => self.take(8, &field).map(drop)?,
                        FIXED32 => self.take(4, &field).map(drop)?,
                        LEN => {
                            let len = self.varint(&field)?;
                            self.take(len, &field).map(drop)?;
                        }
                        other => return Err(err(&field, format!("invalid wire type {other}"))),
                    }
                }
                Ok(())
            }
            END_GROUP => Err(err(&field, "end of group without a start")),
            other => Err(err(&field, format!("invalid wire type {other}"))),
        }
    }
}

/// Decode a `ListPodResourcesResponse` message (without gRPC framing).
pub fn decode_list_response(buf: &[u8]) -> Result<Vec<PodResources>, DecodeError> {
    let mut r = Reader::new(buf, "ListPodResourcesResponse");
    let mut pods = Vec::new();
    while !r.is_empty() {
        match r.key()? {
            (1, w) => pods.push(decode_pod(r.bytes(w, "pod_resources")?)?),
            (n, w) => r.skip(n, w)?,
        }
    }
    Ok(pods)
}

fn decode_pod(buf: &[u8]) -> Result<PodResources, DecodeError> {
    let mut r = Reader::new(buf, "PodResources");
    let mut pod = PodResources::default();
    while !r.is_empty() {
        match r.key()? {
            (1, w) => pod.name = r.string(w, "name")?,
            (2, w) => pod.namespace = r.string(w, "namespace")?,
            (3, w) => pod.containers.push(decode_container(r.bytes(w, "containers")?)?),
            (n, w) => r.skip(n, w)?,
        }
    }
    Ok(pod)
}

fn decode_container(buf: &[u8]) -> Result<ContainerResources, DecodeError> {
    let mut r = Reader::new(buf, "ContainerResources");
    let mut c = ContainerResources::default();
    while !r.is_empty() {
        match r.key()? {
            (1, w) => c.name = r.string(w, "name")?,
            (2, w) => c.devices.push(decode_devices(r.bytes(w, "devices")?)?),
            (n, w) => r.skip(n, w)?,
        }
    }
    Ok(c)
}

fn decode_devices(buf: &[u8]) -> Result<ContainerDevices, DecodeError> {
    let mut r = Reader::new(buf, "ContainerDevices");
    let mut d = ContainerDevices::default();
    while !r.is_empty() {
        match r.key()? {
            (1, w) => d.resource_name = r.string(w, "resource_name")?,
            (2, w) => d.device_ids.push(r.string(w, "device_ids")?),
            (n, w) => r.skip(n, w)?,
        }
    }
    Ok(d)
}

/// Encoding, for the fake kubelet of the tests.
#[cfg(test)]
pub(crate) mod encode {
    use super::*;

    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    pub fn key(out: &mut Vec<u8>, number: u64, wire: u8) {
        varint(out, (number << 3) | u64::from(wire));
    }

    pub fn bytes(out: &mut Vec<u8>, number: u64, data: &[u8]) {
        key(out, number, LEN);
        varint(out, data.len() as u64);
        out.extend_from_slice(data);
    }

    pub fn list_response(pods: &[PodResources]) -> Vec<u8> {
        let mut out = Vec::new();
        for pod in pods {
            let mut p = Vec::new();
            bytes(&mut p, 1, pod.name.as_bytes());
            bytes(&mut p, 2, pod.namespace.as_bytes());
            for c in &pod.containers {
                let mut cb = Vec::new();
                bytes(&mut cb, 1, c.name.as_bytes());
                for d in &c.devices {
                    let mut db = Vec::new();
                    bytes(&mut db, 1, d.resource_name.as_bytes());
                    for id in &d.device_ids {
                        bytes(&mut db, 2, id.as_bytes());
                    }
                    bytes(&mut cb, 2, &db);
                }
                bytes(&mut p, 3, &cb);
            }
            bytes(&mut out, 1, &p);
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::encode::*;
    use super::*;

    fn sample() -> Vec<PodResources> {
        vec![
            PodResources {
                name: "web".into(),
                namespace: "default".into(),
                containers: vec![ContainerResources {
                    name: "nginx".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "intel.com/sriov_a".into(),
                        device_ids: vec!["0000:3b:02.3".into(), "0000:3b:02.5".into()],
                    }],
                }],
            },
            PodResources {
                name: "db".into(),
                namespace: "prod".into(),
                containers: vec![],
            },
        ]
    }

    #[test]
    fn round_trips_the_fields_it_knows() {
        let pods = sample();
        assert_eq!(decode_list_response(&list_response(&pods)).unwrap(), pods);
        assert_eq!(decode_list_response(&[]).unwrap(), vec![]);
    }

    #[test]
    fn skips_unknown_fields_of_every_wire_type() {
        let unknown = |out: &mut Vec<u8>| {
            key(out, 7, VARINT);
            varint(out, u64::MAX); // 10-byte varint
            key(out, 8, FIXED64);
            out.extend_from_slice(&[1; 8]);
            key(out, 9, FIXED32);
            out.extend_from_slice(&[2; 4]);
            bytes(out, 10, b"\x0a\x03abc"); // looks like a message, is skipped
            // A group with a nested group and fields inside.
            key(out, 11, START_GROUP);
            key(out, 1, VARINT);
            varint(out, 5);
            key(out, 12, START_GROUP);
            bytes(out, 2, b"zz");
            key(out, 12, END_GROUP);
            key(out, 3, FIXED32);
            out.extend_from_slice(&[0; 4]);
            key(out, 11, END_GROUP);
        };
        // devices: topology (field 3) and more, as newer kubelets send.
        let mut dev = Vec::new();
        unknown(&mut dev);
        bytes(&mut dev, 1, b"intel.com/sriov_a");
        unknown(&mut dev);
        bytes(&mut dev, 2, b"0000:3b:02.3");
        bytes(&mut dev, 3, b"\x0a\x02\x08\x01"); // TopologyInfo
        let mut container = Vec::new();
        bytes(&mut container, 1, b"c1");
        bytes(&mut container, 2, &dev);
        key(&mut container, 3, VARINT); // cpu_ids, unpacked
        varint(&mut container, 4);
        bytes(&mut container, 3, &[1, 2, 3]); // cpu_ids, packed
        unknown(&mut container);
        let mut pod = Vec::new();
        unknown(&mut pod);
        bytes(&mut pod, 2, b"ns");
        bytes(&mut pod, 3, &container);
        bytes(&mut pod, 1, b"p");
        let mut resp = Vec::new();
        unknown(&mut resp);
        bytes(&mut resp, 1, &pod);
        unknown(&mut resp);
        let pods = decode_list_response(&resp).unwrap();
        assert_eq!(
            pods,
            vec![PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![ContainerResources {
                    name: "c1".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "intel.com/sriov_a".into(),
                        device_ids: vec!["0000:3b:02.3".into()],
                    }],
                }],
            }]
        );
    }

    #[test]
    fn truncated_input_is_an_error_at_every_cut() {
        // One pod: a cut between two top-level entries would be a valid message.
        let full = list_response(&sample()[..1]);
        for cut in 1..full.len() {
            assert!(
                decode_list_response(&full[..cut]).is_err(),
                "a response cut at {cut} of {} bytes decoded",
                full.len()
            );
        }
    }

    #[test]
    fn malformed_input_names_the_field() {
        // Length beyond the end.
        let e = decode_list_response(&[0x0a, 0x05, 0x0a]).unwrap_err();
        assert_eq!(e.field, "ListPodResourcesResponse.pod_resources");
        assert!(e.message.contains("truncated"), "{e}");
        // A known field with the wrong wire type.
        let mut pod = Vec::new();
        key(&mut pod, 1, VARINT);
        varint(&mut pod, 1);
        let mut resp = Vec::new();
        bytes(&mut resp, 1, &pod);
        let e = decode_list_response(&resp).unwrap_err();
        assert_eq!(e.field, "PodResources.name");
        // Not UTF-8.
        let mut pod = Vec::new();
        bytes(&mut pod, 2, &[0xff, 0xfe]);
        let mut resp = Vec::new();
        bytes(&mut resp, 1, &pod);
        assert_eq!(
            decode_list_response(&resp).unwrap_err().field,
            "PodResources.namespace"
        );
        // Field number 0, wire types 6/7, stray end of group, overlong varint.
        assert!(decode_list_response(&[0x02, 0x00]).is_err());
        // (field 2 is unknown at the top: the skipping path)
        assert!(decode_list_response(&[0x16]).is_err());
        assert!(decode_list_response(&[0x17]).is_err());
        assert!(decode_list_response(&[0x14]).is_err());
        let e = decode_list_response(&[0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02])
            .unwrap_err();
        assert!(e.message.contains("overflows"), "{e}");
        assert!(
            decode_list_response(&[
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x81, 0x00
            ])
            .is_err()
        );
        assert!(decode_list_response(&[0x10, 0x80]).is_err());
        // A group never closed, or closed by another number.
        assert!(decode_list_response(&[0x5b, 0x08, 0x01]).is_err());
        assert!(decode_list_response(&[0x5b, 0x64]).is_err());
        // Groups nested beyond any real message.
        let deep: Vec<u8> = std::iter::repeat_n(0x5b, 1000).collect();
        assert!(decode_list_response(&deep).is_err());
    }
}
