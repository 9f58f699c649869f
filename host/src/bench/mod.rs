//! Benchmarks behind `host bench …`. Each prints its numbers next to a peer measured in the same
//! run (a ratio, never an absolute target baked into a test).

pub mod generate;
pub mod grammar;
pub mod logprobs;
pub mod math_verify;
pub mod plugins;
pub mod sampler;
pub mod sandbox;
pub mod serve;
