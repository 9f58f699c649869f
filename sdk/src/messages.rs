//! Message builders and small conversation queries every plugin needs.

use crate::types::{Message, Role, ToolCall};

fn plain(role: Role, content: impl Into<String>) -> Message {
    Message {
        role,
        content: content.into(),
        tool_calls: Vec::new(),
        tool_call_id: None,
        reasoning: None,
    }
}

/// A system message.
pub fn system(content: impl Into<String>) -> Message {
    plain(Role::System, content)
}

/// A user message.
pub fn user(content: impl Into<String>) -> Message {
    plain(Role::User, content)
}

/// An assistant message without tool calls.
pub fn assistant(content: impl Into<String>) -> Message {
    plain(Role::Assistant, content)
}

/// An assistant message that calls tools.
pub fn assistant_with_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Message {
    Message {
        tool_calls: calls,
        ..plain(Role::Assistant, content)
    }
}

/// A tool result answering the call `call_id`.
pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Message {
    Message {
        tool_call_id: Some(call_id.into()),
        ..plain(Role::Tool, content)
    }
}

/// The last assistant message of a conversation.
pub fn last_assistant(messages: &[Message]) -> Option<&Message> {
    messages.iter().rev().find(|m| m.role == Role::Assistant)
}

/// Number of assistant turns in a conversation.
pub fn assistant_turns(messages: &[Message]) -> usize {
    messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .count()
}

/// Number of tool calls made in a conversation.
pub fn tool_calls(messages: &[Message]) -> usize {
    messages.iter().map(|m| m.tool_calls.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_see_the_right_messages() {
        let call = ToolCall {
            id: "c1".into(),
            name: "python".into(),
            arguments: "{}".into(),
        };
        let conv = vec![
            system("s"),
            user("q"),
            assistant_with_calls("", vec![call]),
            tool_result("c1", "2"),
            assistant("done"),
        ];
        assert_eq!(last_assistant(&conv).unwrap().content, "done");
        assert_eq!(assistant_turns(&conv), 2);
        assert_eq!(tool_calls(&conv), 1);
        assert_eq!(conv[3].tool_call_id.as_deref(), Some("c1"));
    }
}
