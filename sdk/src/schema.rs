//! Tool definitions from Rust types: the JSON Schema of a tool's arguments comes from a
//! `#[derive(JsonSchema)]` struct, so the schema the model sees and the type the plugin parses
//! the arguments into cannot drift apart.

use schemars::JsonSchema;

use crate::types::{PluginError, Tool};

/// A tool whose arguments are the JSON form of `Args`.
pub fn tool<Args: JsonSchema>(name: &str, description: &str) -> Tool {
    let mut schema = schemars::schema_for!(Args).to_value();
    if let Some(obj) = schema.as_object_mut() {
        // Metadata the model does not need.
        obj.remove("$schema");
        obj.remove("title");
    }
    Tool {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters: schema.to_string(),
    }
}

/// Parses a tool call's arguments into `Args`; a model's malformed arguments become an
/// [`PluginError::InvalidInput`] whose message can be shown to the model.
pub fn parse_args<Args: serde::de::DeserializeOwned>(
    tool: &str,
    arguments: &str,
) -> Result<Args, PluginError> {
    serde_json::from_str(arguments)
        .map_err(|e| PluginError::InvalidInput(format!("invalid arguments for `{tool}`: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Arguments of a test tool.
    #[derive(JsonSchema, serde::Deserialize)]
    #[allow(dead_code)]
    struct Calc {
        /// An arithmetic expression.
        expression: String,
    }

    #[test]
    fn schema_comes_from_the_type() {
        let t = tool::<Calc>("calc", "Evaluate arithmetic");
        let schema: serde_json::Value = serde_json::from_str(&t.parameters).unwrap();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["properties"]["expression"]["type"], "string");
        assert_eq!(schema["required"][0], "expression");
        assert!(schema.get("$schema").is_none());
        let args: Calc = parse_args("calc", r#"{"expression": "1+1"}"#).unwrap();
        assert_eq!(args.expression, "1+1");
        assert!(parse_args::<Calc>("calc", "{").is_err());
    }
}
