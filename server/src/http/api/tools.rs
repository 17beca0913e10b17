//! Function calling for any model, the way llama.cpp's generic tool format
//! does it: the tools are described to the model in a system preamble, and
//! the output is constrained (`engine::Grammar`) to one JSON object, either
//! `{"tool_call": {"name": ..., "arguments": {...}}}` or, when the model may
//! answer instead (`tool_choice: "auto"`), `{"response": "..."}`. The
//! object is then parsed into OpenAI's `tool_calls` or plain content, so a
//! forced call always names a declared function with arguments that match
//! its `parameters` schema.

use engine::Grammar;
use serde_json::{Value, json};

use super::types::ChatMessageDto;
use crate::http::error::ApiError;

/// One declared function.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// How a request uses its tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub grammar: Grammar,
    /// The system text that describes the tools and the reply format.
    pub preamble: String,
}

/// What the model produced.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutput {
    Content(String),
    Call { name: String, arguments: String },
}

fn refuse(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(param, message)
}

/// Reads `tools` (functions only).
pub fn functions(tools: &[Value]) -> Result<Vec<Function>, ApiError> {
    if tools.len() > MAX_TOOLS {
        return Err(refuse(
            "tools",
            format!("at most {MAX_TOOLS} tools are allowed"),
        ));
    }
    let fns = parse_functions(tools)?;
    for (i, f) in fns.iter().enumerate() {
        if let Some(j) = fns[..i].iter().position(|g| g.name == f.name) {
            return Err(refuse(
                &format!("tools[{i}].function.name"),
                format!("duplicate function name `{}` (also tools[{j}])", f.name),
            ));
        }
    }
    Ok(fns)
}

/// The most tools a request may declare (OpenAI's limit).
const MAX_TOOLS: usize = 128;

fn parse_functions(tools: &[Value]) -> Result<Vec<Function>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let at = |f: &str| format!("tools[{i}].{f}");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(refuse(
                    &at("type"),
                    "only tools of type `function` are supported",
                ));
            }
            let f = t
                .get("function")
                .ok_or_else(|| refuse(&at("function"), "missing `function`"))?;
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
            let valid = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !valid {
                return Err(refuse(
                    &at("function.name"),
                    "a function name is 1-64 letters, digits, `_` or `-`",
                ));
            }
            let parameters = match f.get("parameters") {
                None => json!({"type": "object", "properties": {}}),
                Some(p) if p.is_object() => p.clone(),
                Some(_) => {
                    return Err(refuse(
                        &at("function.parameters"),
                        "parameters must be a JSON Schema object",
                    ));
                }
            };
            Ok(Function {
                name: name.to_string(),
                description: f
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                parameters,
            })
        })
        .collect()
}

/// The plan for `tools` under `tool_choice` (`None` when no tool may be
/// called: no tools, or `"none"`).
pub fn plan(tools: &[Value], tool_choice: Option<&Value>) -> Result<Option<ToolPlan>, ApiError> {
    if tools.is_empty() {
        return match tool_choice {
            None => Ok(None),
            Some(v) if v == "none" => Ok(None),
            Some(_) => Err(refuse("tool_choice", "tool_choice needs `tools`")),
        };
    }
    let fns = functions(tools)?;
    let (callable, may_answer): (Vec<&Function>, bool) = match tool_choice {
        None => (fns.iter().collect(), true),
        Some(v) if v == "auto" => (fns.iter().collect(), true),
        Some(v) if v == "none" => return Ok(None),
        Some(v) if v == "required" => (fns.iter().collect(), false),
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| refuse("tool_choice", "expected none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}"))?;
            let f = fns.iter().find(|f| f.name == name).ok_or_else(|| {
                refuse(
                    "tool_choice.function.name",
                    format!("no tool named `{name}`"),
                )
            })?;
            (vec![f], false)
        }
    };
    let calls: Vec<Value> = callable
        .iter()
        .map(|f| {
            json!({"type": "object", "properties": {
                "name": {"const": f.name}, "arguments": f.parameters},
                "required": ["name", "arguments"], "additionalProperties": false})
        })
        .collect();
    let call = json!({"type": "object", "properties": {"tool_call": {"anyOf": calls}},
        "required": ["tool_call"], "additionalProperties": false});
    let schema = if may_answer {
        let answer = json!({"type": "object", "properties": {"response": {"type": "string"}},
            "required": ["response"], "additionalProperties": false});
        json!({"anyOf": [call, answer]})
    } else {
        call
    };
    Ok(Some(ToolPlan {
        grammar: Grammar::JsonSchema(schema),
        preamble: preamble(&callable, may_answer),
    }))
}

fn preamble(fns: &[&Function], may_answer: bool) -> String {
    let mut s = String::from("You can call these functions:\n");
    for f in fns {
        s.push_str(&format!(
            "- {}: {} Parameters (JSON Schema): {}\n",
            f.name, f.description, f.parameters
        ));
    }
    s.push_str("To call a function, reply with only {\"tool_call\": {\"name\": <function name>, \"arguments\": <arguments object>}}.");
    if may_answer {
        s.push_str(" To answer without a call, reply with only {\"response\": <your answer>}.");
    }
    s
}

