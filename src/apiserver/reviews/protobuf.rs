//! Kubernetes' protobuf encoding of the three review bodies, which kubectl (1.32 on) sends as
//! `application/vnd.kubernetes.protobuf` for built-in kinds and never retries as JSON: the `k8s\0`
//! magic, then a `runtime.Unknown` envelope (apiVersion, kind, the object's message). The messages
//! below are the parts of Kubernetes' `generated.proto` a review reads, with the same field
//! numbers; `prost` decodes them and skips every other field. They become the JSON shape the
//! k8s-openapi types take. Answers are JSON, which kubectl accepts as well. Size is bounded by the
//! body limit, depth by these messages.

use prost::Message;
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

/// The media type of Kubernetes' protobuf encoding.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Every protobuf body starts with these bytes.
const MAGIC: &[u8] = b"k8s\0";

/// Why a protobuf body could not be read (never quoting it).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtobufError {
    #[error("the body does not start with Kubernetes' protobuf envelope (k8s\\0)")]
    NoEnvelope,
    #[error("the body is truncated or is not protobuf")]
    Malformed,
    #[error("a text field is not UTF-8")]
    NotUtf8,
    #[error("the object inside the envelope is compressed or encoded, which is not supported")]
    Encoded,
    #[error("the envelope carries no object")]
    Empty,
}

