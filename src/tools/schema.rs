//! A small JSON-schema check for tool arguments: the subset tool schemas use
//! here (object, properties with type, enum, required, min/max, items).
//! Errors name the argument so the model can fix its call.

use serde_json::Value;

/// Checks `args` against `schema`; the error says which argument is wrong.
pub fn validate(schema: &Value, args: &Value) -> Result<(), String> {
    check(schema, args, "")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn matches_type(expected: &str, v: &Value) -> bool {
    match expected {
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        other => type_name(v) == other,
    }
}

fn check(schema: &Value, v: &Value, path: &str) -> Result<(), String> {
    let at = if path.is_empty() {
        "arguments".to_string()
    } else {
        format!("`{path}`")
    };
    if let Some(t) = schema.get("type") {
        let ok = match t {
            Value::String(s) => matches_type(s, v),
            Value::Array(ts) => ts
                .iter()
                .filter_map(Value::as_str)
                .any(|s| matches_type(s, v)),
            _ => true,
        };
        if !ok {
            return Err(format!(
                "{at} must be {} (got {})",
                describe_type(t),
                type_name(v)
            ));
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        if !options.contains(v) {
            let list: Vec<String> = options.iter().map(Value::to_string).collect();
            return Err(format!("{at} must be one of {}", list.join(", ")));
        }
    }
    if let (Some(min), Some(x)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if x < min {
            return Err(format!("{at} must be at least {min}"));
        }
    }
    if let (Some(max), Some(x)) = (schema.get("maximum").and_then(Value::as_f64), v.as_f64()) {
        if x > max {
            return Err(format!("{at} must be at most {max}"));
        }
    }
    if let (Some(min), Some(s)) = (schema.get("minLength").and_then(Value::as_u64), v.as_str()) {
        if (s.chars().count() as u64) < min {
            return Err(format!("{at} must have at least {min} characters"));
        }
    }
    if let Value::Object(obj) = v {
        if let Some(req) = schema.get("required").and_then(Value::as_array) {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    let p = join(path, r);
                    return Err(format!("missing required argument `{p}`"));
                }
            }
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (k, val) in obj {
                match props.get(k) {
                    Some(s) => check(s, val, &join(path, k))?,
                    None => {
                        if schema.get("additionalProperties") == Some(&Value::Bool(false)) {
                            let known: Vec<&str> = props.keys().map(String::as_str).collect();
                            return Err(format!(
                                "unknown argument `{}` (known: {})",
                                join(path, k),
                                known.join(", ")
                            ));
                        }
                    }
                }
            }
        }
    }
    if let (Value::Array(items), Some(s)) = (v, schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check(
                s,
                item,
                &format!("{}[{i}]", if path.is_empty() { "arguments" } else { path }),
            )?;
        }
    }
    Ok(())
}

fn describe_type(t: &Value) -> String {
    match t {
        Value::String(s) => format!(
            "a{} {s}",
            if s.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "n"
            } else {
                ""
            }
        ),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "valid".into(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "n": {"type": "integer", "minimum": 0},
                "mode": {"type": "string", "enum": ["all", "any"]},
                "ids": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["text"],
            "additionalProperties": false
        })
    }

    #[test]
    fn accepts_valid_arguments() {
        assert_eq!(
            validate(
                &schema(),
                &json!({"text": "x", "n": 3, "mode": "any", "ids": ["a"]})
            ),
            Ok(())
        );
    }

    #[test]
    fn names_the_problem() {
        let s = schema();
        assert_eq!(
            validate(&s, &json!({})),
            Err("missing required argument `text`".into())
        );
        assert_eq!(
            validate(&s, &json!({"text": 1})),
            Err("`text` must be a string (got integer)".into())
        );
        assert_eq!(
            validate(&s, &json!({"text": "x", "n": -1})),
            Err("`n` must be at least 0".into())
        );
        assert_eq!(
            validate(&s, &json!({"text": "x", "mode": "some"})),
            Err("`mode` must be one of \"all\", \"any\"".into())
        );
        assert_eq!(
            validate(&s, &json!({"text": "x", "ids": [1]})),
            Err("`ids[0]` must be a string (got integer)".into())
        );
        assert!(validate(&s, &json!({"text": "x", "zzz": 1}))
            .unwrap_err()
            .contains("unknown argument `zzz`"));
        assert_eq!(
            validate(&s, &json!([1])),
            Err("arguments must be an object (got array)".into())
        );
    }
}
