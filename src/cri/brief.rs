//! Brief listings: `ListPodSandbox` and `ListContainers` answers decoded with only the labels and
//! annotations their reader names.
//!
//! The PLEG lists every sandbox and container of the node, up to ten times a second during a
//! burst of pod starts, and decodes every label and annotation of every entry into maps that the
//! next relist drops: 8.6 % of nodelet's CPU during a 110-pod start on an empty containerd, a
//! quarter of it when containerd also held 1,766 dead containers and sandboxes (`perf` profiles in
//! benches/README.md, issue 14). A brief listing decodes every field of [`api::PodSandbox`] and
//! [`api::Container`] as the runtime sent it, except that a label or an annotation whose key is
//! not in [`BriefKeys`] is skipped (checked for UTF-8, as prost checks it, but not allocated):
//! 0.85–0.90 of the full decode's CPU and 0.86–0.88 of its allocations for 110 pods (`cargo
//! bench --bench pleg`).
//!
//! The result is prost's decode followed by [`BriefKeys::trim_sandbox`] /
//! [`BriefKeys::trim_container`] for every input, and an error wherever prost errs, with one
//! exception: prost counts its limit of 100 nested messages from the top of the answer, this
//! decoder from each entry, so unknown groups nested 98 to 100 deep inside an entry pass here
//! and not in prost (the depth stays bounded either way).
//!
//! kubelet has no such decoder (Go's protobuf decodes whole messages); the wire format is
//! protobuf's, read with prost's own primitives (`decode_key`, `decode_varint`, `skip_field`).

use std::collections::HashMap;
use std::marker::PhantomData;

use prost::bytes::Buf;
use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

use super::api;

/// The label and annotation keys a brief listing keeps (exact matches); every other entry of
/// the two maps is left out.
#[derive(Debug, Clone, Copy)]
pub struct BriefKeys {
    /// Label keys kept (`labels` of sandboxes and containers).
    pub labels: &'static [&'static str],
    /// Annotation keys kept (`annotations` of sandboxes and containers).
    pub annotations: &'static [&'static str],
}

impl BriefKeys {
    /// Removes from `s` the labels and annotations a brief listing would not carry: what a
    /// runtime without a brief decoder (the fake one of the unit tests) returns, so that tests
    /// see what the real listing gives.
    pub fn trim_sandbox(&self, s: &mut api::PodSandbox) {
        s.labels.retain(|k, _| self.labels.contains(&k.as_str()));
        s.annotations
            .retain(|k, _| self.annotations.contains(&k.as_str()));
    }

    /// As [`BriefKeys::trim_sandbox`], for a container.
    pub fn trim_container(&self, c: &mut api::Container) {
        c.labels.retain(|k, _| self.labels.contains(&k.as_str()));
        c.annotations
            .retain(|k, _| self.annotations.contains(&k.as_str()));
    }
}

fn malformed(what: impl std::fmt::Display) -> Status {
    Status::internal(format!("malformed CRI listing: {what}"))
}

/// The bytes of a length-delimited field at the front of `buf`.
fn take<'a>(wire: WireType, buf: &mut &'a [u8]) -> Result<&'a [u8], Status> {
    if wire != WireType::LengthDelimited {
        return Err(malformed(format!(
            "wire type {wire:?} for a length-delimited field"
        )));
    }
    let len = decode_varint(buf).map_err(malformed)?;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l <= buf.len())
        .ok_or_else(|| malformed("field longer than the message"))?;
    let (head, rest) = buf.split_at(len);
    *buf = rest;
    Ok(head)
}

fn varint(wire: WireType, buf: &mut &[u8]) -> Result<u64, Status> {
    if wire != WireType::Varint {
        return Err(malformed(format!("wire type {wire:?} for a varint field")));
    }
    decode_varint(buf).map_err(malformed)
}

fn string(wire: WireType, buf: &mut &[u8]) -> Result<String, Status> {
    std::str::from_utf8(take(wire, buf)?)
        .map(str::to_owned)
        .map_err(malformed)
}

fn message<M: Message + Default>(
    wire: WireType,
    buf: &mut &[u8],
    into: &mut Option<M>,
) -> Result<(), Status> {
    into.get_or_insert_with(M::default)
        .merge(take(wire, buf)?)
        .map_err(malformed)
}

fn skip(wire: WireType, tag: u32, buf: &mut &[u8]) -> Result<(), Status> {
    skip_field(wire, tag, buf, DecodeContext::default()).map_err(malformed)
}