/// Declares a message whose fields are all text, by field number. `prost` reads them as bytes and
/// `text` writes them as JSON strings, so that text that is not UTF-8 is told apart from a body
/// that is not protobuf (prost's own strings fail both alike).
macro_rules! text_message {
    ($(#[$doc:meta])* $name:ident { $($tag:literal: $field:ident),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Message, Serialize)]
        #[serde(rename_all = "camelCase")]
        struct $name {
            $(#[prost(bytes, tag = $tag)] #[serde(serialize_with = "text")] $field: Vec<u8>,)*
        }
    };
}

/// `runtime.Unknown` (k8s.io/apimachinery/pkg/runtime).
#[derive(Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes, optional, tag = "2")]
    raw: Option<Vec<u8>>,
    #[prost(bytes, tag = "3")]
    content_encoding: Vec<u8>,
}

text_message!(
    /// `runtime.TypeMeta`.
    TypeMeta { "1": api_version, "2": kind }
);
text_message!(
    /// `ObjectMeta` (meta/v1): the fields that make metadata "not empty" for a review.
    ObjectMeta { "1": name, "2": generate_name, "3": namespace }
);

/// `SelfSubjectReview` (authentication/v1); its status is the server's to fill.
#[derive(Message, Serialize)]
struct SelfSubjectReview {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

/// `SelfSubjectAccessReview` (authorization/v1).
#[derive(Message, Serialize)]
struct SelfSubjectAccessReview {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<SelfSubjectAccessReviewSpec>,
}

#[derive(Message, Serialize)]
#[serde(rename_all = "camelCase")]
struct SelfSubjectAccessReviewSpec {
    #[prost(message, optional, tag = "1")]
    resource_attributes: Option<ResourceAttributes>,
    #[prost(message, optional, tag = "2")]
    non_resource_attributes: Option<NonResourceAttributes>,
}

text_message!(
    /// `ResourceAttributes`; its field and label selectors (8, 9) are not read.
    ResourceAttributes {
        "1": namespace, "2": verb, "3": group, "4": version, "5": resource, "6": subresource, "7": name,
    }
);
text_message!(
    /// `NonResourceAttributes`: a path, for `kubectl auth can-i VERB /PATH`.
    NonResourceAttributes { "1": path, "2": verb }
);

/// `SelfSubjectRulesReview` (authorization/v1).
#[derive(Message, Serialize)]
struct SelfSubjectRulesReview {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<SelfSubjectRulesReviewSpec>,
}

text_message!(SelfSubjectRulesReviewSpec { "1": namespace });

/// The body of a review of kind `kind` as JSON, with the envelope's apiVersion and kind.
pub fn to_json(body: &[u8], kind: &str) -> Result<Value, ProtobufError> {
    let envelope = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoEnvelope)?;
    let envelope = Unknown::decode(envelope).map_err(|_| ProtobufError::Malformed)?;
    if !envelope.content_encoding.is_empty() {
        return Err(ProtobufError::Encoded);
    }
    let raw = envelope.raw.ok_or(ProtobufError::Empty)?;
    let mut object = match kind {
        "SelfSubjectAccessReview" => read::<SelfSubjectAccessReview>(&raw)?,
        "SelfSubjectRulesReview" => read::<SelfSubjectRulesReview>(&raw)?,
        _ => read::<SelfSubjectReview>(&raw)?,
    };
    object.extend(json(envelope.type_meta.unwrap_or_default())?);
    Ok(Value::Object(object))
}

/// `bytes` as a message of type `M`, as JSON.
fn read<M: Message + Default + Serialize>(bytes: &[u8]) -> Result<Map<String, Value>, ProtobufError> {
    json(M::decode(bytes).map_err(|_| ProtobufError::Malformed)?)
}

/// A decoded message as a JSON object, without unset messages and empty strings (Go writes every
/// string, empty or not; JSON's `omitempty` leaves the empty ones out).
fn json(message: impl Serialize) -> Result<Map<String, Value>, ProtobufError> {
    // Only `text` can fail.
    let Ok(Value::Object(mut object)) = serde_json::to_value(message) else { return Err(ProtobufError::NotUtf8) };
    prune(&mut object);
    Ok(object)
}

fn prune(object: &mut Map<String, Value>) {
    object.retain(|_, value| !value.is_null() && *value != "");
    object.values_mut().filter_map(Value::as_object_mut).for_each(prune);
}

/// A protobuf string as JSON text.
fn text<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(std::str::from_utf8(bytes).map_err(|_| serde::ser::Error::custom("not UTF-8"))?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bytes(number: u8, data: &[u8]) -> Vec<u8> {
        let mut out = vec![number << 3 | 2, u8::try_from(data.len()).unwrap()];
        out.extend_from_slice(data);
        out
    }

    fn envelope(kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [bytes(1, b"authorization.k8s.io/v1"), bytes(2, kind.as_bytes())].concat();
        [MAGIC.to_vec(), bytes(1, &type_meta), bytes(2, raw), bytes(3, b""), bytes(4, b"")].concat()
    }

    #[test]
    fn reads_what_kubectl_sends() {
        // As Go's generated marshallers write them: every string, empty or not; a varint and a
        // fixed64 the reviews do not read.
        let attributes = [
            bytes(1, b"default"),
            bytes(2, b"get"),
            bytes(3, b"content.stowage.dev"),
            bytes(4, b""),
            bytes(5, b"bundles"),
            bytes(6, b"content"),
            bytes(7, b""),
            vec![8 << 3, 0x96, 0x01],
            vec![9 << 3 | 1, 0, 0, 0, 0, 0, 0, 0, 0],
        ]
        .concat();
        let meta = [bytes(1, b""), bytes(2, b""), bytes(3, b"")].concat();
        let raw = [bytes(1, &meta), bytes(2, &bytes(1, &attributes)), bytes(3, &[])].concat();
        let value = to_json(&envelope("SelfSubjectAccessReview", &raw), "SelfSubjectAccessReview").unwrap();
        assert_eq!(
            value,
            json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "metadata": {},
                "spec": {"resourceAttributes": {
                    "namespace": "default", "verb": "get", "group": "content.stowage.dev",
                    "resource": "bundles", "subresource": "content",
                }},
            })
        );
        let rules = [bytes(1, &[]), bytes(2, &bytes(1, b"team-a"))].concat();
        let value = to_json(&envelope("SelfSubjectRulesReview", &rules), "SelfSubjectRulesReview").unwrap();
        assert_eq!(value["spec"], json!({"namespace": "team-a"}));
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert_eq!(to_json(b"{}", "SelfSubjectReview"), Err(ProtobufError::NoEnvelope));
        let good = envelope("SelfSubjectRulesReview", &bytes(2, &bytes(1, b"a")));
        for cut in 4..good.len() {
            // Every truncation is an error or a shorter object, never a panic.
            let _ = to_json(&good[..cut], "SelfSubjectRulesReview");
        }
        let overlong = [MAGIC, &[0xff; 11][..]].concat();
        assert_eq!(to_json(&overlong, "SelfSubjectReview"), Err(ProtobufError::Malformed));
        let huge_length = [MAGIC, &[2 << 3 | 2, 0xff, 0xff, 0xff, 0xff, 0x0f][..]].concat();
        assert_eq!(to_json(&huge_length, "SelfSubjectReview"), Err(ProtobufError::Malformed));
        let gzipped = [MAGIC.to_vec(), bytes(2, b""), bytes(3, b"gzip")].concat();
        assert_eq!(to_json(&gzipped, "SelfSubjectReview"), Err(ProtobufError::Encoded));
        assert_eq!(to_json(MAGIC, "SelfSubjectReview"), Err(ProtobufError::Empty));
        let bad_text = envelope("SelfSubjectRulesReview", &bytes(2, &bytes(1, &[0xff])));
        assert_eq!(to_json(&bad_text, "SelfSubjectRulesReview"), Err(ProtobufError::NotUtf8));
        let group = [MAGIC, &[3 << 3 | 3][..]].concat();
        assert_eq!(to_json(&group, "SelfSubjectReview"), Err(ProtobufError::Malformed));
    }
}
