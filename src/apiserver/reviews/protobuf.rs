//! Just enough of Kubernetes' protobuf encoding to read the three review bodies, which kubectl
//! (1.32 on) sends as `application/vnd.kubernetes.protobuf` for built-in kinds and never retries
//! as JSON: the `k8s\0` envelope (a `runtime.Unknown` carrying the apiVersion and kind) around the
//! object's message. Only the fields a review reads are decoded, into the JSON shape the
//! k8s-openapi types take; other fields are skipped by their wire type. Answers are JSON, which
//! kubectl accepts as well. Depth is bounded by the schemas below, size by the body limit.

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

/// How a field is read.
enum Shape {
    Text,
    Message(&'static [FieldShape]),
}

/// A message field: its number, its JSON name and how it is read.
struct FieldShape(u64, &'static str, Shape);

use Shape::{Message, Text};

const TYPE_META: &[FieldShape] = &[FieldShape(1, "apiVersion", Text), FieldShape(2, "kind", Text)];
/// `ObjectMeta`: the fields that make metadata "not empty" for a review.
const OBJECT_META: &[FieldShape] =
    &[FieldShape(1, "name", Text), FieldShape(2, "generateName", Text), FieldShape(3, "namespace", Text)];
const RESOURCE_ATTRIBUTES: &[FieldShape] = &[
    FieldShape(1, "namespace", Text),
    FieldShape(2, "verb", Text),
    FieldShape(3, "group", Text),
    FieldShape(4, "version", Text),
    FieldShape(5, "resource", Text),
    FieldShape(6, "subresource", Text),
    FieldShape(7, "name", Text),
];
const NON_RESOURCE_ATTRIBUTES: &[FieldShape] = &[FieldShape(1, "path", Text), FieldShape(2, "verb", Text)];
const ACCESS_REVIEW: &[FieldShape] = &[
    FieldShape(1, "metadata", Message(OBJECT_META)),
    FieldShape(
        2,
        "spec",
        Message(&[
            FieldShape(1, "resourceAttributes", Message(RESOURCE_ATTRIBUTES)),
            FieldShape(2, "nonResourceAttributes", Message(NON_RESOURCE_ATTRIBUTES)),
        ]),
    ),
];
const RULES_REVIEW: &[FieldShape] = &[
    FieldShape(1, "metadata", Message(OBJECT_META)),
    FieldShape(2, "spec", Message(&[FieldShape(1, "namespace", Text)])),
];
const SUBJECT_REVIEW: &[FieldShape] = &[FieldShape(1, "metadata", Message(OBJECT_META))];

/// The body of a review of kind `kind` as JSON, with the envelope's apiVersion and kind.
pub fn to_json(body: &[u8], kind: &str) -> Result<Value, ProtobufError> {
    let envelope = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoEnvelope)?;
    let (mut type_meta, mut raw, mut encoded) = (Map::new(), None, false);
    for (number, field) in Fields(envelope) {
        match (number, field?) {
            (1, Field::Bytes(bytes)) => type_meta = message(bytes, TYPE_META)?,
            (2, Field::Bytes(bytes)) => raw = Some(bytes),
            (3, Field::Bytes(bytes)) => encoded = !bytes.is_empty(),
            (1..=3, _) => return Err(ProtobufError::Malformed),
            _ => {}
        }
    }
    if encoded {
        return Err(ProtobufError::Encoded);
    }
    let shape = match kind {
        "SelfSubjectAccessReview" => ACCESS_REVIEW,
        "SelfSubjectRulesReview" => RULES_REVIEW,
        _ => SUBJECT_REVIEW,
    };
    let mut object = message(raw.ok_or(ProtobufError::Empty)?, shape)?;
    object.extend(type_meta);
    Ok(Value::Object(object))
}

/// The fields of `shape` found in `bytes`; empty strings are left out, as JSON's `omitempty` does.
fn message(bytes: &[u8], shape: &'static [FieldShape]) -> Result<Map<String, Value>, ProtobufError> {
    let mut out = Map::new();
    for (number, field) in Fields(bytes) {
        let field = field?;
        let Some(FieldShape(_, name, kind)) = shape.iter().find(|f| f.0 == number) else { continue };
        let Field::Bytes(bytes) = field else { return Err(ProtobufError::Malformed) };
        match kind {
            Text => {
                let text = std::str::from_utf8(bytes).map_err(|_| ProtobufError::NotUtf8)?;
                match text.is_empty() {
                    true => out.remove(*name),
                    false => out.insert((*name).to_owned(), text.into()),
                };
            }
            Message(inner) => {
                out.insert((*name).to_owned(), Value::Object(message(bytes, inner)?));
            }
        }
    }
    Ok(out)
}

/// One field's value: length-delimited bytes, or a scalar the reviews never read.
enum Field<'a> {
    Bytes(&'a [u8]),
    Scalar,
}

/// The fields of a message, in order; an error ends the iteration.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = (u64, Result<Field<'a>, ProtobufError>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            self.0 = &[];
        }
        Some(field.map_or_else(|e| (0, Err(e)), |(number, field)| (number, Ok(field))))
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u64, Field<'a>), ProtobufError> {
        let key = self.varint()?;
        let field = match key & 7 {
            0 => self.varint().map(|_| Field::Scalar)?,
            1 => self.take(8).map(|_| Field::Scalar)?,
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| ProtobufError::Malformed)?;
                Field::Bytes(self.take(len)?)
            }
            5 => self.take(4).map(|_| Field::Scalar)?,
            // Groups (3, 4) are not used by Kubernetes; 6 and 7 do not exist.
            _ => return Err(ProtobufError::Malformed),
        };
        Ok((key >> 3, field))
    }

    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut value = 0u64;
        for (i, byte) in self.0.iter().take(10).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.0 = self.0.get(i + 1..).unwrap_or_default();
                return Ok(value);
            }
        }
        Err(ProtobufError::Malformed)
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], ProtobufError> {
        if len > self.0.len() {
            return Err(ProtobufError::Malformed);
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(head)
    }
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
