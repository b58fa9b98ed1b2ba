//! Renders the version-neutral [`Operation`]s as the `paths` of a Swagger 2.0 or OpenAPI 3.0
//! document. Every operation carries `x-kubernetes-action` and `x-kubernetes-group-version-kind`.

use serde_json::{json, Map, Value};

use super::operations::{Operation, Payload, QueryParam};
use super::Dialect;
use crate::apiserver::schema::set_field;
use crate::apiserver::{GROUP, VERSION};

const TAG: &str = "contentStowageDev_v1alpha1";

/// `paths`: one item per path (with its path parameters), one operation per method.
pub fn paths(dialect: Dialect, operations: &[Operation]) -> Map<String, Value> {
    let mut paths = Map::new();
    for op in operations {
        let item = paths.entry(op.path.clone()).or_insert_with(|| {
            let in_path = |name: &str| op.path.contains(&format!("{{{name}}}"));
            let params: Vec<Value> =
                ["name", "namespace"].into_iter().filter(|n| in_path(n)).map(|n| path_param(dialect, n)).collect();
            json!({"parameters": params})
        });
        item[op.method] = operation(dialect, op);
    }
    paths
}

fn path_param(dialect: Dialect, name: &str) -> Value {
    let description = match name {
        "namespace" => "object name and auth scope, such as for teams and projects",
        _ => "name of the object",
    };
    let mut param = json!({"name": name, "in": "path", "required": true, "description": description});
    set_type(dialect, &mut param, "string");
    param
}

fn query_param(dialect: Dialect, (name, kind, description): &QueryParam) -> Value {
    let mut param = json!({"name": name, "in": "query", "description": description});
    set_type(dialect, &mut param, kind);
    param
}

/// Swagger 2.0 types non-body parameters directly; OpenAPI 3 through a schema (which is also where
/// `uniqueItems` belongs there).
fn set_type(dialect: Dialect, param: &mut Value, kind: &str) {
    match dialect {
        Dialect::Swagger2 => {
            param["type"] = json!(kind);
            param["uniqueItems"] = json!(true);
        }
        Dialect::OpenApi3 => param["schema"] = json!({"type": kind, "uniqueItems": true}),
    }
}

fn schema(dialect: Dialect, payload: &Payload) -> Value {
    match payload {
        Payload::Definition(name) => dialect.reference(name),
        Payload::Binary => json!({"type": "string", "format": "binary"}),
    }
}

fn operation(dialect: Dialect, op: &Operation) -> Value {
    let mut params: Vec<Value> = op.query.iter().map(|q| query_param(dialect, q)).collect();
    let (response_types, response_payload) = &op.response;
    let mut responses = Map::new();
    for code in op.codes {
        let description = match *code {
            "201" => "Created",
            "202" => "Accepted",
            _ => "OK",
        };
        let response = match dialect {
            Dialect::Swagger2 => json!({"description": description, "schema": schema(dialect, response_payload)}),
            Dialect::OpenApi3 => {
                let content: Map<String, Value> = response_types
                    .iter()
                    .map(|t| (t.to_string(), json!({"schema": schema(dialect, response_payload)})))
                    .collect();
                json!({"description": description, "content": content})
            }
        };
        responses.insert(code.to_string(), response);
    }
    responses.insert("401".into(), json!({"description": "Unauthorized"}));
    let mut out = json!({
        "description": op.description,
        "operationId": op.id,
        "tags": [TAG],
        "parameters": [],
        "responses": responses,
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": {"group": GROUP, "version": VERSION, "kind": op.kind},
    });
    // DELETE bodies (DeleteOptions) are optional.
    let required = op.method != "delete";
    match dialect {
        Dialect::Swagger2 => {
            let consumes: &[&str] = op.request.as_ref().map(|(types, _)| *types).unwrap_or(&["*/*"]);
            set_field(&mut out, "consumes", json!(consumes));
            set_field(&mut out, "produces", json!(response_types));
            set_field(&mut out, "schemes", json!(["https"]));
            if let Some((_, payload)) = &op.request {
                let body =
                    json!({"name": "body", "in": "body", "required": required, "schema": schema(dialect, payload)});
                params.push(body);
            }
        }
        Dialect::OpenApi3 => {
            if let Some((types, payload)) = &op.request {
                let content: Map<String, Value> =
                    types.iter().map(|t| (t.to_string(), json!({"schema": schema(dialect, payload)}))).collect();
                set_field(&mut out, "requestBody", json!({"content": content, "required": required}));
            }
        }
    }
    set_field(&mut out, "parameters", Value::Array(params));
    out
}
