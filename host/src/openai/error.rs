//! Errors on the wire: OpenAI's `{"error": {"message", "type", "param", "code"}}`.

use serde::{Deserialize, Serialize};

/// An API error: HTTP status, OpenAI error type, message, offending parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// OpenAI error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// What went wrong, naming the culprit.
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn bad(param: impl Into<Option<String>>, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.into(),
        }
    }

    /// The error as its JSON body, with the HTTP status as `code`.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.to_string(),
                param: self.param.clone(),
                code: Some(self.status.into()),
            },
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

/// An error response's body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What an error response says.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// What went wrong.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `not_found_error`, …).
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The request field at fault (always written, `null` when none).
    #[serde(default)]
    pub param: Option<String>,
    /// The HTTP status on rlhost and vLLM; a string code on OpenAI's own API.
    #[serde(default)]
    pub code: Option<serde_json::Value>,
}
