//! Label and field selectors for list requests (`labelSelector=`, `fieldSelector=`).

use serde_json::{json, Value};

use super::status::{ApiError, ApiResult};
use crate::api::meta::{label_value_errors, qualified_name_errors};
use crate::api::Cause;

#[derive(Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Default)]
pub struct LabelSelector(Vec<Requirement>);

impl LabelSelector {
    /// apimachinery's `labels.Parse`: `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (a,b)`,
    /// `key notin (a,b)` (a space before `(` or not), `key>1`, `key<1`, joined by commas; keys and
    /// values as labels take them. What it refuses is a 400 with kube's message.
    pub fn parse(text: &str) -> ApiResult<LabelSelector> {
        Parser { tokens: lex(text), at: 0 }.selector().map(LabelSelector).map_err(ApiError::bad_request)
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let number = |k: &str| get(k).and_then(|v| v.parse::<i64>().ok());
        self.0.iter().all(|req| match req {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::GreaterThan(k, n) => number(k).is_some_and(|x| x > *n),
            Requirement::LessThan(k, n) => number(k).is_some_and(|x| x < *n),
        })
    }
}

/// The tokens of apimachinery's selector lexer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    End,
    OpenPar,
    ClosedPar,
    Comma,
    DoesNotExist,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    In,
    NotIn,
    Identifier,
}

/// What the binary operator position takes, as kube lists it.
const BINARY_OPERATORS: &str = "in, notin, =, ==, !=, gt, lt";

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

/// Whitespace separates; `= ! ( ) , > <` are symbols (`!=` and `==` one each); every other run of
/// characters is an identifier, `in` and `notin` keywords. Ends with [`Token::End`].
fn lex(text: &str) -> Vec<(Token, String)> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if is_space(c) {
            continue;
        }
        let token = match c {
            '!' | '=' if chars.peek() == Some(&'=') => {
                chars.next();
                if c == '!' {
                    (Token::NotEquals, "!=".to_string())
                } else {
                    (Token::DoubleEquals, "==".to_string())
                }
            }
            '!' => (Token::DoesNotExist, c.to_string()),
            '=' => (Token::Equals, c.to_string()),
            '(' => (Token::OpenPar, c.to_string()),
            ')' => (Token::ClosedPar, c.to_string()),
            ',' => (Token::Comma, c.to_string()),
            '>' => (Token::GreaterThan, c.to_string()),
            '<' => (Token::LessThan, c.to_string()),
            _ => {
                let mut word = c.to_string();
                while let Some(next) = chars.next_if(|n| !is_special(*n) && !is_space(*n)) {
                    word.push(next);
                }
                let token = match word.as_str() {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Identifier,
                };
                (token, word)
            }
        };
        tokens.push(token);
    }
    tokens.push((Token::End, String::new()));
    tokens
}

/// Where a token is read: `in` and `notin` are keywords only where an operator is expected, so
/// `x in (in)` and `in=notin` select what they say.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Operator,
    Values,
}

/// apimachinery's recursive-descent parser, error for error.
struct Parser {
    tokens: Vec<(Token, String)>,
    at: usize,
}

impl Parser {
    fn lookahead(&self, context: Context) -> (Token, String) {
        let (token, literal) = self.tokens.get(self.at).cloned().unwrap_or((Token::End, String::new()));
        match token {
            Token::In | Token::NotIn if context == Context::Values => (Token::Identifier, literal),
            _ => (token, literal),
        }
    }

    fn consume(&mut self, context: Context) -> (Token, String) {
        let next = self.lookahead(context);
        self.at = (self.at + 1).min(self.tokens.len());
        next
    }

