//! Library tests: rlhost's API (model, tokenizer, engine, trainer, plugin runtime, sandboxes)
//! against real models, plugins and components, in one test binary. A test that needs the `host`
//! binary only to make a fixture (`host model init`) belongs here; one that tests what the binary
//! does (its command line, its servers) belongs to `e2e`. Run one module with
//! `cargo test --release -p rlhost --test lib engine::`.

// `common` serves every module; not each uses every helper.
#[allow(dead_code)]
mod common;

mod chat_template;
mod engine;
mod math_envs;
mod model_parity;
mod objectives;
mod plugin_flavours;
mod plugin_runtime;
mod prometheus;
mod rl;
mod rl_config;
mod rollout;
mod sandbox;
mod sandbox_native;
mod tokenizer;
