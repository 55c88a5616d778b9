//! Brief listings: `ListPodSandbox` and `ListContainers` answers decoded with only the labels and
//! annotations their reader names.
//!
//! The PLEG lists every sandbox and container of the node, up to ten times a second during a
//! burst of pod starts. Decoding every label and annotation of every entry into maps, and
//! dropping them at the next relist, took a quarter of nodelet's CPU during a 110-pod start
//! (`perf` profile in benches/README.md, issue 14). A brief listing decodes every field of
//! [`api::PodSandbox`] and [`api::Container`] as the runtime sent it, except that a label or an
//! annotation whose key is not in [`BriefKeys`] is skipped before anything is allocated for it.
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
fn entry(
    wire: WireType,
    buf: &mut &[u8],
    keep: &[&'static str],
    into: &mut HashMap<String, String>,
) -> Result<(), Status> {
    let mut b = take(wire, buf)?;
    let (mut key, mut value): (&[u8], &[u8]) = (&[], &[]);
    while !b.is_empty() {
        let (tag, wire) = decode_key(&mut b).map_err(malformed)?;
        match tag {
            1 => key = take(wire, &mut b)?,
            2 => value = take(wire, &mut b)?,
            _ => skip(wire, tag, &mut b)?,
        }
    }
    if let Some(k) = keep.iter().find(|k| k.as_bytes() == key) {
        let value = std::str::from_utf8(value).map_err(malformed)?;
        into.insert((*k).to_owned(), value.to_owned());
    }
    Ok(())
}

/// A `PodSandbox` (CRI v1 field numbers).
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

    /// Decodes the whole answer (a `ListPodSandboxResponse` or a `ListContainersResponse`).
    ///
    /// Errors: bytes that are not such a message (wire type mismatch, a length past the end,
    /// a string that is not UTF-8, a nested message prost refuses).
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

    fn decode(bytes: &[u8], keep: &BriefKeys) -> Result<Self, Status> {
        list(bytes, keep, sandbox).map(Sandboxes)
    }
}

impl BriefList for Containers {
    const METHOD: &'static str = "ListContainers";
    const PATH: &'static str = "/runtime.v1.RuntimeService/ListContainers";
    const OPERATION: &'static str = "list_containers";

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
}