/// One `map<string, string>` entry (key 1, value 2), inserted only when its key is in `keep`.
fn entry<'a>(
    wire: WireType,
    buf: &mut &'a [u8],
    keep: &[&'static str],
    into: &mut HashMap<String, String>,
) -> Result<(), Status> {
    let mut b = take(wire, buf)?;
    let (mut key, mut value) = ("", "");
    // Every key and value is checked for UTF-8, kept or not, as prost checks them: a listing
    // prost would refuse is refused here too.
    let text = |wire, b: &mut &'a [u8]| std::str::from_utf8(take(wire, b)?).map_err(malformed);
    while !b.is_empty() {
        let (tag, wire) = decode_key(&mut b).map_err(malformed)?;
        match tag {
            1 => key = text(wire, &mut b)?,
            2 => value = text(wire, &mut b)?,
            _ => skip(wire, tag, &mut b)?,
        }
    }
    if let Some(k) = keep.iter().find(|k| **k == key) {
        into.insert((*k).to_owned(), value.to_owned());
    }
    Ok(())
}

/// A `PodSandbox` (CRI v1 field numbers).
// Enums and int64 fields are varints truncated to their width, as prost decodes them.
#[allow(clippy::cast_possible_truncation)]
fn sandbox(mut b: &[u8], keep: &BriefKeys) -> Result<api::PodSandbox, Status> {
    let mut s = api::PodSandbox::default();
    while !b.is_empty() {
        let (tag, wire) = decode_key(&mut b).map_err(malformed)?;
        match tag {
            1 => s.id = string(wire, &mut b)?,
            2 => message(wire, &mut b, &mut s.metadata)?,
            // Enums and int64 are varints; prost truncates them the same way.
            3 => s.state = varint(wire, &mut b)? as i32,
            4 => s.created_at = varint(wire, &mut b)? as i64,
            5 => entry(wire, &mut b, keep.labels, &mut s.labels)?,
            6 => entry(wire, &mut b, keep.annotations, &mut s.annotations)?,
            7 => s.runtime_handler = string(wire, &mut b)?,
            _ => skip(wire, tag, &mut b)?,
        }
    }
    Ok(s)
}

/// A `Container` (CRI v1 field numbers).
// Enums and int64 fields are varints truncated to their width, as prost decodes them.
#[allow(clippy::cast_possible_truncation)]
fn container(mut b: &[u8], keep: &BriefKeys) -> Result<api::Container, Status> {
    let mut c = api::Container::default();
    while !b.is_empty() {
        let (tag, wire) = decode_key(&mut b).map_err(malformed)?;
        match tag {
            1 => c.id = string(wire, &mut b)?,
            2 => c.pod_sandbox_id = string(wire, &mut b)?,
            3 => message(wire, &mut b, &mut c.metadata)?,
            4 => message(wire, &mut b, &mut c.image)?,
            5 => c.image_ref = string(wire, &mut b)?,
            6 => c.state = varint(wire, &mut b)? as i32,
            7 => c.created_at = varint(wire, &mut b)? as i64,
            8 => entry(wire, &mut b, keep.labels, &mut c.labels)?,
            9 => entry(wire, &mut b, keep.annotations, &mut c.annotations)?,
            10 => c.image_id = string(wire, &mut b)?,
            _ => skip(wire, tag, &mut b)?,
        }
    }
    Ok(c)
}

/// The entries (field 1, repeated) of a list response, each decoded by `one`.
fn list<T>(
    mut b: &[u8],
    keep: &BriefKeys,
    one: fn(&[u8], &BriefKeys) -> Result<T, Status>,
) -> Result<Vec<T>, Status> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let (tag, wire) = decode_key(&mut b).map_err(malformed)?;
        if tag == 1 {
            out.push(one(take(wire, &mut b)?, keep)?);
        } else {
            skip(wire, tag, &mut b)?;
        }
    }
    Ok(out)
}

/// A list answer decoded briefly.
pub trait BriefList: Sized + Send + Sync + 'static {
    /// The method of `runtime.v1.RuntimeService` that answers with it.
    const METHOD: &'static str;
    /// Its gRPC path.
    const PATH: &'static str;
    /// kubelet's operation name for it (`kubelet_runtime_operations_total{operation_type}`).
    const OPERATION: &'static str;
    /// The method's request message.
    type Request: Message + Send + 'static;
    /// One entry of the answer.
    type Item;

    /// The request for the entries whose labels match all of `labels` (CRI's label selector).
    fn request(labels: HashMap<String, String>) -> Self::Request;

    /// The entries.
    fn into_items(self) -> Vec<Self::Item>;

    /// Decodes the whole answer (a `ListPodSandboxResponse` or a `ListContainersResponse`).
    ///
    /// Errors: bytes that are not such a message (wire type mismatch, a length past the end,
    /// a string that is not UTF-8, kept or not, a nested message prost refuses).
    fn decode(bytes: &[u8], keep: &BriefKeys) -> Result<Self, Status>;
}

/// `ListPodSandboxResponse.items`.
pub struct Sandboxes(pub Vec<api::PodSandbox>);

