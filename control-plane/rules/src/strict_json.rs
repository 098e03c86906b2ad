//! JSON as the operators' API accepts it: a duplicate key in an object is an
//! error (with plain serde_json the last one silently wins, so
//! `{"kind":"TaskRun", …, "kind":"Device"}` would apply a Device), and
//! nesting is bounded (serde_json's own limit, 128 levels).

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// Parses `bytes` as JSON, refusing duplicate keys.
pub fn parse(bytes: &[u8]) -> Result<Value, String> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = Strict
        .deserialize(&mut deserializer)
        .map_err(|e| e.to_string())?;
    deserializer.end().map_err(|e| e.to_string())?;
    Ok(value)
}

struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            let value = map.next_value_seed(Strict)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// The deepest nesting of `[` and `{` in a text, outside strings: a cheap
/// check before handing a file to a parser.
pub fn nesting_depth(text: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (None::<char>, false);
    for c in text.chars() {
        match in_string {
            Some(quote) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == quote {
                    in_string = None;
                }
            }
            None => match c {
                '"' | '\'' => in_string = Some(c),
                '[' | '{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_json_table() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let cases: &[(&str, Result<&str, &str>)] = &[
            (
                r#"{"a":1,"b":[1,{"c":null}]}"#,
                Ok(r#"{"a":1,"b":[1,{"c":null}]}"#),
            ),
            (
                r#"{"kind":"TaskRun","kind":"Device"}"#,
                Err("duplicate key \"kind\""),
            ),
            (r#"{"a":{"x":1,"x":2}}"#, Err("duplicate key \"x\"")),
            (&deep, Err("recursion limit exceeded")),
            ("{} {}", Err("trailing characters")),
            ("", Err("EOF")),
        ];
        for (input, expected) in cases {
            match (parse(input.as_bytes()), expected) {
                (Ok(value), Ok(text)) => assert_eq!(value.to_string(), *text),
                (Err(e), Err(fragment)) => assert!(e.contains(fragment), "{input}: {e}"),
                (got, _) => panic!("{input}: {got:?}"),
            }
        }
        assert_eq!(nesting_depth("a: [1, {b: \"[[[\"}]"), 2);
        assert_eq!(nesting_depth(&"[".repeat(40_000)), 40_000);
    }
}
