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

use crate::openai::ChatCompletionChunk;

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

/// A dialect's stream writer: pure, it turns the chat pipeline's chunks into its events and
/// keeps what it needs to write the last ones.
pub(super) trait Translator: Send + 'static {
    /// The events before the first chunk.
    fn start(&mut self) -> Vec<Named>;
    /// The events one chunk brings.
    fn push(&mut self, chunk: &ChatCompletionChunk) -> Vec<Named>;
    /// The events after the last chunk (the pipeline's channel closed).
    fn finish(&mut self) -> Vec<Named>;
}

/// OpenAI's stream of `chunks`: each a `data:` line of JSON, `data: [DONE]` after the last.
pub(super) fn openai<C: Serialize + Send + 'static>(chunks: tmpsc::Receiver<C>) -> Response {
    let lines = futures_util::stream::unfold(Some(chunks), |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(c) => {
                let json = serde_json::to_string(&c).expect("chunks serialise");
                Some((format!("data: {json}\n\n"), Some(rx)))
            }
            None => Some(("data: [DONE]\n\n".to_string(), None)),
        }
    });
    body(lines)
}

/// A named-event stream translated by `w` from the pipeline's `chunks`, run by one task that
/// stops reading when the client is gone.
pub(super) fn translated(
    mut chunks: tmpsc::Receiver<ChatCompletionChunk>,
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
        if !send(w.start()).await {
            return;
        }
        while let Some(chunk) = chunks.recv().await {
            if !send(w.push(&chunk)).await {
                return;
            }
        }
        send(w.finish()).await;
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