/// `ListContainersResponse.containers`.
pub struct Containers(pub Vec<api::Container>);

impl BriefList for Sandboxes {
    const METHOD: &'static str = "ListPodSandbox";
    const PATH: &'static str = "/runtime.v1.RuntimeService/ListPodSandbox";
    const OPERATION: &'static str = "list_podsandbox";
    type Request = api::ListPodSandboxRequest;
    type Item = api::PodSandbox;

    fn request(labels: HashMap<String, String>) -> Self::Request {
        api::ListPodSandboxRequest {
            filter: Some(api::PodSandboxFilter {
                label_selector: labels,
                ..Default::default()
            }),
        }
    }

    fn into_items(self) -> Vec<api::PodSandbox> {
        self.0
    }

    fn decode(bytes: &[u8], keep: &BriefKeys) -> Result<Self, Status> {
        list(bytes, keep, sandbox).map(Sandboxes)
    }
}

impl BriefList for Containers {
    const METHOD: &'static str = "ListContainers";
    const PATH: &'static str = "/runtime.v1.RuntimeService/ListContainers";
    const OPERATION: &'static str = "list_containers";
    type Request = api::ListContainersRequest;
    type Item = api::Container;

    fn request(labels: HashMap<String, String>) -> Self::Request {
        api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                label_selector: labels,
                ..Default::default()
            }),
        }
    }

    fn into_items(self) -> Vec<api::Container> {
        self.0
    }

    fn decode(bytes: &[u8], keep: &BriefKeys) -> Result<Self, Status> {
        list(bytes, keep, container).map(Containers)
    }
}

/// tonic codec of a brief list call: the request encoded by prost, the answer decoded by
/// [`BriefList::decode`].
pub struct BriefCodec<Req, Resp> {
    keep: &'static BriefKeys,
    kinds: PhantomData<fn() -> (Req, Resp)>,
}

impl<Req, Resp> BriefCodec<Req, Resp> {
    /// A codec keeping `keep`'s keys.
    pub fn new(keep: &'static BriefKeys) -> Self {
        Self {
            keep,
            kinds: PhantomData,
        }
    }
}

/// Encodes a request with prost.
pub struct RequestEncoder<Req>(PhantomData<fn(Req)>);

impl<Req: Message> Encoder for RequestEncoder<Req> {
    type Item = Req;
    type Error = Status;

    fn encode(&mut self, item: Req, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding a CRI request: {e}")))
    }
}

/// Decodes an answer with [`BriefList::decode`].
pub struct BriefDecoder<Resp> {
    keep: &'static BriefKeys,
    kind: PhantomData<fn() -> Resp>,
}

impl<Resp: BriefList> Decoder for BriefDecoder<Resp> {
    type Item = Resp;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Resp>, Status> {
        // The frame's bytes (tonic hands over a split of its buffer, not a copy).
        let bytes = src.copy_to_bytes(src.remaining());
        Resp::decode(&bytes, self.keep).map(Some)
    }
}