    fn selector(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (token, literal) = self.lookahead(Context::Values);
            match token {
                Token::Identifier | Token::DoesNotExist => {
                    let requirement = self.requirement().map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(requirement);
                    let (token, literal) = self.consume(Context::Values);
                    match token {
                        Token::End => return Ok(requirements),
                        Token::Comma => {
                            let (next, literal) = self.lookahead(Context::Values);
                            if next != Token::Identifier && next != Token::DoesNotExist {
                                return Err(format!("found '{literal}', expected: identifier after ','"));
                            }
                        }
                        _ => return Err(format!("found '{literal}', expected: ',' or 'end of string'")),
                    }
                }
                Token::End => return Ok(requirements),
                _ => return Err(format!("found '{literal}', expected: !, identifier, or 'end of string'")),
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, String> {
        let (negated, key) = self.key()?;
        let (next, _) = self.lookahead(Context::Values);
        if negated {
            // `!key` takes no operator; what follows is for `selector` to refuse.
            return Ok(Requirement::NotExists(key));
        }
        if next == Token::End || next == Token::Comma {
            return Ok(Requirement::Exists(key));
        }
        let (operator, literal) = self.consume(Context::Operator);
        match operator {
            Token::In | Token::NotIn => {
                let values = self.values()?;
                check_values(&key, &values)?;
                Ok(if operator == Token::In { Requirement::In(key, values) } else { Requirement::NotIn(key, values) })
            }
            Token::Equals | Token::DoubleEquals | Token::NotEquals => {
                let value = self.exact_value()?;
                check_values(&key, std::slice::from_ref(&value))?;
                Ok(if operator == Token::NotEquals {
                    Requirement::NotEquals(key, value)
                } else {
                    Requirement::Equals(key, value)
                })
            }
            Token::GreaterThan | Token::LessThan => {
                let value = self.exact_value()?;
                let number = value.parse::<i64>();
                let mut errors = Vec::new();
                if number.is_err() {
                    errors.push(field_error(
                        "values[0]",
                        &value,
                        "for 'Gt', 'Lt' operators, the value must be an integer",
                    ));
                }
                errors.extend(value_errors(&key, std::slice::from_ref(&value)));
                match number {
                    Ok(n) if errors.is_empty() && operator == Token::GreaterThan => {
                        Ok(Requirement::GreaterThan(key, n))
                    }
                    Ok(n) if errors.is_empty() => Ok(Requirement::LessThan(key, n)),
                    _ => Err(aggregate(errors)),
                }
            }
            _ => Err(format!("found '{literal}', expected: {BINARY_OPERATORS}")),
        }
    }

    /// `[!]key`, the key valid as a label key.
    fn key(&mut self) -> Result<(bool, String), String> {
        let (mut token, mut literal) = self.consume(Context::Values);
        let negated = token == Token::DoesNotExist;
        if negated {
            (token, literal) = self.consume(Context::Values);
        }
        if token != Token::Identifier {
            return Err(format!("found '{literal}', expected: identifier"));
        }
        let errors = qualified_name_errors(&literal);
        if !errors.is_empty() {
            // Parsed without a field path, as list options are: kube prints the nil path.
            return Err(field_error("<nil>", &literal, &errors.join("; ")));
        }
        Ok((negated, literal))
    }

    /// `( value, … )`: empty values allowed (`()`, `(,a)`); sorted and unique, as kube keeps them.
    fn values(&mut self) -> Result<Vec<String>, String> {
        let (token, literal) = self.consume(Context::Values);
        if token != Token::OpenPar {
            return Err(format!("found '{literal}' expected: '('"));
        }
        let (token, literal) = self.lookahead(Context::Values);
        let mut values = match token {
            Token::Identifier | Token::Comma => {
                let values = self.identifiers()?;
                if self.consume(Context::Values).0 != Token::ClosedPar {
                    return Err(format!("found '{literal}', expected: ')'"));
                }
                values
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                vec![String::new()]
            }
            _ => return Err(format!("found '{literal}', expected: ',', ')' or identifier")),
        };
        values.sort();
        values.dedup();
        Ok(values)
    }

    /// The values inside `( … )`, up to (not including) the closing parenthesis.
    fn identifiers(&mut self) -> Result<Vec<String>, String> {
        let mut values = Vec::new();
        loop {
            let (token, literal) = self.consume(Context::Values);
            match token {
                Token::Identifier => {
                    values.push(literal);
                    let (next, literal) = self.lookahead(Context::Values);
                    match next {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(values),
                        _ => return Err(format!("found '{literal}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if values.is_empty() {
                        values.push(String::new()); // `(,`
                    }
                    match self.lookahead(Context::Values).0 {
                        Token::ClosedPar => {
                            values.push(String::new()); // `,)`
                            return Ok(values);
                        }
                        Token::Comma => {
                            self.consume(Context::Values);
                            values.push(String::new()); // `,,`
                        }
                        _ => {}
                    }
                }
                _ => return Err(format!("found '{literal}', expected: ',', or identifier")),
            }
        }
    }

    /// The value after `=`, `==`, `!=`, `>` or `<`; empty when the requirement ends there.
    fn exact_value(&mut self) -> Result<String, String> {
        let (next, _) = self.lookahead(Context::Values);
        if next == Token::End || next == Token::Comma {
            return Ok(String::new());
        }
        match self.consume(Context::Values) {
            (Token::Identifier, literal) => Ok(literal),
            (_, literal) => Err(format!("found '{literal}', expected: identifier")),
        }
    }
}

/// `field: Invalid value: "value": detail`, as apimachinery's `field.Error` reads.
fn field_error(field: &str, value: &str, detail: &str) -> String {
    format!("{field}: {}", Cause::invalid("", &json!(value), detail).message)
}

fn value_errors(key: &str, values: &[String]) -> Vec<String> {
    values
        .iter()
        .enumerate()
        .filter_map(|(i, value)| {
            let errors = label_value_errors(value);
            (!errors.is_empty()).then(|| field_error(&format!("values[{i}][{key}]"), value, &errors.join("; ")))
        })
        .collect()
}

fn check_values(key: &str, values: &[String]) -> Result<(), String> {
    let errors = value_errors(key, values);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(aggregate(errors))
    }
}

/// One error as it is; several as apimachinery's `utilerrors.Aggregate` prints them.
fn aggregate(errors: Vec<String>) -> String {
    match <[String; 1]>::try_from(errors) {
        Ok([one]) => one,
        Err(errors) => format!("[{}]", errors.join(", ")),
    }
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

    fn refusal(selector: &str) -> String {
        match LabelSelector::parse(selector) {
            Ok(parsed) => panic!("{selector:?} parsed: {parsed:?}"),
            Err(err) => {
                assert_eq!(err.code, http::StatusCode::BAD_REQUEST, "{selector:?}");
                err.message
            }
        }
    }

    #[test]
    fn every_form_kube_takes() {
        let obj =
            json!({"metadata": {"labels": {"app": "x", "tier": "web", "example.com/team": "a", "n": "7", "e": ""}}});
        for (sel, want) in [
            ("", true),
            ("  ", true),
            ("app", true),
            ("!db", true),
            ("! app", false),
            ("app=x", true),
            ("app==x", true),
            ("app = x", true),
            ("app!=x", false),
            ("e=", true),
            ("e==,app", true),
            ("app in (x,y)", true),
            ("app in(x,y)", true),
            ("app in ( y , x )", true),
            ("app notin (x)", false),
            ("app notin(y)", true),
            ("missing notin (x)", true),
            ("e in ()", true),
            ("e in (,z)", true),
            ("app in (in)", false),
            ("example.com/team=a", true),
            ("n>6,n<8", true),
            ("n>7", false),
            ("app>1", false),
            ("app=x,tier in (web),!db", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&obj), want, "{sel}");
        }
        // Keywords are values where a value is expected.
        let keywords = json!({"metadata": {"labels": {"in": "notin"}}});
        assert!(LabelSelector::parse("in=notin").unwrap().matches(&keywords));
        assert!(LabelSelector::parse("in in (notin)").unwrap().matches(&keywords));
    }

    #[test]
    fn refusals_in_kube_words() {
        for (sel, want) in [
            ("app in (x", "unable to parse requirement: found '', expected: ',' or ')'"),
            ("app in x", "unable to parse requirement: found 'x' expected: '('"),
            ("app in (=)", "unable to parse requirement: found '=', expected: ',', ')' or identifier"),
            ("app in (x y)", "unable to parse requirement: found 'y', expected: ',' or ')'"),
            ("app x", "unable to parse requirement: found 'x', expected: in, notin, =, ==, !=, gt, lt"),
            ("appin(x)", "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"),
            ("app=(x)", "unable to parse requirement: found '(', expected: identifier"),
            ("!=x", "found '!=', expected: !, identifier, or 'end of string'"),
            ("!(x)", "unable to parse requirement: found '(', expected: identifier"),
            ("app=x,", "found '', expected: identifier after ','"),
            ("app=x y", "found 'y', expected: ',' or 'end of string'"),
            ("!app=x", "found '=', expected: ',' or 'end of string'"),
            (",app", "found ',', expected: !, identifier, or 'end of string'"),
            ("n>x", "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"),
        ] {
            assert_eq!(refusal(sel), want, "{sel:?}");
        }
        let key = refusal("-app=x");
        assert!(
            key.starts_with("unable to parse requirement: <nil>: Invalid value: \"-app\": name part must consist of"),
            "{key}"
        );
        let long = refusal(&format!("{}=x", "k".repeat(64)));
        assert!(long.contains("name part must be no more than 63 characters"), "{long}");
        let prefix = refusal("Example.com/app");
        assert!(prefix.contains(": prefix part a lowercase RFC 1123 subdomain must consist of"), "{prefix}");
        let value = refusal("app=-x");
        assert!(
            value.starts_with(
                "unable to parse requirement: values[0][app]: Invalid value: \"-x\": a valid label must be"
            ),
            "{value}"
        );
        let long = refusal(&format!("app={}", "v".repeat(64)));
        assert!(long.contains("values[0][app]: Invalid value:") && long.contains("must be no more than 63 characters"));
        // Sorted as kube keeps a set; both bad values named, as an aggregate.
        let set = refusal("app in (z_, -a)");
        assert!(set.starts_with("unable to parse requirement: [values[0][app]: Invalid value: \"-a\": "), "{set}");
        assert!(set.contains(", values[1][app]: Invalid value: \"z_\": ") && set.ends_with("]"), "{set}");
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
