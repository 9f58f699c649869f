//! The one server-sent-events writer. OpenAI's chat, completions and generate streams are the
//! pipeline's chunks as `data:` lines with `data: [DONE]` last (written here and nowhere else);
//! the Responses and Messages dialects send named events (`event:` and `data:` lines, no
//! sentinel), written by a [`Translator`] from the chat pipeline's chunks.
//!
//! A stream ends when its producer's channel closes; a client that goes away drops the body,
//! which closes the channel back to the producer and so cancels the request in the engine.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde::Serialize;
use tokio::sync::mpsc as tmpsc;

use crate::chat::Chunks;
use crate::openai::{ChatChunkChoice, ChatCompletionChunk, ToolCallChunk, Usage};

/// Events in flight to a slow client.
const DEPTH: usize = 64;

/// An event with a name (`event:` line) and a JSON payload.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Named {
    /// The event's name (its `type`, in both dialects that name events).
    pub name: &'static str,
    /// The event as JSON.
    pub data: String,
}

impl Named {
    /// `event` named `name`, serialised.
    pub fn new(name: &'static str, event: &impl Serialize) -> Self {
        Self {
            name,
            data: serde_json::to_string(event).expect("events serialise"),
        }
    }
}

/// A dialect's stream writer: pure, it turns what the chat pipeline's chunks carry into its
/// events (kept until [`Translator::take`]) and keeps what it needs to write the last ones.
/// [`translated`] walks the chunks and calls it.
pub(super) trait Translator: Send + 'static {
    /// Writes the events before the first chunk.
    fn start(&mut self);
    /// More reasoning (`reasoning`) or content text.
    fn text(&mut self, reasoning: bool, delta: &str);
    /// A tool call's piece: a new call (id, name, arguments so far) or more arguments.
    fn call(&mut self, call: &ToolCallChunk);
    /// The rest a choice's chunk says: token ids, finish reason, policy version.
    fn choice(&mut self, choice: &ChatChunkChoice);
    /// The request's token counts (the stream's last chunk).
    fn usage(&mut self, usage: &Usage);
    /// The pipeline's stream was cut short (its producer failed): the answer is incomplete.
    fn cut(&mut self);
    /// Writes the events after the last chunk (the pipeline's channel closed).
    fn finish(&mut self);
    /// The events written since the last take.
    fn take(&mut self) -> Vec<Named>;
}

/// What `chunk` carries, handed to `w` in order: usage, then per choice its reasoning, content,
/// tool-call pieces and the rest.
fn walk(w: &mut impl Translator, chunk: &ChatCompletionChunk) {
    if let Some(u) = &chunk.usage {
        w.usage(u);
    }
    for c in &chunk.choices {
        if let Some(r) = &c.delta.reasoning_content {
            w.text(true, r);
        }
        if let Some(t) = &c.delta.content {
            w.text(false, t);
        }
        for call in c.delta.tool_calls.iter().flatten() {
            w.call(call);
        }
        w.choice(c);
    }
}

/// OpenAI's stream of `chunks`: each a `data:` line of JSON, `data: [DONE]` after the last,
/// written only when the producer finished the stream (a stream cut short just ends, so a
/// client can tell).
pub(super) fn openai<C: Serialize + Send + 'static>(chunks: Chunks<C>) -> Response {
    let lines = futures_util::stream::unfold(Some(chunks), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(c) => {
                let json = serde_json::to_string(&c).expect("chunks serialise");
                Some((format!("data: {json}\n\n"), Some(rx)))
            }
            None if rx.finished().await => Some(("data: [DONE]\n\n".to_string(), None)),
            None => None,
        }
    });
    body(lines)
}

/// A named-event stream translated by `w` from the pipeline's `chunks`, run by one task that
/// stops reading when the client is gone.
pub(super) fn translated(
    mut chunks: Chunks<ChatCompletionChunk>,
    mut w: impl Translator,
) -> Response {
    let (tx, rx) = tmpsc::channel::<Named>(DEPTH);
    tokio::spawn(async move {
        let send = |events: Vec<Named>| {
            let tx = tx.clone();
            async move {
                for e in events {
                    if tx.send(e).await.is_err() {
                        return false;
                    }
                }
                true
            }
        };
        w.start();
        if !send(w.take()).await {
            return;
        }
        while let Some(chunk) = chunks.recv().await {
            walk(&mut w, &chunk);
            if !send(w.take()).await {
                return;
            }
        }
        if !chunks.finished().await {
            w.cut();
        }
        w.finish();
        send(w.take()).await;
    });
    let lines = futures_util::stream::unfold(rx, |mut rx| async move {
        let e = rx.recv().await?;
        Some((format!("event: {}\ndata: {}\n\n", e.name, e.data), rx))
    });
    body(lines)
}

/// An event-stream response whose body is `lines`.
fn body(lines: impl futures_util::Stream<Item = String> + Send + 'static) -> Response {
    use futures_util::StreamExt;
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(
            lines.map(|l| Ok::<_, Infallible>(Bytes::from(l))),
        ))
        .expect("a valid response")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body `openai` writes for chunks `1` and `2`, the producer finishing or not.
    async fn body_of(finish: bool) -> String {
        let (tx, ended, chunks) = crate::chat::chunks::<u32>();
        let response = openai(chunks);
        for c in [1, 2] {
            tx.send(c).await.unwrap();
        }
        drop(tx);
        if finish {
            ended.send(()).unwrap();
        } else {
            drop(ended);
        }
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn done_follows_a_finished_stream_only() {
        assert_eq!(
            body_of(true).await,
            "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        );
        // A producer that failed midway: the chunks it sent, then the end, no [DONE].
        assert_eq!(body_of(false).await, "data: 1\n\ndata: 2\n\n");
    }
}