impl<Req: Message + Send + 'static, Resp: BriefList> Codec for BriefCodec<Req, Resp> {
    type Encode = Req;
    type Decode = Resp;
    type Encoder = RequestEncoder<Req>;
    type Decoder = BriefDecoder<Resp>;

    fn encoder(&mut self) -> Self::Encoder {
        RequestEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        BriefDecoder {
            keep: self.keep,
            kind: PhantomData,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEEP: BriefKeys = BriefKeys {
        labels: &["io.kubernetes.pod.uid", "io.kubernetes.container.name"],
        annotations: &["io.kubernetes.container.hash"],
    };

    fn map(entries: &[(&str, &str)]) -> HashMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn full_container() -> api::Container {
        api::Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            metadata: Some(api::ContainerMetadata {
                name: "app".into(),
                attempt: 3,
            }),
            image: Some(api::ImageSpec {
                image: "docker.io/library/busybox:1.36".into(),
                annotations: map(&[("image.note", "x")]),
                ..Default::default()
            }),
            image_ref: "sha256:abc".into(),
            state: api::ContainerState::ContainerRunning as i32,
            created_at: 1_700_000_000_123_456_789,
            labels: map(&[
                ("io.kubernetes.pod.uid", "u-1"),
                ("io.kubernetes.container.name", "app"),
                ("app", "web"),
            ]),
            annotations: map(&[
                ("io.kubernetes.container.hash", "1a2b"),
                ("io.kubernetes.container.restartCount", "3"),
                ("kubectl.kubernetes.io/last-applied-configuration", "{…}"),
            ]),
            image_id: "sha256:def".into(),
        }
    }

    fn full_sandbox() -> api::PodSandbox {
        api::PodSandbox {
            id: "s1".into(),
            metadata: Some(api::PodSandboxMetadata {
                name: "web".into(),
                uid: "u-1".into(),
                namespace: "default".into(),
                attempt: 1,
            }),
            state: api::PodSandboxState::SandboxReady as i32,
            created_at: 42,
            labels: map(&[("io.kubernetes.pod.uid", "u-1"), ("tier", "front")]),
            annotations: map(&[("io.kubernetes.container.hash", "h"), ("note", "n")]),
            runtime_handler: "runc".into(),
        }
    }

    #[test]
    fn a_brief_container_is_the_container_without_the_keys_not_kept() {
        let full = full_container();
        let bytes = api::ListContainersResponse {
            containers: vec![full.clone(), api::Container::default()],
        }
        .encode_to_vec();
        let Containers(got) = Containers::decode(&bytes, &KEEP).unwrap();
        let mut want = full;
        KEEP.trim_container(&mut want);
        assert_eq!(got, vec![want.clone(), api::Container::default()]);
        assert_eq!(
            got[0].labels,
            map(&[
                ("io.kubernetes.pod.uid", "u-1"),
                ("io.kubernetes.container.name", "app")
            ])
        );
        assert_eq!(
            got[0].annotations,
            map(&[("io.kubernetes.container.hash", "1a2b")])
        );
        // The image spec is decoded whole, as every field other than the two maps.
        assert_eq!(got[0].image.as_ref().unwrap().annotations.len(), 1);
    }

    #[test]
    fn a_brief_sandbox_is_the_sandbox_without_the_keys_not_kept() {
        let full = full_sandbox();
        let bytes = api::ListPodSandboxResponse {
            items: vec![full.clone()],
        }
        .encode_to_vec();
        let Sandboxes(got) = Sandboxes::decode(&bytes, &KEEP).unwrap();
        let mut want = full;
        KEEP.trim_sandbox(&mut want);
        assert_eq!(got, vec![want]);
        assert_eq!(got[0].labels, map(&[("io.kubernetes.pod.uid", "u-1")]));
        assert_eq!(
            got[0].annotations,
            map(&[("io.kubernetes.container.hash", "h")])
        );
    }

    #[test]
    fn malformed_answers_are_errors() {
        let bytes = api::ListContainersResponse {
            containers: vec![full_container()],
        }
        .encode_to_vec();
        // Cut short: a length past the end.
        let err = Containers::decode(&bytes[..bytes.len() - 3], &KEEP)
            .err()
            .unwrap();
        assert!(err.message().contains("malformed CRI listing"), "{err:?}");
        // A container ID sent as a varint.
        let wrong_wire = [0x0a, 0x02, 0x08, 0x01];
        assert!(Containers::decode(&wrong_wire, &KEEP).is_err());
        // A label key that is not UTF-8, kept.
        let mut bad = api::Container::default();
        bad.labels
            .insert("io.kubernetes.pod.uid".into(), "x".into());
        let mut bytes = api::ListContainersResponse {
            containers: vec![bad],
        }
        .encode_to_vec();
        let at = bytes.iter().rposition(|b| *b == b'x').unwrap();
        bytes[at] = 0xff;
        assert!(Containers::decode(&bytes, &KEEP).is_err());
    }

    fn entries() -> impl Strategy<Value = HashMap<String, String>> {
        proptest::collection::hash_map(
            prop_oneof![
                Just("io.kubernetes.pod.uid".to_owned()),
                Just("io.kubernetes.container.name".to_owned()),
                Just("io.kubernetes.container.hash".to_owned()),
                ".{0,12}",
            ],
            ".{0,24}",
            0..6,
        )
    }

    proptest! {
        #[test]
        fn brief_decode_equals_full_decode_then_trim(
            id in ".{0,16}",
            state in 0i32..4,
            created_at in any::<i64>(),
            labels in entries(),
            annotations in entries(),
            name in ".{0,8}",
            attempt in any::<u32>(),
        ) {
            let full = api::Container {
                id: id.clone(),
                metadata: Some(api::ContainerMetadata { name, attempt }),
                state,
                created_at,
                labels: labels.clone(),
                annotations: annotations.clone(),
                ..Default::default()
            };
            let sandbox = api::PodSandbox { id, state, created_at, labels, annotations, ..Default::default() };
            let bytes = api::ListContainersResponse { containers: vec![full.clone()] }.encode_to_vec();
            let Containers(got) = Containers::decode(&bytes, &KEEP).unwrap();
            let mut want = full;
            KEEP.trim_container(&mut want);
            prop_assert_eq!(got, vec![want]);
            let bytes = api::ListPodSandboxResponse { items: vec![sandbox.clone()] }.encode_to_vec();
            let Sandboxes(got) = Sandboxes::decode(&bytes, &KEEP).unwrap();
            let mut want = sandbox;
            KEEP.trim_sandbox(&mut want);
            prop_assert_eq!(got, vec![want]);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Containers::decode(&bytes, &KEEP);
            let _ = Sandboxes::decode(&bytes, &KEEP);
        }
    }

    // Byte-level comparison with prost: `same_as_prost` decodes the bytes both ways (prost
    // then trim, and brief) as both listings and wants equal results, or errors from both.

    fn put_varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn put_key(tag: u32, wire: u8, out: &mut Vec<u8>) {
        put_varint(u64::from(tag) << 3 | u64::from(wire), out);
    }

    /// Field `tag`, length-delimited.
    fn ld(tag: u32, payload: &[u8]) -> Vec<u8> {
        let mut o = Vec::new();
        put_key(tag, 2, &mut o);
        put_varint(payload.len() as u64, &mut o);
        o.extend_from_slice(payload);
        o
    }

    /// Field `tag`, a varint.
    fn vi(tag: u32, v: u64) -> Vec<u8> {
        let mut o = Vec::new();
        put_key(tag, 0, &mut o);
        put_varint(v, &mut o);
        o
    }

    /// Field `tag` with wire type `wire`, then `rest` as is.
    fn raw(tag: u32, wire: u8, rest: &[u8]) -> Vec<u8> {
        let mut o = Vec::new();
        put_key(tag, wire, &mut o);
        o.extend_from_slice(rest);
        o
    }

    fn same_as_prost(bytes: &[u8]) -> Result<(), String> {
        match (
            api::ListContainersResponse::decode(bytes),
            Containers::decode(bytes, &KEEP),
        ) {
            (Ok(mut full), Ok(Containers(brief))) => {
                full.containers
                    .iter_mut()
                    .for_each(|c| KEEP.trim_container(c));
                if full.containers != brief {
                    return Err(format!("containers: {:?} != {brief:?}", full.containers));
                }
            }
            (Err(_), Err(_)) => {}
            (full, brief) => {
                return Err(format!(
                    "containers: prost {full:?}, brief {:?}",
                    brief.map(|b| b.0)
                ))
            }
        }
        match (
            api::ListPodSandboxResponse::decode(bytes),
            Sandboxes::decode(bytes, &KEEP),
        ) {
            (Ok(mut full), Ok(Sandboxes(brief))) => {
                full.items.iter_mut().for_each(|s| KEEP.trim_sandbox(s));
                if full.items != brief {
                    return Err(format!("sandboxes: {:?} != {brief:?}", full.items));
                }
            }
            (Err(_), Err(_)) => {}
            (full, brief) => {
                return Err(format!(
                    "sandboxes: prost {full:?}, brief {:?}",
                    brief.map(|b| b.0)
                ))
            }
        }
        Ok(())
    }

    fn check_all(cases: &[(&str, Vec<u8>)]) {
        let failed: Vec<String> = cases
            .iter()
            .filter_map(|(name, b)| {
                same_as_prost(b)
                    .err()
                    .map(|e| format!("{name}: {e} on {b:02x?}"))
            })
            .collect();
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }

    const UID: &[u8] = b"io.kubernetes.pod.uid";
    const HASH: &[u8] = b"io.kubernetes.container.hash";
    const TEN_BYTE_MINUS_ONE: [u8; 10] =
        [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];

    /// Empty and repeated messages, fields out of order, scalars and varints at their limits.
    #[test]
    fn messages_and_scalars_at_the_wire_level_decode_as_prost_then_trim() {
        let e = |fields: &[Vec<u8>]| fields.concat();
        let item = |fields: &[Vec<u8>]| ld(1, &fields.concat());
        check_all(&[
            ("empty answer", vec![]),
            ("empty items", e(&[ld(1, &[]), ld(1, &[])])),
            (
                "empty nested messages",
                item(&[ld(2, &[]), ld(3, &[]), ld(4, &[])]),
            ),
            (
                "scalars repeated: last wins",
                item(&[
                    ld(1, b"a"),
                    vi(3, 1),
                    ld(1, b"b"),
                    vi(3, 2),
                    vi(6, 1),
                    vi(6, 0),
                ]),
            ),
            (
                "metadata repeated: merged",
                item(&[
                    ld(3, &ld(1, b"a")),
                    ld(2, &ld(1, b"n")),
                    ld(3, &vi(2, 5)),
                    ld(2, &vi(4, 7)),
                ]),
            ),
            (
                "image repeated: merged",
                item(&[
                    ld(4, &ld(1, b"img")),
                    ld(4, &ld(2, &e(&[ld(1, b"k"), ld(2, b"v")]))),
                ]),
            ),
            (
                "fields out of order",
                item(&[
                    ld(10, b"i"),
                    vi(7, 9),
                    ld(8, &e(&[ld(1, UID), ld(2, b"u")])),
                    ld(1, b"c"),
                ]),
            ),
            (
                "negative enum and int64",
                item(&[
                    raw(3, 0, &TEN_BYTE_MINUS_ONE),
                    raw(4, 0, &TEN_BYTE_MINUS_ONE),
                    raw(6, 0, &TEN_BYTE_MINUS_ONE),
                    raw(7, 0, &TEN_BYTE_MINUS_ONE),
                ]),
            ),
            (
                "enum beyond i32 truncated",
                item(&[vi(3, 1 << 33 | 2), vi(6, u64::MAX - 5)]),
            ),
            (
                "11-byte varint",
                item(&[raw(
                    6,
                    0,
                    &[
                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x80, 0x00,
                    ],
                )]),
            ),
            (
                "10th varint byte over 1",
                item(&[raw(
                    6,
                    0,
                    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02],
                )]),
            ),
        ]);
    }

    /// Lengths past the end, bad tags and wire types, groups and unknown fields at every level.
    #[test]
    fn lengths_tags_wire_types_and_groups_decode_as_prost_then_trim() {
        let e = |fields: &[Vec<u8>]| fields.concat();
        let item = |fields: &[Vec<u8>]| ld(1, &fields.concat());
        let mut groups = Vec::new();
        for _ in 0..20 {
            put_key(15, 3, &mut groups);
        }
        for _ in 0..20 {
            put_key(15, 4, &mut groups);
        }
        check_all(&[
            ("length over usize", raw(1, 2, &TEN_BYTE_MINUS_ONE)),
            (
                "length over usize, nested",
                item(&[raw(1, 2, &TEN_BYTE_MINUS_ONE)]),
            ),
            ("length past the end", raw(1, 2, &[0x7f, 0x00])),
            ("length past the item", item(&[raw(8, 2, &[0x05, 0x0a])])),
            ("tag 0", item(&[vec![0x00]])),
            ("wire type 6", vec![0x0e]),
            ("wire type 7, nested", item(&[vec![0x0f]])),
            ("end group alone", item(&[raw(11, 4, &[])])),
            ("group unclosed", item(&[raw(11, 3, &[])])),
            (
                "group closed by another tag",
                item(&[raw(11, 3, &raw(12, 4, &[]))]),
            ),
            (
                "unknown fields of every wire type",
                item(&[
                    vi(11, 1),
                    raw(12, 1, &[0; 8]),
                    ld(13, b"x"),
                    raw(14, 3, &e(&[vi(1, 1), raw(14, 4, &[])])),
                    raw(15, 5, &[0; 4]),
                    vi(536_870_911, 0),
                ]),
            ),
            (
                "unknown fields at every level",
                e(&[
                    vi(2, 1),
                    item(&[
                        ld(3, &vi(9, 1)),
                        ld(4, &e(&[vi(9, 1), ld(2, &vi(9, 1))])),
                        ld(8, &e(&[vi(3, 1), ld(1, UID)])),
                    ]),
                ]),
            ),
            (
                "groups 20 deep everywhere",
                e(&[
                    groups.clone(),
                    item(&[
                        groups.clone(),
                        ld(3, &groups),
                        ld(4, &groups),
                        ld(8, &groups),
                        ld(9, &groups),
                        ld(5, &groups),
                        ld(6, &groups),
                    ]),
                ]),
            ),
            ("truncated fixed64", item(&[raw(11, 1, &[0; 7])])),
        ]);
    }

    /// Label and annotation entries in every shape, and known fields sent with another wire type.
    #[test]
    fn map_entries_and_fields_of_the_wrong_wire_type_decode_as_prost_then_trim() {
        let e = |fields: &[Vec<u8>]| fields.concat();
        let item = |fields: &[Vec<u8>]| ld(1, &fields.concat());
        check_all(&[
            (
                "entry without key",
                item(&[ld(8, &ld(2, b"v")), ld(5, &ld(2, b"v"))]),
            ),
            (
                "kept entry without value",
                item(&[
                    ld(8, &ld(1, UID)),
                    ld(5, &ld(1, UID)),
                    ld(9, &ld(1, HASH)),
                    ld(6, &ld(1, HASH)),
                ]),
            ),
            (
                "empty entry",
                item(&[ld(8, &[]), ld(9, &[]), ld(5, &[]), ld(6, &[])]),
            ),
            (
                "entry value before key",
                item(&[
                    ld(9, &e(&[ld(2, b"v"), ld(1, HASH)])),
                    ld(6, &e(&[ld(2, b"v"), ld(1, HASH)])),
                ]),
            ),
            (
                "entry key and value repeated",
                item(&[
                    ld(8, &e(&[ld(1, b"x"), ld(2, b"a"), ld(1, UID), ld(2, b"b")])),
                    ld(5, &e(&[ld(1, UID), ld(1, b"x"), ld(2, b"c")])),
                ]),
            ),
            (
                "entry with unknown fields",
                item(&[ld(
                    8,
                    &e(&[
                        ld(3, b"z"),
                        ld(1, UID),
                        vi(4, 1),
                        ld(2, b"v"),
                        raw(5, 5, &[1, 2, 3, 4]),
                        raw(6, 3, &raw(6, 4, &[])),
                    ]),
                )]),
            ),
            (
                "duplicate keys: last wins",
                item(&[
                    ld(8, &e(&[ld(1, UID), ld(2, b"a")])),
                    ld(8, &e(&[ld(1, UID), ld(2, b"b")])),
                    ld(5, &e(&[ld(1, UID), ld(2, b"a")])),
                    ld(5, &e(&[ld(1, UID), ld(2, b"b")])),
                ]),
            ),
            (
                "entry key as a varint",
                item(&[ld(8, &vi(1, 1)), ld(5, &vi(1, 1))]),
            ),
            (
                "dropped entry value as a group",
                item(&[ld(9, &e(&[ld(1, b"k"), raw(2, 3, &raw(2, 4, &[]))]))]),
            ),
            (
                "dropped entry value as fixed32",
                item(&[ld(6, &e(&[ld(1, b"k"), raw(2, 5, &[0; 4])]))]),
            ),
            (
                "dropped entry ending mid-varint",
                item(&[ld(8, &[0x18, 0x80]), ld(5, &[0x18, 0x80])]),
            ),
            ("labels as a varint", item(&[vi(8, 0), vi(5, 0)])),
            (
                "labels as a group",
                item(&[raw(8, 3, &raw(8, 4, &[])), raw(5, 3, &raw(5, 4, &[]))]),
            ),
            ("metadata as a varint", item(&[vi(3, 0), vi(2, 0)])),
            ("id as fixed64", item(&[raw(1, 1, &[0; 8])])),
            ("state as a string", item(&[ld(3, b""), ld(6, b"")])),
            ("items as a varint", vi(1, 0)),
            ("items as a group", raw(1, 3, &raw(1, 4, &[]))),
            ("id not UTF-8", item(&[ld(1, &[0xc3])])),
            (
                "id not UTF-8 then UTF-8",
                item(&[ld(1, &[0xff]), ld(1, b"ok")]),
            ),
            (
                "kept value not UTF-8",
                item(&[
                    ld(8, &e(&[ld(1, UID), ld(2, &[0xff])])),
                    ld(5, &e(&[ld(1, UID), ld(2, &[0xff])])),
                ]),
            ),
            (
                "image annotation not UTF-8",
                item(&[ld(4, &ld(2, &e(&[ld(1, b"k"), ld(2, &[0xff])])))]),
            ),
        ]);
    }

    /// prost refuses a label or an annotation that is not UTF-8 even when the trim drops it, and
    /// so does brief (every key and value of an entry is checked, not only the last).
    #[test]
    fn dropped_entries_that_are_not_utf8_are_errors() {
        let e = |fields: &[Vec<u8>]| fields.concat();
        check_all(&[
            ("dropped key", ld(1, &ld(8, &ld(1, &[0xff])))),
            (
                "dropped value",
                ld(1, &ld(5, &e(&[ld(1, b"a"), ld(2, &[0xff])]))),
            ),
            (
                "bad key then kept key",
                ld(1, &ld(8, &e(&[ld(1, &[0xff]), ld(1, UID)]))),
            ),
            (
                "bad value then good value",
                ld(1, &ld(9, &e(&[ld(1, HASH), ld(2, &[0xff]), ld(2, b"ok")]))),
            ),
        ]);
    }

    fn leaf_payload() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            3 => Just(UID.to_vec()),
            1 => Just(b"io.kubernetes.container.name".to_vec()),
            2 => Just(HASH.to_vec()),
            1 => Just(Vec::new()),
            1 => Just(vec![0xff]),
            1 => Just(b"v".to_vec()),
            1 => proptest::collection::vec(any::<u8>(), 0..6),
        ]
    }

    /// Fields a decoder must skip: every wire type, groups included (closed by their own tag or
    /// by another).
    fn unknown_field() -> BoxedStrategy<Vec<u8>> {
        let tag = prop_oneof![
            Just(11u32),
            Just(12),
            Just(15),
            Just(100),
            Just(536_870_911)
        ];
        prop_oneof![
            (tag.clone(), any::<u64>()).prop_map(|(t, v)| vi(t, v)),
            (tag.clone(), any::<[u8; 4]>()).prop_map(|(t, v)| raw(t, 5, &v)),
            (tag.clone(), any::<[u8; 8]>()).prop_map(|(t, v)| raw(t, 1, &v)),
            (tag.clone(), leaf_payload()).prop_map(|(t, p)| ld(t, &p)),
            (
                tag,
                proptest::collection::vec((1u32..5, any::<u64>()), 0..3),
                any::<bool>()
            )
                .prop_map(|(t, inner, closed)| {
                    let mut o = Vec::new();
                    put_key(t, 3, &mut o);
                    inner.into_iter().for_each(|(it, v)| o.extend(vi(it, v)));
                    put_key(if closed { t } else { t ^ 1 }, 4, &mut o);
                    o
                }),
        ]
        .boxed()
    }

    /// Field `tag`, mostly with its own wire type (`wire`, 0 or 2), at times with another.
    fn field(tag: u32, wire: u8, payload: BoxedStrategy<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
        prop_oneof![
            30 => payload
                .clone()
                .prop_map(move |p| if wire == 2 { ld(tag, &p) } else { raw(tag, 0, &p) }),
            1 => (0u8..6, payload).prop_map(move |(w, p)| {
                let mut o = Vec::new();
                put_key(tag, w, &mut o);
                put_varint(p.len() as u64, &mut o);
                o.extend(p);
                o
            }),
        ]
        .boxed()
    }

    fn string_field(tag: u32) -> BoxedStrategy<Vec<u8>> {
        field(tag, 2, leaf_payload().boxed())
    }

    fn int_field(tag: u32) -> BoxedStrategy<Vec<u8>> {
        let v = prop_oneof![any::<u64>(), 0u64..5, Just(u64::MAX), Just(1 << 63)];
        field(
            tag,
            0,
            v.prop_map(|v| {
                let mut o = Vec::new();
                put_varint(v, &mut o);
                o
            })
            .boxed(),
        )
    }

    /// Up to `n` fields drawn from `kinds`, in any order and repeated.
    fn fields(kinds: Vec<BoxedStrategy<Vec<u8>>>, n: usize) -> BoxedStrategy<Vec<u8>> {
        proptest::collection::vec(proptest::strategy::Union::new(kinds), 0..n)
            .prop_map(|v| v.concat())
            .boxed()
    }

    fn map_entry() -> BoxedStrategy<Vec<u8>> {
        fields(
            vec![
                string_field(1),
                string_field(1),
                string_field(2),
                string_field(2),
                unknown_field(),
            ],
            5,
        )
    }

    fn container_fields() -> BoxedStrategy<Vec<u8>> {
        let metadata = fields(vec![string_field(1), int_field(2), unknown_field()], 4);
        let image = fields(
            vec![
                string_field(1),
                field(2, 2, map_entry()),
                string_field(3),
                string_field(4),
                unknown_field(),
            ],
            4,
        );
        fields(
            vec![
                string_field(1),
                string_field(2),
                field(3, 2, metadata),
                field(4, 2, image),
                string_field(5),
                int_field(6),
                int_field(7),
                field(8, 2, map_entry()),
                field(8, 2, map_entry()),
                field(9, 2, map_entry()),
                field(9, 2, map_entry()),
                string_field(10),
                unknown_field(),
            ],
            10,
        )
    }

    fn sandbox_fields() -> BoxedStrategy<Vec<u8>> {
        let metadata = fields(
            vec![
                string_field(1),
                string_field(2),
                string_field(3),
                int_field(4),
                unknown_field(),
            ],
            5,
        );
        fields(
            vec![
                string_field(1),
                field(2, 2, metadata),
                int_field(3),
                int_field(4),
                field(5, 2, map_entry()),
                field(5, 2, map_entry()),
                field(6, 2, map_entry()),
                field(6, 2, map_entry()),
                string_field(7),
                unknown_field(),
            ],
            10,
        )
    }

    /// Answers shaped after the CRI messages (items of either kind, so that each listing also
    /// reads the other's fields), with wrong wire types, unknown fields, repeats and bad UTF-8.
    fn listing() -> BoxedStrategy<Vec<u8>> {
        fields(
            vec![
                field(1, 2, container_fields()),
                field(1, 2, sandbox_fields()),
                unknown_field(),
            ],
            4,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn cri_shaped_bytes_decode_as_prost_then_trim(
            bytes in listing(),
            cut in any::<prop::sample::Index>(),
            flip in any::<Option<(prop::sample::Index, u8)>>(),
        ) {
            if let Err(e) = same_as_prost(&bytes) {
                prop_assert!(false, "{e} on {bytes:02x?}");
            }
            let cut = &bytes[..cut.index(bytes.len() + 1)];
            if let Err(e) = same_as_prost(cut) {
                prop_assert!(false, "{e} on {cut:02x?}");
            }
            if let Some((at, to)) = flip.filter(|_| !bytes.is_empty()) {
                let mut bytes = bytes;
                let at = at.index(bytes.len());
                bytes[at] = to;
                if let Err(e) = same_as_prost(&bytes) {
                    prop_assert!(false, "{e} on {bytes:02x?}");
                }
            }
        }
    }
}
