//! The part of an object a request reads and writes: the main resource writes everything but
//! `status`, the `status` subresource only `status` (a CRD with a status subresource). Apply and
//! ownership tracking work on that part, the *view*, and the result is put back into the object.

use serde_json::{json, Map, Value};

use super::ApplyError;

/// What part of the object a request writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The main resource: everything but `status`.
    Main,
    /// The `status` subresource: only `status`.
    Status,
}

impl Scope {
    pub fn of(subresource: Option<&str>) -> Result<Scope, ApplyError> {
        match subresource {
            None | Some("") => Ok(Scope::Main),
            Some("status") => Ok(Scope::Status),
            Some(other) => {
                Err(ApplyError::BadRequest(format!("field management is not supported for subresource {other:?}")))
            }
        }
    }

    pub fn subresource(self) -> &'static str {
        match self {
            Scope::Main => "",
            Scope::Status => "status",
        }
    }

    /// The part of `object` this scope reads and writes, without `metadata.managedFields`.
    pub fn view(self, object: &Value) -> Value {
        match self {
            Scope::Main => {
                let mut view = match object {
                    Value::Object(map) => map.clone(),
                    _ => Map::new(),
                };
                view.remove("status");
                if let Some(Value::Object(metadata)) = view.get_mut("metadata") {
                    metadata.remove("managedFields");
                }
                Value::Object(view)
            }
            Scope::Status => match object.get("status") {
                Some(status) => json!({ "status": status }),
                None => json!({}),
            },
        }
    }

    /// `base` with its scoped part replaced by `view`.
    pub fn recombine(self, base: Option<&Value>, view: Value) -> Value {
        match self {
            Scope::Main => {
                let mut out = view;
                if let (Some(status), Value::Object(map)) = (base.and_then(|b| b.get("status")), &mut out) {
                    map.insert("status".into(), status.clone());
                }
                out
            }
            Scope::Status => {
                let mut out = base.cloned().unwrap_or_else(|| json!({}));
                if let Value::Object(map) = &mut out {
                    match view.get("status") {
                        Some(status) => map.insert("status".into(), status.clone()),
                        None => map.remove("status"),
                    };
                }
                out
            }
        }
    }
}
