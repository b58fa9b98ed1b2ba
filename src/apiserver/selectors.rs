//! Label and field selectors for list requests (`labelSelector=`, `fieldSelector=`).

use serde_json::Value;

use super::status::{ApiError, ApiResult};

#[derive(Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Default)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    pub fn parse(text: &str) -> ApiResult<LabelSelector> {
        let mut reqs = Vec::new();
        for term in split_terms(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let bad = || ApiError::bad_request(format!("unable to parse requirement: invalid label selector {term:?}"));
            let req = if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = term.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = term.split_once(" notin ") {
                Requirement::NotIn(k.trim().into(), parse_set(rest).ok_or_else(bad)?)
            } else if let Some((k, rest)) = term.split_once(" in ") {
                Requirement::In(k.trim().into(), parse_set(rest).ok_or_else(bad)?)
            } else if term.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
                Requirement::Exists(term.to_string())
            } else {
                return Err(bad());
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// Splits on commas that are not inside `( … )`.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

fn parse_set(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
}

/// A parsed field selector over the fields a resource supports.
#[derive(Debug, Default)]
pub struct FieldSelector(Vec<(String, String, bool)>);

impl FieldSelector {
    /// `fields` maps selector names (e.g. `spec.bundle`) to JSON pointers.
    pub fn parse(text: &str, fields: &[(&str, &str)]) -> ApiResult<FieldSelector> {
        let mut reqs = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: {term:?}; can't understand {term:?}")));
            };
            let Some((_, pointer)) = fields.iter().find(|(name, _)| *name == field.trim()) else {
                let known: Vec<String> = fields.iter().map(|(n, _)| format!("{n:?}")).collect();
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {} (supported: {})",
                    field.trim(),
                    known.join(", ")
                )));
            };
            reqs.push((pointer.to_string(), value.trim().to_string(), equal));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(pointer, value, equal)| {
            let actual = obj.pointer(pointer).and_then(Value::as_str).unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let obj = json!({"metadata": {"labels": {"app": "x", "tier": "web"}}});
        for (sel, want) in [
            ("app=x", true),
            ("app==x,tier!=db", true),
            ("app in (x,y)", true),
            ("app notin (x)", false),
            ("tier", true),
            ("!tier", false),
            ("missing!=1", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&obj), want, "{sel}");
        }
    }

    #[test]
    fn field_selectors() {
        let obj = json!({"metadata": {"name": "a", "namespace": "n"}});
        let fields = [("metadata.name", "/metadata/name"), ("metadata.namespace", "/metadata/namespace")];
        assert!(FieldSelector::parse("metadata.name=a", &fields).unwrap().matches(&obj));
        assert!(!FieldSelector::parse("metadata.name!=a", &fields).unwrap().matches(&obj));
        assert!(FieldSelector::parse("spec.x=a", &fields).is_err());
    }
}
