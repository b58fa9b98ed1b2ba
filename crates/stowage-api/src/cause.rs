//! Why an object is invalid, field by field: `metav1.StatusCause` as validation produces it. The
//! API layer puts these into a 422 `Status`; the unpacker and clients read the same type.

use serde::{Deserialize, Serialize};

/// One reason an object is invalid, as in `metav1.StatusCause` (whose `Type` is sent as `reason`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl Cause {
    /// `field: Invalid value: <value>: <detail>`
    pub fn invalid(field: impl Into<String>, value: &serde_json::Value, detail: impl Into<String>) -> Cause {
        let field = field.into();
        let detail = detail.into();
        Cause { reason: "FieldValueInvalid".into(), message: format!("Invalid value: {value}: {detail}"), field }
    }

    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Cause {
        Cause {
            reason: "FieldValueRequired".into(),
            message: format!("Required value: {}", detail.into()),
            field: field.into(),
        }
    }

    pub fn not_supported(field: impl Into<String>, value: &serde_json::Value, supported: &[&str]) -> Cause {
        let list = supported.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
        Cause {
            reason: "FieldValueNotSupported".into(),
            message: format!("Unsupported value: {value}: supported values: {list}"),
            field: field.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Cause {
        Cause {
            reason: "FieldValueForbidden".into(),
            message: format!("Forbidden: {}", detail.into()),
            field: field.into(),
        }
    }

    pub fn type_invalid(field: impl Into<String>, value: &serde_json::Value, expected: &str) -> Cause {
        let field = field.into();
        Cause {
            reason: "FieldValueTypeInvalid".into(),
            message: format!("Invalid value: {value}: {field} in body must be of type {expected}"),
            field,
        }
    }
}