/// Parses the constrained output. An answer cut by `max_tokens`
/// (`{"response": "Paris is a ci`) is the answer so far, never the
/// envelope; other text that is not the format is returned as it is.
pub fn parse_output(text: &str) -> ToolOutput {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return ToolOutput::Content(cut_response(text).unwrap_or_else(|| text.to_string()));
    };
    if let Some(call) = v.get("tool_call")
        && let Some(name) = call.get("name").and_then(Value::as_str)
    {
        let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
        return ToolOutput::Call {
            name: name.to_string(),
            arguments: arguments.to_string(),
        };
    }
    match v.get("response").and_then(Value::as_str) {
        Some(r) => ToolOutput::Content(r.to_string()),
        None => ToolOutput::Content(text.to_string()),
    }
}

/// The answer inside a `{"response": "...` envelope that ends before its
/// string does: the string's text so far (escapes decoded, a cut escape
/// dropped). `None` when `text` is not such an envelope.
fn cut_response(text: &str) -> Option<String> {
    let rest = text.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest.strip_prefix("\"response\"")?.trim_start();
    let body = rest.strip_prefix(':')?.trim_start().strip_prefix('"')?;
    // Close the string at each candidate end, longest first: the first
    // prefix that parses as a JSON string is the answer so far. A cut
    // escape is at most 6 characters (`\u00e9`), so a few tries do.
    let mut end = body.len();
    for _ in 0..8 {
        let candidate = &body[..end];
        if let Ok(s) = serde_json::from_str::<String>(&format!("\"{candidate}\"")) {
            return Some(s);
        }
        end = body[..end].char_indices().next_back().map(|(i, _)| i)?;
    }
    None
}

/// The prompt text of a message that belongs to a tool exchange: an
/// assistant turn that made calls (shown in the reply format the model is
/// asked to use) or a tool result. `None` for ordinary messages.
pub fn exchange_text(m: &ChatMessageDto, content: Option<String>) -> Option<String> {
    if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
        let rendered: Vec<String> = calls
            .iter()
            .map(|c| {
                let f = &c["function"];
                let args = f["arguments"].as_str().map_or_else(
                    || f["arguments"].clone(),
                    |s| serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.into())),
                );
                json!({"tool_call": {"name": f["name"], "arguments": args}}).to_string()
            })
            .collect();
        return Some(rendered.join("\n"));
    }
    if m.role == "tool" {
        let id = m.tool_call_id.as_deref().unwrap_or("?");
        return Some(format!(
            "Result of tool call {id}: {}",
            content.unwrap_or_default()
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn a_named_choice_constrains_to_that_function_only() {
        let p = plan(
            &[weather()],
            Some(&json!({"type": "function", "function": {"name": "get_weather"}})),
        )
        .expect("valid")
        .expect("a plan");
        let Grammar::JsonSchema(s) = p.grammar else {
            panic!("a schema")
        };
        assert!(s.get("anyOf").is_none(), "no free answer: {s}");
        assert_eq!(
            s["properties"]["tool_call"]["anyOf"][0]["properties"]["name"]["const"],
            "get_weather"
        );
        assert!(p.preamble.contains("get_weather") && !p.preamble.contains("\"response\""));
    }

    #[test]
    fn auto_allows_an_answer_and_none_disables_tools() {
        let p = plan(&[weather()], None).expect("valid").expect("a plan");
        let Grammar::JsonSchema(s) = p.grammar else {
            panic!("a schema")
        };
        assert_eq!(s["anyOf"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            plan(&[weather()], Some(&json!("none"))).expect("valid"),
            None
        );
        assert!(plan(&[], Some(&json!("required"))).is_err());
        assert!(
            plan(
                &[weather()],
                Some(&json!({"type": "function", "function": {"name": "nope"}}))
            )
            .is_err()
        );
        assert!(plan(&[json!({"type": "retrieval"})], None).is_err());
    }

    #[test]
    fn outputs_parse_into_calls_or_content() {
        assert_eq!(
            parse_output(
                r#"{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}"#
            ),
            ToolOutput::Call {
                name: "get_weather".into(),
                arguments: r#"{"city":"Oslo"}"#.into()
            }
        );
        assert_eq!(
            parse_output(r#"{"response": "Hi"}"#),
            ToolOutput::Content("Hi".into())
        );
        assert_eq!(
            parse_output("{\"tool_ca"),
            ToolOutput::Content("{\"tool_ca".into())
        );
    }

    #[test]
    fn an_answer_cut_by_max_tokens_is_its_text_so_far_never_the_envelope() {
        for (cut, want) in [
            (r#"{"response": "Paris is a city"#, "Paris is a city"),
            (r#"{ "response" : "Paris\nis"#, "Paris\nis"),
            (r#"{"response": "a \"quote\" and \"#, "a \"quote\" and "),
            (r#"{"response": "caf\u00"#, "caf"),
            (r#"{"response": ""#, ""),
            (r#"{"response": "done"}"#, "done"),
        ] {
            assert_eq!(parse_output(cut), ToolOutput::Content(want.into()), "{cut}");
        }
    }
}
